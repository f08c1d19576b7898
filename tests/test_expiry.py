"""Message expiry: a message published with ``expires_in_seconds`` that is
still waiting when its time is up is not delivered but dead-lettered with
reason ``expired`` (IBM MQ's MQFB_EXPIRATION)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.db.models import F

from broker.errors import InvalidInput
from broker.models import AuditEvent, Message, MessageState, Queue
from broker.rules.symbols import MQFB, reason_code
from broker.services.dead_letters import dead_letter_scan
from broker.services.delivery import queue_deliver
from broker.services.publish import NewMessage, messages_publish, topic_publish
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_create_and_activate
from broker.services.topics import subscription_create, topic_create
from broker.services.transitions.expiry import messages_expire
from rig.processes import wait_until
from tests.support.messages import claimed

pytestmark = pytest.mark.usefixtures("dumps")
S = MessageState
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def publish_expiring(queue_name: str, expires_in_seconds: float | None = 60, **fields) -> int:
    [message_id] = messages_publish(
        queue_name=queue_name,
        messages=[NewMessage(payload=b"x", expires_in_seconds=expires_in_seconds, **fields)],
        put_user="oscar",
        put_application="api",
    )
    return message_id


def time_is_up(*message_ids: int) -> None:
    """Each message's expiry passes: a test runs in one transaction, whose
    now() stands still, so the expiry moves instead."""
    Message.objects.filter(id__in=message_ids).update(
        expires_at=F("created_at") - timedelta(seconds=1)
    )


def expired_on(queue_name: str, **fields) -> int:
    """A message published to ``queue_name`` whose time is up."""
    message_id = publish_expiring(queue_name, **fields)
    time_is_up(message_id)
    return message_id


def where(message_id: int) -> tuple[str, str]:
    message = Message.objects.select_related("queue").get(id=message_id)
    return message.queue.name, message.state


# --- the service -------------------------------------------------------------


@pytest.mark.django_db
def test_publishing_sets_the_expiry_from_the_publish_time(orders):
    expiring = publish_expiring("ORDERS.IN", 90.5)
    lasting = publish_expiring("ORDERS.IN", None)

    message = Message.objects.get(id=expiring)
    assert message.expires_at == message.created_at + timedelta(seconds=90.5)
    assert Message.objects.get(id=lasting).expires_at is None


@pytest.mark.django_db
def test_an_expired_message_moves_to_the_dead_letter_queue_with_reason_expired(orders):
    expired = expired_on("ORDERS.IN", content_type="application/json")

    assert messages_expire() == [expired]

    message = Message.objects.select_related("queue").get(id=expired)
    assert (message.queue.name, message.state, message.expires_at) == (DLQ, S.TO_BE_DELIVERED, None)
    assert message.dead_letter is not None
    assert message.dead_letter | {"time": None, "error": None} == {
        "reason": "expired",
        "original_queue": "ORDERS.IN",
        "put_user": "oscar",
        "put_application": "api",
        "format": "application/json",
        "time": None,
        "error": None,
    }
    assert "expired at" in message.dead_letter["error"]
    assert not message.suspect
    assert message.enqueued_at >= message.created_at
    assert messages_expire() == []


@pytest.mark.django_db
def test_an_unexpired_message_stays_where_it_is(orders):
    waiting = publish_expiring("ORDERS.IN", 60)
    lasting = publish_expiring("ORDERS.IN", None)

    assert messages_expire() == []

    assert where(waiting) == where(lasting) == ("ORDERS.IN", S.TO_BE_DELIVERED)
    assert Message.objects.get(id=waiting).dead_letter is None


@pytest.mark.django_db
def test_it_moves_at_most_limit_messages_per_call(orders):
    ids = [publish_expiring("ORDERS.IN") for _ in range(3)]
    time_is_up(*ids)

    first = messages_expire(limit=2)
    rest = messages_expire(limit=2)

    assert len(first) == 2
    assert sorted(first + rest) == ids


@pytest.mark.django_db
def test_an_expired_message_of_a_queue_without_a_dead_letter_queue_is_blacklisted(db):
    queue_create(name="NO.DLQ", consumer="log", dead_letter_queue=None)
    expired = expired_on("NO.DLQ")

    assert messages_expire() == [expired]

    assert where(expired) == ("NO.DLQ", S.NOT_DELIVERABLE)
    event = AuditEvent.objects.get(action="message_quarantine", message_id=expired)
    assert "expired" in event.reason
    assert "no dead-letter queue" in event.reason


@pytest.mark.django_db
def test_an_expired_message_is_never_claimed(orders):
    expired = publish_expiring("ORDERS.IN")
    fresh = publish_expiring("ORDERS.IN")
    time_is_up(expired)

    assert claimed(orders, 10) == [fresh]
    assert queue_deliver(queue_id=orders.id).claimed == 0
    assert where(expired) == ("ORDERS.IN", S.TO_BE_DELIVERED)


@pytest.mark.django_db
def test_a_message_on_a_paused_queue_expires_too(db):
    queue_create(name="PAUSED.Q", consumer="log", paused=True)
    expired = expired_on("PAUSED.Q")

    assert messages_expire() == [expired]
    assert where(expired) == (DLQ, S.TO_BE_DELIVERED)


@pytest.mark.django_db
def test_only_waiting_messages_of_standard_queues_expire(orders):
    in_flight = publish_expiring("ORDERS.IN")
    claimed(orders, 1)
    time_is_up(in_flight)

    assert messages_expire() == []
    assert where(in_flight) == ("ORDERS.IN", S.DELIVERING)


@pytest.mark.django_db
def test_expired_maps_to_mqfb_expiration():
    assert reason_code("expired") == MQFB["MQFB_EXPIRATION"] == 258


@pytest.mark.django_db
def test_a_rule_matching_reason_mqfb_expiration_acts_on_an_expired_message(orders):
    queue_create(name="EXPIRED.PARKED")
    expired = expired_on("ORDERS.IN")
    messages_expire()
    rule_table_create_and_activate(
        queue=Queue.objects.get(name=DLQ),
        text="REASON(MQRC_FORMAT_ERROR) ACTION(DISCARD)\n"
        "REASON(MQFB_EXPIRATION) ACTION(FWD) FWDQ(EXPIRED.PARKED) HEADER(YES)\n",
    )

    result = dead_letter_scan(queue=Queue.objects.get(name=DLQ))

    assert result.forwarded == 1
    assert where(expired) == ("EXPIRED.PARKED", S.TO_BE_DELIVERED)
    event = AuditEvent.objects.get(action="dlq_fwd", message_id=expired)
    assert event.details["rule"] == 2


@pytest.mark.django_db
def test_every_copy_of_a_topic_publish_expires(db):
    topic = topic_create(name="ORDERS", topic_string="orders")
    subscription_create(name="EU", topic=topic, queue_name="ORDERS.EU", topic_filter="orders/eu")
    subscription_create(name="ALL", topic=topic, queue_name="ORDERS.ALL", topic_filter="orders/#")

    deliveries = topic_publish(
        topic_name="ORDERS",
        topic_string="orders/eu",
        messages=[NewMessage(payload=b"x", expires_in_seconds=30)],
    )

    ids = [message_id for delivery in deliveries for message_id in delivery.ids]
    assert len(ids) == 2
    for message in Message.objects.filter(id__in=ids):
        assert message.expires_at == message.created_at + timedelta(seconds=30)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "value", [-1, 0, 0.0, True, False, math.nan, math.inf, 31_536_001, 1e12, "60"]
)
def test_publishing_refuses_a_bad_expiry_and_writes_nothing(orders, value):
    with pytest.raises(InvalidInput) as refused:
        messages_publish(
            queue_name="ORDERS.IN",
            messages=[
                NewMessage(payload=b"ok"),
                NewMessage(payload=b"x", expires_in_seconds=value),
            ],
        )

    assert list(refused.value.field_errors) == ["messages[1].expires_in_seconds"]
    assert not Message.objects.exists()


@pytest.mark.django_db
def test_the_longest_expiry_is_365_days(orders):
    message_id = publish_expiring("ORDERS.IN", 31_536_000)

    message = Message.objects.get(id=message_id)
    assert message.expires_at == message.created_at + timedelta(days=365)


# --- the API -----------------------------------------------------------------


def url(queue: str) -> str:
    return f"/api/v1/queues/{queue}/messages/"


@pytest.mark.django_db
def test_the_api_publishes_a_message_that_expires(operator_api, orders):
    response = operator_api.post(
        url("ORDERS.IN"), {"payload": "x", "expires_in_seconds": 2.5}, format="json"
    )

    assert response.status_code == 201, response.json()
    [message_id] = response.json()["ids"]
    message = Message.objects.get(id=message_id)
    assert message.expires_at == message.created_at + timedelta(seconds=2.5)
    detail = operator_api.get(f"/api/v1/messages/{message_id}/").json()
    assert detail["expires_at"] is not None


@pytest.mark.django_db
def test_the_api_publishes_on_a_topic_with_an_expiry(operator_api, db):
    topic = topic_create(name="ORDERS", topic_string="orders")
    subscription_create(name="EU", topic=topic, queue_name="ORDERS.EU", topic_filter="orders/#")

    response = operator_api.post(
        "/api/v1/topics/ORDERS/messages/",
        {"messages": [{"payload": "x", "expires_in_seconds": 10}], "topic_string": "orders/eu"},
        format="json",
    )

    assert response.status_code == 201, response.json()
    [delivery] = response.json()["deliveries"]
    message = Message.objects.get(id=delivery["ids"][0])
    assert message.expires_at == message.created_at + timedelta(seconds=10)


BAD_EXPIRIES = [-1, 0, "soon", True, "NaN", "Infinity", "-Infinity", 1e12, 31_536_001, [], {}]


@pytest.mark.django_db
@pytest.mark.parametrize("value", BAD_EXPIRIES)
def test_the_api_refuses_a_bad_expiry_naming_the_field_and_writes_nothing(
    operator_api, orders, value
):
    before = Message.objects.count()

    response = operator_api.post(
        url("ORDERS.IN"),
        {"messages": [{"payload": "ok"}, {"payload": "x", "expires_in_seconds": value}]},
        format="json",
    )

    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "invalid"
    assert list(body["field_errors"]) == ["messages[1].expires_in_seconds"]
    assert "expires_in_seconds" in body["detail"]
    assert Message.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize("value", [-1, "soon", True, "NaN"])
def test_the_topic_api_refuses_a_bad_expiry_and_writes_nothing(operator_api, db, value):
    topic = topic_create(name="ORDERS", topic_string="orders")
    subscription_create(name="EU", topic=topic, queue_name="ORDERS.EU", topic_filter="orders/#")

    response = operator_api.post(
        "/api/v1/topics/ORDERS/messages/",
        {"payload": "x", "expires_in_seconds": value},
        format="json",
    )

    assert response.status_code == 400, response.json()
    assert list(response.json()["field_errors"]) == ["messages[0].expires_in_seconds"]
    assert not Message.objects.exists()


@pytest.mark.django_db
def test_the_schema_documents_expires_in_seconds(operator_api):
    schema = operator_api.get("/api/schema/", HTTP_ACCEPT="application/json").json()

    message = schema["components"]["schemas"]["TextMessageInRequest"]
    field = message["properties"]["expires_in_seconds"]
    assert field["type"] == ["number", "null"]
    assert field["description"]
    assert (field["exclusiveMinimum"], field["maximum"]) == (0, 31_536_000)
    expires_at = schema["components"]["schemas"]["Message"]["properties"]["expires_at"]
    assert expires_at["readOnly"] is True


# --- with real workers ---------------------------------------------------------


@pytest.mark.slow
def test_a_message_waiting_on_a_paused_queue_expires_into_the_dead_letter_queue(start_workers):
    queue_create(name="PAUSED.Q", consumer="log", paused=True)
    start_workers(concurrency=1)

    [message_id] = messages_publish(
        queue_name="PAUSED.Q", messages=[NewMessage(payload=b"late", expires_in_seconds=1)]
    )

    wait_until(lambda: where(message_id)[0] == DLQ, timeout=10, what="the message to expire")
    message = Message.objects.get(id=message_id)
    assert message.state == S.TO_BE_DELIVERED
    assert message.dead_letter is not None
    assert (message.dead_letter["reason"], message.dead_letter["original_queue"]) == (
        "expired",
        "PAUSED.Q",
    )


@pytest.mark.django_db
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_the_api_refuses_a_non_json_number_and_writes_nothing(operator_api, orders, literal):
    response = operator_api.post(
        url("ORDERS.IN"),
        f'{{"payload": "x", "expires_in_seconds": {literal}}}',
        content_type="application/json",
    )

    assert response.status_code == 400
    assert response.json()["code"] == "malformed_request"
    assert not Message.objects.exists()
