"""Replay schedules for real: beat reading them from PostgreSQL, Celery
workers firing them and delivering, Spark jobs (clients of the session's
Spark Connect server) writing the copies."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from broker.models import Message, ReplayJob, ReplayJobStatus, ReplaySchedule, ScheduleFiring
from broker.pipeline.schedules import (
    ScheduleSpec,
    Timing,
    given_up_by,
    schedule_create,
    schedule_run_now,
    schedules_reading,
)
from broker.pipeline.selection import ReplaySpec
from broker.services.publish import NewMessage
from broker.services.queues import queue_create
from rig.processes import ROOT, Workers, wait_until
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE as DLQ
from tests.support.messages import dead_lettered
from tests.support.publishing import published
from workers.pipeline import replay_job_launch

pytestmark = pytest.mark.slow
with_spark = pytest.mark.usefixtures("spark_env")


def schedule(**values: Any) -> ReplaySchedule:
    replay = values.pop("replay", ReplaySpec(source="dead_letter", source_queue=DLQ))
    return schedule_create(
        spec=ScheduleSpec(name="retry-orders", replay=replay, **values), actor=None
    )


def jobs_of(scheduled: ReplaySchedule) -> list[ReplayJob]:
    return list(ReplayJob.objects.filter(schedule=scheduled).order_by("id"))


def assert_never_two_at_once(jobs: list[ReplayJob]) -> None:
    for earlier, later in itertools.pairwise(jobs):
        assert earlier.finished_at is not None, earlier
        assert later.started_at is None or later.started_at >= earlier.finished_at, (earlier, later)


@with_spark
def test_a_message_that_keeps_failing_is_replayed_k_times_then_given_up(start_workers):
    """Every 2 s over a dead-letter queue whose messages fail each time, with
    K = 3: each original yields three copies, one a firing (a copy goes
    back, fails, and is dead-lettered again before the next takes it);
    later firings write nothing; the last of each line is given up."""
    orders = queue_create(name="ORDERS.IN", consumer="json")
    workers = start_workers(pipeline=True)
    published(orders, 3, NewMessage(payload=b"not json"))
    wait_until(
        lambda: Message.objects.filter(queue__name=DLQ).count() == 3,
        timeout=30,
        what="the three to be dead-lettered",
    )

    scheduled = schedule(timing=Timing(every_seconds=2), give_up_after=3)

    def settled() -> bool:
        jobs = jobs_of(scheduled)
        done = [job for job in jobs if job.status == ReplayJobStatus.DONE]
        # Two firings after the last copy came back wrote nothing.
        return (
            Message.objects.filter(queue__name=DLQ, generation=3).count() == 3
            and len(done) >= 5
            and all(job.written == 0 for job in done[-2:])
        )

    wait_until(
        settled,
        timeout=180,
        interval=0.5,
        what=lambda: f"the schedule to give up; pipeline log:\n{workers.log('pipeline')[-3000:]}",
    )

    dead = Message.objects.filter(queue__name=DLQ)
    assert sorted(dead.values_list("generation", flat=True)) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    # Each original's line: three copies, each of the one before.
    originals = dead.filter(generation=0).values_list("id", flat=True)
    for original in originals:
        line = [original]
        while copy := Message.objects.filter(replay_source_id=line[-1]).first():
            line.append(copy.id)
        assert len(line) == 4, line
    jobs = jobs_of(scheduled)
    # Nine copies in all (a copy still on its way back when a job reads waits
    # for the next firing, so a job may write fewer than three).
    assert sum(job.written for job in jobs) == 9
    assert {job.status for job in jobs} <= {
        ReplayJobStatus.DONE,
        ReplayJobStatus.RUNNING,
        ReplayJobStatus.QUEUED,
    }
    assert_never_two_at_once([job for job in jobs if job.finished_at is not None])
    # The last of each line stays, given up by the schedule.
    reading = schedules_reading(DLQ)
    assert [
        [schedule.name for schedule in given_up_by(reading, message)]
        for message in dead.filter(generation=3)
    ] == [["retry-orders"]] * 3
    assert [given_up_by(reading, message) for message in dead.filter(generation=2)] == [[]] * 3


@with_spark
def test_firings_while_a_job_outlasts_the_interval_are_skipped_and_recorded(start_workers):
    """Every second, a job written at one message a second: the firings
    meanwhile submit nothing, and two of its jobs never run at once."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    dead_lettered(orders, 4)
    start_workers(pipeline=True)

    scheduled = schedule(
        timing=Timing(every_seconds=1),
        replay=ReplaySpec(source="dead_letter", source_queue=DLQ, velocity=1),
    )
    wait_until(
        lambda: ReplayJob.objects.filter(schedule=scheduled, status=ReplayJobStatus.DONE).exists(),
        timeout=120,
        what="the first job to finish",
    )
    first = jobs_of(scheduled)[0]

    # The firings while the first job was queued or running.
    skipped = ScheduleFiring.objects.filter(
        schedule=scheduled, job__isnull=True, fired_at__lte=first.finished_at
    )
    assert skipped.count() >= 2
    assert {firing.skipped for firing in skipped} <= {
        f"replay job {first.id} was still queued",
        f"replay job {first.id} was still running",
    }
    assert first.written == 4
    assert_never_two_at_once(
        [job for job in jobs_of(scheduled) if job.finished_at is not None or job.id == first.id]
    )


@with_spark
def test_a_five_minute_cool_off_leaves_a_message_dead_lettered_a_minute_ago(transactional_db):
    orders = queue_create(name="ORDERS.IN", consumer="")
    old, recent = dead_lettered(orders, 2)
    Message.objects.filter(id=old).update(enqueued_at=timezone.now() - timedelta(minutes=6))
    Message.objects.filter(id=recent).update(enqueued_at=timezone.now() - timedelta(minutes=1))
    scheduled = schedule(timing=Timing(every_seconds=3600), cool_off_minutes=5)

    firing = schedule_run_now(schedule_id=scheduled.id, actor=None)
    assert firing.job is not None
    job = replay_job_launch(firing.job.id)

    assert (job.status, job.written) == (ReplayJobStatus.DONE, 1)
    assert list(
        Message.objects.filter(replay_job_id=job.id).values_list("replay_source_id", flat=True)
    ) == [old]
    stamped = Message.objects.filter(schedule_replayed_at__isnull=False)
    assert list(stamped.values_list("id", flat=True)) == [old]


class Beat:
    """`celery beat` on its own, started and stopped by the test."""

    def __init__(self, workers: Workers, directory: Path) -> None:
        self.env = workers.env()
        self.log = directory / "beat.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "workers", "beat", "-l", "info"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=20)
            self.process = None


def test_schedules_survive_a_restart_of_beat_which_fires_a_missed_slot_once(
    start_workers, tmp_path
):
    """Beat down for two slots of a 2 s schedule: started again, it fires
    once at once, then every 2 s. (No pipeline worker runs: the first job
    stays queued and every later firing is recorded as skipped.)"""
    beat = Beat(start_workers(beat=False), tmp_path)
    scheduled = schedule(timing=Timing(every_seconds=2))
    firings = ScheduleFiring.objects.filter(schedule=scheduled)
    beat.start()
    try:
        wait_until(lambda: firings.count() >= 2, timeout=60, what="two firings")
        beat.stop()
        time.sleep(1)  # the control worker runs the last firing beat sent
        before = firings.count()
        time.sleep(5)
        assert firings.count() == before

        beat.start()
        wait_until(lambda: firings.count() > before, timeout=60, what="beat to fire again")
        caught_up = firings.count()
        time.sleep(1.0)
        assert firings.count() == caught_up == before + 1
        wait_until(lambda: firings.count() == before + 2, timeout=4, what="the next slot")
    finally:
        beat.stop()
    assert ReplayJob.objects.filter(schedule=scheduled).count() == 1
