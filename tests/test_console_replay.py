"""Console pages of replay jobs and the archive, and the replay lines of a
message's timeline."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html import unescape
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from broker.models import Message, Queue, ReplayJob
from broker.pipeline.replay import replay_job_submit
from broker.pipeline.selection import ReplaySpec
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from tests.support.archive import DAY, archived, message_row
from tests.support.console import error_beside, logged_in
from tests.support.messages import dead_lettered
from tests.support.replay import reported

pytestmark = pytest.mark.django_db

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
HX = {"HX-Request": "true"}


def job_form(**values: Any) -> dict[str, Any]:
    """A valid dead-letter replay job as the form posts it, changed by ``values``."""
    return {"source": "dead_letter", "source_queue": DLQ, **values}


def a_job(operator: User, **spec: Any) -> ReplayJob:
    values: dict[str, Any] = {"source": "dead_letter", "source_queue": DLQ, **spec}
    return replay_job_submit(spec=ReplaySpec(**values), actor=operator)


@pytest.fixture
def dead(orders: Queue) -> list[int]:
    """Three messages dead-lettered from ORDERS.IN and one from OTHER.IN."""
    other = queue_create(name="OTHER.IN")
    return [*dead_lettered(orders, 3), *dead_lettered(other, 1, reason="format_error")]


# --- roles ----------------------------------------------------------------------


def test_a_viewer_reads_jobs_and_the_archive_but_may_not_submit_cancel_or_run(
    viewer, operator, orders, settings, tmp_path
):
    settings.ARCHIVE_DIR = tmp_path
    job = a_job(operator)
    client = logged_in(viewer)

    jobs = client.get("/replay/")
    page = client.get(f"/replay/{job.id}/")

    assert jobs.status_code == page.status_code == 200
    assert client.get("/archive/").status_code == 200
    assert "New replay job" not in jobs.content.decode()
    assert "Cancel" not in page.content.decode()
    assert client.get("/replay/new/").status_code == 403
    assert client.post("/replay/new/", job_form()).status_code == 403
    assert client.post("/replay/preview/", job_form()).status_code == 403
    assert client.post(f"/replay/{job.id}/cancel/").status_code == 403
    assert client.post(f"/replay/{job.id}/run/").status_code == 403
    assert ReplayJob.objects.count() == 1
    assert ReplayJob.objects.get().status == "queued"


def test_an_operator_sees_the_new_job_link_and_the_cancel_button(operator):
    job = a_job(operator)
    client = logged_in(operator)

    assert 'href="/replay/new/"' in client.get("/replay/").content.decode()
    assert client.get("/replay/new/").status_code == 200
    assert f'action="/replay/{job.id}/cancel/"' in client.get(f"/replay/{job.id}/").content.decode()


def test_anonymous_users_are_sent_to_the_login_page(operator):
    job = a_job(operator)
    client = Client()

    for path in ["/replay/", "/replay/new/", f"/replay/{job.id}/", "/archive/"]:
        response = client.get(path)
        assert response.status_code == 302, path
        assert response["Location"].startswith("/login/?next="), path
    for path in ["/replay/new/", "/replay/preview/", f"/replay/{job.id}/cancel/"]:
        assert client.post(path, job_form()).status_code == 302, path
    assert ReplayJob.objects.count() == 1


def test_every_replay_post_needs_its_csrf_token(admin, dead):
    job = a_job(admin)
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)

    for path in ["/replay/new/", "/replay/preview/", f"/replay/{job.id}/cancel/"]:
        assert client.post(path, job_form()).status_code == 403, path
    ReplayJob.objects.filter(id=job.id).update(status="done")
    assert client.post(f"/replay/{job.id}/run/").status_code == 403
    assert list(ReplayJob.objects.values_list("status", flat=True)) == ["done"]


def test_the_nav_links_to_replay_and_the_archive(viewer):
    html = logged_in(viewer).get("/replay/").content.decode()

    assert '<a href="/replay/" aria-current="page">Replay</a>' in html
    assert '<a href="/archive/" >Archive</a>' in html


def test_an_unknown_job_is_not_found(operator):
    client = logged_in(operator)

    assert client.get("/replay/999999/").status_code == 404
    assert client.post("/replay/999999/cancel/").status_code == 404
    assert client.post("/replay/999999/run/").status_code == 404


# --- the form ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field", "said"),
    [
        ({"target_queue": "NO.SUCH"}, "target_queue", "There is no queue named 'NO.SUCH'."),
        ({"target_queue": DLQ}, "target_queue", f"{DLQ} is a dead-letter queue"),
        (
            {"rules_text": "* park format errors\nREASON(MQRC_FORMAT_ERROR) ACTION(FWD)\n"},
            "rules_text",
            "line 2, column",
        ),
        ({"velocity": "0"}, "velocity", "Give from 1 to 1,000,000 messages per second"),
        ({"velocity": "-5"}, "velocity", "Give from 1 to 1,000,000 messages per second"),
        (
            {"since": "2024-05-02T10:00:00", "until": "2024-05-01T10:00:00"},
            "until",
            "The time range ends before it starts.",
        ),
        ({"queues": "ORDERS.IN, NO.SUCH"}, "queues", "There is no queue named 'NO.SUCH'."),
        ({"source_queue": ""}, "source_queue", "Name the dead-letter queue to replay from."),
        ({"source": "blacklist"}, "source_queue", "Only a dead-letter source names a source"),
        ({"header": "no-equals-sign"}, "header", "name=value"),
    ],
)
@pytest.mark.parametrize("path", ["/replay/new/", "/replay/preview/"])
def test_a_bad_job_shows_the_error_beside_its_field_and_writes_nothing(
    operator, orders, values, field, said, path
):
    response = logged_in(operator).post(path, job_form(**values), headers=HX)

    html = response.content.decode()
    assert response.status_code == 200
    assert said in error_beside(html, field)
    assert "Nothing was submitted" in html
    assert "data-preview-count" not in html
    assert not ReplayJob.objects.exists()


def test_every_rules_error_is_shown_with_its_line(operator):
    rules = "ACTION(FWD)\n* fine\nREASON(MQRC_FORMAT_ERROR) ACTION(FWD)\n"

    html = logged_in(operator).post("/replay/new/", job_form(rules_text=rules)).content.decode()

    shown = error_beside(html, "rules_text")
    assert "line 1, column" in shown
    assert "line 3, column" in shown
    assert "<br>" in shown  # one error a line
    assert not ReplayJob.objects.exists()


def test_the_preview_counts_the_dead_letter_queue_messages_the_filter_matches(operator, dead):
    client = logged_in(operator)

    everything = client.post("/replay/preview/", job_form(), headers=HX).content.decode()
    from_orders = client.post(
        "/replay/preview/", job_form(queues="ORDERS.IN"), headers=HX
    ).content.decode()
    by_reason = client.post(
        "/replay/preview/", job_form(reason="format_error"), headers=HX
    ).content.decode()

    assert 'data-preview-count="4"' in everything
    assert "4 messages match the filter now." in everything
    assert 'data-preview-count="3"' in from_orders
    assert "1 message matches the filter now." in by_reason
    assert everything.lstrip().startswith(
        '<form id="replay-form"'
    )  # only the form, swapped in place
    assert not ReplayJob.objects.exists()


def test_without_javascript_the_preview_is_a_whole_page(operator, dead):
    html = logged_in(operator).post("/replay/preview/", job_form()).content.decode()

    assert "<h1>New replay job</h1>" in html
    assert 'data-preview-count="4"' in html


def test_submitting_queues_a_job_and_shows_its_page(operator, dead):
    client = logged_in(operator)

    response = client.post(
        "/replay/new/",
        job_form(
            queues="ORDERS.IN  OTHER.IN,ORDERS.IN",
            target_queue="OTHER.IN",
            velocity="50",
            dry_run="on",
            since="2024-05-01T10:00:00",
            header="region=eu",
        ),
    )

    job = ReplayJob.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/replay/{job.id}/"
    assert (job.source, job.source_queue, job.target_queue) == ("dead_letter", DLQ, "OTHER.IN")
    assert job.filters == {
        "queues": ["ORDERS.IN", "OTHER.IN"],
        "since": "2024-05-01T10:00:00+00:00",
        "header": "region=eu",
    }
    assert (job.velocity, job.dry_run, job.status) == (50, True, "queued")
    assert job.created_by == operator
    html = client.get(response["Location"]).content.decode()
    assert f"Dry run {job.id} queued." in html
    assert 'data-status="queued"' in html
    assert "Waiting for a worker" in html


def test_the_form_is_prefilled_from_the_query_string(operator, orders):
    html = (
        logged_in(operator)
        .get(
            "/replay/new/",
            {
                "source": "archive",
                "queues": "ORDERS.IN",
                "since": "2024-05-01T00:00:00",
                "until": "2024-05-02T00:00:00+00:00",
                "velocity": "not a number",
            },
        )
        .content.decode()
    )

    assert '<option value="archive" selected>' in html
    assert 'name="queues" value="ORDERS.IN"' in html
    assert 'name="since" value="2024-05-01T00:00:00"' in html
    assert 'name="until" value="2024-05-02T00:00:00"' in html
    assert re.search(r'<input type="number" name="velocity"(?! value)[^>]*>', html)
    assert 'class="error"' not in html  # a prefilled form is not judged yet


# --- a job's page -------------------------------------------------------------------


def test_the_job_page_shows_counts_per_target_and_per_rule_and_polls_while_running(operator):
    job = a_job(operator, rules_text="ACTION(RETRY)\n")
    reported(
        job.id,
        "running",
        (10, 10, 8, 5, 1, 1),
        per_target={"PARKED.Q": 2, "ORDERS.IN": 3},
        per_rule={"2": 2, "0": 1, "10": 1, "1": 3},
        spark_app_id="local-1715000000000",
    )
    client = logged_in(operator)

    html = client.get(f"/replay/{job.id}/").content.decode()
    partial = client.get(f"/replay/{job.id}/", headers=HX).content.decode()

    counts = dict(re.findall(r'data-count="(\w+)">(\d+)<', html))
    assert counts == {"read": "10", "matched": "8", "written": "5", "skipped": "1", "failed": "1"}
    assert "Running: 9 of 10 source messages (90%)." in html
    assert '<progress max="100" value="90"' in html
    assert re.findall(r'data-target="([^"]+)"><td>[^<]+</td><td class="num[^"]*">(\d+)<', html) == [
        ("ORDERS.IN", "3"),
        ("PARKED.Q", "2"),
    ]
    assert re.findall(r'data-rule="([^"]+)"><td>[^<]+</td><td class="num[^"]*">(\d+)<', html) == [
        ("rule 1", "3"),
        ("rule 2", "2"),
        ("rule 10", "1"),
        ("no rule matched", "1"),
    ]
    assert "local-1715000000000" in html
    assert 'hx-trigger="every 1s [document.visibilityState' in html
    assert partial.lstrip().startswith('<div id="replay-progress"')
    assert "<h1>" not in partial
    assert 'action="/replay/' + str(job.id) + '/cancel/"' in partial


@pytest.mark.parametrize("status", ["done", "failed", "cancelled"])
def test_a_finished_job_stops_polling_and_offers_run_again(operator, status):
    job = a_job(operator)
    ReplayJob.objects.filter(id=job.id).update(status=status)

    html = logged_in(operator).get(f"/replay/{job.id}/").content.decode()

    assert f'data-status="{status}"' in html
    assert "hx-trigger" not in html
    assert f'action="/replay/{job.id}/run/"' in html
    assert f'action="/replay/{job.id}/cancel/"' not in html


def test_a_dry_run_shows_its_sample(operator):
    job = a_job(operator, dry_run=True)
    ReplayJob.objects.filter(id=job.id).update(
        status="done",
        sample=[
            {"message": 41, "target": "ORDERS.IN", "rule": 1},
            {"message": 42, "target": "<b>PARKED</b>", "rule": None},
        ],
    )

    html = logged_in(operator).get(f"/replay/{job.id}/").content.decode()

    assert "nothing was written" in html
    assert '<th scope="col">Message</th><th scope="col">Target</th>' in html
    assert '<td><a href="/messages/41/">41</a></td><td>ORDERS.IN</td><td>1</td>' in html
    assert "<td>—</td>" in html  # no rule
    assert "&lt;b&gt;PARKED&lt;/b&gt;" in html
    assert "<b>PARKED" not in html


def test_cancelling_a_queued_job_cancels_it_at_once(operator):
    job = a_job(operator)
    client = logged_in(operator)

    response = client.post(f"/replay/{job.id}/cancel/", follow=True)

    job.refresh_from_db()
    assert job.status == "cancelled"
    assert job.finished_at is not None
    assert response.redirect_chain == [(f"/replay/{job.id}/", 302)]
    assert f"Replay job {job.id} cancelled." in response.content.decode()


def test_cancelling_a_running_job_asks_its_driver_to_stop(operator):
    job = a_job(operator)
    ReplayJob.objects.filter(id=job.id).update(status="running")

    html = logged_in(operator).post(f"/replay/{job.id}/cancel/", follow=True).content.decode()

    job.refresh_from_db()
    assert (job.status, job.cancel_requested) == ("running", True)
    assert "Cancel requested" in html


def test_cancelling_a_finished_job_says_why_not(operator):
    job = a_job(operator)
    ReplayJob.objects.filter(id=job.id).update(status="done")

    html = logged_in(operator).post(f"/replay/{job.id}/cancel/", follow=True).content.decode()

    assert "has already finished (done)" in html
    assert ReplayJob.objects.get(id=job.id).status == "done"


def test_running_a_cancelled_job_again_queues_it(operator):
    job = a_job(operator)
    ReplayJob.objects.filter(id=job.id).update(status="cancelled", cancel_requested=True)
    client = logged_in(operator)

    html = client.post(f"/replay/{job.id}/run/", follow=True).content.decode()
    busy = client.post(f"/replay/{job.id}/run/", follow=True).content.decode()

    job.refresh_from_db()
    assert (job.status, job.cancel_requested) == ("queued", False)
    assert f"Replay job {job.id} queued again" in html
    assert "is queued; wait for it or cancel it." in busy


def test_rules_filters_and_errors_show_as_text(operator, orders):
    script = "<script>alert(1)</script>"
    client = logged_in(operator)
    client.post(
        "/replay/new/",
        job_form(rules_text=f"* {script}\nACTION(RETRY)\n", payload_text=script, reason=script),
    )
    job = ReplayJob.objects.get()
    ReplayJob.objects.filter(id=job.id).update(status="failed", error=f"boom {script}")

    html = client.get(f"/replay/{job.id}/").content.decode()
    refused = client.post(
        "/replay/new/", job_form(rules_text=f"{script}\n", target_queue=script)
    ).content.decode()

    assert script not in html
    assert script not in refused
    assert "* &lt;script&gt;alert(1)&lt;/script&gt;\nACTION(RETRY)" in html
    assert "boom &lt;script&gt;" in html
    assert 'data-filter="payload text">&lt;script&gt;' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in refused
    assert ReplayJob.objects.count() == 1


def test_the_job_list_shows_recent_jobs_newest_first(operator, viewer):
    first = a_job(operator)
    second = a_job(operator, dry_run=True, target_queue="")
    ReplayJob.objects.filter(id=first.id).update(status="done", read=4, matched=4, written=4)

    html = logged_in(viewer).get("/replay/").content.decode()

    assert re.findall(r'<tr data-job="(\d+)">', html) == [str(second.id), str(first.id)]
    row = re.search(rf'<tr data-job="{first.id}">(.*?)</tr>', html, re.S)
    assert row
    assert "Done" in row.group(1)
    assert "100%" in row.group(1)
    assert "by oscar" in row.group(1)
    assert 'hx-trigger="every 2s' in html  # the second job is still queued


# --- the archive --------------------------------------------------------------------


def test_the_archive_without_files_says_nothing_matches(viewer, orders, settings, tmp_path):
    settings.ARCHIVE_DIR = tmp_path / "not-there"
    client = logged_in(viewer)

    unsearched = client.get("/archive/").content.decode()
    html = client.get("/archive/", {"queue": "ORDERS.IN"}).content.decode()

    assert "Choose a queue to search its archive." in unsearched
    assert '<option value="ORDERS.IN">ORDERS.IN</option>' in unsearched
    assert "Nothing archived matches." in html


def test_the_archive_shows_a_queues_messages_newest_first_as_text(
    viewer, operator, orders, settings, tmp_path
):
    settings.ARCHIVE_DIR = tmp_path
    archived(
        tmp_path,
        "ORDERS.IN",
        [
            message_row(1, DAY, payload=b"<b>bold</b>", content_type="text/html"),
            message_row(
                2,
                DAY + timedelta(hours=1),
                state="FAIL",
                dead_letter=json.dumps({"reason": "format_error", "original_queue": "ORDERS.IN"}),
            ),
            message_row(3, DAY + timedelta(days=1), payload=b"\x00\x01\xff"),
        ],
    )
    archived(tmp_path, "OTHER.IN", [message_row(9, DAY)])

    html = logged_in(viewer).get("/archive/", {"queue": "ORDERS.IN"}).content.decode()
    one_day = (
        logged_in(viewer)
        .get(
            "/archive/",
            {"queue": "ORDERS.IN", "since": "2024-05-01T00:00:00", "until": "2024-05-02T00:00:00"},
            headers=HX,
        )
        .content.decode()
    )

    assert re.findall(r'<tr data-message="(\d+)">', html) == ["3", "2", "1"]
    assert "&lt;b&gt;bold&lt;/b&gt;" in html
    assert "<b>bold" not in html
    assert "binary, 3 bytes" in html
    row = re.search(r'<tr data-message="2">(.*?)</tr>', html, re.S)
    assert row
    assert "format_error" in row.group(1)
    assert "FAIL" in row.group(1)
    assert ">2024-05-02</a>, <a" in html  # the days archived, newest first
    assert "Replay these" not in html  # viewers get no replay link
    assert re.findall(r'<tr data-message="(\d+)">', one_day) == ["2", "1"]
    assert one_day.lstrip().startswith('<div id="archive-results"')


def test_the_archive_pages_older_messages_by_keyset(viewer, orders, settings, tmp_path):
    settings.ARCHIVE_DIR = tmp_path
    archived(
        tmp_path, "ORDERS.IN", [message_row(n, DAY + timedelta(seconds=n)) for n in range(1, 61)]
    )
    client = logged_in(viewer)

    first = client.get("/archive/", {"queue": "ORDERS.IN"}).content.decode()
    cursor = re.search(r"before=(\d+)", first)
    assert cursor
    second = client.get("/archive/", {"queue": "ORDERS.IN", "before": cursor.group(1)})

    shown = [int(n) for n in re.findall(r'<tr data-message="(\d+)">', first)]
    assert shown == list(range(60, 10, -1))
    older = [int(n) for n in re.findall(r'<tr data-message="(\d+)">', second.content.decode())]
    assert older == list(range(10, 0, -1))
    assert "before=" not in second.content.decode()


def test_replay_these_links_to_a_prefilled_archive_job_that_previews_the_same_messages(
    operator, orders, settings, tmp_path
):
    settings.ARCHIVE_DIR = tmp_path
    archived(
        tmp_path,
        "ORDERS.IN",
        [message_row(n, DAY + timedelta(hours=n)) for n in range(1, 6)],
    )
    client = logged_in(operator)
    html = client.get(
        "/archive/",
        {"queue": "ORDERS.IN", "since": "2024-05-01T11:00:00", "until": "2024-05-01T13:30:00"},
    ).content.decode()
    link = re.search(r'<a href="([^"]+)" data-replay-link>Replay these</a>', html)
    assert link
    url = unescape(link.group(1))

    assert parse_qs(urlsplit(url).query) == {
        "source": ["archive"],
        "queues": ["ORDERS.IN"],
        "since": ["2024-05-01T11:00:00"],
        "until": ["2024-05-01T13:30:00"],
    }
    form = client.get(url).content.decode()
    values = dict(re.findall(r'<input type="[^"]+" name="(\w+)" value="([^"]*)"', form))
    assert values["since"] == "2024-05-01T11:00:00"
    preview = client.post(
        "/replay/preview/",
        {"source": "archive", **{k: values[k] for k in ("queues", "since", "until")}},
        headers=HX,
    ).content.decode()
    assert 'data-preview-count="3"' in preview  # published 11:00, 12:00 and 13:00


# --- a message's timeline -------------------------------------------------------------


def test_a_message_page_shows_the_replays_of_it_and_the_one_it_came_from(viewer, operator, orders):
    [source] = dead_lettered(orders, 1)
    [copy, second_copy] = messages_publish(
        queue_name="ORDERS.IN", messages=[NewMessage(payload=b"{}")] * 2
    )
    job, again = a_job(operator), a_job(operator)
    # As the replay writes them: each copy carries its job and its source.
    Message.objects.filter(id=copy).update(replay_job_id=job.id, replay_source_id=source)
    Message.objects.filter(id=second_copy).update(replay_job_id=again.id, replay_source_id=source)
    client = logged_in(viewer)

    original = re.sub(r"\s+", " ", client.get(f"/messages/{source}/").content.decode())
    replayed = re.sub(r"\s+", " ", client.get(f"/messages/{copy}/").content.decode())

    for replay_job, message_id in [(job, copy), (again, second_copy)]:
        assert (
            f'<strong>replayed</strong> by job <a href="/replay/{replay_job.id}/">{replay_job.id}</a>'
            f' as message <a href="/messages/{message_id}/">{message_id}</a>'
        ) in original
    assert (
        f'<strong>replayed from</strong> message <a href="/messages/{source}/">{source}</a>'
        f' by job <a href="/replay/{job.id}/">{job.id}</a>'
    ) in replayed
    assert "replayed from" not in original
    assert "<strong>replayed</strong> by" not in replayed
