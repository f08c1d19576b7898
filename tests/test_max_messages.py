"""Max messages on queues and subscriptions: reject_new and discard_old."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from rest_framework.test import APIClient

from broker.models import AuditEvent, Message, MessageState, Queue
from broker.services.publish import NewMessage, messages_publish, topic_publish
from broker.services.queues import queue_create
from broker.services.topics import subscription_create, topic_create
from broker.services.transitions.dead_lettered import message_forward
from tests.support.messages import dead_lettered

if TYPE_CHECKING:
    from rest_framework.response import _MonkeyPatchedResponse as Response

S = MessageState


def count(queue_name: str) -> int:
    return Message.objects.filter(queue__name=queue_name).count()


def one(queue_name: str, payload: bytes = b"m") -> list[int]:
    return messages_publish(queue_name=queue_name, messages=[NewMessage(payload=payload)])


def publish_to_orders(api: APIClient, topic_string: str, payload: str = "x") -> Response:
    """One message published to topic ORDERS through the API under ``topic_string``."""
    return api.post(
        "/api/v1/topics/ORDERS/messages/",
        {"topic_string": topic_string, "payload": payload},
        format="json",
    )


@pytest.mark.slow
def test_20_concurrent_publishers_never_push_a_reject_new_queue_past_its_limit(live_server, admin):
    from console.tokens import token_create

    queue_create(name="LIMITED.Q", max_messages=1000, overflow="reject_new")
    _, token = token_create(user=admin, name="publishers")
    url = f"{live_server.url}/api/v1/queues/LIMITED.Q/messages/"
    body = json.dumps({"messages": [{"payload": "x"}] * 5}).encode()
    outcomes: Counter[int] = Counter()
    codes: Counter[str] = Counter()
    peak = 0
    done = threading.Event()
    lock = threading.Lock()

    def publisher() -> None:
        for _ in range(20):  # 20 publishers x 20 batches x 5 = 2000 attempted
            request = urllib.request.Request(
                url,
                data=body,
                headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status, answer = response.status, json.loads(response.read())
            except urllib.error.HTTPError as error:
                status, answer = error.code, json.loads(error.read())
            with lock:
                outcomes[status] += 1
                if status != 201:
                    codes[answer["code"]] += 1

    def watcher() -> None:
        nonlocal peak
        from django.db import connections

        while not done.is_set():
            with connections["default"].cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM broker_message m JOIN broker_queue q ON q.id = m.queue_id"
                    " WHERE q.name = 'LIMITED.Q'"
                )
                peak = max(peak, cursor.fetchone()[0])
        connections["default"].close()

    threads = [threading.Thread(target=publisher) for _ in range(20)]
    spy = threading.Thread(target=watcher)
    spy.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    spy.join()

    assert set(outcomes) == {201, 409}
    assert codes == Counter({"max_messages_reached": outcomes[409]})
    assert outcomes[201] + outcomes[409] == 400
    assert count("LIMITED.Q") == 5 * outcomes[201] == 1000
    assert peak <= 1000


@pytest.mark.django_db(transaction=True)
def test_discard_old_keeps_exactly_the_newest_messages_and_records_each_discard():
    queue_create(name="RECENT.Q", max_messages=100, overflow="discard_old")
    ids = [one("RECENT.Q", f"m{n}".encode())[0] for n in range(1000)]

    kept = sorted(Message.objects.filter(queue__name="RECENT.Q").values_list("id", flat=True))
    assert kept == ids[-100:]
    discards = AuditEvent.objects.filter(action="message_discard", queue_name="RECENT.Q")
    assert discards.count() == 900
    assert sorted(event.message_id or 0 for event in discards) == ids[:900]
    assert {event.reason for event in discards} == {
        "discard_old: queue RECENT.Q was past its limit of 100 messages"
    }


@pytest.mark.django_db(transaction=True)
def test_discard_old_can_move_discards_to_the_dead_letter_queue():
    queue_create(
        name="RECENT.Q", max_messages=2, overflow="discard_old", discard_to_dead_letter=True
    )
    ids = messages_publish(
        queue_name="RECENT.Q", messages=[NewMessage(payload=f"{n}".encode()) for n in range(5)]
    )

    assert (
        sorted(Message.objects.filter(queue__name="RECENT.Q").values_list("id", flat=True))
        == ids[3:]
    )
    moved = Message.objects.filter(queue__name="SYSTEM.DEAD.LETTER.QUEUE").order_by("id")
    assert [m.id for m in moved] == ids[:3]
    headers = [m.dead_letter or {} for m in moved]
    assert {header["reason"] for header in headers} == {"discarded_old"}
    assert headers[0]["original_queue"] == "RECENT.Q"


@pytest.mark.django_db(transaction=True)
def test_discard_old_discards_by_arrival_so_a_forwarded_message_is_not_first_to_go():
    other = queue_create(name="OTHER.Q", consumer="noop")
    [forwarded] = dead_lettered(other, 1)  # the oldest id of all
    queue_create(name="RECENT.Q", max_messages=2, overflow="discard_old")
    first, second = messages_publish(
        queue_name="RECENT.Q", messages=[NewMessage(payload=b"a"), NewMessage(payload=b"b")]
    )
    message_forward(message_id=forwarded, queue_name="RECENT.Q")
    assert count("RECENT.Q") == 3  # an internal move lands past the limit, drops nothing

    [newest] = one("RECENT.Q")

    kept = set(Message.objects.filter(queue__name="RECENT.Q").values_list("id", flat=True))
    assert forwarded < first
    assert kept == {forwarded, newest}
    discarded = AuditEvent.objects.filter(action="message_discard", queue_name="RECENT.Q")
    assert set(discarded.values_list("message_id", flat=True)) == {first, second}


@pytest.mark.django_db(transaction=True)
def test_a_batch_bigger_than_the_room_left_is_refused_whole_by_reject_new():
    queue_create(name="LIMITED.Q", max_messages=10)
    messages_publish(queue_name="LIMITED.Q", messages=[NewMessage(payload=b"x")] * 8)

    from broker.errors import MaxMessagesReached

    with pytest.raises(MaxMessagesReached, match="holds 8 of at most 10"):
        messages_publish(queue_name="LIMITED.Q", messages=[NewMessage(payload=b"x")] * 3)
    assert count("LIMITED.Q") == 8


@pytest.fixture
def orders_topic(transactional_db):
    topic = topic_create(name="ORDERS", topic_string="orders")
    for name, topic_filter in [
        ("BILLING", "orders/+/created"),
        ("AUDIT", "orders/#"),
        ("SHIPPING", "orders/eu/created"),
    ]:
        subscription_create(
            name=name, topic=topic, queue_name=f"{name}.Q", topic_filter=topic_filter
        )
    return topic


def test_a_topic_publish_writes_one_copy_per_matching_subscription(orders_topic):
    deliveries = topic_publish(
        topic_name="ORDERS",
        topic_string="orders/us/created",
        messages=[NewMessage(payload=b"o1"), NewMessage(payload=b"o2")],
    )

    assert {d.subscription: len(d.ids) for d in deliveries} == {"AUDIT": 2, "BILLING": 2}
    assert (count("AUDIT.Q"), count("BILLING.Q"), count("SHIPPING.Q")) == (2, 2, 0)


def test_a_full_reject_new_subscription_fails_the_whole_topic_publish(orders_topic, operator_api):
    from broker.models import Subscription

    Subscription.objects.filter(name="SHIPPING").update(max_messages=3)
    topic_publish(
        topic_name="ORDERS",
        topic_string="orders/eu/created",
        messages=[NewMessage(payload=b"x")] * 3,
    )

    response = publish_to_orders(operator_api, "orders/eu/created", "one more")

    assert response.status_code == 409
    body = response.json()
    assert (body["code"], body["subscription"], body["limit"], body["depth"]) == (
        "max_messages_reached",
        "SHIPPING",
        3,
        3,
    )
    assert "SHIPPING" in body["detail"]
    assert (count("AUDIT.Q"), count("BILLING.Q"), count("SHIPPING.Q")) == (3, 3, 3)


def test_a_dead_letter_forward_into_a_full_reject_new_queue_still_lands(
    transactional_db, admin_api
):
    full = queue_create(name="FULL.Q", consumer="noop", max_messages=2)
    messages_publish(queue_name="FULL.Q", messages=[NewMessage(payload=b"x")] * 2)
    other = queue_create(name="OTHER.Q", consumer="noop")
    [stray] = dead_lettered(other, 1)

    message_forward(message_id=stray, queue_name="FULL.Q")

    assert count("FULL.Q") == 3
    limit = admin_api.get("/api/v1/queues/FULL.Q/").json()["limit"]
    assert limit == {"live": 3, "over_limit": True, "high_water": True}
    assert full.max_messages == 2


def test_the_high_water_flag_rises_at_80_percent(transactional_db, viewer_api):
    queue_create(name="HW.Q", max_messages=10)
    messages_publish(queue_name="HW.Q", messages=[NewMessage(payload=b"x")] * 7)
    assert viewer_api.get("/api/v1/queues/HW.Q/").json()["limit"]["high_water"] is False

    one("HW.Q")

    assert viewer_api.get("/api/v1/queues/HW.Q/").json()["limit"] == {
        "live": 8,
        "over_limit": False,
        "high_water": True,
    }


def test_a_topic_publish_without_matching_subscriptions_writes_nothing(orders_topic, operator_api):
    response = publish_to_orders(operator_api, "orders/eu/cancelled/late")

    assert response.status_code == 201
    body = response.json()
    assert [d["subscription"] for d in body["deliveries"]] == ["AUDIT"]


@pytest.mark.parametrize("limit", [0, -5, "many", 2.5])
def test_a_bad_limit_is_a_field_error(admin_api, orders_topic, limit):
    queue = admin_api.post(
        "/api/v1/queues/", {"name": "NEW.Q", "max_messages": limit}, format="json"
    )
    subscription = admin_api.post(
        "/api/v1/subscriptions/",
        {
            "name": "NEW",
            "topic": "ORDERS",
            "topic_filter": "orders/#",
            "queue": "NEW.Q",
            "max_messages": limit,
        },
        format="json",
    )

    for response in (queue, subscription):
        assert response.status_code == 400
        assert "max_messages" in response.json()["field_errors"]
    assert not Queue.objects.filter(name="NEW.Q").exists()


def test_an_unknown_behaviour_is_a_field_error(admin_api, orders_topic):
    response = admin_api.patch(
        "/api/v1/subscriptions/BILLING/", {"overflow": "drop_everything"}, format="json"
    )

    assert response.status_code == 400
    assert "overflow" in response.json()["field_errors"]


@pytest.mark.parametrize(
    "topic_string", ["orders//created", "orders/+/created", "orders/#", "/orders"]
)
def test_a_publish_topic_with_empty_levels_or_wildcards_is_refused(
    operator_api, orders_topic, topic_string
):
    response = publish_to_orders(operator_api, topic_string)

    assert response.status_code == 400
    assert "topic_string" in response.json()["field_errors"]
    assert Message.objects.count() == 0


def test_a_publish_outside_the_topic_is_a_409_conflict(operator_api, orders_topic):
    response = publish_to_orders(operator_api, "payments/x")

    assert (response.status_code, response.json()["code"]) == (409, "outside_topic")
    assert "topic_string" in response.json()["field_errors"]
    assert Message.objects.count() == 0


@pytest.mark.parametrize("topic_filter", ["orders/#/created", "orders/a#", "orders//x"])
def test_a_subscription_filter_with_misplaced_wildcards_is_refused(
    admin_api, orders_topic, topic_filter
):
    response = admin_api.post(
        "/api/v1/subscriptions/",
        {"name": "NEW", "topic": "ORDERS", "topic_filter": topic_filter, "queue": "NEW.Q"},
        format="json",
    )

    assert response.status_code == 400
    assert "topic_filter" in response.json()["field_errors"]
    assert not Queue.objects.filter(name="NEW.Q").exists()


def test_a_subscription_filter_outside_its_topic_is_a_409_conflict(admin_api, orders_topic):
    """Well formed, but not under the topic's string: a conflict with the topic."""
    response = admin_api.post(
        "/api/v1/subscriptions/",
        {"name": "NEW", "topic": "ORDERS", "topic_filter": "payments/#", "queue": "NEW.Q"},
        format="json",
    )

    assert (response.status_code, response.json()["code"]) == (409, "outside_topic")
    assert "topic_filter" in response.json()["field_errors"]
    assert not Queue.objects.filter(name="NEW.Q").exists()


