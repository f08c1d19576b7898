"""Waiting messages removed in bulk: the oldest arrivals of a full
``discard_old`` queue (deleted, or moved to its dead-letter queue), and a
queue purge. Each leaves an audit trail; the dead-letter handler's attempt
counts of removed messages go with them."""

from __future__ import annotations

import json

from django.db import connection

from broker.models import Queue
from broker.services.audit import AuditEntry, audit_record_many
from broker.services.counting import minute_count
from broker.services.transitions.headers import dead_letter_header
from broker.services.transitions.table import Transition, guard

T = Transition

# The earliest arrivals in the queue (a forwarded or released message arrives
# when it is moved, whatever its id). SKIP LOCKED leaves a message that a
# worker is claiming right now to that worker. Index: message_waiting_idx.
_OLDEST_SQL = f"""
SELECT m.id, m.put_application, m.put_user, m.content_type
FROM broker_message AS m
WHERE m.queue_id = %(queue_id)s AND {guard(T.DISCARD_OLD)}
ORDER BY m.enqueued_at, m.id
LIMIT %(excess)s
FOR UPDATE SKIP LOCKED
"""  # noqa: S608
_DELETE_SQL = """
WITH gone AS (
    DELETE FROM broker_message WHERE id = ANY(%(ids)s) RETURNING id
), forgotten AS (
    DELETE FROM broker_deadletterattempt WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone
"""
_TO_DEAD_LETTER_SQL = """
UPDATE broker_message AS m
SET queue_id = %(target)s, dead_letter = d.header, available_at = now(), enqueued_at = now(),
    updated_at = now()
FROM jsonb_to_recordset(%(rows)s::jsonb) AS d(id bigint, header jsonb)
WHERE m.id = d.id
"""
_PURGE_WAITING_SQL = f"""
WITH gone AS (
    DELETE FROM broker_message AS m
    WHERE m.queue_id = %(queue_id)s AND {guard(T.PURGE_WAITING)}
    RETURNING m.id
), forgotten AS (
    DELETE FROM broker_deadletterattempt WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone
"""  # noqa: S608


def messages_discard_old(
    *,
    queue: Queue,
    excess: int,
    to_dead_letter: bool,
    reason: str,
    subscription: str | None = None,
) -> list[int]:
    """TBDL -> deleted, or TBDL -> TBDL on the queue's dead-letter queue
    with reason ``discarded_old`` (``to_dead_letter``), for the ``excess``
    earliest arrivals waiting on ``queue``. One system audit event each.
    Runs in the caller's transaction; returns the ids discarded."""
    to_dead_letter = to_dead_letter and queue.dead_letter_queue_id is not None
    with connection.cursor() as cursor:
        cursor.execute(_OLDEST_SQL, {"queue_id": queue.id, "excess": excess})
        oldest = cursor.fetchall()
        ids = sorted(message_id for message_id, *_ in oldest)
        if to_dead_letter:
            rows = [
                {
                    "id": message_id,
                    "header": dead_letter_header(
                        reason="discarded_old",
                        original_queue=queue.name,
                        put_application=application,
                        put_user=user,
                        content_type=content_type,
                        error=reason,
                    ),
                }
                for message_id, application, user, content_type in oldest
            ]
            if rows:
                cursor.execute(
                    _TO_DEAD_LETTER_SQL,
                    {"target": queue.dead_letter_queue_id, "rows": json.dumps(rows)},
                )
        elif ids:
            cursor.execute(_DELETE_SQL, {"ids": ids})
    audit_record_many(
        entries=(
            AuditEntry(
                action="message_discard_dead_letter" if to_dead_letter else "message_discard",
                queue_name=queue.name,
                message_id=message_id,
                reason=reason,
                details={"subscription": subscription} if subscription else {},
            )
            for message_id in ids
        )
    )
    if to_dead_letter:
        minute_count(queue_id=queue.id, dead_lettered=len(ids))
    else:
        minute_count(queue_id=queue.id, discarded=len(ids))
    return ids


def messages_purge_waiting(*, queue_id: int) -> int:
    """TBDL -> deleted for every waiting message of a queue; in-flight
    deliveries finish. Runs in the caller's transaction, which records the
    audit event; returns how many were deleted."""
    with connection.cursor() as cursor:
        cursor.execute(_PURGE_WAITING_SQL, {"queue_id": queue_id})
        row = cursor.fetchone()
    return int(row[0]) if row else 0
