"""A queue page's "Publish a test message" form (operators): one message
published as the signed-in user from application "console", or the refusal
beside the field, with nothing written."""

from __future__ import annotations

import pytest

from broker.models import Message, QueueKind
from broker.services.queues import queue_create, queue_update
from tests.support.console import error_beside, logged_in
from tests.support.messages import payload_of

pytestmark = pytest.mark.django_db

URL = "/queues/ORDERS.IN/publish/"
HX = {"HX-Request": "true"}
MESSAGE = {
    "payload": '{"order": 7}\n',
    "content_type": "application/json",
    "headers": "region = eu\n\ntrace=a=b\n",
    "priority": "7",
}


def test_an_operator_sees_the_form_and_a_viewer_does_not(operator, viewer, orders):
    assert (
        "Publish a test message" in logged_in(operator).get("/queues/ORDERS.IN/").content.decode()
    )
    assert (
        "Publish a test message" not in logged_in(viewer).get("/queues/ORDERS.IN/").content.decode()
    )


def test_an_operator_publishes_a_test_message(operator, orders):
    response = logged_in(operator).post(URL, MESSAGE)

    assert response.status_code == 302
    message = Message.objects.get(queue=orders)
    assert payload_of(message) == b'{"order": 7}\n'
    assert message.content_type == "application/json"
    assert message.headers == {"region": "eu", "trace": "a=b"}
    assert message.priority == 7
    assert (message.state, message.put_user, message.put_application) == (
        "TBDL",
        "oscar",
        "console",
    )


def test_with_htmx_the_panel_shows_the_new_depth_and_what_was_published(operator, orders):
    html = logged_in(operator).post(URL, MESSAGE, headers=HX).content.decode()

    [message_id] = Message.objects.filter(queue=orders).values_list("id", flat=True)
    assert html.lstrip().startswith('<div id="queue-panel">')
    assert f"Published message {message_id} to ORDERS.IN." in html
    assert 'data-state="TBDL">1<' in html


# Per field, each bad value and what is said beside the field.
BAD_INPUT = {
    "headers": {"region eu": "Line 1: write it as name=value.", "a=1\n=2": "Line 2: write it"},
    "priority": {"10": "less than or equal to 9", "": "This field is required"},
    "content_type": {"": "This field is required"},
    "payload": {"x" * 101: "payload"},
}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [(field, value, said) for field, cases in BAD_INPUT.items() for value, said in cases.items()],
)
def test_bad_input_is_shown_beside_its_field_and_publishes_nothing(
    operator, orders, field, value, message
):
    queue_update(queue=orders, max_payload_bytes=100)

    response = logged_in(operator).post(URL, {**MESSAGE, field: value}, headers=HX)

    assert response.status_code == 200
    assert message in error_beside(response.content.decode(), field)
    assert not Message.objects.filter(queue=orders).exists()


def test_a_full_queue_refuses_and_says_so(operator, orders, publish):
    queue_update(queue=orders, max_messages=1)
    publish(orders, 1)

    html = logged_in(operator).post(URL, MESSAGE, headers=HX).content.decode()

    assert "would pass the limit" in error_beside(html, "payload")
    assert Message.objects.filter(queue=orders).count() == 1


def test_a_dead_letter_queue_offers_no_publish_form(operator, orders):
    queue_create(name="ORDERS.DLQ", kind=QueueKind.DEAD_LETTER)

    html = logged_in(operator).get("/queues/ORDERS.DLQ/").content.decode()

    assert "Publish a test message" not in html


def test_viewers_may_not_publish(viewer, orders):
    response = logged_in(viewer).post(URL, MESSAGE)

    assert response.status_code == 403
    assert not Message.objects.filter(queue=orders).exists()
