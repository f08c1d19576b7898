"""How late a replay schedule's job writes: from each firing's due time to
its job's first write, over N firings of one schedule, as a user's schedule
runs. Beat (in the control worker) fires it from PostgreSQL, the control
worker submits the job, the pipeline worker launches its driver, a client
of the warm Spark Connect server.

The schedule fires every ``every`` seconds over a dead-letter queue of its
own and writes to a sink queue nothing delivers. Before each firing the
bench dead-letters ``messages`` new messages: a schedule's job takes each
message once, so each firing has a fresh batch to write.

A firing's due time is beat's: an interval schedule is due ``every``
seconds after its last run, which beat stores as it sends the firing (the
periodic task's ``last_run_at``), and the first one ``every`` seconds after
the task was saved. The first write is seen as bench/replay.py sees it: the
first poll (every 20 ms) that finds the job's ``written`` above 0, i.e. the
commit of its first write.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench import _harness as harness
from bench._celery import log_tails, start_workers, worker_env
from bench._loaders import copy_batch, dead_letter_queue
from bench._peer_report import percentile

FIRINGS = 20
EVERY_SECONDS = 6
MESSAGES = 100
DLQ = "BENCH.SCHEDULE.DLQ"
ORIGIN = "BENCH.SCHEDULE.ORIGIN"
SINK = "BENCH.SCHEDULE.SINK"
NAME = "bench-firings"
# At most, p99 of the firings' delays on the warm Spark Connect server.
TARGET_P99_SECONDS = 3.0
POLL_SECONDS = 0.02
DEFINITION = (
    "a firing's delay: from its due time (beat's: the interval after its previous send) to the "
    "first poll that sees its job's written > 0 (the commit of the job's first write)"
)

TASK_SQL = """
SELECT t.last_run_at FROM django_celery_beat_periodictask AS t
JOIN broker_replayschedule AS s ON s.periodic_task_id = t.id WHERE s.id = %s
"""
JOBS_SQL = "SELECT id, written, status FROM broker_replayjob WHERE schedule_id = %s ORDER BY id"
SKIPPED_SQL = "SELECT count(*) FROM broker_schedulefiring WHERE schedule_id = %s AND job_id IS NULL"


@dataclass(frozen=True)
class Firings:
    """Each firing's delay (seconds) from its due time to its job's first
    write, in order; and the firings that submitted no job."""

    delays: list[float]
    skipped: int
    every: int
    messages: int

    @property
    def p50(self) -> float:
        return percentile(self.delays, 50)

    @property
    def p99(self) -> float:
        return percentile(self.delays, 99)

    @property
    def on_target(self) -> bool:
        """Every firing wrote, its p99 within the target."""
        return not self.skipped and self.p99 <= TARGET_P99_SECONDS

    def summary(self) -> dict[str, Any]:
        return {
            "firings": len(self.delays),
            "every_seconds": self.every,
            "messages_per_firing": self.messages,
            "p50_seconds": round(self.p50, 3),
            "p99_seconds": round(self.p99, 3),
            "max_seconds": round(max(self.delays), 3),
            "skipped": self.skipped,
            "definition": DEFINITION,
        }


def due_times(date_changed: datetime, sent: list[datetime], every: float) -> list[datetime]:
    """Each firing's due time: ``every`` after the task's last change for
    the first, after the previous firing's send for each later one."""
    step = timedelta(seconds=every)
    return [date_changed + step, *(moment + step for moment in sent[:-1])]


def dead_letters(bench_url: str, origin_id: int, dlq_id: int, messages: int, size: int) -> None:
    """``messages`` new dead letters on the schedule's dead-letter queue."""
    batch = harness.make_messages(harness.make_payload(size), messages)
    with psycopg.connect(bench_url, autocommit=True) as conn:
        copy_batch(conn, origin_id, batch)
        dead_letter_queue(conn, dlq_id=dlq_id, origin=ORIGIN, origin_id=origin_id)


