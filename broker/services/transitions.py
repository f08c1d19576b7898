"""The message state machine. Every change of a message's state happens in
one of these functions; each is a conditional update (the row must still be in
a state the transition starts from), so two processes racing for the same
message cannot both win, and a transition the machine does not allow changes
nothing and raises ``IllegalTransition``.

    TBDL -> DLNG            claim (set-based, in the delivery service)
    DLNG -> DLVD            ack
    DLNG -> TBDL            handler error with retries left, or crash
    DLNG -> NDLV            quarantine (crash threshold or poison limit)
    NDLV -> TBDL            operator release
    NDLV -> FAIL            operator fail (terminal)
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from broker.errors import IllegalTransition, MessageNotFound
from broker.models import Message, MessageState
from broker.services.audit import Actor, audit_record

S = MessageState

# For each target state, the states a message may come from.
SOURCES: dict[str, frozenset[str]] = {
    S.TO_BE_DELIVERED: frozenset({S.DELIVERING, S.NOT_DELIVERABLE}),
    S.DELIVERING: frozenset({S.TO_BE_DELIVERED}),
    S.DELIVERED: frozenset({S.DELIVERING}),
    S.NOT_DELIVERABLE: frozenset({S.DELIVERING}),
    S.FAILED: frozenset({S.NOT_DELIVERABLE}),
}


def message_transition(
    *,
    message_id: int,
    to_state: MessageState,
    from_states: frozenset[str] | None = None,
    changes: dict[str, Any] | None = None,
) -> Message:
    """Move one message to ``to_state`` if the state machine allows it from
    the state the message is in now (narrowed to ``from_states`` if given),
    applying ``changes`` in the same update. Raises ``IllegalTransition`` and
    changes nothing otherwise."""
    allowed = SOURCES[to_state] if from_states is None else SOURCES[to_state] & from_states
    updated = Message.objects.filter(id=message_id, state__in=allowed).update(
        state=to_state, updated_at=Now(), **(changes or {})
    )
    if updated == 0:
        current = Message.objects.filter(id=message_id).values_list("state", flat=True).first()
        if current is None:
            raise MessageNotFound(f"There is no message {message_id}.")
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


@transaction.atomic
def message_release(*, message_id: int, actor: Actor, reason: str = "") -> Message:
    """NDLV -> TBDL: an operator lets a blacklisted message be delivered
    again, with its attempt and crash counters reset and suspicion cleared."""
    message = message_transition(
        message_id=message_id,
        to_state=S.TO_BE_DELIVERED,
        from_states=frozenset({S.NOT_DELIVERABLE}),
        changes={
            "attempts": 0,
            "crash_count": 0,
            "suspect": False,
            "available_at": Now(),
            "lease_owner": "",
            "lease_deadline": None,
        },
    )
    audit_record(
        action="message_release",
        actor=actor,
        queue_name=message.queue.name,
        message_id=message.id,
        reason=reason,
    )
    return message


@transaction.atomic
def message_fail(*, message_id: int, actor: Actor, reason: str = "") -> Message:
    """NDLV -> FAIL: an operator gives up on a blacklisted message for good."""
    message = message_transition(message_id=message_id, to_state=S.FAILED)
    audit_record(
        action="message_fail",
        actor=actor,
        queue_name=message.queue.name,
        message_id=message.id,
        reason=reason,
    )
    return message


@transaction.atomic
def message_dead_letter(*, message_id: int, reason: str, error: str = "") -> Message:
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
