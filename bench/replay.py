"""Replay throughput: dead-lettered messages written back to their original
queue by the Spark replay job, against one INSERT ... SELECT (the machine's
limit for the same move) and a row-by-row ORM loop (a naive script).

The three ways move the same source; between them the copies and the replay
jobs are deleted and the tables vacuumed.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import _harness as harness
from bench import _spark
from bench._celery import private_redis
from bench._loaders import copy_batch, dead_letter_queue, replay_undo

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
ORIGIN = "BENCH.REPLAY.ORIGIN"
SETUP_BATCH = 10_000
ORM_SAMPLE = 20_000
TARGETS = {
    "spark_phase_vs_insert_select": 0.3,
    "spark_vs_orm": 20.0,
    "spark_total_seconds": 30.0,
}
# The spark_total_seconds target is stated for this many messages.
TOTAL_TARGET_MESSAGES = 1_000_000
# Amazon SQS's dead-letter queue redrive moves at most this many messages a second.
SQS_REDRIVE_MSGS_PER_S = 500
# How often the job's progress goes to the log.
PROGRESS_LOG_SECONDS = 5.0
# The Spark way is cancelled (and the bench fails) past this many seconds.
SPARK_TIMEOUT_SECONDS = 1800

# The machine's limit: the same copies (to the original queue, TBDL, header
# kept, fresh counters) in one statement, the copies unmarked (no job, no
# source, so no unique index to check).
INSERT_SELECT_SQL = """
INSERT INTO broker_message (queue_id, payload, content_type, headers, priority, dead_letter,
                            put_application, put_user, state, available_at, enqueued_at,
                            created_at, updated_at)
SELECT t.id, m.payload, m.content_type, m.headers, m.priority, m.dead_letter,
       m.put_application, m.put_user, 'TBDL', now(), now(), now(), now()
FROM broker_message AS m JOIN broker_queue AS t ON t.name = m.dead_letter->>'original_queue'
WHERE m.queue_id = %(dlq)s AND m.state = 'TBDL'
"""
COUNTS_SQL = """
SELECT (SELECT count(*) FROM broker_message WHERE queue_id = %(queue)s),
       (SELECT count FROM broker_queuedepth_current WHERE queue_id = %(queue)s AND state = 'TBDL'),
       (SELECT count(*) FROM broker_message WHERE queue_id = %(dlq)s AND state = 'TBDL')
