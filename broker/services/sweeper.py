"""The sweeper: notice deliveries whose worker died or hung.

A DLNG message has crashed when the worker that leased it is gone (its
advisory lock, see ``broker.services.delivery``, is free again because its
database session ended) or when its lease deadline passed. Each crashed
message goes back to TBDL as a suspect with ``crash_count + 1``; the suspects
are then delivered alone, one at a time per queue (see
``broker.services.delivery``). A message whose crash count reaches the queue's crash
threshold, or whose attempts reach its poison limit, is blacklisted instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import connection, transaction

from broker.models import Message
from broker.services.delivery import lease_token
from broker.services.stats import minute_count
from broker.services.transitions.blacklist import messages_quarantine
from broker.services.transitions.in_flight import Crashed, messages_requeue_crashed


@dataclass
class SweepResult:
    requeued: list[int] = field(default_factory=list)
    quarantined: list[int] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.requeued or self.quarantined)


def dead_lease_owners() -> list[str]:
    """Lease owners of DLNG messages whose worker no longer holds its lock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT lease_owner FROM broker_message WHERE state = 'DLNG'")
        owners = [owner for (owner,) in cursor.fetchall()]
        tokens = {owner: lease_token(owner) for owner in owners}
        live_tokens = [token for token in tokens.values() if token is not None]
        if not live_tokens:
            return owners
        # Taking the lock succeeds only if its holder's session is gone; give
        # it straight back so the check itself holds nothing.
        cursor.execute(
            "SELECT token FROM unnest(%s::bigint[]) AS token WHERE pg_try_advisory_lock(token)",
            [live_tokens],
        )
        free = {token for (token,) in cursor.fetchall()}
        if free:
            cursor.execute(
                "SELECT pg_advisory_unlock(token) FROM unnest(%s::bigint[]) AS token", [list(free)]
            )
    return [owner for owner, token in tokens.items() if token is None or token in free]


def quarantine_reasons(crashed: Sequence[Crashed]) -> dict[int, str]:
    """The requeued messages that are poison, and why: their consumer crashed
    ``crash_threshold`` times, or they were delivered ``poison_limit`` times
    without an acknowledgement."""
    reasons: dict[int, str] = {}
    for message in crashed:
        if message.crash_count >= message.crash_threshold:
            reasons[message.id] = (
                f"its consumer crashed {message.crash_count} times while delivering it "
                f"(crash threshold {message.crash_threshold})"
            )
        elif message.attempts >= message.poison_limit:
            reasons[message.id] = (
                f"delivered {message.attempts} times without an acknowledgement "
                f"(poison limit {message.poison_limit})"
            )
    return reasons


def messages_sweep() -> SweepResult:
    """Requeue every crashed delivery as a suspect, and blacklist those that
    reached their crash threshold or poison limit, in one transaction."""
    dead = dead_lease_owners()
    with transaction.atomic():
        crashed = messages_requeue_crashed(dead_owners=dead)
        quarantined = messages_quarantine(reasons=quarantine_reasons(crashed))
    requeued = sorted({message.id for message in crashed} - set(quarantined))
    if quarantined:
        for queue_id, count in Counter(
            Message.objects.filter(id__in=quarantined).values_list("queue_id", flat=True)
        ).items():
            minute_count(queue_id=queue_id, delivered=0, failed=count)
    return SweepResult(requeued=requeued, quarantined=quarantined)
