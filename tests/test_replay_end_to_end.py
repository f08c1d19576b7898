"""Replay jobs end to end: real Spark drivers (clients of a local Spark
Connect server, and for some tests drivers of their own in local mode)
reading and writing the test database over JDBC, launched as the pipeline
launches them; delivery by real Celery workers."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import QuerySet

from broker.errors import InvalidInput
from broker.models import (
    AuditEvent,
    Message,
    MessageState,
    Queue,
    ReplayJob,
    ReplayJobStatus,
)
from broker.pipeline.replay import replay_job_cancel, replay_job_run_again, replay_job_submit
from broker.pipeline.selection import MessageSelection, ReplaySpec, window_problem
from broker.pipeline.selectors import replayed_from, replays_of
from broker.selectors import queue_depths
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from rig.processes import wait_until
from tests.conftest import SPARK_MODES
from tests.support.messages import claimed, dead_lettered, quarantined
from tests.support.replay import copies_per_source, launched_in_background
from workers.pipeline import replay_job_launch
from workers.spark.replay import KILL_AFTER_WRITE

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
S = MessageState

# Every test runs its jobs on the session's Spark Connect server; those
# marked ``both_modes`` run them with a driver of their own too (classic).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("spark_env")]
both_modes = pytest.mark.parametrize("spark_mode", SPARK_MODES, indirect=True)


def on(queue: str, state: str = S.TO_BE_DELIVERED) -> int:
    return Message.objects.filter(queue__name=queue, state=state).count()


def submit(**values: Any) -> ReplayJob:
    values.setdefault("source", "dead_letter")
    if values["source"] == "dead_letter":
        values.setdefault("source_queue", DLQ)
    return replay_job_submit(spec=ReplaySpec(**values), actor=None)


def run(job: ReplayJob) -> ReplayJob:
    return replay_job_launch(job.id)


def copies_of(job: ReplayJob) -> QuerySet[Message]:
    return Message.objects.filter(replay_job_id=job.id)


@both_modes
def test_10000_dead_lettered_messages_go_back_once_and_are_delivered(start_workers):
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 10_000)
    Queue.objects.filter(id=orders.id).update(consumer="log")
    workers = start_workers(pipeline=True, **{k: os.environ[k] for k in ("ARCHIVE_DIR",)})

    # Submitted as the console and the API submit: a pipeline worker launches it.
    job = submit()
    job = wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, status=ReplayJobStatus.DONE).first(),
        timeout=180,
        what=f"replay job to finish; pipeline log:\n{workers.log('pipeline')[-3000:]}",
    )
    assert (job.read, job.matched, job.written, job.skipped, job.failed) == (
        10_000,
        10_000,
        10_000,
        0,
        0,
    )
    assert job.per_target == {"ORDERS.IN": 10_000}
    assert job.spark_app_id.startswith("local-")
    wait_until(lambda: on("ORDERS.IN", S.DELIVERED) == 10_000, timeout=120, what="deliveries")
    # The sources stay where they were, each with exactly one copy.
    assert on(DLQ) == 10_000
    assert set(copies_per_source(job).values()) == {1}
    assert set(copies_per_source(job)) == set(sources)
    depths = queue_depths(queue_ids=[orders.id])[orders.id]
    assert depths.get(S.DELIVERED) == 10_000

    # Run again: the pipeline worker takes it up, and writes nothing new.
    replay_job_run_again(job_id=job.id, actor=None)
    job = wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, status=ReplayJobStatus.DONE, runs=2).first(),
        timeout=180,
        what="the second run",
    )
    assert (job.written, job.skipped) == (0, 10_000)
    assert Message.objects.filter(queue=orders).count() == 10_000
    assert list(
        AuditEvent.objects.filter(action="replay_finish", details__job=job.id)
        .order_by("id")
        .values_list("details__written", flat=True)
    ) == [10_000, 0]


def test_a_driver_killed_midway_then_run_again_completes_without_duplicates():
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 3000)
    # 1,000 a second: the kill lands while copies are being written.
    job = submit(velocity=1000)
    thread, ended = launched_in_background(job)
    running = wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, written__gt=0).first(),
        timeout=120,
        what="the first copies",
    )
    assert running.written < 3000
    assert running.driver_pid is not None
    os.killpg(os.getpgid(running.driver_pid), signal.SIGKILL)
    thread.join(timeout=60)

    killed = ended["job"]
    assert killed.status == ReplayJobStatus.FAILED
    assert "SIGKILL" in killed.error
    assert 0 < on("ORDERS.IN") < 3000

    replay_job_run_again(job_id=job.id, actor=None)
    job = run(job)
    assert job.status == ReplayJobStatus.DONE
    assert job.written + killed.written == 3000
    assert job.skipped == killed.written
    assert on("ORDERS.IN") == 3000
    assert copies_per_source(job) == Counter(dict.fromkeys(sources, 1))


def test_a_driver_killed_right_after_a_write_leaves_counts_that_add_up(
    monkeypatch: pytest.MonkeyPatch,
):
    orders = queue_create(name="ORDERS.IN", consumer="")
    dead_lettered(orders, 300)
    job = submit(velocity=100)
    monkeypatch.setenv(KILL_AFTER_WRITE, "1")

    killed = run(job)

    assert killed.status == ReplayJobStatus.FAILED
    assert "SIGKILL" in killed.error
    assert (killed.written, on("ORDERS.IN")) == (100, 100)
    monkeypatch.delenv(KILL_AFTER_WRITE)
    replay_job_run_again(job_id=job.id, actor=None)
    again = run(job)
    assert (again.status, again.written, again.skipped) == (ReplayJobStatus.DONE, 200, 100)
    audited = AuditEvent.objects.filter(action="replay_finish", details__job=job.id)
    assert sorted(event.details["written"] for event in audited) == [100, 200]
    assert on("ORDERS.IN") == 300


@both_modes
def test_cancel_stops_the_driver_and_leaves_what_was_written():
    orders = queue_create(name="ORDERS.IN", consumer="")
    dead_lettered(orders, 3000)
    job = submit(velocity=500)
    thread, ended = launched_in_background(job)
    wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, written__gt=0).exists(),
        timeout=120,
        what="the first copies",
    )
    replay_job_cancel(job_id=job.id, actor=None)
    thread.join(timeout=60)
    cancelled = ended["job"]
    assert cancelled.status == ReplayJobStatus.CANCELLED
    written = on("ORDERS.IN")
    assert 0 < written < 3000
    assert copies_of(job).count() == written
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM broker_replaystage WHERE job_id = %s", [job.id])
        assert cursor.fetchone() == (0,)


RULES = """
* Handler errors of ORDERS.IN go back; format errors go to REPAIR; other
* queues' messages from the app 'legacy' are discarded.
REASON(LZRC_HANDLER_ERROR) DESTQ(ORDERS.IN) ACTION(RETRY)
REASON(MQRC_FORMAT_ERROR) ACTION(FWD) FWDQ(REPAIR) HEADER(NO)
APPLNAME('legacy') ACTION(DISCARD)
"""


def _mixed() -> dict[str, list[int]]:
    orders = queue_create(name="ORDERS.IN", consumer="")
    billing = queue_create(name="BILLING.IN", consumer="")
    queue_create(name="REPAIR", consumer="")
    return {
        "orders_handler": dead_lettered(orders, 30),
        "orders_format": dead_lettered(orders, 20, reason="format_error"),
        "billing_handler": dead_lettered(billing, 10),
        "billing_expired": dead_lettered(billing, 5, reason="expired"),
    }


def _mixed_in_ranges(times: int) -> None:
    """``times`` rounds of _mixed's sources, so that each id range of a job
    has sources of every kind."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    billing = queue_create(name="BILLING.IN", consumer="")
    queue_create(name="REPAIR", consumer="")
    for _ in range(times):
        dead_lettered(orders, 30)
        dead_lettered(orders, 20, reason="format_error")
        dead_lettered(billing, 10)
        dead_lettered(billing, 5, reason="expired")


COUNTED_SQL = """
SELECT j.written, j.skipped, j.read, j.status,
       (SELECT count(*) FROM broker_message AS m WHERE m.replay_job_id = j.id)
FROM broker_replayjob AS j WHERE j.id = %s
"""


def test_overlapping_writes_commit_in_order_with_counts_that_add_up_at_every_moment(
    monkeypatch: pytest.MonkeyPatch,
):
    """Ranges of 200: the driver writes two at once. Seen in one snapshot,
    the job's written always equals its copies, and no count goes back."""
    _mixed_in_ranges(10)
    monkeypatch.setenv("LAZARETTO_REPLAY_SLICE_ROWS", "200")
    job = submit(rules_text=RULES)
    thread, ended = launched_in_background(job)
    seen: list[tuple[Any, ...]] = []
    with connection.cursor() as cursor:
        while thread.is_alive():
            cursor.execute(COUNTED_SQL, [job.id])
            seen.append(cursor.fetchone())
            time.sleep(0.005)
    thread.join()

    done = ended["job"]
    assert done.status == ReplayJobStatus.DONE, done.error
    assert (done.read, done.matched, done.written, done.skipped, done.failed) == (
        650,
        650,
        500,
        150,
        0,
    )
    assert done.per_target == {"ORDERS.IN": 300, "REPAIR": 200}
    assert done.per_rule == {"1": 300, "2": 200, "0": 150}
    assert set(copies_per_source(done).values()) == {1}
    assert all(written == copies for written, _, _, _, copies in seen)
    for before, after in itertools.pairwise(seen):
        assert all(now >= then for now, then in zip(after[:3], before[:3], strict=True))
    assert len({written for written, *_ in seen}) > 2, "the job wrote in one go"


def test_a_driver_killed_right_after_a_write_while_the_next_is_under_way_adds_up(
    monkeypatch: pytest.MonkeyPatch,
):
    _mixed_in_ranges(10)
    monkeypatch.setenv("LAZARETTO_REPLAY_SLICE_ROWS", "200")
    monkeypatch.setenv(KILL_AFTER_WRITE, "1")
    job = submit(rules_text=RULES)

    killed = run(job)

    assert killed.status == ReplayJobStatus.FAILED
    assert 0 < killed.written == copies_of(job).count() < 500
    monkeypatch.delenv(KILL_AFTER_WRITE)
    replay_job_run_again(job_id=job.id, actor=None)
    again = run(job)
    assert again.status == ReplayJobStatus.DONE, again.error
    assert again.written + killed.written == 500
    assert set(copies_per_source(job).values()) == {1}
    assert copies_of(job).count() == 500
    audited = AuditEvent.objects.filter(action="replay_finish", details__job=job.id)
    assert sum(event.details["written"] for event in audited) == 500


@both_modes
def test_a_dry_run_writes_nothing_and_counts_what_the_real_run_then_writes():
    _mixed()
    before = Message.objects.count()
    dry = run(submit(rules_text=RULES, dry_run=True))
    assert dry.status == ReplayJobStatus.DONE
    assert Message.objects.count() == before
    assert not Message.objects.filter(replay_job_id__isnull=False).exists()
    assert dry.per_target == {"ORDERS.IN": 30, "REPAIR": 20}
    assert dry.per_rule == {"1": 30, "2": 20, "0": 15}
    assert (dry.read, dry.matched, dry.written, dry.skipped) == (65, 65, 50, 15)
    assert len(dry.sample) == 10
    assert {row["target"] for row in dry.sample} <= {"ORDERS.IN", "REPAIR"}

    real = run(submit(rules_text=RULES))
    assert (real.per_target, real.per_rule) == (dry.per_target, dry.per_rule)
    assert (real.read, real.matched, real.written, real.skipped, real.failed) == (
        dry.read,
        dry.matched,
        dry.written,
        dry.skipped,
        dry.failed,
    )
    assert on("ORDERS.IN") == 30
    repaired = Message.objects.filter(queue__name="REPAIR")
    assert repaired.count() == 20
    assert set(repaired.values_list("dead_letter", flat=True)) == {None}  # HEADER(NO)


def test_filters_pick_by_queue_reason_time_header_and_payload():
    orders = queue_create(name="ORDERS.IN", consumer="")
    queue_create(name="SPARE", consumer="")
    tagged = dead_lettered(orders, 4, region="eu")
    dead_lettered(orders, 6, region="us")
    job = run(
        submit(
            filter=MessageSelection(
                queues=("ORDERS.IN",), reason="handler_error", header="region=eu"
            ),
            target_queue="SPARE",
        )
    )
    assert (job.read, job.matched, job.written) == (10, 4, 4)
    assert copies_per_source(job) == Counter(tagged)
    # A named target keeps the dead-letter header, so the consumer sees the history.
    for message in Message.objects.filter(queue__name="SPARE"):
        assert message.dead_letter is not None
        assert message.dead_letter["original_queue"] == "ORDERS.IN"


def test_a_filter_matching_nothing_completes_with_zero_counts_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the driver's temporary files go here
    orders = queue_create(name="ORDERS.IN", consumer="")
    dead_lettered(orders, 10)
    job = run(submit(filter=MessageSelection(payload_text="no such text")))
    assert job.status == ReplayJobStatus.DONE
    assert (job.read, job.matched, job.written, job.skipped, job.failed) == (10, 0, 0, 0, 0)
    assert job.per_target == {}
    assert on("ORDERS.IN") == 0
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"target_queue": "NO.SUCH.QUEUE"}, "target_queue"),
        ({"rules_text": "ACTION(RETRY)\nREASON(NOPE) ACTION(FWD)\n"}, "rules_text"),
        ({"velocity": 0}, "velocity"),
        ({"velocity": -5}, "velocity"),
        ({"filter": MessageSelection(queues=("NO.SUCH.QUEUE",))}, "queues"),
        ({"source_queue": "ORDERS.IN"}, "source_queue"),
        ({"source_queue": ""}, "source_queue"),
        ({"source": "everything"}, "source"),
        ({"filter": MessageSelection(header="no-equals-sign")}, "header"),
    ],
)
def test_bad_input_is_refused_at_submission_and_writes_nothing(values, field):
    queue_create(name="ORDERS.IN", consumer="")
    with pytest.raises(InvalidInput) as refused:
        submit(**values)
    assert field in refused.value.field_errors
    assert not ReplayJob.objects.exists()
    assert not AuditEvent.objects.filter(action="replay_submit").exists()


def test_a_time_range_that_ends_before_it_starts_selects_nothing():
    """The API takes it as it is; the console and the command name it."""
    since, until = datetime(2026, 5, 2, tzinfo=UTC), datetime(2026, 5, 1, tzinfo=UTC)

    job = submit(filter=MessageSelection(since=since, until=until))

    assert job.total == 0
    assert window_problem(since, until) == "The time range ends before it starts."
    assert window_problem(until, since) is None


def test_rules_errors_are_reported_with_their_lines():
    with pytest.raises(InvalidInput) as refused:
        submit(rules_text="ACTION(RETRY)\n\nREASON(NOPE) ACTION(RETRY)\n")
    [problem] = refused.value.field_errors["rules_text"]
    assert problem.startswith("line 3, ")


def test_blacklisted_messages_replay_to_their_own_queue_and_their_timeline_says_so():
    orders = queue_create(name="ORDERS.IN", consumer="")
    ids = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"x")] * 5)
    claimed(orders, 5)
    quarantined(ids)
    job = run(submit(source="blacklist"))
    assert (job.written, job.per_target) == (5, {"ORDERS.IN": 5})
    assert on("ORDERS.IN", S.NOT_DELIVERABLE) == 5
    assert on("ORDERS.IN") == 5

    [record] = replays_of(message_id=ids[0])
    assert record.job_id == job.id
    copy = Message.objects.get(id=record.message_id)
    assert (copy.queue, copy.state, copy.crash_count, copy.payload) == (
        orders,
        S.TO_BE_DELIVERED,
        0,
        b"x",
    )
    assert replayed_from(message_id=copy.id) == record


def test_the_replay_command_runs_a_job_and_prints_its_counts():
    orders = queue_create(name="ORDERS.IN", consumer="")
    dead_lettered(orders, 7)
    out = StringIO()
    call_command(
        "replay", "submit", "--source", "dead_letter", "--source-queue", DLQ, "--wait", stdout=out
    )
    printed = out.getvalue()
    assert "status      done, 100%" in printed
    assert "written 7, skipped 0, failed 0" in printed
    assert on("ORDERS.IN") == 7
