"""Console forms for topics, subscriptions and queue limits."""

import re

import pytest
from django.test import Client

from broker.models import Queue, Subscription, Topic
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.topics import subscription_create, topic_create
from tests.support.console import error_beside, logged_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def orders_topic(db):
    return topic_create(name="ORDERS", topic_string="orders")


def test_an_admin_creates_a_topic_and_a_subscription_with_plain_posts(admin, orders_topic):
    client = logged_in(admin)

    topic = client.post("/topics/new/", {"name": "PAY", "topic_string": "payments"})
    subscription = client.post(
        "/subscriptions/new/",
        {
            "name": "BILLING",
            "topic": "ORDERS",
            "topic_filter": "orders/+/created",
            "queue": "BILLING.Q",
            "max_messages": "100",
            "overflow": "discard_old",
        },
        follow=True,
    )

    assert topic.status_code == 302
    assert Topic.objects.filter(name="PAY", topic_string="payments").exists()
    created = Subscription.objects.get(name="BILLING")
    assert (created.max_messages, created.overflow, created.queue.name) == (
        100,
        "discard_old",
        "BILLING.Q",
    )
    assert "Subscription BILLING created." in subscription.content.decode()
    assert 'data-subscription="BILLING"' in subscription.content.decode()


def test_an_htmx_post_swaps_only_the_topics_region(admin, orders_topic):
    response = logged_in(admin).post(
        "/topics/new/", {"name": "PAY", "topic_string": "payments"}, headers={"HX-Request": "true"}
    )

    html = response.content.decode()
    assert html.lstrip().startswith('<div id="topics">')
    assert 'data-topic="PAY"' in html
    assert "<html" not in html


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (
            {"topic_filter": "orders/#/created"},
            "topic_filter",
            "'#' must be a whole level and the last one",
        ),
        ({"topic_filter": "payments/#"}, "topic_filter", "must start with the topic's string"),
        ({"max_messages": "0"}, "max_messages", "greater than or equal to 1"),
        ({"max_messages": "lots"}, "max_messages", "Enter a whole number"),
        ({"overflow": "drop_all"}, "overflow", "Select a valid choice"),
        ({"topic": "NO.SUCH.TOPIC"}, "topic", "Select a valid choice"),
        ({"queue": "BAD QUEUE"}, "queue", "Use 1 to 48 ASCII letters"),
        ({"name": ""}, "name", "This field is required"),
        ({"name": "N" * 49}, "name", "at most 48 characters"),
    ],
)
def test_bad_subscription_input_is_shown_beside_its_field_and_changes_nothing(
    admin, orders_topic, data, field, message
):
    form = {
        "name": "BILLING",
        "topic": "ORDERS",
        "topic_filter": "orders/#",
        "queue": "BILLING.Q",
        "overflow": "reject_new",
        **data,
    }

    response = logged_in(admin).post("/subscriptions/new/", form)

    assert response.status_code == 200
    assert message in error_beside(response.content.decode(), field)
    assert not Subscription.objects.exists()
    assert not Queue.objects.filter(name__in=["BILLING.Q", "BAD QUEUE"]).exists()


@pytest.mark.parametrize(
    ("field", "value"), [("topic_string", "orders//x"), ("topic_string", "a/+"), ("name", "ORDERS")]
)
def test_bad_topic_input_is_shown_beside_its_field(admin, orders_topic, field, value):
    form = {"name": "NEW", "topic_string": "new", field: value}
    response = logged_in(admin).post("/topics/new/", form)

    assert error_beside(response.content.decode(), field)
    assert Topic.objects.count() == 1


def test_a_viewer_sees_no_forms_and_cannot_post(viewer, orders_topic, orders):
    client = logged_in(viewer)

    page = client.get("/topics/").content.decode()

    assert "New topic" not in page
    assert client.post("/topics/new/", {"name": "PAY", "topic_string": "p"}).status_code == 403
    assert client.post("/queues/ORDERS.IN/limits/", {"overflow": "reject_new"}).status_code == 403
    assert not Topic.objects.filter(name="PAY").exists()


def test_posts_need_the_csrf_token(admin, orders_topic):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)

    assert client.post("/topics/new/", {"name": "PAY", "topic_string": "p"}).status_code == 403


def test_an_admin_edits_a_subscription_limit(admin, orders_topic):
    subscription_create(
        name="BILLING", topic=orders_topic, queue_name="BILLING.Q", topic_filter="orders/#"
    )
    client = logged_in(admin)

    bad = client.post(
        "/subscriptions/BILLING/",
        {"topic_filter": "orders/#", "max_messages": "-1", "overflow": "reject_new"},
    )
    good = client.post(
        "/subscriptions/BILLING/",
        {"topic_filter": "orders/#", "max_messages": "10", "overflow": "discard_old"},
    )

    assert "greater than or equal to 1" in error_beside(bad.content.decode(), "max_messages")
    assert good.status_code == 302
    assert Subscription.objects.get(name="BILLING").max_messages == 10


def test_an_admin_sets_queue_limits_and_the_dashboard_flags_high_water(admin, orders_topic):
    queue_create(name="Q1")
    messages_publish(queue_name="Q1", messages=[NewMessage(payload=b"x")] * 9)
    client = logged_in(admin)

    bad = client.post("/queues/Q1/limits/", {"max_messages": "0", "overflow": "reject_new"})
    assert error_beside(bad.content.decode(), "max_messages")
    assert Queue.objects.get(name="Q1").max_messages is None

    client.post("/queues/Q1/limits/", {"max_messages": "10", "overflow": "reject_new"})

    assert Queue.objects.get(name="Q1").max_messages == 10
    row = re.search(r'<tr data-queue="Q1">(.*?)</tr>', client.get("/").content.decode(), re.S)
    assert row
    assert "9 / 10" in row.group(1)
    assert "high water" in row.group(1)


def test_unknown_subscriptions_and_queues_are_404(viewer):
    client = logged_in(viewer)

    assert client.get("/subscriptions/NOPE/").status_code == 404
    assert client.get("/queues/NOPE/limits/").status_code == 404
