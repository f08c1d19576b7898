"""``manage.py replay`` and ``manage.py archive``. Spark is not run here: a
job stays queued, and ``--wait`` and ``archive run`` are shown calling
through to workers.pipeline with stand-ins for the driver."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from broker.models import AuditEvent, Message, Queue, QueueKind, ReplayJob, ReplayJobStatus
from broker.pipeline.archive_reads import SCHEMA
from broker.pipeline.replay import replay_run_finish, replay_run_progress, replay_run_start
from tests.support.messages import dead_lettered
from tests.support.replay import reported

pytestmark = pytest.mark.django_db

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
FROM_DLQ = ("--source", "dead_letter", "--source-queue", DLQ)


@pytest.fixture(autouse=True)
def system_dead_letter_queue(db: None) -> Queue:
    """The migrations make it, but a transactional test run earlier (they
    flush the database) may have taken it away."""
    queue, _ = Queue.objects.get_or_create(name=DLQ, defaults={"kind": QueueKind.DEAD_LETTER})
    return queue


def replay(*args: str) -> str:
    out = StringIO()
    call_command("replay", *args, stdout=out)
    return out.getvalue()


def refused(*args: str) -> str:
    """The command's error message; it exits 1."""
    with pytest.raises(CommandError) as error:
        replay(*args)
    assert error.value.returncode == 1
    return str(error.value)


def submitted(*args: str) -> ReplayJob:
    output = replay("submit", *FROM_DLQ, *args)
    job = ReplayJob.objects.latest("id")
    assert output.startswith(f"replay job {job.id} queued"), output
    return job


# --- submit ----------------------------------------------------------------------


def test_submit_queues_a_job_as_asked(orders, operator, tmp_path: Path):
    rules = tmp_path / "route.rules"
    rules.write_text("ACTION(FWD) FWDQ(ORDERS.IN)\n")

    job = submitted(
        *("--queue", "ORDERS.IN", "--reason", "handler_error"),
        *("--since", "2026-01-01T00:00:00Z", "--until", "2026-02-01T12:00:00+01:00"),
        *("--header", "region=eu", "--payload-text", "invoice 42"),
        *("--target-queue", "ORDERS.IN", "--rules", str(rules), "--velocity", "25"),
        *("--dry-run", "--user", "oscar"),
    )

    assert (job.source, job.source_queue, job.target_queue) == ("dead_letter", DLQ, "ORDERS.IN")
    assert job.filters == {
        "queues": ["ORDERS.IN"],
        "reason": "handler_error",
        "since": "2026-01-01T00:00:00+00:00",
        "until": "2026-02-01T12:00:00+01:00",
        "header": "region=eu",
        "payload_text": "invoice 42",
    }
    assert (job.rules_text, job.velocity, job.dry_run) == (rules.read_text(), 25, True)
    assert (job.status, job.created_by) == ("queued", operator)
    assert AuditEvent.objects.get(action="replay_submit").actor_name == "oscar"


def test_a_time_without_an_offset_is_local_time(settings):
    settings.TIME_ZONE = "Europe/Paris"

    job = submitted("--since", "2026-01-01T00:00")

    assert job.filters["since"] == "2026-01-01T00:00:00+01:00"


def test_submit_without_a_user_is_the_systems(db):
    job = submitted()

    assert job.created_by is None
    assert AuditEvent.objects.get(action="replay_submit").actor_name == "system"


