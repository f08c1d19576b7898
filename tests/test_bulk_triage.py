"""Bulk triage of the blacklist: preview, confirmation, a background job
with progress."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import psycopg
import pytest

from broker.models import AuditEvent, BulkJob, Message
from broker.selectors import MessageFilter
from broker.services.bulk import RUN_LOCK_CLASS, bulk_job_run, bulk_job_submit, bulk_preview
from broker.services.queues import queue_create
from rig.processes import database_url_for_workers, wait_until
from tests.support.console import logged_in
from tests.support.messages import blacklisted

pytestmark = pytest.mark.django_db


def test_a_job_fails_every_blacklisted_message_the_filter_matches(orders, operator):
    queue_create(name="OTHER.Q")
    ids = blacklisted("ORDERS.IN", 500)
    others = blacklisted("OTHER.Q", 7)

    assert bulk_preview(filters=MessageFilter(queue="ORDERS.IN")) == 500
    job = bulk_job_submit(
        action="fail", actor=operator, filters=MessageFilter(queue="ORDERS.IN"), reason="bad batch"
    )
    job = bulk_job_run(job_id=job.id)

    assert (job.status, job.done, job.total, job.percent) == ("done", 500, 500, 100)
    assert Message.objects.filter(id__in=ids, state="FAIL").count() == 500
    assert Message.objects.filter(id__in=others, state="NDLV").count() == 7
    assert AuditEvent.objects.filter(action="message_fail", reason="bad batch").count() == 500


def test_a_selection_acts_only_on_its_blacklisted_messages(orders, operator, publish):
    [waiting] = publish(orders)
    chosen = blacklisted("ORDERS.IN", 3)

    job = bulk_job_submit(action="purge", actor=operator, message_ids=[*chosen[:2], waiting])
    bulk_job_run(job_id=job.id)

    assert not Message.objects.filter(id__in=chosen[:2]).exists()
    assert Message.objects.filter(id__in=[chosen[2], waiting]).count() == 2
    assert AuditEvent.objects.filter(action="message_purge").count() == 2


def test_a_rerun_takes_up_only_what_is_left(orders, operator):
    blacklisted("ORDERS.IN", 10)
    job = bulk_job_submit(action="release", actor=operator, filters=MessageFilter())
    bulk_job_run(job_id=job.id)
    BulkJob.objects.filter(id=job.id).update(status="running")

    assert bulk_job_run(job_id=job.id).done == 10
    assert AuditEvent.objects.filter(action="message_release").count() == 10


def test_a_start_that_arrives_while_another_process_runs_the_job_leaves_it_to_that_run(
    orders, operator
):
    """Its start sent twice (broker.services.job_starts): the second run
    finds the job's run lock held by the first, in another session, and
    acts on nothing."""
    ids = blacklisted("ORDERS.IN", 5)
    job = bulk_job_submit(action="fail", actor=operator, filters=MessageFilter(queue="ORDERS.IN"))

    with psycopg.connect(database_url_for_workers(), autocommit=True) as first_run:
        first_run.execute("SELECT pg_advisory_lock(%s, %s)", [RUN_LOCK_CLASS, job.id])
        assert bulk_job_run(job_id=job.id).status == "queued"
        assert Message.objects.filter(id__in=ids, state="NDLV").count() == 5
        # The first run ends. (Closing the session would release the lock too,
        # but the server ends a closed session a moment after the client.)
        first_run.execute("SELECT pg_advisory_unlock(%s, %s)", [RUN_LOCK_CLASS, job.id])

    assert bulk_job_run(job_id=job.id).status == "done"
    assert Message.objects.filter(id__in=ids, state="FAIL").count() == 5


def test_the_console_previews_confirms_and_shows_progress(orders, operator):
    blacklisted("ORDERS.IN", 25)
    client = logged_in(operator)
    form = {"action": "fail", "note": "n", "scope": "filter", "queue": "ORDERS.IN"}

    preview = client.post("/blacklist/bulk/", form).content.decode()
    submitted = client.post("/blacklist/bulk/", {**form, "confirmed": "on"})

    assert 'data-confirm-count="25"' in preview
    assert Message.objects.filter(state="NDLV").count() == 25  # nothing before the job runs
    job = BulkJob.objects.get()
    assert submitted["Location"] == f"/jobs/{job.id}/"
    bulk_job_run(job_id=job.id)
    page = client.get(f"/jobs/{job.id}/").content.decode()
    assert re.search(r'<progress max="25" value="25"', page)
    assert 'data-status="done"' in page


def test_selected_rows_are_failed_from_the_blacklist_page(orders, operator):
    ids = blacklisted("ORDERS.IN", 4)

    logged_in(operator).post(
        "/blacklist/bulk/", {"action": "fail", "scope": "selected", "ids": ids[:2]}
    )
    bulk_job_run(job_id=BulkJob.objects.get().id)

    assert sorted(Message.objects.filter(state="FAIL").values_list("id", flat=True)) == ids[:2]


@pytest.mark.parametrize(
    "form",
    [
        {"action": "explode", "scope": "selected", "ids": ["1"]},
        {"action": "fail", "scope": "selected", "ids": ["x"]},
        {"action": "fail", "scope": "selected"},
        {"action": "fail", "scope": "everything"},
    ],
)
def test_bad_bulk_input_changes_nothing(orders, operator, form):
    blacklisted("ORDERS.IN", 2)

    response = logged_in(operator).post("/blacklist/bulk/", form, follow=True)

    assert response.redirect_chain[-1][0] == "/blacklist/"
    assert not BulkJob.objects.exists()
    assert Message.objects.filter(state="NDLV").count() == 2


def test_a_viewer_cannot_start_a_job(orders, viewer):
    blacklisted("ORDERS.IN", 1)

    assert (
        logged_in(viewer)
        .post("/blacklist/bulk/", {"action": "fail", "scope": "filter"})
        .status_code
        == 403
    )


@pytest.mark.slow
def test_workers_run_a_submitted_job(start_workers, operator):
    queue_create(name="ORDERS.IN")
    blacklisted("ORDERS.IN", 1200)
    start_workers(concurrency=1)

    job = bulk_job_submit(action="fail", actor=operator, filters=MessageFilter(queue="ORDERS.IN"))

    wait_until(
        lambda: BulkJob.objects.filter(id=job.id, status="done").first(), timeout=60, what="the job"
    )
    assert Message.objects.filter(state="FAIL").count() == 1200


class BulkFormFields(HTMLParser):
    """The hidden fields a browser submits to /blacklist/bulk/: those inside a
    form posting there, and those elsewhere naming the blacklist's bulk form
    (form="bulk-form")."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "form":
            self.inside = attributes.get("action") == "/blacklist/bulk/"
        elif tag == "input" and attributes.get("type") == "hidden" and self.submits(attributes):
            self.fields[attributes["name"] or ""] = attributes.get("value") or ""

    def submits(self, attributes: dict[str, str | None]) -> bool:
        return self.inside or attributes.get("form") == "bulk-form"

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False