"""
CANCEL_SQL = "UPDATE broker_replayjob SET cancel_requested = true WHERE id = %s"
JOB_SQL = """
SELECT spark_app_id, heartbeat_at, started_at, finished_at, total, read, written, status
FROM broker_replayjob WHERE id = %s
"""


@dataclass(frozen=True)
class Options:
    messages: int
    size: int
    partitions: int | None
    slice_rows: int | None
    orm_sample: int
    spark_timeout: int = SPARK_TIMEOUT_SECONDS


@dataclass(frozen=True)
class Setup:
    bench_url: str
    dlq_id: int
    origin_id: int
    messages: int


@dataclass(frozen=True)
class SparkTimes:
    """The Spark way's clock, in seconds from the launch. ``ready`` is when
    the driver stored its Spark application id (the job row's heartbeat of
    that update): Python, Django and the Spark session (JVM, SparkContext) are
    up. ``finished`` is the job's finished_at; after it the driver stops its
    JVM and exits, and the launcher notices within its 0.5 s poll."""

    total: float
    ready: float
    ready_exact: bool
    driver_started: float
    first_jdbc: float | None
    finished: float
    db_seconds: dict[str, float]
    # The longest any one statement of each kind was seen active.
    longest_seconds: dict[str, float]

    @property
    def phase(self) -> float:
        return self.total - self.ready


# --- arguments --------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> Options:
    args = harness.parser(
        __doc__,
        messages=harness.messages(1_000_000, "dead letters"),
        size=harness.SIZE,
        partitions=_spark.PARTITIONS,
        slice_rows=(harness.positive_int, None, "LAZARETTO_REPLAY_SLICE_ROWS for the driver"),
        spark_timeout=(
            harness.positive_int,
            SPARK_TIMEOUT_SECONDS,
            f"cancel the replay job and fail past this many seconds (default {SPARK_TIMEOUT_SECONDS})",
        ),
        orm_sample=(
            harness.positive_int,
            ORM_SAMPLE,
            f"messages the ORM loop moves (default {ORM_SAMPLE}, at most N)",
        ),
    ).parse_args(argv)
    args.orm_sample = min(args.orm_sample, args.messages)
    return Options(**vars(args))


# --- the Spark driver's environment --------------------------------------------------


def driver_environment(redis_url: str) -> None:
    """After Django has started here: what only the driver process sees."""
    os.environ["CELERY_BROKER_URL"] = redis_url
    os.environ.update(_spark.DRIVER_ENV)


# --- watching the replay job ---------------------------------------------------------


def classify_replay(application: str, query: str) -> str | None:
    text = query.lstrip().upper()
    if text.startswith("WITH PICKED"):
        return "replay_insert"
    if text.startswith("INSERT INTO BROKER_REPLAYSTAGE"):
        return "stage_load"
    if application == _spark.JDBC_APPLICATION:
        return "jdbc_read" if text.startswith("SELECT") else "jdbc_other"
    if text.startswith(("SELECT COUNT(*)", "DELETE FROM BROKER_REPLAYSTAGE")):
        return "driver_sql"
    return None


class JobWatch(_spark.Sampler):
    """A Sampler that also follows the replay job's row: when the driver
    stored its Spark application id, and its progress for the log."""

    def __init__(self, bench_url: str, job_id: int, total: int, timeout: float) -> None:
        super().__init__(bench_url, classify_replay)
        self.job_id = job_id
        self.total = total
        self.deadline = time.perf_counter() + timeout
        self.timed_out = False
        self.ready: datetime | None = None
        self.ready_exact = False
        self.driver_started: datetime | None = None
        self.logged = time.perf_counter()

    def poll(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(JOB_SQL, [self.job_id]).fetchone()
        if row is None:
            return
        app_id, heartbeat, started, _, total, read, written, status = row
        if self.ready is None and app_id:
            # Until the driver's next progress report (after it counted the
            # source), heartbeat_at is the time it stored the application id.
            self.ready_exact = total == 0 and read == 0
            self.ready = heartbeat if self.ready_exact else datetime.now(heartbeat.tzinfo)
            self.driver_started = started
            harness.log(f"spark: session up ({app_id})")
        if harness.since(self.logged) >= PROGRESS_LOG_SECONDS:
            self.logged = time.perf_counter()
            harness.log(f"spark: {status}, read {read}, written {written} of {self.total}")
        if not self.timed_out and time.perf_counter() > self.deadline:
            # The launcher sees the request and stops the driver.
            self.timed_out = True
            harness.log("spark: past --spark-timeout; asking the job to cancel")
            conn.execute(CANCEL_SQL, [self.job_id])


# --- setup -------------------------------------------------------------------------


def dead_letter(bench_url: str, options: Options) -> Setup:
    """N messages waiting on the system dead-letter queue, dead-lettered from
    ORIGIN with reason handler_error: published with the COPY writer, then
    moved by a loader."""
    from broker.models import Queue

    origin = harness.make_queue(ORIGIN, options.size)  # consumer blank: nothing delivers
    dlq_id = Queue.objects.get(name=DLQ).id
    messages = harness.make_messages(harness.make_payload(options.size), SETUP_BATCH)
    started = time.perf_counter()
    with psycopg.connect(bench_url, autocommit=True) as conn:
        for count in harness.batch_sizes(options.messages, SETUP_BATCH):
            copy_batch(conn, origin.id, messages[:count])
        moved = dead_letter_queue(conn, dlq_id=dlq_id, origin=ORIGIN, origin_id=origin.id)
    if moved != options.messages:
        raise harness.BenchError(f"setup: dead-lettered {moved} of {options.messages} messages")
    harness.log(f"setup: {moved} messages on {DLQ} in {harness.since(started):.1f}s")
    return Setup(bench_url, dlq_id=dlq_id, origin_id=origin.id, messages=options.messages)


def reset(setup: Setup) -> None:
    """Delete what a way wrote (copies and replay jobs), then
    VACUUM ANALYZE and CHECKPOINT, so every way starts from the same tables."""
    replay_undo(setup.bench_url, setup.origin_id)
    _spark.vacuum(setup.bench_url)
    harness.checkpoint()


def verify(setup: Setup, expected: int, way: str) -> None:
    """The original queue holds ``expected`` copies (table and depth counter)
    and the dead-letter queue still holds every source."""
    with psycopg.connect(setup.bench_url, autocommit=True) as conn:
        row = conn.execute(COUNTS_SQL, {"queue": setup.origin_id, "dlq": setup.dlq_id}).fetchone()
    rows, depth, sources = row if row else (None, None, None)
    if rows != expected or depth != expected or sources != setup.messages:
        raise harness.BenchError(
            f"{way}: expected {expected} copies, table has {rows}, depth {depth}; "
            f"{sources} of {setup.messages} sources left on {DLQ}"
        )
    harness.log(f"{way}: verified {rows} copies on {ORIGIN}, depth counter {depth}")


# --- way a: one INSERT ... SELECT ------------------------------------------------------


def run_insert_select(setup: Setup) -> harness.Timed:
    with psycopg.connect(setup.bench_url, autocommit=True) as conn:
        started = time.perf_counter()
        with conn.transaction():
            written = conn.execute(INSERT_SELECT_SQL, {"dlq": setup.dlq_id}).rowcount
        seconds = harness.since(started)
    if written != setup.messages:
        raise harness.BenchError(f"insert_select: wrote {written} of {setup.messages}")
    verify(setup, setup.messages, "insert_select")
    return harness.Timed("insert_select", seconds, written)


# --- way b: the Spark replay job --------------------------------------------------------


def run_spark(setup: Setup, timeout: float) -> tuple[harness.Timed, SparkTimes]:
    from broker.models import ReplayJobStatus, ReplaySource
    from broker.pipeline.replay import replay_job_submit
    from broker.pipeline.selection import ReplaySpec
    from workers.pipeline import replay_job_launch

    job = replay_job_submit(
        spec=ReplaySpec(source=ReplaySource.DEAD_LETTER, source_queue=DLQ), actor=None
    )
    watch = JobWatch(setup.bench_url, job.id, setup.messages, timeout)
    watch.start()
    launched = time.time()
    started = time.perf_counter()
    try:
        with _spark.stdout_to_stderr():
            ended = replay_job_launch(job.id)
    finally:
        seconds = harness.since(started)
        db_seconds = watch.stop()
    if watch.timed_out:
        raise harness.BenchError(
            f"spark: the replay job ran past {timeout:.0f}s and was cancelled ({ended.status}); "
            f"written {ended.written} of {setup.messages}; longest statements (s): "
            f"{watch.longest}"
        )
    if ended.status != ReplayJobStatus.DONE:
        raise harness.BenchError(f"spark: replay job ended {ended.status}: {ended.error}")
    if ended.written != setup.messages:
        raise harness.BenchError(
            f"spark: the job wrote {ended.written} of {setup.messages} "
            f"(read {ended.read}, failed {ended.failed}, skipped {ended.skipped})"
        )
    if watch.ready is None or watch.driver_started is None or ended.finished_at is None:
        raise harness.BenchError("spark: the job never stored its Spark application id")
    verify(setup, setup.messages, "spark")

    def since_launch(moment: datetime) -> float:
        return moment.timestamp() - launched

    times = SparkTimes(
        total=seconds,
        ready=since_launch(watch.ready),
        ready_exact=watch.ready_exact,
        driver_started=since_launch(watch.driver_started),
        first_jdbc=since_launch(watch.first_jdbc) if watch.first_jdbc else None,
        finished=since_launch(ended.finished_at),
        db_seconds=db_seconds,
        longest_seconds={kind: round(value, 1) for kind, value in sorted(watch.longest.items())},
    )
    harness.log(
        f"spark: {ended.written} written in {seconds:.2f}s; driver took the job at "
        f"{times.driver_started:.2f}s, session up at {times.ready:.2f}s"
        f"{'' if times.ready_exact else ' (seen, not stamped)'}, first JDBC connection at "
        f"{times.first_jdbc if times.first_jdbc is None else round(times.first_jdbc, 2)}s, "
        f"job finished at {times.finished:.2f}s"
    )
    harness.log(
        f"spark: sampled database time (s): {db_seconds}; longest (s): {times.longest_seconds}"
    )
    return harness.Timed("spark", seconds, ended.written), times


# --- way c: a naive ORM loop ------------------------------------------------------------


def run_orm(setup: Setup, sample: int) -> harness.Timed:
    """Row by row, as a naive script would: read the dead letters, and for
    each create its copy on the original queue, each in its own transaction
    (autocommit). The queue is looked up once per name. DEBUG off, as in
    production, so Django keeps no query log."""
    from django.test.utils import override_settings

    from broker.models import Message, Queue
    from workers.spark.replay import ARCHIVE_COLUMNS  # what a replay copies of a message

    started = time.perf_counter()
    with override_settings(DEBUG=False):
        queues: dict[str, Queue] = {}
        sources = Message.objects.filter(queue_id=setup.dlq_id, state="TBDL").order_by("id")
        for source in sources[:sample]:
            name = source.dead_letter["original_queue"] if source.dead_letter else ""
            if name not in queues:
                queues[name] = Queue.objects.get(name=name)
            copied = {field: getattr(source, field) for field in ARCHIVE_COLUMNS}
            Message.objects.create(queue=queues[name], **copied)
    seconds = harness.since(started)
    verify(setup, sample, "orm")
    return harness.Timed("orm", seconds, sample)


# --- driver and report --------------------------------------------------------------------


@dataclass
class Figures:
    results: dict[str, harness.Timed] = field(default_factory=dict)
    spark: SparkTimes | None = None
    config: dict[str, Any] = field(default_factory=dict)


def run_all(options: Options, bench_url: str) -> Figures:
    figures = Figures()
    with (
        tempfile.TemporaryDirectory(prefix="bench-archive-") as archive,
        tempfile.TemporaryDirectory(prefix="bench-redis-") as directory,
    ):
        _spark.spark_environment(
            bench_url,
            Path(archive),
            LAZARETTO_SPARK_PARTITIONS=options.partitions,
            LAZARETTO_REPLAY_SLICE_ROWS=options.slice_rows,
        )
        harness.setup_django(bench_url)
        with private_redis(Path(directory)) as redis_server:
            driver_environment(redis_server.url)
            figures.config = _spark.spark_config()
            harness.log(f"spark settings: {figures.config}")
            harness.log(
                f"setup: dead-lettering {options.messages} messages of {options.size} bytes"
            )
            setup = dead_letter(bench_url, options)
            reset(setup)
            harness.log(f"insert_select: {options.messages} messages in one statement")
            figures.results["insert_select"] = run_insert_select(setup)
            reset(setup)
            harness.log(f"spark: replay job for {options.messages} messages")
            result, figures.spark = run_spark(setup, options.spark_timeout)
            figures.results["spark"] = result
            reset(setup)
            harness.log(f"orm: {options.orm_sample} messages, one transaction each")
            figures.results["orm"] = run_orm(setup, options.orm_sample)
    return figures


def ratios(figures: Figures) -> dict[str, float]:
    assert figures.spark is not None
    results, spark = figures.results, figures.spark
    phase_rate = results["spark"].messages / spark.phase
    return {
        "spark_phase_vs_insert_select": phase_rate / results["insert_select"].rate,
        "spark_vs_orm": results["spark"].rate / results["orm"].rate,
    }


def verdicts(options: Options, figures: Figures) -> dict[str, str]:
    """PASS or MISS per target; the total's only at the size it is set for."""
    assert figures.spark is not None
    found = ratios(figures)
    judged = {
        name: "PASS" if found[name] >= TARGETS[name] else "MISS"
        for name in ("spark_phase_vs_insert_select", "spark_vs_orm")
    }
    if options.messages == TOTAL_TARGET_MESSAGES:
        ok = figures.spark.total <= TARGETS["spark_total_seconds"]
        judged["spark_total_seconds"] = "PASS" if ok else "MISS"
    else:
        judged["spark_total_seconds"] = f"n/a (set for {TOTAL_TARGET_MESSAGES:,} messages)"
    return judged