def test_a_dry_run_says_so(db):
    assert replay("submit", *FROM_DLQ, "--dry-run").endswith("queued (dry run)\n")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--velocity", "abc"), "--velocity: 'abc' is not a whole number"),
        (("--velocity", "1.5"), "--velocity: '1.5' is not a whole number"),
        (("--velocity", "0"), "--velocity: Give from 1 to"),
        (("--velocity", "-1"), "--velocity: Give from 1 to"),
        (("--since", "last tuesday"), "--since: 'last tuesday' is not an ISO 8601 time"),
        (("--until", "2026-13-01"), "--until: '2026-13-01' is not an ISO 8601 time"),
        (
            ("--since", "2026-02-01T00:00Z", "--until", "2026-01-01T00:00Z"),
            "--until: The time range ends before it starts.",
        ),
        (("--queue", "NO.SUCH.Q"), "--queue: There is no queue named 'NO.SUCH.Q'."),
        (("--target-queue", "NO.SUCH.Q"), "--target-queue: There is no queue named 'NO.SUCH.Q'."),
        (("--target-queue", DLQ), f"--target-queue: {DLQ} is a dead-letter queue"),
        (("--header", "region"), "--header: Write the header filter as name=value."),
        (("--payload-text", "x" * 1001), "--payload-text: At most 1000 characters."),
        (("--user", "nobody"), "--user: there is no user named 'nobody'."),
        (("--rules", "/no/such/file.rules"), "--rules: cannot read /no/such/file.rules"),
    ],
)
def test_bad_input_is_refused_naming_the_option_and_nothing_is_written(orders, args, expected):
    assert expected in refused("submit", *FROM_DLQ, *args)
    assert not ReplayJob.objects.exists()
    assert not AuditEvent.objects.filter(action="replay_submit").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--source", "nowhere"), "--source: Choose one of dead_letter, blacklist"),
        (("--source", "dead_letter"), "--source-queue: Name the dead-letter queue"),
        (
            ("--source", "dead_letter", "--source-queue", "NO.SUCH.Q"),
            "--source-queue: There is no queue named 'NO.SUCH.Q'.",
        ),
        (
            ("--source", "dead_letter", "--source-queue", "ORDERS.IN"),
            "--source-queue: ORDERS.IN is not a dead-letter queue.",
        ),
        (
            ("--source", "blacklist", "--source-queue", DLQ),
            "--source-queue: Only a dead-letter source names a source queue.",
        ),
    ],
)
def test_a_bad_source_is_refused(orders, args, expected):
    assert expected in refused("submit", *args)
    assert not ReplayJob.objects.exists()


def test_a_missing_source_is_a_usage_error(db):
    with pytest.raises(CommandError, match="--source"):
        replay("submit")


def test_rules_errors_are_listed_with_their_lines(tmp_path: Path):
    rules = tmp_path / "bad.rules"
    rules.write_text("ACTION(FLY)\n* fine\nACTION(DISCARD) HEADER(NO)\n")

    message = refused("submit", *FROM_DLQ, "--rules", str(rules))

    lines = [line for line in message.splitlines() if line.startswith(f"  --rules {rules}: ")]
    assert [line.split(": ")[1].split(",")[0] for line in lines] == ["line 1", "line 3"]
    assert all(", column " in line for line in lines)
    assert message.splitlines()[0] == "The replay job is not valid."
    assert not ReplayJob.objects.exists()


def test_every_problem_is_listed_at_once(tmp_path: Path):
    message = refused(
        "submit",
        *FROM_DLQ,
        *("--velocity", "fast", "--since", "soon", "--target-queue", "NO.SUCH.Q"),
        *("--queue", "NOPE"),
    )

    assert [line.split(":")[0].strip() for line in message.splitlines()[1:]] == [
        "--queue",
        "--since",
        "--target-queue",
        "--velocity",
    ]


# --- status, cancel, run, list ------------------------------------------------------