def bulk_form_fields(html: str) -> dict[str, str]:
    parser = BulkFormFields()
    parser.feed(html)
    return parser.fields


def test_apply_to_the_filter_acts_on_the_filter_shown_after_filtering_in_place(orders, operator):
    queue_create(name="OTHER.Q")
    blacklisted("ORDERS.IN", 3)
    blacklisted("OTHER.Q", 2)
    client = logged_in(operator)
    loaded = client.get("/blacklist/", {"queue": "ORDERS.IN"}).content.decode()
    # The operator filters again: htmx swaps #message-table (the end of the page) only.
    swapped = client.get(
        "/blacklist/", {"queue": "OTHER.Q"}, headers={"HX-Request": "true"}
    ).content.decode()
    page = loaded[: loaded.index('<div id="message-table"')] + swapped

    form = {**bulk_form_fields(page), "action": "fail", "scope": "filter"}
    confirmation = client.post("/blacklist/bulk/", form).content.decode()
    client.post("/blacklist/bulk/", {**bulk_form_fields(confirmation), "action": "fail"})

    assert 'data-confirm-count="2"' in confirmation
    assert '<dd data-filter="queue">OTHER.Q</dd>' in confirmation
    job = BulkJob.objects.get()
    assert (job.filters, job.total) == ({"queue": "OTHER.Q"}, 2)


def test_the_confirmation_states_the_filter_it_will_apply(orders, operator):
    blacklisted("ORDERS.IN", 4)
    form = {"action": "release", "scope": "filter", "queue": "ORDERS.IN", "text": "x"}

    html = logged_in(operator).post("/blacklist/bulk/", form).content.decode()

    assert "Release 4 blacklisted messages?" in html
    assert '<dd data-filter="queue">ORDERS.IN</dd>' in html
    assert '<dd data-filter="text">x</dd>' in html
    assert 'data-filter="state"' not in html


def test_the_confirmation_without_a_filter_says_it_takes_every_blacklisted_message(
    orders, operator
):
    blacklisted("ORDERS.IN", 2)

    html = (
        logged_in(operator)
        .post("/blacklist/bulk/", {"action": "purge", "scope": "filter"})
        .content.decode()
    )

    assert "No filter: <strong>every</strong> blacklisted message will be purged." in html
    assert "data-filter=" not in html
