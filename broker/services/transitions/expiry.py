"""Expiry: a waiting message whose ``expires_at`` has passed is not delivered
but moved to its queue's dead-letter queue (TBDL there) with reason
``expired``, IBM MQ's MQFB_EXPIRATION; on a queue without one it is
blacklisted. Paused queues expire too: pausing stops delivery, not time."""

from __future__ import annotations

import json

from django.db import connection, transaction

from broker.models import QueueKind
from broker.services.transitions.blacklist import messages_quarantine
from broker.services.transitions.headers import dead_letter_header
from broker.services.transitions.table import Transition, guard

T = Transition

# The earliest expiries first. SKIP LOCKED: a message a worker is claiming
# right now (the claim skips expired ones anyway) or another sweeper is
# expiring is left for the next sweep rather than waited on. Index:
# message_expiry_idx (state = 'TBDL' AND expires_at IS NOT NULL).
_EXPIRED_SQL = f"""
SELECT m.id, q.name, q.dead_letter_queue_id, m.put_application, m.put_user, m.content_type,
       m.expires_at
FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id
WHERE {guard(T.EXPIRE)} AND m.expires_at < now() AND q.kind = '{QueueKind.STANDARD.value}'
ORDER BY m.expires_at, m.id
LIMIT %(limit)s
FOR UPDATE OF m SKIP LOCKED
"""  # noqa: S608
_EXPIRE_SQL = """
UPDATE broker_message AS m
SET queue_id = d.queue_id, dead_letter = d.header, suspect = false, expires_at = NULL,
    available_at = now(), enqueued_at = now(), updated_at = now()
FROM jsonb_to_recordset(%(rows)s::jsonb) AS d(id bigint, queue_id bigint, header jsonb)
WHERE m.id = d.id
"""


def messages_expire(*, limit: int = 1000) -> list[int]:
    """TBDL -> TBDL on the queue's dead-letter queue, with a dead-letter
    header of reason ``expired``, for up to ``limit`` waiting messages of
    standard queues whose expiry has passed. A message whose queue has no
    dead-letter queue is blacklisted instead (NDLV), its reason saying so.
    Runs in its own transaction; returns the ids that expired either way."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_EXPIRED_SQL, {"limit": limit})
        moves = []
        nowhere: dict[int, str] = {}
        for (
            message_id,
            queue_name,
            target,
            application,
            user,
            content_type,
            expires_at,
        ) in cursor.fetchall():
            error = f"not delivered before it expired at {expires_at.isoformat()}"
            if target is None:
                nowhere[message_id] = (
                    f"expired, and queue {queue_name} has no dead-letter queue: {error}"
                )
                continue
            header = dead_letter_header(
                reason="expired",
                original_queue=queue_name,
                put_application=application,
                put_user=user,
                content_type=content_type,
                error=error,
            )
            moves.append({"id": message_id, "queue_id": target, "header": header})
        if moves:
            cursor.execute(_EXPIRE_SQL, {"rows": json.dumps(moves)})
        return sorted([move["id"] for move in moves] + messages_quarantine(reasons=nowhere))
