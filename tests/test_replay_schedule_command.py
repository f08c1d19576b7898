"""``manage.py replay schedule create|list|pause|resume|run|delete``. No
beat, Spark or worker here: a firing's job stays queued unless a test
moves it on."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError
from django_celery_beat.models import PeriodicTask

from broker.models import AuditEvent, Queue, QueueKind, ReplayJob, ReplayJobStatus, ReplaySchedule
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE as DLQ
from tests.support.replay import reported

pytestmark = pytest.mark.django_db

FROM_DLQ = ("--source", "dead_letter", "--source-queue", DLQ)
HOURLY = ("--every", "3600")


@pytest.fixture(autouse=True)
def system_dead_letter_queue(db: None) -> Queue:
    """The migrations make it, but a transactional test run earlier (they
    flush the database) may have taken it away."""
    queue, _ = Queue.objects.get_or_create(name=DLQ, defaults={"kind": QueueKind.DEAD_LETTER})
    return queue


def schedule(*args: str) -> str:
    out = StringIO()
    call_command("replay", "schedule", *args, stdout=out)
    return out.getvalue()


def refused(*args: str) -> str:
    """The command's error message; it exits 1."""
    with pytest.raises(CommandError) as error:
        schedule(*args)
    assert error.value.returncode == 1
    return str(error.value)


def created(name: str = "nightly", *args: str) -> ReplaySchedule:
    output = schedule("create", "--name", name, *FROM_DLQ, *(args or HOURLY))
    saved = ReplaySchedule.objects.get(name=name, deleted_at__isnull=True)
    assert output.startswith(f"replay schedule {saved.id} ({name}) created: "), output
    return saved


def saved() -> tuple[int, int, int]:
    return (
        ReplaySchedule.objects.count(),
        PeriodicTask.objects.count(),
        AuditEvent.objects.filter(action__startswith="schedule_").count(),
    )


# --- create ---------------------------------------------------------------------------


def test_create_saves_a_cron_schedule_as_asked(orders, operator, tmp_path):
    rules = tmp_path / "route.rules"
    rules.write_text("ACTION(FWD) FWDQ(ORDERS.IN)\n")

    with time_machine.travel(datetime(2026, 1, 10, 12, 0, tzinfo=UTC), tick=False):
        output = schedule(
            "create",
            *("--name", "nightly", *FROM_DLQ),
            *("--queue", "ORDERS.IN", "--reason", "handler_error", "--header", "region=eu"),
            *("--target-queue", "ORDERS.IN", "--rules", str(rules), "--velocity", "25"),
            *("--cron", "0 3 * * *", "--time-zone", "Europe/Paris"),
            *("--cool-off", "30", "--give-up-after", "2", "--user", "oscar"),
        )

    stored = ReplaySchedule.objects.get()
    assert output == (
        f"replay schedule {stored.id} (nightly) created: 0 3 * * * (Europe/Paris), "
        "next firing 2026-01-11T02:00:00+00:00\n"
    )
    assert (stored.source, stored.source_queue, stored.target_queue) == (
        "dead_letter",
        DLQ,
        "ORDERS.IN",
    )
    assert stored.filters == {
        "queues": ["ORDERS.IN"],
        "reason": "handler_error",
        "header": "region=eu",
    }
    assert (stored.rules_text, stored.velocity) == (rules.read_text(), 25)
    assert (stored.cool_off_minutes, stored.give_up_after, stored.created_by) == (30, 2, operator)
    task = stored.periodic_task
    assert task is not None
    assert task.enabled
    assert (task.crontab.minute, task.crontab.hour, str(task.crontab.timezone)) == (
        "0",
        "3",
        "Europe/Paris",
    )
    assert AuditEvent.objects.get(action="schedule_create").actor_name == "oscar"