def summary(options: Options, figures: Figures) -> dict[str, Any]:
    assert figures.spark is not None
    results, spark = figures.results, figures.spark
    found = ratios(figures)
    return {
        "bench": "replay",
        "messages": options.messages,
        "payload_bytes": options.size,
        "orm_sample": options.orm_sample,
        "insert_select_seconds": round(results["insert_select"].seconds, 2),
        "insert_select_msgs_per_s": round(results["insert_select"].rate, 1),
        "spark_total_seconds": round(spark.total, 2),
        "spark_msgs_per_s": round(results["spark"].rate, 1),
        "spark_startup_seconds": round(spark.ready, 2),
        "spark_phase_seconds": round(spark.phase, 2),
        "spark_phase_msgs_per_s": round(options.messages / spark.phase, 1),
        "spark_driver_started_seconds": round(spark.driver_started, 2),
        "spark_first_jdbc_seconds": None
        if spark.first_jdbc is None
        else round(spark.first_jdbc, 2),
        "spark_finished_seconds": round(spark.finished, 2),
        "spark_startup_exact": spark.ready_exact,
        "spark_startup_clock": "launch to the driver storing its Spark application id",
        "spark_db_sampled_seconds": spark.db_seconds,
        "spark_db_longest_statement_seconds": spark.longest_seconds,
        "orm_seconds": round(results["orm"].seconds, 2),
        "orm_msgs_per_s": round(results["orm"].rate, 1),
        "orm_is_sample": options.orm_sample < options.messages,
        "spark_phase_vs_insert_select": round(found["spark_phase_vs_insert_select"], 3),
        "spark_vs_orm": round(found["spark_vs_orm"], 1),
        "sqs_redrive_msgs_per_s": SQS_REDRIVE_MSGS_PER_S,
        "spark_vs_sqs_redrive": round(results["spark"].rate / SQS_REDRIVE_MSGS_PER_S, 1),
        "verdicts": verdicts(options, figures),
        "targets": dict(TARGETS),
        "spark": figures.config,
    }


