"""Expiry: a waiting message whose ``expires_at`` has passed is not delivered
but moved to its queue's dead-letter queue (TBDL there) with reason
``expired``, IBM MQ's MQFB_EXPIRATION; on a queue without one it is
blacklisted. Paused queues expire too: pausing stops delivery, not time."""

from __future__ import annotations

from django.db import connection, transaction

from broker.models import QueueKind
from broker.services.transitions.in_flight import DeadLetterCause, dead_letter_locked
from broker.services.transitions.table import Transition, guard

T = Transition

# Waiting messages of standard queues whose expiry has passed. Index:
# message_expiry_idx (state = 'TBDL' AND expires_at IS NOT NULL).
_EXPIRED = f"""
FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id
WHERE {guard(T.EXPIRE)} AND m.expires_at < now() AND q.kind = '{QueueKind.STANDARD.value}'
"""
# The earliest expiries first. SKIP LOCKED: a message a worker is claiming
# right now (the claim skips expired ones anyway) or another sweeper is
# expiring is left for the next sweep rather than waited on.
_EXPIRED_SQL = f"""
SELECT m.id, q.name, q.dead_letter_queue_id, m.put_application, m.put_user, m.content_type,
       m.expires_at
{_EXPIRED}
ORDER BY m.expires_at, m.id
LIMIT %(limit)s
FOR UPDATE OF m SKIP LOCKED
"""
# Whether any has: the sweep's usual answer is no, in one statement and no
# transaction.
_ANY_EXPIRED_SQL = f"SELECT EXISTS (SELECT {_EXPIRED})"


def messages_expire(*, limit: int = 1000) -> list[int]:
    """TBDL -> TBDL on the queue's dead-letter queue, with a dead-letter
    header of reason ``expired``, for up to ``limit`` waiting messages of
    standard queues whose expiry has passed. A message whose queue has no
    dead-letter queue is blacklisted instead (NDLV), its reason saying so.
    Runs in its own transaction; returns the ids that expired either way."""
    with connection.cursor() as cursor:
        cursor.execute(_ANY_EXPIRED_SQL)
        [(any_expired,)] = cursor.fetchall()
    if not any_expired:
        return []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_EXPIRED_SQL, {"limit": limit})
        rows = cursor.fetchall()
        causes = {
            row[0]: DeadLetterCause(
                "expired", f"not delivered before it expired at {row[-1].isoformat()}"
            )
            for row in rows
        }
        return dead_letter_locked(cursor, rows=[row[:-1] for row in rows], causes=causes)
