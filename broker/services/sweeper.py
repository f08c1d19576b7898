"""The sweeper: notice deliveries that ended without an answer.

A DLNG message's delivery ended without an answer when the worker that leased
it is gone (its advisory lock, see ``broker.services.delivery``, is free again
because its database session ended), or when it outlived its lease by the
time Celery needs to kill a hung task. A worker that died within the lease
crashed (``crash_count + 1``); a delivery past its lease timed out
(``timeout_count + 1``). Either way the message goes back to TBDL as a
suspect, delivered alone from then on (``broker.services.delivery``).

Two rules decide that a suspect is poison, whichever comes first:

* the crash threshold (blacklisting as IBM's message servers do it): a
  message whose consumer crashed ``crash_threshold`` times (default 2: once
  in its batch, once alone) is poison;
* the poison limit (BlazingMQ's retransmission limit): a message whose
  deliveries ended without an answer ``poison_limit`` times (default 5),
  crashes and timeouts together, is poison; this is what catches a message
  that hangs its consumer rather than killing it.

A poison message is set aside by its queue's poison action: quarantined
(NDLV) or purged, its payload dumped and an alarm raised either way.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from broker.services.counting import minute_count
from broker.services.delivery import lease_token
from broker.services.transitions.blacklist import messages_set_aside_poison
from broker.services.transitions.in_flight import Unanswered, messages_requeue_unanswered

logger = logging.getLogger(__name__)


@dataclass
class SweepResult:
    requeued: list[int] = field(default_factory=list)
    quarantined: list[int] = field(default_factory=list)
    purged: list[int] = field(default_factory=list)
    # How many suspects each queue got back: each is a delivery unit of its own.
    suspects_by_queue: dict[int, int] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return bool(self.requeued or self.quarantined or self.purged)


@dataclass(frozen=True)
class Leases:
    """The leases of the DLNG messages, as a sweep finds them."""

    # Owners whose worker no longer holds its lock.
    dead_owners: list[str]
    # Some lease of a live owner was outlived by ``overdue_seconds()``.
    overdue: bool

    @property
    def ended(self) -> bool:
        """Some delivery ended without an answer."""
        return bool(self.dead_owners) or self.overdue


# Each owner of DLNG messages' leases, and whether one of them is overdue.
# Index: message_in_flight_idx (lease_deadline IS NOT NULL, which only DLNG has).
LEASES_SQL = (
    "SELECT lease_owner, bool_or(lease_deadline < now() - make_interval(secs => %(overdue)s))"
    " FROM broker_message WHERE state = 'DLNG' AND lease_deadline IS NOT NULL"
    " GROUP BY lease_owner"
)


def leases_find(*, overdue_seconds: float) -> Leases:
    """The leases of the DLNG messages: whose worker is gone, and whether a
    live worker's lease is overdue."""
    with connection.cursor() as cursor:
        cursor.execute(LEASES_SQL, {"overdue": overdue_seconds})
        overdue_by_owner: dict[str, bool] = dict(cursor.fetchall())
        tokens = {owner: lease_token(owner) for owner in overdue_by_owner}
        live_tokens = [token for token in tokens.values() if token is not None]
        free: set[int] = set()
        if live_tokens:
            # Taking the lock succeeds only if its holder's session is gone;
            # give it straight back so the check itself holds nothing.
            cursor.execute(
                "SELECT token FROM unnest(%s::bigint[]) AS token WHERE pg_try_advisory_lock(token)",
                [live_tokens],
            )
            free = {token for (token,) in cursor.fetchall()}
        if free:
            cursor.execute(
                "SELECT pg_advisory_unlock(token) FROM unnest(%s::bigint[]) AS token", [list(free)]
            )
    dead = [owner for owner, token in tokens.items() if token is None or token in free]
    return Leases(
        dead_owners=dead,
        overdue=any(late for owner, late in overdue_by_owner.items() if owner not in dead),
    )


def poison_reasons(ended: Sequence[Unanswered]) -> dict[int, str]:
    """The requeued messages that are poison, and why (see the module's
    docstring for the two rules)."""
    reasons: dict[int, str] = {}
    for message in ended:
        if message.crash_count >= message.crash_threshold:
            reasons[message.id] = (
                f"its consumer crashed {message.crash_count} times while delivering it "
                f"(crash threshold {message.crash_threshold})"
            )
        elif message.retransmissions >= message.poison_limit:
            reasons[message.id] = (
                f"{message.retransmissions} deliveries ended without an answer "
                f"({message.crash_count} crashed, {message.timeout_count} timed out; "
                f"poison limit {message.poison_limit})"
            )
    return reasons


def overdue_seconds() -> float:
    """How long past its lease a delivery of a live worker may still be
    answered: Celery kills a hung delivery task when it has run its loop
    budget plus the lease, so beyond that (and a grace) no answer can come."""
    return settings.LAZARETTO_DELIVERY_TASK_SECONDS + settings.LAZARETTO_LEASE_GRACE_SECONDS


def messages_sweep() -> SweepResult:
    """Requeue every delivery that ended without an answer as a suspect, and
    set aside the poison among them, in one transaction."""
    overdue = overdue_seconds()
    leases = leases_find(overdue_seconds=overdue)
    if not leases.ended:  # the common sweep: one statement
        return SweepResult()
    with transaction.atomic():
        ended = messages_requeue_unanswered(dead_owners=leases.dead_owners, overdue_seconds=overdue)
        # Said once committed, before what becomes of the poison among them.
        transaction.on_commit(lambda: _log_unanswered(ended), robust=True)
        quarantined, purged = messages_set_aside_poison(reasons=poison_reasons(ended))
    gone = set(quarantined) | set(purged)
    requeued = [message for message in ended if message.id not in gone]
    failed = Counter(message.queue_id for message in ended if message.id in gone)
    crashed = Counter(message.queue_id for message in ended if message.crashed)
    timed_out = Counter(message.queue_id for message in ended if not message.crashed)
    for queue_id in sorted({message.queue_id for message in ended}):
        minute_count(
            queue_id=queue_id,
            failed=failed[queue_id],
            crashed=crashed[queue_id],
            timed_out=timed_out[queue_id],
        )
    return SweepResult(
        requeued=sorted(message.id for message in requeued),
        quarantined=quarantined,
        purged=purged,
        suspects_by_queue=dict(Counter(message.queue_id for message in requeued)),
    )


def _log_unanswered(ended: Sequence[Unanswered]) -> None:
    """One line per delivery that ended without an answer; its ``worker`` is
    the one that had the delivery (host:pid of the lease), not the sweeper."""
    for message in ended:
        worker = message.lease_owner.rsplit(":", 1)[0]
        logger.info(
            "message %s on %s: %s (crash count %s, timeouts %s)",
            message.id,
            message.queue_name,
            f"worker {worker} died delivering it"
            if message.crashed
            else f"no answer from worker {worker} within the lease",
            message.crash_count,
            message.timeout_count,
            extra={
                "message_id": message.id,
                "queue": message.queue_name,
                "worker": worker,
                "crashed": message.crashed,
            },
        )