def run_firings(
    bench_url: str,
    redis_url: str,
    remote: str,
    directory: Path,
    *,
    count: int = FIRINGS,
    every: int = EVERY_SECONDS,
    messages: int = MESSAGES,
    size: int = 1024,
) -> Firings:
    """``count`` firings of a schedule every ``every`` seconds, each job
    writing ``messages`` copies on the Spark Connect server at ``remote``."""
    from broker.models import QueueKind
    from broker.pipeline.schedules import ScheduleSpec, Timing, schedule_create
    from broker.pipeline.selection import ReplaySpec
    from broker.services.queues import queue_create
    from rig.processes import Workers

    origin = harness.make_queue(ORIGIN, size)
    harness.make_queue(SINK, size)
    dlq_id = queue_create(name=DLQ, kind=QueueKind.DEAD_LETTER).id
    dead_letters(bench_url, origin.id, dlq_id, messages, size)
    workers = Workers(
        directory=directory,
        broker_url=redis_url,
        pipeline=True,
        extra_env={**worker_env(bench_url), "SPARK_REMOTE": remote},
    )
    try:
        start_workers(workers)
        schedule = schedule_create(
            spec=ScheduleSpec(
                name=NAME,
                replay=ReplaySpec(source="dead_letter", source_queue=DLQ, target_queue=SINK),
                timing=Timing(every_seconds=every),
            ),
            actor=None,
        )
        # Saved: beat counts the first interval from here (its later saves move it).
        task = schedule.periodic_task
        if task is None:
            raise harness.BenchError("firings: the schedule has no periodic task")
        date_changed = task.date_changed
        sent, written_at = _watch(
            bench_url, schedule.id, count, every, origin.id, dlq_id, messages, size
        )
        with psycopg.connect(bench_url, autocommit=True) as conn:
            skipped = _value(conn, SKIPPED_SQL, schedule.id)
    except harness.BenchError as error:
        raise harness.BenchError(f"{error}\n{log_tails(workers)}") from None
    finally:
        workers.stop()
    dues = due_times(date_changed, sent, every)
    delays = [(seen - due).total_seconds() for due, seen in zip(dues, written_at, strict=False)]
    return Firings(delays=delays, skipped=skipped, every=every, messages=messages)


def _value(conn: psycopg.Connection[Any], query: str, schedule_id: int) -> Any:
    """The first column of the query's one row for the schedule."""
    row = conn.execute(query, [schedule_id]).fetchone()
    if row is None:
        raise harness.BenchError(f"firings: schedule {schedule_id} is gone")
    return row[0]


def _watch(
    bench_url: str,
    schedule_id: int,
    count: int,
    every: int,
    origin_id: int,
    dlq_id: int,
    messages: int,
    size: int,
) -> tuple[list[datetime], list[datetime]]:
    """Poll until ``count`` jobs of the schedule wrote: each firing's send
    time (the periodic task's last run) and when each job's first write
    was seen. After each job is done, the next batch of dead letters."""
    sent: list[datetime] = []
    written_at: dict[int, datetime] = {}
    topped_up: set[int] = set()
    deadline = time.monotonic() + count * every * 3 + 60
    with psycopg.connect(bench_url, autocommit=True) as conn:
        while len(written_at) < count:
            if time.monotonic() > deadline:
                raise harness.BenchError(
                    f"firings: {len(written_at)} of {count} jobs wrote within the bench's time"
                )
            last_run = _value(conn, TASK_SQL, schedule_id)
            if last_run is not None and (not sent or last_run > sent[-1]):
                sent.append(last_run)
            jobs = conn.execute(JOBS_SQL, [schedule_id]).fetchall()
            now = datetime.now().astimezone()
            for job_id, written, status in jobs:
                if written and job_id not in written_at:
                    written_at[job_id] = now
                    harness.log(f"firings: job {job_id} wrote ({len(written_at)} of {count})")
                if status == "failed":
                    raise harness.BenchError(f"firings: replay job {job_id} failed")
                if status == "done" and job_id not in topped_up:
                    topped_up.add(job_id)
                    dead_letters(bench_url, origin_id, dlq_id, messages, size)
            time.sleep(POLL_SECONDS)
    return sent, [written_at[job_id] for job_id in sorted(written_at)]
