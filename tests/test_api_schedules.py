"""The replay-schedules API: create, read, change, pause, resume, run now
and delete schedules, list their jobs; and the given-up marks on a
dead-letter queue's messages. Nothing here runs beat, Spark or a worker: a
firing's job stays queued unless a test moves it on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from django.core.management import call_command
from django_celery_beat.models import PeriodicTask

from broker.models import AuditEvent, Message, ReplayJob, ReplayJobStatus, ReplaySchedule
from broker.services.queues import queue_create
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE as DLQ
from tests.support.messages import dead_lettered
from tests.support.replay import reported

pytestmark = pytest.mark.django_db

SCHEDULES = "/api/v1/replay-schedules/"
BASE = {"name": "nightly", "source": "dead_letter", "source_queue": DLQ, "every_seconds": 3600}
FILTER = {
    "queues": ["ORDERS.IN"],
    "reason": "handler_error",
    "since": "2026-01-01T00:00:00Z",
    "until": None,
    "header": "region=eu",
    "payload_text": "",
}


def create(client, **body) -> dict:
    response = client.post(SCHEDULES, {**BASE, **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def saved() -> tuple[int, int, int]:
    """What a refused request must leave as it was."""
    return (
        ReplaySchedule.objects.count(),
        PeriodicTask.objects.count(),
        AuditEvent.objects.filter(action__startswith="schedule_").count(),
    )


def url(schedule: dict, action: str = "") -> str:
    return f"{SCHEDULES}{schedule['id']}/{action + '/' if action else ''}"


# --- create and read ------------------------------------------------------------------


def test_an_operator_creates_a_cron_schedule_and_reads_it_back(operator_api, orders):
    with time_machine.travel(datetime(2026, 1, 10, 12, 0, tzinfo=UTC), tick=False):
        schedule = create(
            operator_api,
            every_seconds=None,
            cron="0 3 * * *",
            time_zone="Europe/Paris",
            filter=FILTER,
            target_queue="ORDERS.IN",
            rules_text="ACTION(FWD) FWDQ(ORDERS.IN)\n",
            velocity=50,
            cool_off_minutes=30,
            give_up_after=2,
        )
        again = operator_api.get(url(schedule)).json()

    assert again == schedule
    assert (schedule["name"], schedule["source"], schedule["source_queue"]) == (
        "nightly",
        "dead_letter",
        DLQ,
    )
    assert schedule["filter"] == FILTER
    assert (schedule["target_queue"], schedule["velocity"]) == ("ORDERS.IN", 50)
    assert schedule["rules_text"] == "ACTION(FWD) FWDQ(ORDERS.IN)\n"
    assert (schedule["cron"], schedule["time_zone"], schedule["every_seconds"]) == (
        "0 3 * * *",
        "Europe/Paris",
        None,
    )
    assert (schedule["cool_off_minutes"], schedule["give_up_after"]) == (30, 2)
    assert (schedule["enabled"], schedule["last_job"]) == (True, None)
    assert schedule["created_by"] == "oscar"
    # 03:00 in Paris is 02:00 UTC in January.
    assert [at(moment) for moment in schedule["next_firings"]] == [
        datetime(2026, 1, day, 2, 0, tzinfo=UTC) for day in range(11, 16)
    ]
    assert at(schedule["next_firing"]) == datetime(2026, 1, 11, 2, 0, tzinfo=UTC)
    task = PeriodicTask.objects.get(replay_schedule__id=schedule["id"])
    assert (task.enabled, task.crontab.hour, str(task.crontab.timezone)) == (
        True,
        "3",
        "Europe/Paris",
    )
    assert AuditEvent.objects.filter(action="schedule_create", actor_name="oscar").exists()


def test_a_bare_schedule_takes_the_defaults(operator_api):
    with time_machine.travel(datetime(2026, 1, 10, 12, 0, tzinfo=UTC), tick=False):
        schedule = create(operator_api)

    assert schedule["filter"] == {
        "queues": [],
        "reason": "",
        "since": None,
        "until": None,
        "header": "",
        "payload_text": "",
    }
    assert (schedule["target_queue"], schedule["rules_text"], schedule["velocity"]) == (
        "",
        "",
        None,
    )
    assert (schedule["cron"], schedule["every_seconds"]) == ("", 3600)
    assert (schedule["cool_off_minutes"], schedule["give_up_after"]) == (0, 3)
    first = datetime(2026, 1, 10, 13, 0, tzinfo=UTC)
    assert [at(moment) for moment in schedule["next_firings"]] == [
        first + timedelta(hours=k) for k in range(5)
    ]


def test_a_schedule_saved_paused_fires_at_no_time(operator_api):
    schedule = create(operator_api, enabled=False)

    assert (schedule["enabled"], schedule["next_firing"], schedule["next_firings"]) == (
        False,
        None,
        [],
    )
    assert not PeriodicTask.objects.get().enabled


def test_the_list_shows_every_schedule_not_deleted_by_name(operator_api, viewer_api):
    create(operator_api, name="weekly")
    create(operator_api, name="daily", source="blacklist", source_queue="")
    gone = create(operator_api, name="gone")
    operator_api.delete(url(gone))

    listed = viewer_api.get(SCHEDULES).json()

    assert [schedule["name"] for schedule in listed] == ["daily", "weekly"]
    assert listed[0]["source"] == "blacklist"


def test_a_deleted_schedule_is_gone_but_its_jobs_are_still_listed(operator_api):
    schedule = create(operator_api)
    job = operator_api.post(url(schedule, "run")).json()["job"]

    deleted = operator_api.delete(url(schedule))
    shown = operator_api.get(url(schedule))
    jobs = operator_api.get(url(schedule, "jobs")).json()

    assert deleted.status_code == 204
    assert (shown.status_code, shown.json()["code"]) == (404, "schedule_not_found")
    assert shown.json()["detail"] == "Replay schedule 'nightly' was deleted."
    assert [listed["id"] for listed in jobs["results"]] == [job["id"]]
    assert ReplaySchedule.objects.get().deleted_at is not None
    assert not PeriodicTask.objects.filter(enabled=True).exists()


def test_an_unknown_schedule_is_404(viewer_api, operator_api):
    missing = f"{SCHEDULES}999999/"
    for response in (
        viewer_api.get(missing),
        viewer_api.get(f"{missing}jobs/"),
        operator_api.patch(missing, {"name": "x"}, format="json"),
        operator_api.put(missing, BASE, format="json"),
        operator_api.delete(missing),
        operator_api.post(f"{missing}pause/"),
        operator_api.post(f"{missing}resume/"),
        operator_api.post(f"{missing}run/"),
        viewer_api.get(f"{SCHEDULES}99999999999999999999999/"),
    ):
        assert response.status_code == 404, response.json()
        assert response.json()["code"] == "schedule_not_found"


# --- bad input ------------------------------------------------------------------------


BAD = [
    ({"every_seconds": None, "cron": "61 * * * *"}, "cron"),
    ({"every_seconds": None, "cron": "0 24 * * *"}, "cron"),
    ({"every_seconds": None, "cron": "0 9 * * * *"}, "cron"),
    ({"every_seconds": None, "cron": "0 9 * *"}, "cron"),
    ({"every_seconds": None, "cron": ""}, "cron"),
    ({"every_seconds": None}, "cron"),
    ({"every_seconds": None, "cron": "0 0 31 2 *"}, "cron"),
    ({"every_seconds": None, "cron": "-1 * * * *"}, "cron"),
    ({"every_seconds": None, "cron": "1,,2 * * * *"}, "cron"),
    ({"every_seconds": None, "cron": "0\t9 * * *"}, "cron"),
    ({"every_seconds": None, "cron": "9" * 256}, "cron"),
    ({"cron": "0 9 * * *"}, "cron"),
    ({"every_seconds": None, "cron": "0 9 * * *", "time_zone": "Mars/Olympus_Mons"}, "time_zone"),
    ({"every_seconds": None, "cron": "0 9 * * *", "time_zone": "localtime"}, "time_zone"),
    ({"every_seconds": None, "cron": "0 9 * * *", "time_zone": ""}, "time_zone"),
    ({"every_seconds": 0}, "every_seconds"),
    ({"every_seconds": -5}, "every_seconds"),
    ({"every_seconds": 365 * 24 * 3600 + 1}, "every_seconds"),
    ({"every_seconds": 10**40}, "every_seconds"),
    ({"every_seconds": "3600"}, "every_seconds"),
    ({"every_seconds": 1.5}, "every_seconds"),
    ({"give_up_after": 0}, "give_up_after"),
    ({"give_up_after": 101}, "give_up_after"),
    ({"give_up_after": -(10**40)}, "give_up_after"),
    ({"cool_off_minutes": -1}, "cool_off_minutes"),
    ({"cool_off_minutes": 10**40}, "cool_off_minutes"),
    ({"enabled": "yes"}, "enabled"),
    ({"name": ""}, "name"),
    ({"name": "   "}, "name"),
    ({"name": "x" * 101}, "name"),
    ({"name": "nul\x00inside"}, "name"),
    ({"source": "delivered", "source_queue": ""}, "source"),
    ({"source": "archive", "source_queue": ""}, "source"),
    ({"source": "nowhere"}, "source"),
    ({"source_queue": "ORDERS.IN"}, "source_queue"),
    ({"source_queue": "NO.SUCH.Q"}, "source_queue"),
    ({"source_queue": ""}, "source_queue"),
    ({"source": "blacklist"}, "source_queue"),
    ({"target_queue": "NO.SUCH.Q"}, "target_queue"),
    ({"target_queue": DLQ}, "target_queue"),
    ({"filter": {"queues": ["NO.SUCH.Q"]}}, "queues"),
    ({"filter": {"header": "region"}}, "header"),
    ({"rules_text": "ACTION(FLY)\n"}, "rules_text"),
    ({"velocity": 0}, "velocity"),
    ({"dry_run": True}, "dry_run"),
    ({"colour": "red"}, "colour"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_a_bad_schedule_is_400_naming_the_field_and_nothing_is_saved(
    operator_api, orders, body, field
):
    before = saved()

    response = operator_api.post(SCHEDULES, {**BASE, **body}, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid"
    assert field in response.json()["field_errors"], response.json()
    assert saved() == before == (0, 0, 0)


def test_a_queue_that_is_not_there_is_a_400_not_a_404(operator_api):
    """A one-off job naming a missing queue is 404, as a path naming it
    would be; a schedule's queues are checked with the rest of it, and a
    queue deleted later makes its firings skip."""
    response = operator_api.post(
        SCHEDULES,
        {**BASE, "target_queue": "NO.SUCH.Q", "filter": {"queues": ["NOPE"]}},
        format="json",
    )

    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert response.json()["field_errors"] == {
        "target_queue": ["There is no queue named 'NO.SUCH.Q'."],
        "queues": ["There is no queue named 'NOPE'."],
    }


def test_every_problem_the_service_finds_is_reported_at_once(operator_api):
    response = operator_api.post(
        SCHEDULES,
        {
            **BASE,
            "every_seconds": None,
            "cron": "0 9 * * * *",
            "time_zone": "Nowhere/At_All",
            "target_queue": "NO.SUCH.Q",
            "rules_text": "ACTION(FLY)\n",
        },
        format="json",
    )

    assert set(response.json()["field_errors"]) == {
        "cron",
        "time_zone",
        "target_queue",
        "rules_text",
    }


def test_a_name_another_schedule_has_is_409_until_that_one_is_deleted(operator_api):
    first = create(operator_api)
    before = saved()

    taken = operator_api.post(SCHEDULES, {**BASE, "every_seconds": 60}, format="json")
    after_refusal = saved()
    operator_api.delete(url(first))
    again = operator_api.post(SCHEDULES, BASE, format="json")

    assert (taken.status_code, taken.json()["code"]) == (409, "already_exists")
    assert taken.json()["field_errors"] == {"name": ["Another schedule has this name."]}
    assert after_refusal == before
    assert again.status_code == 201


def test_a_body_that_is_not_an_object_is_refused(operator_api):
    response = operator_api.post(SCHEDULES, [BASE], format="json")

    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert saved() == (0, 0, 0)


# --- change ---------------------------------------------------------------------------


def test_a_patch_changes_what_it_names_and_keeps_the_rest(operator_api, orders):
    schedule = create(operator_api, filter=FILTER, give_up_after=5, cool_off_minutes=10)

    response = operator_api.patch(
        url(schedule), {"cron": "*/15 * * * *", "target_queue": "ORDERS.IN"}, format="json"
    )

    changed = response.json()
    assert response.status_code == 200, changed
    assert (changed["cron"], changed["time_zone"], changed["every_seconds"]) == (
        "*/15 * * * *",
        "UTC",
        None,
    )
    assert changed["target_queue"] == "ORDERS.IN"
    assert changed["filter"] == FILTER
    assert (changed["give_up_after"], changed["cool_off_minutes"], changed["name"]) == (
        5,
        10,
        "nightly",
    )
    assert PeriodicTask.objects.get().interval is None
    assert AuditEvent.objects.filter(action="schedule_update").count() == 1


def test_a_patch_of_an_interval_turns_a_cron_schedule_into_an_interval_one(operator_api):
    schedule = create(operator_api, every_seconds=None, cron="0 3 * * *")

    changed = operator_api.patch(url(schedule), {"every_seconds": 600}, format="json").json()

    assert (changed["cron"], changed["every_seconds"]) == ("", 600)


def test_a_patch_replaces_the_filter_whole(operator_api, orders):
    schedule = create(operator_api, filter=FILTER)

    changed = operator_api.patch(
        url(schedule), {"filter": {"reason": "expired"}}, format="json"
    ).json()

    assert changed["filter"] == {
        "queues": [],
        "reason": "expired",
        "since": None,
        "until": None,
        "header": "",
        "payload_text": "",
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"every_seconds": 0}, "every_seconds"),
        ({"every_seconds": None}, "cron"),
        ({"time_zone": "Mars/Olympus_Mons", "cron": "0 1 * * *"}, "time_zone"),
        ({"give_up_after": 0}, "give_up_after"),
        ({"cool_off_minutes": -1}, "cool_off_minutes"),
        ({"source": "blacklist"}, "source_queue"),
        ({"source": "delivered", "source_queue": ""}, "source"),
        ({"source_queue": "ORDERS.IN"}, "source_queue"),
        ({"target_queue": "NO.SUCH.Q"}, "target_queue"),
        ({"name": ""}, "name"),
        ({"dry_run": True}, "dry_run"),
    ],
)
def test_a_bad_patch_is_400_naming_the_field_and_changes_nothing(operator_api, orders, body, field):
    schedule = create(operator_api)
    before = saved()

    response = operator_api.patch(url(schedule), body, format="json")

    assert (response.status_code, response.json()["code"]) == (400, "invalid"), response.json()
    assert field in response.json()["field_errors"], response.json()
    assert saved() == before
    stored = ReplaySchedule.objects.get()
    assert (stored.source, stored.source_queue, stored.target_queue) == ("dead_letter", DLQ, "")
    assert PeriodicTask.objects.get().interval.every == 3600


def test_a_patch_to_a_taken_name_is_409(operator_api):
    create(operator_api, name="first")
    second = create(operator_api, name="second")

    response = operator_api.patch(url(second), {"name": "first"}, format="json")

    assert (response.status_code, response.json()["code"]) == (409, "already_exists")
    assert ReplaySchedule.objects.get(id=second["id"]).name == "second"


def test_a_put_replaces_the_schedule_whole(operator_api, orders):
    schedule = create(operator_api, filter=FILTER, target_queue="ORDERS.IN", enabled=False)

    response = operator_api.put(
        url(schedule),
        {"name": "renamed", "source": "failed", "cron": "0 4 * * mon-fri"},
        format="json",
    )

    replaced = response.json()
    assert response.status_code == 200, replaced
    assert (replaced["name"], replaced["source"], replaced["source_queue"]) == (
        "renamed",
        "failed",
        "",
    )
    assert (replaced["target_queue"], replaced["filter"]["queues"]) == ("", [])
    assert (replaced["cron"], replaced["every_seconds"], replaced["enabled"]) == (
        "0 4 * * mon-fri",
        None,
        True,
    )


def test_a_put_without_a_name_is_400(operator_api):
    schedule = create(operator_api)

    response = operator_api.put(url(schedule), {"source": "failed"}, format="json")

    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert "name" in response.json()["field_errors"]
    assert ReplaySchedule.objects.get().source == "dead_letter"


def test_a_deleted_schedule_is_changed_no_more(operator_api):
    schedule = create(operator_api)
    operator_api.delete(url(schedule))

    for response in (
        operator_api.patch(url(schedule), {"cool_off_minutes": 5}, format="json"),
        operator_api.put(url(schedule), BASE, format="json"),
        operator_api.post(url(schedule, "pause")),
        operator_api.post(url(schedule, "resume")),
        operator_api.post(url(schedule, "run")),
        operator_api.delete(url(schedule)),
    ):
        assert (response.status_code, response.json()["code"]) == (409, "schedule_deleted")
    assert AuditEvent.objects.filter(action="schedule_delete").count() == 1


# --- pause, resume, run now -------------------------------------------------------------


def test_pause_and_resume_switch_its_periodic_task(operator_api):
    schedule = create(operator_api)

    paused = operator_api.post(url(schedule, "pause"))
    task_paused = PeriodicTask.objects.get().enabled
    resumed = operator_api.post(url(schedule, "resume"))

    assert paused.status_code == 200
    assert (paused.json()["enabled"], paused.json()["next_firing"]) == (False, None)
    assert task_paused is False
    assert resumed.status_code == 200
    assert resumed.json()["enabled"] is True
    assert resumed.json()["next_firing"] is not None
    assert PeriodicTask.objects.get().enabled
    assert [event.action for event in AuditEvent.objects.order_by("id")][-2:] == [
        "schedule_pause",
        "schedule_resume",
    ]


def test_run_now_queues_the_schedules_job_and_answers_the_firing(operator_api, orders):
    schedule = create(operator_api, target_queue="ORDERS.IN", give_up_after=2)

    response = operator_api.post(url(schedule, "run"))

    firing = response.json()
    assert response.status_code == 201, firing
    assert (firing["manual"], firing["skipped"]) == (True, "")
    job = firing["job"]
    assert (job["status"], job["source"], job["source_queue"], job["target_queue"]) == (
        "queued",
        "dead_letter",
        DLQ,
        "ORDERS.IN",
    )
    assert (job["dry_run"], job["created_by"]) == (False, "oscar")
    stored = ReplayJob.objects.get(id=job["id"])
    assert (stored.schedule_id, stored.generation_below) == (schedule["id"], 2)
    assert operator_api.get(url(schedule)).json()["last_job"] == {
        "id": job["id"],
        "status": "queued",
        "written": 0,
        "finished_at": None,
    }


def test_run_now_is_refused_while_its_job_runs_or_while_it_is_paused(operator_api):
    schedule = create(operator_api)
    job = operator_api.post(url(schedule, "run")).json()["job"]

    busy = operator_api.post(url(schedule, "run"))
    reported(job["id"], ReplayJobStatus.DONE, (4, 4, 4, 3, 1))
    operator_api.post(url(schedule, "pause"))
    paused = operator_api.post(url(schedule, "run"))

    assert (busy.status_code, busy.json()["code"]) == (409, "schedule_busy")
    assert (paused.status_code, paused.json()["code"]) == (409, "schedule_paused")
    assert ReplayJob.objects.count() == 1
    last = operator_api.get(url(schedule)).json()["last_job"]
    assert (last["status"], last["written"]) == ("done", 3)


def test_its_jobs_are_listed_newest_first_in_pages_and_by_status(operator_api, viewer_api):
    schedule = create(operator_api)
    other = create(operator_api, name="other")
    ids = []
    for _ in range(3):
        ids.append(operator_api.post(url(schedule, "run")).json()["job"]["id"])
        reported(ids[-1], ReplayJobStatus.DONE, (1, 1, 1, 1))
    operator_api.post(url(other, "run"))
    operator_api.post("/api/v1/replay-jobs/", {"source": "blacklist"}, format="json")
    ReplayJob.objects.filter(id=ids[0]).update(status=ReplayJobStatus.FAILED)

    first = viewer_api.get(url(schedule, "jobs"), {"page_size": 2}).json()
    second = viewer_api.get(first["next"]).json()
    failed = viewer_api.get(url(schedule, "jobs"), {"status": "failed"}).json()

    assert [job["id"] for job in first["results"]] == [ids[2], ids[1]]
    assert [job["id"] for job in second["results"]] == [ids[0]]
    assert second["next"] is None
    assert [job["id"] for job in failed["results"]] == [ids[0]]
    assert first["results"][0]["written"] == 1


# --- roles ------------------------------------------------------------------------------


def test_a_viewer_reads_schedules_but_changes_none(operator_api, viewer_api):
    schedule = create(operator_api)
    before = saved()

    assert viewer_api.get(SCHEDULES).status_code == 200
    assert viewer_api.get(url(schedule)).status_code == 200
    assert viewer_api.get(url(schedule, "jobs")).status_code == 200
    for response in (
        viewer_api.post(SCHEDULES, {**BASE, "name": "mine"}, format="json"),
        viewer_api.patch(url(schedule), {"cool_off_minutes": 5}, format="json"),
        viewer_api.put(url(schedule), BASE, format="json"),
        viewer_api.delete(url(schedule)),
        viewer_api.post(url(schedule, "pause")),
        viewer_api.post(url(schedule, "resume")),
        viewer_api.post(url(schedule, "run")),
    ):
        assert (response.status_code, response.json()["code"]) == (403, "permission_denied")
    assert saved() == before
    assert not ReplayJob.objects.exists()


def test_a_user_without_a_role_reads_nothing_and_anonymous_gets_401(
    outsider_api, anonymous_api, db
):
    assert outsider_api.get(SCHEDULES).status_code == 403
    for response in (anonymous_api.get(SCHEDULES), anonymous_api.post(SCHEDULES, BASE)):
        assert (response.status_code, response.json()["code"]) == (401, "not_authenticated")
    assert saved() == (0, 0, 0)


def test_an_admin_may_do_what_an_operator_may(admin_api):
    schedule = create(admin_api)

    assert admin_api.post(url(schedule, "run")).status_code == 201
    assert schedule["created_by"] == "alice"


# --- given up, on the dead-letter queue's messages ----------------------------------------


@pytest.fixture
def generations(orders) -> dict[int, int]:
    """Four dead letters on the system dead-letter queue, of generations 0
    to 3 (a replay's copy of a copy of ...), by id."""
    ids = dead_lettered(orders, 4)
    for generation, message_id in enumerate(ids):
        Message.objects.filter(id=message_id).update(generation=generation)
    return dict(zip(ids, range(4), strict=True))


def test_each_dead_letter_says_which_schedules_gave_up_on_it(operator_api, viewer_api, generations):
    other_dlq = queue_create(name="OTHER.DLQ", kind="dead_letter")
    create(operator_api, name="patient", give_up_after=3)
    create(operator_api, name="hasty", give_up_after=1)
    create(operator_api, name="elsewhere", give_up_after=1, source_queue=other_dlq.name)
    create(operator_api, name="blacklist", give_up_after=1, source="blacklist", source_queue="")

    response = viewer_api.get(f"/api/v1/dead-letter-queues/{DLQ}/messages/")

    assert response.status_code == 200, response.json()
    listed = response.json()["results"]
    assert [message["id"] for message in listed] == sorted(generations, reverse=True)
    by_generation = {message["generation"]: message["given_up_by"] for message in listed}
    assert by_generation == {
        0: [],
        1: ["hasty"],
        2: ["hasty"],
        3: ["hasty", "patient"],
    }
    assert all(message["dead_letter"]["reason"] == "handler_error" for message in listed)
    assert all(message["state"] == "TBDL" for message in listed)


def test_the_dead_letter_list_pages_and_refuses_what_is_no_dead_letter_queue(
    viewer_api, generations
):
    first = viewer_api.get(f"/api/v1/dead-letter-queues/{DLQ}/messages/", {"page_size": 3})
    second = viewer_api.get(first.json()["next"])
    standard = viewer_api.get("/api/v1/dead-letter-queues/ORDERS.IN/messages/")
    missing = viewer_api.get("/api/v1/dead-letter-queues/NO.SUCH.Q/messages/")

    assert [len(page.json()["results"]) for page in (first, second)] == [3, 1]
    assert all(message["given_up_by"] == [] for message in first.json()["results"])
    assert (standard.status_code, standard.json()["code"]) == (404, "queue_not_found")
    assert (missing.status_code, missing.json()["code"]) == (404, "queue_not_found")


# --- the schema -------------------------------------------------------------------------


def test_the_schema_documents_schedules_and_generates_without_warnings(viewer_api, tmp_path: Path):
    call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    schema = viewer_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    paths = schema["paths"]
    assert set(paths[SCHEDULES]) == {"get", "post"}
    assert set(paths["/api/v1/replay-schedules/{schedule_id}/"]) == {
        "get",
        "put",
        "patch",
        "delete",
    }
    for action in ("pause", "resume", "run"):
        assert "post" in paths[f"/api/v1/replay-schedules/{{schedule_id}}/{action}/"]
    assert "get" in paths["/api/v1/replay-schedules/{schedule_id}/jobs/"]
    assert "get" in paths["/api/v1/dead-letter-queues/{name}/messages/"]
    components = schema["components"]["schemas"]
    shapes = components["ReplayScheduleInRequest"]["oneOf"]
    assert [shape["$ref"].rsplit("/", 1)[1] for shape in shapes] == [
        "DeadLetterReplayScheduleInRequest",
        "OtherSourceReplayScheduleInRequest",
    ]
    other = components["OtherSourceReplayScheduleInRequest"]["properties"]
    assert other["source"]["enum"] == ["blacklist", "failed"]
    assert "dry_run" not in other
    patched = components["PatchedReplayScheduleInRequest"]
    assert "required" not in patched
    assert not [name for name, field in patched["properties"].items() if "default" in field]
    assert components["ReplaySchedule"]["properties"]["last_job"]["oneOf"] == [
        {"$ref": "#/components/schemas/LastJob"},
        {"type": "null"},
    ]
    assert "given_up_by" in components["DeadLetterMessage"]["required"]