def test_status_shows_a_jobs_progress_counts_and_error(orders):
    job = submitted("--queue", "ORDERS.IN", "--velocity", "10")
    reported(
        job.id,
        ReplayJobStatus.FAILED,
        (10, 10, 8, 4, 1, 0),
        per_target={"ORDERS.IN": 4},
        per_rule={"1": 3, "none": 1},
        spark_app_id="local-1234",
        runs=1,
        error="the Spark driver was killed by signal SIGKILL",
    )

    output = replay("status", str(job.id))

    assert output.startswith(f"replay job {job.id}\n")
    assert "  status      failed, 70%\n" in output
    assert f"  source      dead_letter {DLQ}\n" in output
    assert "  filter      queues=ORDERS.IN\n" in output
    assert "  target      original queues\n" in output
    assert "  velocity    10 a second\n" in output
    assert "  counts      total 10, read 10, matched 8, written 4, skipped 1, failed 0\n" in output
    assert "  per target  ORDERS.IN 4\n" in output
    assert "  per rule    1 3, none 1\n" in output
    assert "  spark app   local-1234\n" in output
    assert "  error       the Spark driver was killed by signal SIGKILL\n" in output


def test_status_of_an_unknown_job_is_refused(db):
    assert refused("status", "999999") == "There is no replay job 999999."


def test_a_queued_job_is_cancelled_once(operator):
    job = submitted()

    output = replay("cancel", str(job.id), "--user", "oscar")

    assert output == f"replay job {job.id} cancelled\n"
    assert ReplayJob.objects.get(id=job.id).status == "cancelled"
    assert AuditEvent.objects.get(action="replay_cancel").actor_name == "oscar"
    assert "has already finished (cancelled)" in refused("cancel", str(job.id))


def test_a_running_job_is_asked_to_stop(db):
    job = submitted()
    ReplayJob.objects.filter(id=job.id).update(status=ReplayJobStatus.RUNNING)

    output = replay("cancel", str(job.id))

    assert "cancel requested" in output
    assert ReplayJob.objects.get(id=job.id).cancel_requested


def test_run_queues_a_finished_job_again_but_not_a_queued_one(db):
    job = submitted()
    busy = refused("run", str(job.id))
    replay("cancel", str(job.id))

    output = replay("run", str(job.id))

    assert "is queued; wait for it or cancel it" in busy
    assert output == f"replay job {job.id} queued again\n"
    assert ReplayJob.objects.get(id=job.id).status == "queued"
    assert refused("run", "999999") == "There is no replay job 999999."


def test_list_shows_the_latest_jobs_newest_first(orders, operator):
    assert replay("list") == "no replay jobs\n"
    first = submitted("--user", "oscar")
    second = submitted("--target-queue", "ORDERS.IN", "--dry-run")

    lines = replay("list").splitlines()
    only_one = replay("list", "--limit", "1").splitlines()

    assert lines[0].split() == [
        "ID",
        "STATUS",
        "%",
        "SOURCE",
        "TARGET",
        "WRITTEN",
        "SUBMITTED",
        "BY",
    ]
    assert [int(line.split()[0]) for line in lines[1:]] == [second.id, first.id]
    assert "ORDERS.IN" in lines[1]
    assert "dry run" in lines[1]
    assert lines[1].endswith("system")
    assert lines[2].endswith("oscar")
    assert len(only_one) == 2
    assert "--limit" in refused("list", "--limit", "0")


# --- --wait ------------------------------------------------------------------------


def driver_stand_in(status: str = ReplayJobStatus.DONE, error: str = ""):
    """Does what the Spark driver reports, through the same service calls."""
    calls: list[int] = []

    def launch(job_id: int, *, watch: Callable[[ReplayJob], None] | None = None) -> ReplayJob:
        calls.append(job_id)
        assert replay_run_start(job_id=job_id, pid=4711) is not None
        for step in (1, 3):
            replay_run_progress(
                job_id=job_id,
                total=3,
                read=step,
                matched=step,
                written=step,
                per_target={"ORDERS.IN": step},
                spark_app_id="local-42",
            )
            if watch is not None:
                watch(ReplayJob.objects.get(id=job_id))
        return replay_run_finish(job_id=job_id, status=status, error=error)

    launch.calls = calls  # type: ignore[attr-defined]
    return launch


