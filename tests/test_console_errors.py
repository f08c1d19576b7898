"""The console's one not-found path and one error path: whatever is missing
is the 404 page saying what; a broker error lands beside the field it
concerns, in the flash area, or in the row that was acted on."""

from __future__ import annotations

import re
from html import unescape

import pytest

from broker.models import BulkJob, Queue
from broker.services.publish import NewMessage, messages_publish
from broker.services.rule_tables import rule_table_create
from broker.services.topics import subscription_create, topic_create
from broker.services.transitions.blacklist import messages_quarantine
from tests.support.console import logged_in

pytestmark = pytest.mark.django_db
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def detail(html: str) -> str:
    match = re.search(r"<span data-detail>([^<]*)</span>", html)
    assert match, "the 404 page says nothing about what is missing"
    return unescape(match.group(1))


@pytest.fixture
def rules_v1(db) -> None:
    rule_table_create(queue=Queue.objects.get(name=DLQ), text="ACTION(IGNORE)\n")


# What the 404 page says, and the requests it says it to.
MISSING = {
    "There is no queue named 'NOPE'.": [
        "GET /queues/NOPE/",
        "GET /queues/NOPE/limits/",
        "POST /queues/NOPE/settings/",
        "POST /queues/NOPE/pause/",
        "POST /queues/NOPE/purge/",
        "GET /dead-letters/NOPE/",
    ],
    "There is no message 999999.": [
        "GET /messages/999999/",
        "GET /messages/999999/payload/",
        "GET /messages/999999/dump/",
        "GET /messages/999999/resubmit/",
    ],
    "There is no subscription named 'NOPE'.": [
        "GET /subscriptions/NOPE/",
        "POST /subscriptions/NOPE/delete/",
    ],
    "ORDERS.IN is not a dead-letter queue.": [
        "GET /dead-letters/ORDERS.IN/",
        "GET /dead-letters/ORDERS.IN/rules/",
        "POST /dead-letters/ORDERS.IN/rules/rollback/",
        "POST /dead-letters/ORDERS.IN/apply/",
    ],
    f"{DLQ} has no rules table version 7.": [
        f"GET /dead-letters/{DLQ}/rules/7/",
        f"POST /dead-letters/{DLQ}/rules/7/activate/",
    ],
    "There is no job 999999.": ["GET /jobs/999999/"],
}


@pytest.mark.parametrize(
    ("method", "path", "said"),
    [
        (method.lower(), path, said)
        for said, requests in MISSING.items()
        for method, path in map(str.split, requests)
    ],
)
def test_whatever_is_missing_is_the_404_page_saying_what(
    admin, orders, rules_v1, method, path, said
):
    response = getattr(logged_in(admin), method)(path)

    assert response.status_code == 404
    html = response.content.decode()
    assert "<h1>Not found</h1>" in html
    assert detail(html) == said


def test_a_path_that_leads_nowhere_is_the_404_page_naming_the_path(viewer):
    html = logged_in(viewer).get("/nowhere/").content.decode()

    assert "Nothing is at <code>/nowhere/</code>" in html


def test_a_viewer_reads_a_settings_page_but_only_an_admin_posts_it(viewer, operator, admin, db):
    topic = topic_create(name="ORDERS", topic_string="orders")
    subscription_create(
        name="BILLING", topic=topic, queue_name="BILLING.Q", topic_filter="orders/#"
    )
    form = {"topic_filter": "orders/#", "max_messages": "5", "overflow": "reject_new"}

    assert logged_in(viewer).get("/subscriptions/BILLING/").status_code == 200
    assert logged_in(viewer).post("/subscriptions/BILLING/", form).status_code == 403
    assert logged_in(operator).post("/subscriptions/BILLING/", form).status_code == 403
    assert logged_in(operator).post("/queues/BILLING.Q/limits/", form).status_code == 403
    assert logged_in(admin).post("/subscriptions/BILLING/", form).status_code == 302


def test_a_service_error_naming_a_field_goes_beside_it(admin, db):
    subscription_create(
        name="BILLING",
        topic=topic_create(name="PAY", topic_string="pay"),
        queue_name="BILLING.Q",
        topic_filter="pay/#",
    )

    html = (
        logged_in(admin)
        .post(
            "/subscriptions/BILLING/",
            {"topic_filter": "orders/#", "overflow": "reject_new"},
            headers={"HX-Request": "true"},
        )
        .content.decode()
    )

    assert html.lstrip().startswith('<form id="subscription-form"')
    assert re.search(r'id="id_topic_filter-error">[^<]*must start with the topic', html)


def test_a_service_error_without_a_form_goes_to_the_flash_area(operator, orders):
    [waiting] = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"x")])

    response = logged_in(operator).post(
        f"/messages/{waiting}/fail/", {"next": f"/messages/{waiting}/"}, follow=True
    )

    assert response.redirect_chain[-1][0] == f"/messages/{waiting}/"
    assert re.search(r'<li class="error">[^<]*is TBDL', response.content.decode())


def test_a_refused_bulk_job_says_why_in_the_flash_area(operator, orders):
    response = logged_in(operator).post(
        "/blacklist/bulk/", {"action": "fail", "scope": "selected"}, follow=True
    )

    assert response.redirect_chain[-1][0] == "/blacklist/"
    assert '<li class="error">Select from 1 to 10,000 messages.</li>' in response.content.decode()
    assert not BulkJob.objects.exists()


def test_a_blacklist_row_action_shows_a_refusal_in_the_row_and_not_again(operator, orders):
    [message_id] = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"x")])
    messages_quarantine(reasons={message_id: "crashed"})
    client = logged_in(operator)
    client.post(f"/messages/{message_id}/fail/", headers={"HX-Request": "true"})

    again = client.post(f"/messages/{message_id}/fail/", headers={"HX-Request": "true"})
    later = client.get("/blacklist/").content.decode()

    assert re.search(
        rf'<tr id="message-{message_id}".*<span class="outcome bad" role="status">[^<]*is FAIL',
        again.content.decode(),
        re.S,
    )
    assert "is FAIL" not in later
    assert "failed for good" not in later