def test_an_admin_manages_topics_and_subscriptions_through_the_api(admin_api, transactional_db):
    assert (
        admin_api.post(
            "/api/v1/topics/", {"name": "PAY", "topic_string": "payments"}, format="json"
        ).status_code
        == 201
    )
    created = admin_api.post(
        "/api/v1/subscriptions/",
        {
            "name": "LEDGER",
            "topic": "PAY",
            "topic_filter": "payments/+",
            "queue": "LEDGER.Q",
            "max_messages": 50,
            "overflow": "discard_old",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert created.json()["limit"] == {"live": 0, "over_limit": False, "high_water": False}
    assert Queue.objects.get(name="LEDGER.Q").kind == "standard"

    changed = admin_api.patch("/api/v1/subscriptions/LEDGER/", {"max_messages": 60}, format="json")
    assert changed.json()["max_messages"] == 60
    assert (
        admin_api.patch(
            "/api/v1/subscriptions/LEDGER/", {"queue": "ELSEWHERE"}, format="json"
        ).status_code
        == 400
    )
    assert admin_api.delete("/api/v1/topics/PAY/").status_code == 409
    assert admin_api.delete("/api/v1/subscriptions/LEDGER/").status_code == 204
    assert admin_api.delete("/api/v1/topics/PAY/").status_code == 204
    assert admin_api.get("/api/v1/topics/PAY/").json()["code"] == "topic_not_found"