def test_submit_wait_runs_the_job_here_and_prints_how_it_ended(orders, monkeypatch):
    launch = driver_stand_in()
    monkeypatch.setattr("workers.pipeline.replay_job_launch", launch)

    output = replay("submit", *FROM_DLQ, "--wait")

    job = ReplayJob.objects.get()
    assert launch.calls == [job.id]
    assert job.status == "done"
    assert f"replay job {job.id} queued\n" in output
    assert "  status      done, 100%\n" in output
    assert "  counts      total 3, read 3, matched 3, written 3, skipped 0, failed 0\n" in output
    assert "  spark app   local-42\n" in output


def test_wait_with_progress_draws_a_bar_of_settled_rows_with_the_counts(orders, monkeypatch):
    monkeypatch.setattr("workers.pipeline.replay_job_launch", driver_stand_in())
    err = StringIO()

    call_command(
        "replay", "submit", *FROM_DLQ, "--wait", "--progress", stdout=StringIO(), stderr=err
    )

    job = ReplayJob.objects.get()
    bar = err.getvalue()
    assert f"replay job {job.id}:  33%" in bar
    assert f"replay job {job.id}: 100%" in bar
    assert "3/3" in bar
    assert "written=3, skipped=0, failed=0" in bar


def test_without_a_terminal_the_bar_stays_off_unless_asked(orders, monkeypatch):
    monkeypatch.setattr("workers.pipeline.replay_job_launch", driver_stand_in())
    err = StringIO()

    call_command("replay", "submit", *FROM_DLQ, "--wait", stdout=StringIO(), stderr=err)

    assert err.getvalue() == ""


def test_submit_wait_exits_non_zero_when_the_job_fails(orders, monkeypatch):
    monkeypatch.setattr(
        "workers.pipeline.replay_job_launch",
        driver_stand_in(ReplayJobStatus.FAILED, "JDBC connection refused"),
    )

    message = refused("submit", *FROM_DLQ, "--wait")

    job = ReplayJob.objects.get()
    assert message == f"replay job {job.id} failed: JDBC connection refused"


def test_run_wait_runs_the_job_again_here(orders, monkeypatch):
    job = submitted()
    replay("cancel", str(job.id))
    launch = driver_stand_in()
    monkeypatch.setattr("workers.pipeline.replay_job_launch", launch)

    output = replay("run", str(job.id), "--wait")

    assert launch.calls == [job.id]
    assert "  status      done, 100%\n" in output
    assert ReplayJob.objects.get(id=job.id).runs == 1


def test_interrupting_a_wait_cancels_the_job(db, monkeypatch):
    def interrupted(job_id: int, **kwargs: Any) -> ReplayJob:
        raise KeyboardInterrupt

    monkeypatch.setattr("workers.pipeline.replay_job_launch", interrupted)

    message = refused("submit", *FROM_DLQ, "--wait")

    job = ReplayJob.objects.get()
    assert message.startswith(f"interrupted: cancel requested for replay job {job.id}")
    assert (job.status, job.cancel_requested) == ("cancelled", True)


def test_a_dead_lettered_message_is_not_touched_by_a_submit(orders):
    ids = dead_lettered(orders, 2)

    submitted("--queue", "ORDERS.IN")

    assert ReplayJob.objects.get().status == "queued"
    assert Message.objects.filter(id__in=ids, queue__name=DLQ, state="TBDL").count() == 2


# --- manage.py archive --------------------------------------------------------------


def archive(*args: str) -> str:
    out = StringIO()
    call_command("archive", *args, stdout=out)
    return out.getvalue()


def test_archive_run_calls_the_archive_job(monkeypatch):
    monkeypatch.setattr("workers.pipeline.archive_launch", lambda **kwargs: 0)

    assert archive("run") == "archive run finished\n"


def test_archive_run_with_progress_counts_the_messages_archived(monkeypatch):
    def launch(*, watch: Callable[[int], None]) -> int:
        for rows in (5_000, 12_000):
            watch(rows)
        return 0

    monkeypatch.setattr("workers.pipeline.archive_launch", launch)
    err = StringIO()

    call_command("archive", "run", "--progress", stdout=StringIO(), stderr=err)

    assert "archived: 12000msg" in err.getvalue()


