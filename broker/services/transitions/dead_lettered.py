"""Messages waiting on a dead-letter queue leave it by a forward to another
queue, a retry on the queue they were dead-lettered from, or a discard,
whether an operator or the dead-letter handler's rules decide it. Either way
the same statement moves them and forgets the handler's attempt counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction

from broker.errors import IllegalTransition, QueueNotFound
from broker.models import Message, Queue, QueueKind
from broker.services.audit import Actor, audit_record
from broker.services.counting import minute_count
from broker.services.transitions.table import Transition, guard, refuse
from broker.signals import messages_available

T = Transition

# A move is a new arrival: fresh delivery counters, due now, at the back of
# the target queue (enqueued_at). The handler's attempt counts of the moved
# messages go in the same statement.
_MOVE_SQL = """
WITH moved AS (
    UPDATE broker_message AS m
    SET queue_id = %(target)s, attempts = 0, crash_count = 0, timeout_count = 0, suspect = false,
        available_at = now(), enqueued_at = now(), updated_at = now(),
        dead_letter = CASE WHEN %(keep_header)s THEN m.dead_letter ELSE NULL END
    FROM broker_queue AS q
    WHERE m.id = ANY(%(ids)s) AND q.id = m.queue_id AND {guard}
    RETURNING m.id
), forgotten AS (
    DELETE FROM broker_deadletterattempt WHERE message_id IN (SELECT id FROM moved)
)
SELECT id FROM moved ORDER BY id
"""
_FORWARD_SQL = _MOVE_SQL.format(guard=guard(T.FORWARD))
_RETRY_SQL = _MOVE_SQL.format(guard=guard(T.RETRY_DEAD_LETTER))

_DISCARD_SQL = f"""
WITH gone AS (
    DELETE FROM broker_message AS m USING broker_queue AS q
    WHERE m.id = ANY(%(ids)s) AND q.id = m.queue_id AND {guard(T.DISCARD)}
    RETURNING m.id, m.queue_id
), forgotten AS (
    DELETE FROM broker_deadletterattempt WHERE message_id IN (SELECT id FROM gone)
)
SELECT id, queue_id FROM gone ORDER BY id
"""  # noqa: S608


def _move(sql: str, message_ids: Sequence[int], target: Queue, keep_header: bool) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            sql, {"ids": list(message_ids), "target": target.id, "keep_header": keep_header}
        )
        moved = [message_id for (message_id,) in cursor.fetchall()]
    if moved and target.kind == QueueKind.STANDARD:
        messages_available.send(sender=Queue, queue=target, count=len(moved))
    return moved


def messages_forward(
    *, message_ids: Sequence[int], target: Queue, keep_header: bool = True
) -> list[int]:
    """TBDL on a dead-letter queue -> TBDL on ``target``, with fresh
    delivery counters, for those of ``message_ids`` that wait on a
    dead-letter queue. ``keep_header=False`` drops the dead-letter header.
    An internal move: ``target``'s max-messages limit does not refuse it.
    Runs in the caller's transaction, which records the audit events (the
    handler names its rule); returns the ids moved."""
    return _move(_FORWARD_SQL, message_ids, target, keep_header)


def messages_retry_dead_lettered(*, message_ids: Sequence[int], target: Queue) -> list[int]:
    """As ``messages_forward`` with the header kept, for messages going back
    to ``target``, the queue they were dead-lettered from."""
    return _move(_RETRY_SQL, message_ids, target, True)


def messages_discard(*, message_ids: Sequence[int]) -> list[int]:
    """TBDL on a dead-letter queue -> deleted, for those of ``message_ids``
    that wait on a dead-letter queue. Runs in the caller's transaction,
    which records the audit events; returns the ids deleted."""
    with connection.cursor() as cursor:
        cursor.execute(_DISCARD_SQL, {"ids": list(message_ids)})
        rows = cursor.fetchall()
    for queue_id, count in Counter(queue_id for _, queue_id in rows).items():
        minute_count(queue_id=queue_id, discarded=count)
    return [message_id for message_id, _ in rows]


def _target(queue_name: str) -> Queue:
    target = Queue.objects.filter(name=queue_name).first()
    if target is None:
        raise QueueNotFound(f"There is no queue named {queue_name!r}.")
    return target


def _source(message_id: int) -> Message:
    message = Message.objects.select_related("queue").filter(id=message_id).first()
    if message is None:
        refuse(T.FORWARD, message_id=message_id)
    return message


def _forwarded(
    message_id: int, target: Queue, actor: Actor, reason: str, details: dict[str, Any]
) -> Message:
    """The audit event of an operator's forward (or retry) of one message,
    and the message as it is now."""
    audit_record(
        action="message_forward",
        actor=actor,
        queue_name=target.name,
        message_id=message_id,
        reason=reason,
        details=details,
    )
    return Message.objects.select_related("queue").get(id=message_id)


@transaction.atomic
def message_forward(
    *,
    message_id: int,
    queue_name: str,
    keep_header: bool = True,
    actor: Actor = None,
    reason: str = "",
) -> Message:
    """An operator's forward of one dead-lettered message to ``queue_name``
    (see ``messages_forward``), with an audit event."""
    target = _target(queue_name)
    source = _source(message_id).queue.name
    if not messages_forward(message_ids=[message_id], target=target, keep_header=keep_header):
        refuse(T.FORWARD, message_id=message_id)
    return _forwarded(
        message_id, target, actor, reason, {"from": source, "keep_header": keep_header}
    )


@transaction.atomic
def message_retry(*, message_id: int, actor: Actor = None, reason: str = "") -> Message:
    """An operator's retry of one dead-lettered message: back to the queue
    its dead-letter header names, the header kept as history (see
    ``messages_retry_dead_lettered``), with an audit event."""
    message = _source(message_id)
    original = (message.dead_letter or {}).get("original_queue")
    if not original:
        raise IllegalTransition(f"Message {message_id} has no dead-letter header to retry by.")
    target = _target(original)
    if not messages_retry_dead_lettered(message_ids=[message_id], target=target):
        refuse(T.RETRY_DEAD_LETTER, message_id=message_id)
    details = {"from": message.queue.name, "keep_header": True, "retry": True}
    return _forwarded(message_id, target, actor, reason, details)


@transaction.atomic
def message_discard(*, message_id: int, actor: Actor = None, reason: str = "") -> None:
    """An operator's discard of one dead-lettered message (see
    ``messages_discard``); the audit event keeps its id, queue, reason and
    dead-letter header."""
    message = _source(message_id)
    if not messages_discard(message_ids=[message_id]):
        refuse(T.DISCARD, message_id=message_id)
    details: dict[str, Any] = {"dead_letter": message.dead_letter}
    audit_record(
        action="message_discard",
        actor=actor,
        queue_name=message.queue.name,
        message_id=message_id,
        reason=reason,
        details=details,
    )


def messages_defer(*, message_ids: Sequence[int], seconds: float) -> None:
    """Make waiting messages due again only after ``seconds`` (the dead-letter
    handler's RETRYINT); their state and queue stay."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_message SET available_at = now() + make_interval(secs => %s)"
            " WHERE id = ANY(%s)",
            [seconds, list(message_ids)],
        )


def messages_wake_deferred(*, queue_id: int) -> int:
    """Make every deferred waiting message of a queue due now (a new rules
    table looks at all of them at once); returns how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE broker_message SET available_at = now()"
            " WHERE queue_id = %s AND state = 'TBDL' AND available_at > now()",
            [queue_id],
        )
        return cursor.rowcount
