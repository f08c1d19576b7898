from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from broker.errors import IllegalTransition, MessageNotFound
from broker.models import AuditEvent, Message, MessageState
from broker.services.transitions import (
    message_ack,
    message_dead_letter,
    message_fail,
    message_release,
    message_transition,
)

pytestmark = pytest.mark.django_db
S = MessageState


def claim(message_id: int) -> Message:
    return message_transition(
        message_id=message_id,
        to_state=S.DELIVERING,
        changes={
            "attempts": 1,
            "lease_owner": "w1",
            "lease_deadline": timezone.now() + timedelta(seconds=30),
        },
    )


def snapshot(message_id: int) -> dict[str, Any]:
    return dict(Message.objects.filter(id=message_id).values().get())


def blacklisted(message_id: int) -> Message:
    claim(message_id)
    return message_transition(
        message_id=message_id,
        to_state=S.NOT_DELIVERABLE,
        changes={"crash_count": 2, "suspect": True},
    )


def test_a_message_is_claimed_and_acknowledged(orders, publish):
    [message_id] = publish(orders)

    claim(message_id)
    message = message_ack(message_id=message_id)

    assert message.state == S.DELIVERED
    assert message.lease_deadline is None


def test_a_delivered_message_cannot_be_claimed_again(orders, publish):
    [message_id] = publish(orders)
    claim(message_id)
    message_ack(message_id=message_id)
    before = snapshot(message_id)

    with pytest.raises(IllegalTransition, match="is DLVD"):
        claim(message_id)

    assert snapshot(message_id) == before


def test_a_blacklisted_message_cannot_be_acknowledged(orders, publish):
    [message_id] = publish(orders)
    blacklisted(message_id)
    before = snapshot(message_id)

    with pytest.raises(IllegalTransition, match="is NDLV"):
        message_ack(message_id=message_id)

    assert snapshot(message_id) == before


def test_a_failed_message_is_terminal(orders, publish):
    [message_id] = publish(orders)
    blacklisted(message_id)
    message_fail(message_id=message_id, actor=None)

    for target in (S.TO_BE_DELIVERED, S.DELIVERING, S.DELIVERED, S.NOT_DELIVERABLE):
        with pytest.raises(IllegalTransition):
            message_transition(message_id=message_id, to_state=target)
    assert Message.objects.get(id=message_id).state == S.FAILED


def test_release_puts_a_blacklisted_message_back_with_counters_reset(orders, publish, operator):
    [message_id] = publish(orders)
    blacklisted(message_id)

    message = message_release(message_id=message_id, actor=operator, reason="fixed consumer")

    assert message.state == S.TO_BE_DELIVERED
    assert (message.attempts, message.crash_count, message.suspect) == (0, 0, False)
    event = AuditEvent.objects.get(action="message_release")
    assert (event.message_id, event.actor_name, event.reason) == (
        message_id,
        "oscar",
        "fixed consumer",
    )


def test_release_of_a_waiting_message_is_refused(orders, publish, operator):
    [message_id] = publish(orders)

    with pytest.raises(IllegalTransition, match="is TBDL"):
        message_release(message_id=message_id, actor=operator)

    assert not AuditEvent.objects.filter(action="message_release").exists()


def test_an_unknown_message_is_reported(db):
    with pytest.raises(MessageNotFound):
        message_ack(message_id=987654)


def test_dead_lettering_moves_the_message_with_a_header(orders, publish):
    [message_id] = publish(orders)
    claim(message_id)

    message = message_dead_letter(message_id=message_id, reason="handler_error", error="boom")

    assert message.queue.name == "SYSTEM.DEAD.LETTER.QUEUE"
    assert message.state == S.TO_BE_DELIVERED
    assert message.dead_letter is not None
    assert message.dead_letter["original_queue"] == "ORDERS.IN"
    assert message.dead_letter["reason"] == "handler_error"
    assert message.dead_letter["error"] == "boom"


def test_the_database_refuses_an_unknown_state(orders, publish):
    [message_id] = publish(orders)

    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.filter(id=message_id).update(state="GONE")


@pytest.mark.parametrize("assignment", ["attempts = -1", "crash_count = -1", "priority = 10"])
def test_the_database_refuses_negative_counters_and_bad_priorities(orders, publish, assignment):
    [message_id] = publish(orders)

    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE broker_message SET {assignment} WHERE id = %s", [message_id])


def test_a_delivering_message_must_have_a_lease(orders, publish):
    [message_id] = publish(orders)

    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.filter(id=message_id).update(state=S.DELIVERING)
