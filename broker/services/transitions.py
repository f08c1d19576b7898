"""The message state machine. Every change of a message's state happens in
one of these functions; each is a conditional update (the row must still be in
a state the transition starts from), so two processes racing for the same
message cannot both win, and a transition the machine does not allow changes
nothing and raises ``IllegalTransition``.

    TBDL -> DLNG            claim (set-based, in the delivery service)
    DLNG -> DLVD            ack
    DLNG -> TBDL            handler error with retries left, or crash
    DLNG -> TBDL (DLQ)      dead-letter: moved to the dead-letter queue
    TBDL/DLNG -> NDLV       quarantine (crash threshold or poison limit),
                            in broker.services.quarantine
    NDLV -> TBDL            operator release
    NDLV -> FAIL            operator fail (terminal)
    NDLV -> (deleted)       operator purge
    TBDL in a DLQ -> TBDL   forward to another queue, or retry on the original
                            one (internal moves: never refused by the
                            target's max-messages limit)
    TBDL in a DLQ -> (deleted)  discard

Set-based versions for whole batches (claim, ack, retry, crash) live in
broker.services.delivery and broker.services.sweeper; they follow the same
table.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from broker.errors import IllegalTransition, MessageNotFound, QueueNotFound
from broker.models import AuditEvent, Message, MessageState, Queue, QueueKind
from broker.services.audit import SYSTEM_ACTOR, Actor, audit_record
from broker.signals import messages_available

S = MessageState

# For each target state, the states a message may come from.
SOURCES: dict[str, frozenset[str]] = {
    S.TO_BE_DELIVERED: frozenset({S.DELIVERING, S.NOT_DELIVERABLE}),
    S.DELIVERING: frozenset({S.TO_BE_DELIVERED}),
    S.DELIVERED: frozenset({S.DELIVERING}),
    S.NOT_DELIVERABLE: frozenset({S.TO_BE_DELIVERED, S.DELIVERING}),
    S.FAILED: frozenset({S.NOT_DELIVERABLE}),
}


def message_transition(
    *,
    message_id: int,
    to_state: MessageState,
    from_states: frozenset[str] | None = None,
    lease_owner: str | None = None,
    changes: dict[str, Any] | None = None,
) -> Message:
    """Move one message to ``to_state`` if the state machine allows it from
    the state the message is in now (narrowed to ``from_states`` if given),
    applying ``changes`` in the same update. With ``lease_owner``, the message
    must also still be leased to that owner. Raises ``IllegalTransition`` and
    changes nothing otherwise."""
    allowed = SOURCES[to_state] if from_states is None else SOURCES[to_state] & from_states
    rows = Message.objects.filter(id=message_id, state__in=allowed)
    if lease_owner is not None:
        rows = rows.filter(lease_owner=lease_owner)
    updated = rows.update(state=to_state, updated_at=Now(), **(changes or {}))
    if updated == 0:
        current = Message.objects.filter(id=message_id).values_list("state", flat=True).first()
        if current is None:
            raise MessageNotFound(f"There is no message {message_id}.")
        if current in allowed:
            raise IllegalTransition(f"Message {message_id} is no longer leased to {lease_owner}.")
        raise IllegalTransition(
            f"Message {message_id} is {current}; it cannot move to {to_state}"
            f" (only from {', '.join(sorted(allowed)) or 'nowhere'})."
        )
    return Message.objects.get(id=message_id)


def message_ack(*, message_id: int) -> Message:
    """DLNG -> DLVD: the consumer handled the message."""
    return message_transition(
        message_id=message_id,
        to_state=S.DELIVERED,
        changes={"lease_owner": "", "lease_deadline": None, "suspect": False},
    )


# Operator actions on blacklisted messages, set-based so that a bulk job and a
# single click share one statement each: the WHERE state = 'NDLV' is the
# transition's guard, RETURNING tells which messages it applied to.
_RELEASE_SQL = """
UPDATE broker_message AS m
SET state = 'TBDL', attempts = 0, crash_count = 0, suspect = false, available_at = now(),
    lease_owner = '', lease_deadline = NULL, updated_at = now()