@pytest.mark.parametrize(
    ("code", "expected"),
    [(3, "its Spark driver exited with status 3"), (-9, "killed by signal SIGKILL")],
)
def test_archive_run_fails_when_its_driver_does(monkeypatch, code, expected):
    monkeypatch.setattr("workers.pipeline.archive_launch", lambda **kwargs: code)

    with pytest.raises(CommandError, match=expected):
        archive("run")


@pytest.fixture
def archived(settings, tmp_path: Path) -> list[int]:
    """Three archived messages of ORDERS.IN, one of them dead-lettered once."""
    settings.ARCHIVE_DIR = str(tmp_path / "archive")
    day = tmp_path / "archive" / "queue=ORDERS.IN" / "day=2026-01-05"
    day.mkdir(parents=True)
    at = [datetime(2026, 1, 5, hour, tzinfo=UTC) for hour in (9, 10, 11)]
    rows: dict[str, list[Any]] = {
        "id": [101, 102, 103],
        "state": ["DLVD", "DLVD", "FAIL"],
        "payload": [b'{"order": 1}', b"x" * 500, b"\xff\xfe"],
        "content_type": ["application/json", "text/plain", "application/octet-stream"],
        "headers": ["{}", "{}", "{}"],
        "priority": [4, 4, 4],
        "attempts": [1, 1, 3],
        "crash_count": [0, 0, 0],
        "timeout_count": [0, 0, 0],
        "dead_letter": [None, None, '{"reason": "handler_error"}'],
        "last_error": ["", "", "boom"],
        "put_application": ["api", "api", "api"],
        "put_user": ["oscar", "oscar", "oscar"],
        "created_at": at,
        "updated_at": at,
        "replay_job_id": [None, None, None],
        "replay_source_id": [None, None, None],
    }
    pq.write_table(pa.table(rows, schema=SCHEMA), day / "part-0.parquet")
    return rows["id"]


def test_archive_search_prints_a_queues_messages_newest_first(archived):
    lines = archive("search", "--queue", "ORDERS.IN").splitlines()

    assert lines[0].split() == ["ID", "STATE", "PUBLISHED", "BYTES", "REASON", "PAYLOAD"]
    assert [int(line.split()[0]) for line in lines[1:]] == [103, 102, 101]
    assert lines[1].split()[1:5] == ["FAIL", "2026-01-05T11:00:00+00:00", "2", "handler_error"]
    assert lines[2].endswith("x" * 60 + "…")
    assert lines[3].endswith('{"order": 1}')


def test_archive_search_pages_and_filters_by_time(archived):
    first = archive("search", "--queue", "ORDERS.IN", "--limit", "2").splitlines()
    rest = archive("search", "--queue", "ORDERS.IN", "--before", "102").splitlines()
    window = archive(
        "search",
        "--queue",
        "ORDERS.IN",
        "--since",
        "2026-01-05T10:00Z",
        "--until",
        "2026-01-05T11:00Z",
    ).splitlines()

    assert first[-1] == "more: --before 102"
    assert [int(line.split()[0]) for line in rest[1:]] == [101]
    assert [int(line.split()[0]) for line in window[1:]] == [102]


def test_archive_search_says_when_nothing_is_found(archived):
    assert archive("search", "--queue", "PAYROLL.IN") == (
        "no archived messages of PAYROLL.IN in that range\n"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--since", "soon"), "--since: 'soon' is not an ISO 8601 time"),
        (("--limit", "0"), "--limit: Give 1 to 500."),
        (("--limit", "501"), "--limit: Give 1 to 500."),
    ],
)
def test_archive_search_refuses_bad_input_naming_the_option(archived, args, expected):
    with pytest.raises(CommandError, match=expected):
        archive("search", "--queue", "ORDERS.IN", *args)
