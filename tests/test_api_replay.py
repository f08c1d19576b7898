"""The replay-jobs API: submit, preview, read, cancel and run again. Nothing
here runs Spark; a job stays queued unless a test moves it on."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from broker.models import AuditEvent, ReplayJob, ReplayJobStatus
from broker.services.queues import queue_create
from tests.support.messages import dead_lettered
from tests.support.replay import reported

pytestmark = pytest.mark.django_db

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
JOBS = "/api/v1/replay-jobs/"
PREVIEW = f"{JOBS}preview/"
BASE = {"source": "dead_letter", "source_queue": DLQ}
# A filter that names every field.
FILTER = {
    "queues": ["ORDERS.IN"],
    "reason": "handler_error",
    "since": "2026-01-01T00:00:00Z",
    "until": "2026-02-01T00:00:00Z",
    "header": "region=eu",
    "payload_text": "invoice",
}


def submit(client, **body) -> dict:
    response = client.post(JOBS, {**BASE, **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.fixture
def parked(db):
    return queue_create(name="PARKED.Q", consumer="log")


def test_an_operator_submits_a_job_and_reads_it_back(operator_api, orders, parked):
    body = {
        "filter": FILTER,
        "target_queue": "PARKED.Q",
        "rules_text": "ACTION(FWD) FWDQ(PARKED.Q)\n",
        "velocity": 50,
        "dry_run": True,
    }

    job = submit(operator_api, **body)
    again = operator_api.get(f"{JOBS}{job['id']}/").json()

    assert again == job
    assert (job["status"], job["percent"], job["created_by"]) == ("queued", 0, "oscar")
    assert (job["source"], job["source_queue"], job["target_queue"]) == (
        "dead_letter",
        DLQ,
        "PARKED.Q",
    )
    assert job["filter"] == FILTER
    assert (job["rules_text"], job["velocity"], job["dry_run"]) == (body["rules_text"], 50, True)
    for count in ("total", "read", "matched", "written", "skipped", "failed", "runs"):
        assert job[count] == 0
    assert (job["per_target"], job["per_rule"], job["sample"]) == ({}, {}, [])
    assert (job["spark_app_id"], job["error"], job["finished_at"]) == ("", "", None)
    stored = ReplayJob.objects.get()
    assert (stored.velocity, stored.dry_run, stored.filters["queues"]) == (50, True, ["ORDERS.IN"])
    assert AuditEvent.objects.filter(action="replay_submit", actor_name="oscar").exists()


def test_a_bare_job_takes_everything_back_to_its_original_queues(operator_api):
    job = submit(operator_api)

    assert job["filter"] == {
        "queues": [],
        "reason": "",
        "since": None,
        "until": None,
        "header": "",
        "payload_text": "",
    }
    assert (job["target_queue"], job["rules_text"], job["velocity"], job["dry_run"]) == (
        "",
        "",
        None,
        False,
    )


def test_a_finished_job_shows_its_counts(operator_api, viewer_api):
    job = submit(operator_api)
    reported(
        job["id"],
        ReplayJobStatus.DONE,
        (10, 10, 8, 7, 1),
        per_target={"ORDERS.IN": 7},
        per_rule={"1": 7, "0": 1},
        spark_app_id="local-1234",
        runs=1,
        finished_at=timezone.now(),
    )

    shown = viewer_api.get(f"{JOBS}{job['id']}/").json()

    assert (shown["status"], shown["percent"]) == ("done", 100)
    assert (shown["read"], shown["matched"], shown["written"], shown["skipped"]) == (10, 8, 7, 1)
    assert shown["per_target"] == {"ORDERS.IN": 7}
    assert shown["per_rule"] == {"1": 7, "0": 1}
    assert shown["spark_app_id"] == "local-1234"


def test_a_preview_counts_what_the_filter_matches_and_stores_nothing(operator_api, orders):
    dead_lettered(orders, 3, reason="handler_error")
    dead_lettered(orders, 2, reason="format_error", region="eu")

    everything = operator_api.post(PREVIEW, BASE, format="json")
    by_reason = operator_api.post(
        PREVIEW, {**BASE, "filter": {"reason": "format_error"}}, format="json"
    )
    by_header = operator_api.post(
        PREVIEW, {**BASE, "filter": {"header": "region=eu", "queues": ["ORDERS.IN"]}}, format="json"
    )

    assert everything.status_code == 200, everything.json()
    assert everything.json() == {"count": 5}
    assert by_reason.json() == {"count": 2}
    assert by_header.json() == {"count": 2}
    assert not ReplayJob.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"velocity": "abc"}, "velocity"),
        ({"velocity": 0}, "velocity"),
        ({"velocity": -1}, "velocity"),
        ({"velocity": 1.5}, "velocity"),
        ({"velocity": 10_000_000}, "velocity"),
        ({"dry_run": "maybe"}, "dry_run"),
        ({"source": "nowhere"}, "source"),
        ({"source_queue": ""}, "source_queue"),
        ({"source": "blacklist"}, "source_queue"),
        ({"rules_text": "ACTION(FLY)\n"}, "rules_text"),
        ({"filter": "ORDERS.IN"}, "filter"),
        ({"filter": {"queues": "ORDERS.IN"}}, "queues"),
        ({"filter": {"until": "yesterday"}}, "until"),
        ({"filter": {"header": "region"}}, "header"),
        ({"filter": {"payload_text": "x" * 1001}}, "payload_text"),
        ({"dryrun": True}, "dryrun"),
        ({"filter": {"queue": "ORDERS.IN"}}, "filter.queue"),
    ],
)
@pytest.mark.parametrize("path", [JOBS, PREVIEW])
def test_a_bad_job_is_400_naming_the_field_and_nothing_is_written(
    operator_api, orders, body, field, path
):
    response = operator_api.post(path, {**BASE, **body}, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid"
    assert field in response.json()["field_errors"], response.json()
    assert not ReplayJob.objects.exists()
    assert not AuditEvent.objects.filter(action="replay_submit").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"source_queue": "NO.SUCH.Q"}, "source_queue"),
        ({"target_queue": "NO.SUCH.Q"}, "target_queue"),
        ({"filter": {"queues": ["NO.SUCH.Q"]}}, "queues"),
    ],
)
@pytest.mark.parametrize("path", [JOBS, PREVIEW])
def test_a_job_naming_a_queue_that_is_not_there_is_404_by_field(
    operator_api, orders, body, field, path
):
    response = operator_api.post(path, {**BASE, **body}, format="json")

    assert (response.status_code, response.json()["code"]) == (404, "queue_not_found")
    assert response.json()["field_errors"][field] == ["There is no queue named 'NO.SUCH.Q'."]
    assert not ReplayJob.objects.exists()


@pytest.mark.parametrize(
    ("body", "field", "code", "queue"),
    [
        ({"source_queue": "ORDERS.IN"}, "source_queue", "queue_is_not_dead_letter", "ORDERS.IN"),
        ({"target_queue": DLQ}, "target_queue", "queue_is_dead_letter", DLQ),
    ],
)
@pytest.mark.parametrize("path", [JOBS, PREVIEW])
def test_a_job_naming_a_queue_of_the_wrong_kind_is_409_naming_the_queue(
    operator_api, orders, body, field, code, queue, path
):
    """The body is what the schema asks for; the queue it names is of the
    other kind: a conflict with what exists, as a publish to a dead-letter
    queue is."""
    response = operator_api.post(path, {**BASE, **body}, format="json")

    assert (response.status_code, response.json()["code"]) == (409, code)
    assert response.json()["detail"].startswith(f"{queue} is ")
    assert list(response.json()["field_errors"]) == [field]
    assert not ReplayJob.objects.exists()


def test_a_fault_of_the_job_itself_outranks_a_queue_of_the_wrong_kind(operator_api, orders):
    response = operator_api.post(
        JOBS, {**BASE, "source_queue": "ORDERS.IN", "rules_text": "ACTION(FLY)\n"}, format="json"
    )

    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert set(response.json()["field_errors"]) == {"source_queue", "rules_text"}


def test_a_queue_that_is_not_there_outranks_one_of_the_wrong_kind(operator_api, orders):
    response = operator_api.post(
        JOBS,
        {**BASE, "source_queue": "ORDERS.IN", "filter": {"queues": ["NO.SUCH.Q"]}},
        format="json",
    )

    assert (response.status_code, response.json()["code"]) == (404, "queue_not_found")
    assert set(response.json()["field_errors"]) == {"source_queue", "queues"}


def test_rules_errors_name_their_line_and_column(operator_api):
    response = operator_api.post(
        JOBS,
        {**BASE, "rules_text": "ACTION(FLY)\n* fine\nACTION(DISCARD) HEADER(NO)\n"},
        format="json",
    )

    errors = response.json()["field_errors"]["rules_text"]
    assert [error.split(",")[0] for error in errors] == ["line 1", "line 3"]
    assert all(", column " in error for error in errors)


def test_every_problem_the_service_finds_is_reported_at_once(operator_api):
    response = operator_api.post(
        JOBS,
        {
            **BASE,
            "target_queue": "NO.SUCH.Q",
            "rules_text": "ACTION(FLY)\n",
            "filter": {"queues": ["NOPE"]},
        },
        format="json",
    )

    assert set(response.json()["field_errors"]) == {"target_queue", "rules_text", "queues"}


def test_a_window_that_ends_before_it_starts_selects_nothing(operator_api):
    """The schema cannot state a rule between two fields, so the API takes
    the window as it is (the console and the command say it is reversed)."""
    window = {"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}

    response = operator_api.post(PREVIEW, {**BASE, "filter": window}, format="json")

    assert (response.status_code, response.json()) == (200, {"count": 0})


def test_a_body_that_is_not_an_object_is_refused(operator_api):
    response = operator_api.post(JOBS, [BASE], format="json")

    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert not ReplayJob.objects.exists()


def test_an_unknown_job_is_404(viewer_api, operator_api):
    for response in (
        viewer_api.get(f"{JOBS}999999/"),
        operator_api.post(f"{JOBS}999999/cancel/"),
        operator_api.post(f"{JOBS}999999/run/"),
    ):
        assert response.status_code == 404
        assert response.json()["code"] == "replay_job_not_found"


def test_a_queued_job_is_cancelled_at_once_and_only_once(operator_api):
    job = submit(operator_api)

    cancelled = operator_api.post(f"{JOBS}{job['id']}/cancel/")
    again = operator_api.post(f"{JOBS}{job['id']}/cancel/")

    assert cancelled.status_code == 200
    assert (cancelled.json()["status"], cancelled.json()["cancel_requested"]) == ("cancelled", True)
    assert again.status_code == 409
    assert again.json()["code"] == "replay_job_busy"
    assert AuditEvent.objects.filter(action="replay_cancel").count() == 1


def test_a_running_job_is_asked_to_stop(operator_api):
    job = submit(operator_api)
    ReplayJob.objects.filter(id=job["id"]).update(
        status=ReplayJobStatus.RUNNING, started_at=timezone.now(), heartbeat_at=timezone.now()
    )

    response = operator_api.post(f"{JOBS}{job['id']}/cancel/")

    assert response.status_code == 200
    assert (response.json()["status"], response.json()["cancel_requested"]) == ("running", True)


def test_a_cancelled_job_runs_again_but_a_queued_or_running_one_does_not(operator_api):
    job = submit(operator_api)
    busy = operator_api.post(f"{JOBS}{job['id']}/run/")
    operator_api.post(f"{JOBS}{job['id']}/cancel/")

    again = operator_api.post(f"{JOBS}{job['id']}/run/")
    ReplayJob.objects.filter(id=job["id"]).update(
        status=ReplayJobStatus.RUNNING, heartbeat_at=timezone.now()
    )
    running = operator_api.post(f"{JOBS}{job['id']}/run/")

    assert (busy.status_code, busy.json()["code"]) == (409, "replay_job_busy")
    assert again.status_code == 200
    assert (again.json()["status"], again.json()["cancel_requested"]) == ("queued", False)
    assert (running.status_code, running.json()["code"]) == (409, "replay_job_busy")


def test_the_list_is_newest_first_in_keyset_pages_and_filters_by_status(operator_api, viewer_api):
    ids = [submit(operator_api)["id"] for _ in range(3)]
    operator_api.post(f"{JOBS}{ids[0]}/cancel/")

    first = viewer_api.get(JOBS, {"page_size": 2}).json()
    second = viewer_api.get(first["next"]).json()
    cancelled = viewer_api.get(JOBS, {"status": "cancelled"}).json()
    both = viewer_api.get(f"{JOBS}?status=cancelled&status=queued").json()

    assert [job["id"] for job in first["results"]] == [ids[2], ids[1]]
    assert [job["id"] for job in second["results"]] == [ids[0]]
    assert second["next"] is None
    assert [job["id"] for job in cancelled["results"]] == [ids[0]]
    assert len(both["results"]) == 3


def test_viewers_read_jobs_but_do_not_submit_preview_cancel_or_run_them(operator_api, viewer_api):
    job = submit(operator_api)

    assert viewer_api.get(JOBS).status_code == 200
    assert viewer_api.get(f"{JOBS}{job['id']}/").status_code == 200
    for response in (
        viewer_api.post(JOBS, BASE, format="json"),
        viewer_api.post(PREVIEW, BASE, format="json"),
        viewer_api.post(f"{JOBS}{job['id']}/cancel/"),
        viewer_api.post(f"{JOBS}{job['id']}/run/"),
    ):
        assert response.status_code == 403
        assert response.json()["code"] == "permission_denied"
    assert ReplayJob.objects.get().status == "queued"


def test_a_user_without_a_role_reads_nothing(outsider_api):
    response = outsider_api.get(JOBS)

    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"


def test_anonymous_gets_401(anonymous_api, db):
    for response in (anonymous_api.get(JOBS), anonymous_api.post(JOBS, BASE, format="json")):
        assert response.status_code == 401
        assert response.json()["code"] == "not_authenticated"
    assert not ReplayJob.objects.exists()


def test_the_schema_documents_replay_jobs_and_generates_without_warnings(
    viewer_api, tmp_path: Path
):
    call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    schema = viewer_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    for path in (
        "/api/v1/replay-jobs/",
        "/api/v1/replay-jobs/preview/",
        "/api/v1/replay-jobs/{job_id}/",
        "/api/v1/replay-jobs/{job_id}/cancel/",
        "/api/v1/replay-jobs/{job_id}/run/",
    ):
        assert path in schema["paths"]
    shapes = schema["components"]["schemas"]["ReplaySpecRequest"]["oneOf"]
    assert [shape["$ref"].rsplit("/", 1)[1] for shape in shapes] == [
        "DeadLetterReplaySpecRequest",
        "OtherSourceReplaySpecRequest",
    ]
    spec = schema["components"]["schemas"]["DeadLetterReplaySpecRequest"]["properties"]
    assert spec["filter"] == {"$ref": "#/components/schemas/ReplayFilterRequest"}
    assert spec["velocity"]["type"] == ["integer", "null"]
    for path in ("/api/v1/replay-jobs/", "/api/v1/replay-jobs/preview/"):
        conflict = schema["paths"][path]["post"]["responses"]["409"]
        assert "`queue_is_not_dead_letter`" in conflict["description"], path
        assert "`queue_is_dead_letter`" in conflict["description"], path
        assert conflict["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }
