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
from dataclasses import dataclass, field

from django.db import connection, transaction

from broker.models import Message
from broker.services.delivery import lease_token
from broker.services.quarantine import messages_quarantine, quarantine_reasons
from broker.services.stats import minute_count

# SKIP LOCKED: a row another transaction is settling right now (an ack in
# progress, another sweeper) is left for the next sweep instead of waited on.
# Index: message_in_flight_idx (state = 'DLNG').
_REQUEUE_SQL = """
WITH crashed AS (
    SELECT id, lease_owner = ANY(%(dead)s) AS died
    FROM broker_message
    WHERE state = 'DLNG' AND (lease_deadline < now() OR lease_owner = ANY(%(dead)s))
    FOR UPDATE SKIP LOCKED
)
UPDATE broker_message AS m
SET state = 'TBDL', suspect = true, crash_count = m.crash_count + 1,
    lease_owner = '', lease_deadline = NULL, updated_at = now(), available_at = now(),
    last_error = CASE WHEN c.died THEN 'the delivering worker died'
                      ELSE 'the delivery outlived its lease' END
FROM crashed AS c, broker_queue AS q
WHERE m.id = c.id AND q.id = m.queue_id
RETURNING m.id, m.crash_count, m.attempts, q.crash_threshold, q.poison_limit
"""


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


def messages_sweep() -> SweepResult:
    """DLNG -> TBDL (suspect, crash_count + 1) for every crashed delivery, or
    DLNG -> NDLV when the crash threshold or poison limit is reached."""
    dead = dead_lease_owners()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_REQUEUE_SQL, {"dead": dead})
        rows = cursor.fetchall()
        quarantined = messages_quarantine(reasons=quarantine_reasons(rows))
    requeued = sorted({row[0] for row in rows} - set(quarantined))
    if quarantined:
        for queue_id, count in Counter(
            Message.objects.filter(id__in=quarantined).values_list("queue_id", flat=True)
        ).items():
            minute_count(queue_id=queue_id, delivered=0, failed=count)
    return SweepResult(requeued=requeued, quarantined=quarantined)