def test_create_every_so_many_seconds_and_paused(db):
    output = schedule("create", "--name", "quiet", *FROM_DLQ, *HOURLY, "--paused")

    stored = ReplaySchedule.objects.get()
    assert output == f"replay schedule {stored.id} (quiet) created: every 3600 s, paused\n"
    assert stored.periodic_task is not None
    assert (stored.periodic_task.interval.every, stored.enabled) == (3600, False)
    assert (stored.cool_off_minutes, stored.give_up_after, stored.created_by) == (0, 3, None)
    assert AuditEvent.objects.get(action="schedule_create").actor_name == "system"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--cron", "61 * * * *"), "--cron: Not a valid cron line"),
        (("--cron", "0 9 * * * *"), "--cron: A cron line has five fields"),
        (("--cron", "0 0 31 2 *"), "--cron: This cron line names no time that ever comes"),
        (("--cron", "-1 * * * *"), "--cron: Not a valid cron line"),
        ((), "--cron: Give a cron line (five fields) or an interval."),
        (("--cron", "0 9 * * *", *HOURLY), "--cron: Give a cron line or an interval, not both."),
        (
            ("--cron", "0 9 * * *", "--time-zone", "Mars/Olympus_Mons"),
            "--time-zone: 'Mars/Olympus_Mons' is not a time zone",
        ),
        (("--every", "0"), "--every: Give from 1 to 31,536,000 seconds"),
        (("--every", "31536001"), "--every: Give from 1 to 31,536,000 seconds"),
        (("--every", "hourly"), "--every: 'hourly' is not a whole number of seconds."),
        ((*HOURLY, "--give-up-after", "0"), "--give-up-after: Give from 1 to 100 replays."),
        ((*HOURLY, "--give-up-after", "x"), "--give-up-after: 'x' is not a whole number"),
        ((*HOURLY, "--cool-off", "-1"), "--cool-off: Give from 0 to"),
        ((*HOURLY, "--cool-off", "soon"), "--cool-off: 'soon' is not a whole number of minutes."),
        ((*HOURLY, "--target-queue", "NO.SUCH.Q"), "--target-queue: There is no queue named"),
        ((*HOURLY, "--target-queue", DLQ), f"--target-queue: {DLQ} is a dead-letter queue"),
        ((*HOURLY, "--queue", "NOPE"), "--queue: There is no queue named 'NOPE'."),
        ((*HOURLY, "--velocity", "0"), "--velocity: Give from 1 to"),
        ((*HOURLY, "--since", "soon"), "--since: 'soon' is not an ISO 8601 time"),
        ((*HOURLY, "--user", "nobody"), "--user: there is no user named 'nobody'."),
    ],
)
def test_bad_input_is_refused_naming_the_option_and_nothing_is_saved(orders, args, expected):
    message = refused("create", "--name", "nightly", *FROM_DLQ, *args)

    assert expected in message, message
    assert saved() == (0, 0, 0)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--source", "delivered"), "--source: A schedule replays from a dead-letter queue"),
        (("--source", "nowhere"), "--source: Choose one of"),
        (
            ("--source", "dead_letter", "--source-queue", "ORDERS.IN"),
            "--source-queue: ORDERS.IN is not a dead-letter queue.",
        ),
        (
            ("--source", "dead_letter", "--source-queue", "NO.SUCH.Q"),
            "--source-queue: There is no queue named 'NO.SUCH.Q'.",
        ),
        (
            ("--source", "blacklist", "--source-queue", DLQ),
            "--source-queue: Only a dead-letter source names a source queue.",
        ),
        (("--source", "dead_letter"), "--source-queue: Name the dead-letter queue"),
    ],
)
def test_a_source_a_schedule_cannot_read_is_refused(orders, args, expected):
    message = refused("create", "--name", "nightly", *args, *HOURLY)

    assert expected in message, message
    assert saved() == (0, 0, 0)


def test_every_problem_is_listed_at_once_by_option(orders):
    message = refused(
        "create",
        *("--name", "nightly", *FROM_DLQ, "--every", "often", "--give-up-after", "0"),
        *("--target-queue", "NO.SUCH.Q", "--velocity", "fast"),
    )

    assert message.splitlines()[0] == "The replay schedule is not valid."
    assert [line.split(":")[0].strip() for line in message.splitlines()[1:]] == [
        "--target-queue",
        "--velocity",
        "--every",
        "--give-up-after",
    ]
    assert saved() == (0, 0, 0)


def test_a_name_another_schedule_has_is_refused(db):
    created("nightly")

    message = refused("create", "--name", "nightly", *FROM_DLQ, *HOURLY)

    assert message == (
        "A replay schedule named 'nightly' already exists.\n"
        "  --name: Another schedule has this name."
    )
    assert ReplaySchedule.objects.count() == 1


