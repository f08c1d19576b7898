"""A queue's page: depth, settings, pause and resume, purge; and edit and
resubmit of a blacklisted message."""

from __future__ import annotations

from html import unescape

import pytest

from broker.models import AuditEvent, Message, Queue
from broker.services.publish import NewMessage, messages_publish
from broker.services.transitions.blacklist import messages_quarantine
from tests.support.console import QUEUE_SETTINGS_FORM, error_beside, logged_in
from tests.support.messages import payload_of

pytestmark = pytest.mark.django_db


def test_an_admin_changes_settings(admin, orders):
    response = logged_in(admin).post(
        "/queues/ORDERS.IN/settings/", {**QUEUE_SETTINGS_FORM, "batch_size": "25"}
    )

    assert response.status_code == 302
    orders.refresh_from_db()
    assert (orders.batch_size, orders.consumer) == (25, "noop")
    assert AuditEvent.objects.get(action="queue_update").details == {
        "changed": ["batch_size", "consumer", "description"]
    }


def test_an_admin_chooses_to_purge_poison_and_names_an_alarm_webhook(admin, orders):
    response = logged_in(admin).post(
        "/queues/ORDERS.IN/settings/",
        {
            **QUEUE_SETTINGS_FORM,
            "poison_action": "purge",
            "alarm_webhook_url": "https://alarms.example.com/hook",
        },
    )

    assert response.status_code == 302
    orders.refresh_from_db()
    assert (orders.poison_action, orders.alarm_webhook_url) == (
        "purge",
        "https://alarms.example.com/hook",
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch_size", "0", "greater than or equal to 1"),
        ("batch_size", "many", "Enter a whole number"),
        ("consumer", "ftp://x.example.com/", "http:// or https://"),
        ("consumer", "nope", "No handler is registered"),
        ("suspect_delay_seconds", "9", "less than or equal to 5"),
        ("poison_action", "explode", "Select a valid choice"),
        ("delivered_retention", "forever", "Select a valid choice"),
        ("alarm_webhook_url", "ftp://alarms.example.com/", "http:// or https://"),
        ("dead_letter_queue", "ORDERS.IN", "Select a valid choice"),
        ("description", "d" * 201, "at most 200 characters"),
        ("alert_waiting_above", "-1", "greater than or equal to 0"),
        ("alert_oldest_waiting_seconds", "0", "At least 1 second."),
        ("alert_stalled_seconds", "31536001", "At most a year (31536000 seconds)."),
        ("alert_blacklisted_above", "1000000001", "At most a billion"),
        ("alert_dead_letter_per_minute", "lots", "Enter a whole number."),
    ],
)
def test_bad_settings_are_shown_beside_their_field_and_change_nothing(
    admin, orders, field, value, message
):
    html = (
        logged_in(admin)
        .post("/queues/ORDERS.IN/settings/", {**QUEUE_SETTINGS_FORM, field: value})
        .content.decode()
    )

    assert message in error_beside(html, field)
    orders.refresh_from_db()
    assert (orders.batch_size, orders.consumer, orders.description) == (10, "log", "")


def test_an_operator_pauses_and_resumes_delivery(operator, orders):
    client = logged_in(operator)

    client.post("/queues/ORDERS.IN/pause/", {"paused": "1"})
    assert Queue.objects.get(name="ORDERS.IN").paused
    client.post("/queues/ORDERS.IN/pause/", {"paused": "0"})
    assert not Queue.objects.get(name="ORDERS.IN").paused
    assert list(AuditEvent.objects.values_list("action", flat=True).order_by("id")) == [
        "queue_create",
        "queue_pause",
        "queue_resume",
    ]


def test_a_purge_needs_the_queue_name_typed(operator, orders, publish):
    publish(orders, 5)
    client = logged_in(operator)

    wrong = client.post("/queues/ORDERS.IN/purge/", {"confirmation": "orders.in"}).content.decode()
    assert "Type ORDERS.IN exactly" in error_beside(wrong, "confirmation")
    assert Message.objects.count() == 5

    client.post("/queues/ORDERS.IN/purge/", {"confirmation": "ORDERS.IN"})
    assert Message.objects.count() == 0
    assert AuditEvent.objects.get(action="queue_purge").details == {"deleted": 5}


def test_a_viewer_sees_the_queue_but_cannot_change_it(viewer, orders):
    client = logged_in(viewer)

    page = client.get("/queues/ORDERS.IN/").content.decode()

    assert "Save settings" not in page
    assert "Purge" not in page
    dead_letter_queue = orders.dead_letter_queue.name
    assert f"<dt>Dead letter queue</dt><dd>{dead_letter_queue}</dd>" in page
    assert client.post("/queues/ORDERS.IN/pause/", {"paused": "1"}).status_code == 403
    assert client.post("/queues/ORDERS.IN/settings/", QUEUE_SETTINGS_FORM).status_code == 403
    assert client.post("/queues/ORDERS.IN/purge/", {"confirmation": "ORDERS.IN"}).status_code == 403
    assert not Queue.objects.get(name="ORDERS.IN").paused


@pytest.fixture
def poison(orders) -> int:
    [message_id] = messages_publish(
        queue_name="ORDERS.IN",
        messages=[
            NewMessage(payload=b'{"qty": -1}', content_type="application/json", headers={"a": "b"})
        ],
    )
    messages_quarantine(reasons={message_id: "crashed twice"})
    return message_id


def test_an_operator_corrects_a_blacklisted_message_and_resubmits_it(operator, poison):
    form = {
        "queue": "ORDERS.IN",
        "content_type": "application/json",
        "priority": "4",
        "headers": '{"a": "b"}',
        "payload": '{"qty": 1}',
    }

    response = logged_in(operator).post(f"/messages/{poison}/resubmit/", form)

    copy = Message.objects.exclude(id=poison).get()
    assert response["Location"] == f"/messages/{copy.id}/"
    assert payload_of(copy) == b'{"qty": 1}'
    assert copy.headers == {"a": "b", "lazaretto-resubmitted-from": str(poison)}
    assert (copy.state, copy.put_user) == ("TBDL", "oscar")
    assert Message.objects.get(id=poison).state == "NDLV"
    assert AuditEvent.objects.get(action="message_resubmit", message_id=poison).details == {
        "copy": copy.id
    }


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("headers", '["a"]', "JSON object of string values"),
        ("headers", "{not json", "Enter a valid JSON"),
        ("queue", "NO.SUCH", "There is no queue named"),
        ("priority", "12", "less than or equal to 9"),
    ],
)
def test_bad_resubmit_input_is_shown_beside_its_field(operator, poison, field, value, message):
    form = {
        "queue": "ORDERS.IN",
        "content_type": "application/json",
        "priority": "4",
        "headers": "{}",
        "payload": "{}",
        field: value,
    }

    html = logged_in(operator).post(f"/messages/{poison}/resubmit/", form).content.decode()

    if field == "queue":
        assert message in unescape(html)
    else:
        assert message in error_beside(html, field)
    assert Message.objects.count() == 1
