"""The dashboard's "New queue" form (admins): a queue created, or the
queue service's refusal beside the field it names, with nothing written."""

from __future__ import annotations

import pytest

from broker.models import AuditEvent, Queue
from tests.support.console import error_beside, logged_in

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}
NEW = {"name": "PAYROLL.IN", "kind": "standard", "consumer": "log", "description": "Payroll"}


def test_an_admin_sees_the_form_and_others_do_not(admin, viewer, operator):
    assert 'id="queue-new"' in logged_in(admin).get("/").content.decode()
    assert 'id="queue-new"' not in logged_in(operator).get("/").content.decode()
    assert 'id="queue-new"' not in logged_in(viewer).get("/").content.decode()


def test_an_admin_creates_a_queue_and_lands_on_its_page(admin):
    response = logged_in(admin).post("/queues/", NEW)

    assert response.status_code == 302
    assert response["Location"] == "/queues/PAYROLL.IN/"
    queue = Queue.objects.get(name="PAYROLL.IN")
    assert (queue.kind, queue.consumer, queue.description) == ("standard", "log", "Payroll")
    assert queue.dead_letter_queue is not None
    assert AuditEvent.objects.filter(action="queue_create", queue_name="PAYROLL.IN").exists()


def test_with_htmx_the_form_comes_back_empty_and_says_what_it_made(admin):
    html = logged_in(admin).post("/queues/", NEW, headers=HX).content.decode()

    assert html.lstrip().startswith('<div id="queue-new"')
    assert "Queue PAYROLL.IN created." in html
    assert 'value="PAYROLL.IN"' not in html
    assert Queue.objects.filter(name="PAYROLL.IN").exists()


def test_a_dead_letter_queue_is_made_as_one(admin):
    logged_in(admin).post("/queues/", {**NEW, "name": "PAYROLL.DLQ", "kind": "dead_letter"})

    queue = Queue.objects.get(name="PAYROLL.DLQ")
    assert queue.is_dead_letter
    assert queue.dead_letter_queue is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "PAY ROLL", "Use 1 to 48 ASCII letters, digits and the characters . _ / %"),
        ("name", "PAYROLL!", "Use 1 to 48 ASCII letters"),
        ("name", "Q" * 49, "at most 48 characters"),
        ("name", "", "This field is required"),
        ("name", "SYSTEM.DEAD.LETTER.QUEUE", "already exists"),
        ("kind", "topic", "Select a valid choice"),
        ("consumer", "nope", "No handler is registered"),
        ("consumer", "ftp://x.example.com/", "http:// or https://"),
    ],
)
@pytest.mark.parametrize("htmx", [False, True])
def test_bad_input_is_shown_beside_its_field_and_writes_nothing(admin, field, value, message, htmx):
    before = set(Queue.objects.values_list("name", flat=True))

    response = logged_in(admin).post("/queues/", {**NEW, field: value}, headers=HX if htmx else {})

    assert response.status_code == 200
    assert message in error_beside(response.content.decode(), field)
    assert set(Queue.objects.values_list("name", flat=True)) == before
    assert not AuditEvent.objects.filter(action="queue_create").exists()


def test_operators_may_not_create_queues(operator):
    response = logged_in(operator).post("/queues/", NEW)

    assert response.status_code == 403
    assert not Queue.objects.filter(name="PAYROLL.IN").exists()