FROM broker_queue AS q
WHERE m.id = ANY(%s) AND m.state = 'NDLV' AND q.id = m.queue_id
RETURNING m.id, q.name, m.dump_path
"""
_FAIL_SQL = """
UPDATE broker_message AS m SET state = 'FAIL', updated_at = now()
FROM broker_queue AS q
WHERE m.id = ANY(%s) AND m.state = 'NDLV' AND q.id = m.queue_id
RETURNING m.id, q.name, m.dump_path
"""
_PURGE_SQL = """
DELETE FROM broker_message AS m USING broker_queue AS q
WHERE m.id = ANY(%s) AND m.state = 'NDLV' AND q.id = m.queue_id
RETURNING m.id, q.name, m.dump_path
"""
_TRIAGE = {"release": _RELEASE_SQL, "fail": _FAIL_SQL, "purge": _PURGE_SQL}
TRIAGE_ACTIONS = tuple(_TRIAGE)


@transaction.atomic
def messages_triage(
    *, action: str, message_ids: list[int], actor: Actor, reason: str = ""
) -> list[int]:
    """Release (NDLV -> TBDL, counters reset, suspicion cleared), fail
    (NDLV -> FAIL, terminal) or purge (NDLV -> deleted) the blacklisted
    messages among ``message_ids``; the others are left alone. One audit
    event per message (a purge's keeps its queue and dump file). Returns the
    ids acted on."""
    with connection.cursor() as cursor:
        cursor.execute(_TRIAGE[action], [message_ids])
        rows = cursor.fetchall()
    user = actor if isinstance(actor, User) else None
    AuditEvent.objects.bulk_create(
        AuditEvent(
            actor=user,
            actor_name=user.get_username() if user else SYSTEM_ACTOR,
            action=f"message_{action}",
            queue_name=queue_name,
            message_id=message_id,
            reason=reason,
            details={"dump_path": dump_path} if action == "purge" else {},
        )
        for message_id, queue_name, dump_path in rows
    )
    released = Counter(queue_name for _, queue_name, _ in rows) if action == "release" else {}
    for queue in Queue.objects.filter(name__in=released):
        messages_available.send(sender=Queue, queue=queue, count=released[queue.name])
    return [message_id for message_id, _, _ in rows]


def _triage_one(action: str, message_id: int, actor: Actor, reason: str) -> None:
    if messages_triage(action=action, message_ids=[message_id], actor=actor, reason=reason):
        return
    current = Message.objects.filter(id=message_id).values_list("state", flat=True).first()
    if current is None:
        raise MessageNotFound(f"There is no message {message_id}.")
    raise IllegalTransition(
        f"Message {message_id} is {current}; only blacklisted (NDLV) messages are "
        f"{'released' if action == 'release' else action + 'ed'}."
    )


@transaction.atomic
def message_release(*, message_id: int, actor: Actor, reason: str = "") -> Message:
    """NDLV -> TBDL for one message (see ``messages_triage``)."""
    _triage_one("release", message_id, actor, reason)
    return Message.objects.select_related("queue").get(id=message_id)


@transaction.atomic
def message_fail(*, message_id: int, actor: Actor, reason: str = "") -> Message:
    """NDLV -> FAIL for one message (see ``messages_triage``)."""
    _triage_one("fail", message_id, actor, reason)
    return Message.objects.select_related("queue").get(id=message_id)


@transaction.atomic
def message_dead_letter(
    *, message_id: int, reason: str, error: str = "", lease_owner: str | None = None
) -> Message:
    """DLNG -> TBDL on the queue's dead-letter queue, with a dead-letter
    header that records why and where the message came from."""
    message = Message.objects.select_related("queue__dead_letter_queue").get(id=message_id)
    target = message.queue.dead_letter_queue
    if target is None:
        raise IllegalTransition(f"Queue {message.queue.name} has no dead-letter queue.")
    header = {
        "reason": reason,
        "original_queue": message.queue.name,
        "time": timezone.now().isoformat(),
        "put_application": message.put_application,
        "put_user": message.put_user,
        "format": message.content_type,
        "error": error[:2000],
    }
    return message_transition(
        message_id=message_id,
        to_state=S.TO_BE_DELIVERED,
        from_states=frozenset({S.DELIVERING}),
        lease_owner=lease_owner,
        changes={
            "queue_id": target.id,
            "dead_letter": header,
            "last_error": error[:2000],
            "lease_owner": "",
            "lease_deadline": None,
            "suspect": False,
            "available_at": Now(),
        },
    )


@transaction.atomic
def message_purge(*, message_id: int, actor: Actor, reason: str = "") -> None:
    """NDLV -> deleted for one message (see ``messages_triage``)."""
    _triage_one("purge", message_id, actor, reason)


@transaction.atomic
def message_forward(
    *,
    message_id: int,
    queue_name: str,
    keep_header: bool = True,
    actor: Actor = None,
    reason: str = "",
) -> Message:
    """TBDL on a dead-letter queue -> TBDL on ``queue_name``, with fresh
    delivery counters. An internal move: it may take the target past its
    max-messages limit, never drops the message. ``keep_header=False`` drops
    the dead-letter header."""
    target = Queue.objects.filter(name=queue_name).first()
    if target is None:
        raise QueueNotFound(f"There is no queue named {queue_name!r}.")
    message = _dead_lettered(message_id)
    source = message.queue.name
    changes: dict[str, Any] = {
        "queue": target,
        "available_at": Now(),
        "updated_at": Now(),
        "attempts": 0,
        "crash_count": 0,
        "suspect": False,
    }
    if not keep_header:
        changes["dead_letter"] = None
    moved = Message.objects.filter(
        id=message_id, state=S.TO_BE_DELIVERED, queue__kind=QueueKind.DEAD_LETTER
    ).update(**changes)
    if not moved:
        raise IllegalTransition(
            f"Message {message_id} is {message.state} on {source}; only waiting messages "
            "on a dead-letter queue are forwarded."
        )
    audit_record(
        action="message_forward",
        actor=actor,
        queue_name=target.name,
        message_id=message_id,
        reason=reason,
        details={"from": source, "keep_header": keep_header},
    )
    if target.kind == QueueKind.STANDARD:
        messages_available.send(sender=Queue, queue=target, count=1)
    return Message.objects.select_related("queue").get(id=message_id)


def _dead_lettered(message_id: int) -> Message:
    message = Message.objects.select_related("queue").filter(id=message_id).first()
    if message is None:
        raise MessageNotFound(f"There is no message {message_id}.")
    return message


@transaction.atomic
def message_retry(*, message_id: int, actor: Actor = None, reason: str = "") -> Message:
    """A dead-lettered message back to the queue it was dead-lettered from
    (its dead-letter header stays as history)."""
    message = _dead_lettered(message_id)
    original = (message.dead_letter or {}).get("original_queue")
    if not original:
        raise IllegalTransition(f"Message {message_id} has no dead-letter header to retry by.")
    return message_forward(message_id=message_id, queue_name=original, actor=actor, reason=reason)


@transaction.atomic
def message_discard(*, message_id: int, actor: Actor = None, reason: str = "") -> None:
    """Deletes a waiting message of a dead-letter queue; the audit event
    keeps its id, queue, reason and dead-letter header."""
    message = _dead_lettered(message_id)
    deleted, _ = Message.objects.filter(
        id=message_id, state=S.TO_BE_DELIVERED, queue__kind=QueueKind.DEAD_LETTER
    ).delete()
    if not deleted:
        raise IllegalTransition(
            f"Message {message_id} is {message.state} on {message.queue.name}; only waiting "
            "messages on a dead-letter queue are discarded."
        )
    audit_record(
        action="message_discard",
        actor=actor,
        queue_name=message.queue.name,
        message_id=message_id,
        reason=reason,
        details={"dead_letter": message.dead_letter},
    )