def print_report(options: Options, figures: Figures) -> None:
    assert figures.spark is not None
    results, spark, config = figures.results, figures.spark, figures.config
    harness.title(
        f"replay bench: {options.messages} dead-lettered messages of {options.size} bytes on "
        f"{DLQ}, back to {ORIGIN}",
        f"spark: {config['master']}, {config['partitions']} JDBC partitions, slices of "
        f"{config['slice_rows']} rows, fetch {config['fetch_rows']}, "
        f"write batches {config['write_batch_rows']}",
        "insert_select: one INSERT ... SELECT, one transaction, unmarked copies (the machine's limit)",
        f"orm: Message.objects.create per message, one transaction each, on a sample of "
        f"{options.orm_sample}",
    )
    rows = [
        [name, r.messages, f"{r.seconds:.2f}", f"{r.rate:.0f}"]
        for name, r in ((name, results[name]) for name in ("insert_select", "spark", "orm"))
    ]
    harness.table(["way", "messages", "seconds", "msgs/s"], rows)
    exact = "" if spark.ready_exact else " (seen by polling, not stamped)"
    print(
        f"  spark start-up {spark.ready:>6.2f} s  launch to Spark session up{exact}: "
        f"driver took the job at {spark.driver_started:.2f} s"
    )
    print(
        f"  spark phase    {spark.phase:>6.2f} s  {options.messages / spark.phase:>10.0f} msgs/s  "
        f"read, route, stage, write; includes {spark.total - spark.finished:.2f} s of driver "
        "exit after the job ended"
    )
    print()
    print_targets(options, figures)
    print(
        f"context: SQS's dead-letter redrive tops out at {SQS_REDRIVE_MSGS_PER_S} msgs/s; "
        f"spark moved {results['spark'].rate:.0f} msgs/s "
        f"({results['spark'].rate / SQS_REDRIVE_MSGS_PER_S:.0f}x)"
    )
    harness.print_figures(summary(options, figures))


def print_targets(options: Options, figures: Figures) -> None:
    assert figures.spark is not None
    found, judged = ratios(figures), verdicts(options, figures)
    rows = [
        [name, f"{found[name]:.2f}", f">= {TARGETS[name]:g} {judged[name]}"]
        for name in ("spark_phase_vs_insert_select", "spark_vs_orm")
    ]
    total = TARGETS["spark_total_seconds"]
    rows.append(
        [
            "spark_total_seconds",
            f"{figures.spark.total:.2f}",
            f"<= {total:g} {judged['spark_total_seconds']}",
        ]
    )
    harness.table(["ratio", "value", "target"], rows, align="<><")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    return harness.main(argv, parse_args, run_all, print_report)


if __name__ == "__main__":
    sys.exit(main())