def test_a_missing_name_is_a_usage_error(db):
    with pytest.raises(CommandError, match="--name"):
        schedule("create", *FROM_DLQ, *HOURLY)


# --- list ------------------------------------------------------------------------------


def test_list_shows_each_schedule_with_its_timing_state_next_firing_and_last_job(db):
    assert schedule("list") == "no replay schedules\n"
    with time_machine.travel(datetime(2026, 1, 10, 12, 0, tzinfo=UTC), tick=False):
        nightly = created("nightly", "--cron", "0 3 * * *", "--time-zone", "Europe/Paris")
        hourly = created("hourly", *HOURLY)
        quiet = created("quiet", *HOURLY, "--paused")
        job_id = int(schedule("run", "hourly").split()[-2])
        reported(job_id, ReplayJobStatus.DONE, (5, 5, 5, 4, 1))

        lines = schedule("list").splitlines()

    source = f"dead_letter {DLQ}"
    assert [re.split(r"\s{2,}", line.strip()) for line in lines] == [
        ["ID", "NAME", "SOURCE", "WHEN", "STATE", "NEXT FIRING", "LAST JOB"],
        [
            str(hourly.id),
            "hourly",
            source,
            "every 3600 s",
            "enabled",
            "2026-01-10 13:00",
            f"job {job_id}: done, 4 written",
        ],
        [
            str(nightly.id),
            "nightly",
            source,
            "0 3 * * * (Europe/Paris)",
            "enabled",
            "2026-01-11 02:00",
            "-",
        ],
        [str(quiet.id), "quiet", source, "every 3600 s", "paused", "-", "-"],
    ]


# --- pause, resume, run, delete ---------------------------------------------------------


def test_pause_and_resume_by_name_or_id(operator):
    nightly = created("nightly")

    paused = schedule("pause", "nightly", "--user", "oscar")
    enabled_when_paused = PeriodicTask.objects.get().enabled
    resumed = schedule("resume", str(nightly.id))

    assert paused == "replay schedule nightly paused\n"
    assert enabled_when_paused is False
    assert resumed.startswith("replay schedule nightly resumed: next firing ")
    assert PeriodicTask.objects.get().enabled
    assert AuditEvent.objects.get(action="schedule_pause").actor_name == "oscar"


def test_run_fires_it_now_and_prints_the_job(operator):
    nightly = created("nightly")

    output = schedule("run", "nightly", "--user", "oscar")

    job = ReplayJob.objects.get()
    assert output == f"replay schedule nightly: replay job {job.id} queued\n"
    assert (job.schedule_id, job.status, job.created_by) == (nightly.id, "queued", operator)
    assert nightly.firings.get().manual


def test_run_is_refused_while_its_job_runs_and_while_it_is_paused(db):
    created("nightly")
    schedule("run", "nightly")

    busy = refused("run", "nightly")
    ReplayJob.objects.update(status=ReplayJobStatus.DONE)
    schedule("pause", "nightly")
    paused = refused("run", "nightly")

    assert "two jobs of one schedule never run at once" in busy
    assert "is paused; resume it to run it" in paused
    assert ReplayJob.objects.count() == 1


def test_delete_stops_it_for_good_and_frees_its_name(db):
    nightly = created("nightly")
    schedule("run", "nightly")

    output = schedule("delete", "nightly")
    again = refused("delete", str(nightly.id))
    by_name = refused("pause", "nightly")
    renewed = created("nightly")

    assert output == "replay schedule nightly deleted (its jobs stay)\n"
    assert again == "Replay schedule 'nightly' was deleted."
    assert by_name == "There is no replay schedule named 'nightly'."
    assert ReplayJob.objects.get().schedule_id == nightly.id
    assert renewed.id != nightly.id
    assert [line.split()[1] for line in schedule("list").splitlines()[1:]] == ["nightly"]


def test_an_unknown_schedule_is_refused(db):
    assert refused("run", "nobody") == "There is no replay schedule named 'nobody'."
    assert refused("pause", "999999") == "There is no replay schedule 999999."
