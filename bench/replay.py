"""Replay throughput: dead-lettered messages written back to their original
queue by the Spark replay job, on a warm Spark Connect server and on a cold
classic driver, against one INSERT ... SELECT (the machine's limit for the
same move) and a row-by-row ORM loop (a naive script).

The four ways move the same source; between them the copies and the replay
jobs are deleted and the tables vacuumed. The Spark Connect server is the
bench's own, started once per run, and has run a small warm-up job before
the measured one.
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
from bench._replay_firings import FIRINGS, TARGET_P99_SECONDS, Firings, run_firings

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
ORIGIN = "BENCH.REPLAY.ORIGIN"
# The warm-up job's own source: a dead-letter queue of its own, so the
# measured source stays as it is.
WARMUP_DLQ = "BENCH.REPLAY.WARMUP.DLQ"
WARMUP_ORIGIN = "BENCH.REPLAY.WARMUP"
WARMUP_MESSAGES = 1_000
SETUP_BATCH = 10_000
ORM_SAMPLE = 20_000
# How the Spark jobs run: a client of the bench's Spark Connect server, warm
# (it ran the warm-up job), or a driver of their own on SPARK_MASTER, cold (a
# new JVM for the job).
MODES = ("connect", "classic")
WAYS = ("insert_select", "spark_connect", "spark_classic", "orm")
TARGETS = {
    # At most, on the warm Spark Connect server.
    "connect_submit_to_first_write_seconds": 3.0,
    # At least, each mode: the Spark phase's rate over the single statement's.
    "spark_phase_vs_insert_select": 0.5,
    # At most, each mode: end to end against the single statement's time,
    # times this factor plus END_TO_END_SLACK_SECONDS.
    "end_to_end_vs_insert_select": 1.5,
    # At least, each mode: the end-to-end rate over the ORM loop's.
    "spark_vs_orm": 20.0,
}
END_TO_END_SLACK_SECONDS = 3.0
FIRST_WRITE_DEFINITION = (
    "submit to first write: from just before replay_job_submit() to the first time the "
    "bench's watcher (polling the job row every 10-50 ms) sees written > 0, i.e. the commit "
    "of the job's first write transaction, which inserts the copies and stores their count; "
    "first copy: that transaction's start (the copies' created_at, now())"
)
# Amazon SQS's dead-letter queue redrive moves at most this many messages a second.
SQS_REDRIVE_MSGS_PER_S = 500
# How often the job's progress goes to the log.
PROGRESS_LOG_SECONDS = 5.0
# A Spark way is cancelled (and the bench fails) past this many seconds.
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
FIRST_COPY_SQL = "SELECT min(created_at) FROM broker_message WHERE queue_id = %s"
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
    warmup_messages: int = WARMUP_MESSAGES
    firings: int = FIRINGS


@dataclass(frozen=True)
class Source:
    """Dead letters on ``dlq`` from ``origin``, where a replay writes them back."""

    dlq: str
    dlq_id: int
    origin: str
    origin_id: int
    messages: int


@dataclass(frozen=True)
class Setup:
    bench_url: str
    main: Source
    warmup: Source

    # The measured source's, as the ways use them.
    @property
    def dlq_id(self) -> int:
        return self.main.dlq_id

    @property
    def origin_id(self) -> int:
        return self.main.origin_id

    @property
    def messages(self) -> int:
        return self.main.messages


@dataclass(frozen=True)
class SparkTimes:
    """A Spark way's clock, in seconds from just before the job's
    submission (replay_job_submit). ``submit`` is what the submission took.
    ``ready`` is when the driver stored its Spark application id (the job
    row's heartbeat of that update): Python, Django and the Spark session
    (a JVM and SparkContext of its own, or a session on the Connect server)
    are up. ``first_write`` is when the watcher saw the job's first write
    committed (written > 0); ``first_copy`` the start of that write's
    transaction (the first copy's created_at). ``finished`` is the job's
    finished_at; after it the driver exits (a classic one stops its JVM),
    and the launcher notices within its 0.5 s poll: ``total``, end to end."""

    mode: str
    total: float
    submit: float
    ready: float
    ready_exact: bool
    driver_started: float
    first_jdbc: float | None
    first_write: float
    first_copy: float | None
    finished: float
    db_seconds: dict[str, float]
    # The longest any one statement of each kind was seen active.
    longest_seconds: dict[str, float]

    @property
    def phase(self) -> float:
        """From the Spark session up to the launcher's return: read, route,
        stage, write, and the driver's exit."""
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
        warmup_messages=(
            harness.positive_int,
            WARMUP_MESSAGES,
            f"dead letters of the warm-up job on the Spark Connect server (default "
            f"{WARMUP_MESSAGES})",
        ),
        firings=(
            harness.positive_int,
            FIRINGS,
            f"firings of a replay schedule timed from due time to first write (default {FIRINGS})",
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
    if "INSERT INTO BROKER_MESSAGE " in text:
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
        self.first_write: datetime | None = None
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
        if self.first_write is None and written:
            # The write commits its copies and their count together.
            self.first_write = datetime.now(heartbeat.tzinfo)
        if harness.since(self.logged) >= PROGRESS_LOG_SECONDS:
            self.logged = time.perf_counter()
            harness.log(f"spark: {status}, read {read}, written {written} of {self.total}")
        if not self.timed_out and time.perf_counter() > self.deadline:
            # The launcher sees the request and stops the driver.
            self.timed_out = True
            harness.log("spark: past --spark-timeout; asking the job to cancel")
            conn.execute(CANCEL_SQL, [self.job_id])


# --- setup -------------------------------------------------------------------------


def dead_letter_source(
    bench_url: str, *, dlq: str, origin: str, messages: int, size: int
) -> Source:
    """``messages`` dead letters waiting on ``dlq``, dead-lettered from
    ``origin`` with reason handler_error: published with the COPY writer,
    then moved by a loader."""
    from broker.models import Queue

    origin_queue = harness.make_queue(origin, size)  # consumer blank: nothing delivers
    dlq_id = Queue.objects.get(name=dlq).id
    batch = harness.make_messages(harness.make_payload(size), min(SETUP_BATCH, messages))
    with psycopg.connect(bench_url, autocommit=True) as conn:
        for count in harness.batch_sizes(messages, SETUP_BATCH):
            copy_batch(conn, origin_queue.id, batch[:count])
        moved = dead_letter_queue(conn, dlq_id=dlq_id, origin=origin, origin_id=origin_queue.id)
    if moved != messages:
        raise harness.BenchError(f"setup: dead-lettered {moved} of {messages} messages on {dlq}")
    return Source(dlq, dlq_id=dlq_id, origin=origin, origin_id=origin_queue.id, messages=moved)


def dead_letter(bench_url: str, options: Options) -> Setup:
    """N messages waiting on the system dead-letter queue, dead-lettered from
    ORIGIN; and the warm-up job's few on a dead-letter queue of their own."""
    from broker.models import QueueKind
    from broker.services.queues import queue_create

    started = time.perf_counter()
    main = dead_letter_source(
        bench_url, dlq=DLQ, origin=ORIGIN, messages=options.messages, size=options.size
    )
    harness.log(f"setup: {main.messages} messages on {DLQ} in {harness.since(started):.1f}s")
    queue_create(name=WARMUP_DLQ, kind=QueueKind.DEAD_LETTER)
    warmup = dead_letter_source(
        bench_url,
        dlq=WARMUP_DLQ,
        origin=WARMUP_ORIGIN,
        messages=options.warmup_messages,
        size=options.size,
    )
    harness.log(f"setup: {warmup.messages} messages on {WARMUP_DLQ} for the warm-up job")
    return Setup(bench_url, main=main, warmup=warmup)


def reset(setup: Setup) -> None:
    """Delete what a way wrote (copies and replay jobs), then
    VACUUM ANALYZE and CHECKPOINT, so every way starts from the same tables."""
    replay_undo(setup.bench_url, setup.warmup.origin_id)
    replay_undo(setup.bench_url, setup.origin_id)
    _spark.vacuum(setup.bench_url)
    harness.checkpoint()


def verify(bench_url: str, source: Source, expected: int, way: str) -> None:
    """The original queue holds ``expected`` copies (table and depth counter)
    and the dead-letter queue still holds every source."""
    with psycopg.connect(bench_url, autocommit=True) as conn:
        row = conn.execute(COUNTS_SQL, {"queue": source.origin_id, "dlq": source.dlq_id}).fetchone()
    rows, depth, sources = row if row else (None, None, None)
    if rows != expected or depth != expected or sources != source.messages:
        raise harness.BenchError(
            f"{way}: expected {expected} copies, table has {rows}, depth {depth}; "
            f"{sources} of {source.messages} sources left on {source.dlq}"
        )
    harness.log(f"{way}: verified {rows} copies on {source.origin}, depth counter {depth}")


# --- way a: one INSERT ... SELECT ------------------------------------------------------


def run_insert_select(setup: Setup) -> harness.Timed:
    with psycopg.connect(setup.bench_url, autocommit=True) as conn:
        started = time.perf_counter()
        with conn.transaction():
            written = conn.execute(INSERT_SELECT_SQL, {"dlq": setup.dlq_id}).rowcount
        seconds = harness.since(started)
    if written != setup.messages:
        raise harness.BenchError(f"insert_select: wrote {written} of {setup.messages}")
    verify(setup.bench_url, setup.main, setup.messages, "insert_select")
    return harness.Timed("insert_select", seconds, written)


# --- ways b and c: the Spark replay job, warm on Spark Connect and cold classic --------


def spark_mode(mode: str, remote: str | None) -> None:
    """The environment the next driver starts in: SPARK_REMOTE for a client
    of the Spark Connect server (``connect``), none for a driver of its own
    on SPARK_MASTER (``classic``)."""
    from workers.pipeline import STANDBY

    if mode == "connect":
        if not remote:
            raise harness.BenchError("spark: connect mode without a Spark Connect server")
        os.environ["SPARK_REMOTE"] = remote
    else:
        os.environ.pop("SPARK_REMOTE", None)
    # As a pipeline worker keeps one ready (LAZARETTO_SPARK_STANDBY).
    STANDBY.start()


@dataclass
class Launched:
    """A replay job run to its end, as the bench saw it."""

    job: Any  # ReplayJob, as it ended
    watch: JobWatch
    submitted: float  # time.time() just before the submission
    submit_seconds: float
    seconds: float  # end to end
    db_seconds: dict[str, float]


def run_spark(
    bench_url: str, source: Source, timeout: float, mode: str, way: str
) -> tuple[harness.Timed, SparkTimes]:
    """Submit a replay job of ``source``'s dead letters back to their queue
    (replay_job_submit) and run it with the launcher a pipeline worker uses
    (replay_job_launch), its driver in ``mode`` (the environment says which:
    spark_mode). The clock starts just before the submission."""
    run = launch(bench_url, source, timeout)
    check_run(run, source, timeout, way)
    verify(bench_url, source, source.messages, way)
    times = spark_times(run, bench_url, source, mode, way)
    harness.log(
        f"{way}: {run.job.written} written in {run.seconds:.2f}s from the submission; driver "
        f"took the job at {times.driver_started:.2f}s, session up at {times.ready:.2f}s"
        f"{'' if times.ready_exact else ' (seen, not stamped)'}, first JDBC connection at "
        f"{times.first_jdbc if times.first_jdbc is None else round(times.first_jdbc, 2)}s, "
        f"first write seen at {times.first_write:.2f}s (its transaction began at "
        f"{times.first_copy if times.first_copy is None else round(times.first_copy, 2)}s), "
        f"job finished at {times.finished:.2f}s"
    )
    harness.log(
        f"{way}: sampled database time (s): {run.db_seconds}; longest (s): {times.longest_seconds}"
    )
    return harness.Timed(way, run.seconds, run.job.written), times


def launch(bench_url: str, source: Source, timeout: float) -> Launched:
    """The job submitted and launched, watched from just before the
    submission to the launcher's return."""
    from broker.models import ReplaySource
    from broker.pipeline.replay import replay_job_submit
    from broker.pipeline.selection import ReplaySpec
    from workers.pipeline import replay_job_launch

    submitted = time.time()
    started = time.perf_counter()
    job = replay_job_submit(
        spec=ReplaySpec(source=ReplaySource.DEAD_LETTER, source_queue=source.dlq), actor=None
    )
    submit_seconds = harness.since(started)
    watch = JobWatch(bench_url, job.id, source.messages, timeout)
    watch.start()
    try:
        with _spark.stdout_to_stderr():
            ended = replay_job_launch(job.id)
    finally:
        seconds = harness.since(started)
        db_seconds = watch.stop()
    return Launched(ended, watch, submitted, submit_seconds, seconds, db_seconds)


def check_run(run: Launched, source: Source, timeout: float, way: str) -> None:
    """Fail the bench unless the job wrote every copy."""
    from broker.models import ReplayJobStatus

    ended, watch = run.job, run.watch
    if watch.timed_out:
        raise harness.BenchError(
            f"{way}: the replay job ran past {timeout:.0f}s and was cancelled ({ended.status}); "
            f"written {ended.written} of {source.messages}; longest statements (s): "
            f"{watch.longest}"
        )
    if ended.status != ReplayJobStatus.DONE:
        raise harness.BenchError(f"{way}: replay job ended {ended.status}: {ended.error}")
    if ended.written != source.messages:
        raise harness.BenchError(
            f"{way}: the job wrote {ended.written} of {source.messages} "
            f"(read {ended.read}, failed {ended.failed}, skipped {ended.skipped})"
        )


def spark_times(run: Launched, bench_url: str, source: Source, mode: str, way: str) -> SparkTimes:
    """The run's clock, in seconds from the submission."""
    watch = run.watch
    if watch.ready is None or watch.driver_started is None or run.job.finished_at is None:
        raise harness.BenchError(f"{way}: the job never stored its Spark application id")
    if watch.first_write is None:
        raise harness.BenchError(f"{way}: the watcher never saw the job's first write")
    with psycopg.connect(bench_url, autocommit=True) as conn:
        row = conn.execute(FIRST_COPY_SQL, [source.origin_id]).fetchone()
    first_copy: datetime | None = row[0] if row else None

    def since_submit(moment: datetime) -> float:
        return moment.timestamp() - run.submitted

    return SparkTimes(
        mode=mode,
        total=run.seconds,
        submit=run.submit_seconds,
        ready=since_submit(watch.ready),
        ready_exact=watch.ready_exact,
        driver_started=since_submit(watch.driver_started),
        first_jdbc=since_submit(watch.first_jdbc) if watch.first_jdbc else None,
        first_write=since_submit(watch.first_write),
        first_copy=since_submit(first_copy) if first_copy else None,
        finished=since_submit(run.job.finished_at),
        db_seconds=run.db_seconds,
        longest_seconds={kind: round(value, 1) for kind, value in sorted(watch.longest.items())},
    )


def run_warmup(setup: Setup, timeout: float) -> harness.Timed:
    """The warm-up job on the Spark Connect server: its own few dead letters,
    so the measured job runs on a server that has run a job before."""
    result, _ = run_spark(setup.bench_url, setup.warmup, timeout, "connect", "warmup")
    return result


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
    verify(setup.bench_url, setup.main, sample, "orm")
    return harness.Timed("orm", seconds, sample)


# --- driver and report --------------------------------------------------------------------


@dataclass
class Figures:
    results: dict[str, harness.Timed] = field(default_factory=dict)
    spark: dict[str, SparkTimes] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    warmup: harness.Timed | None = None
    firings: Firings | None = None
    # The 1-minute load average at the start and at the end of the ways.
    load: dict[str, float] = field(default_factory=dict)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def run_all(options: Options, bench_url: str) -> Figures:
    figures = Figures()
    with (
        tempfile.TemporaryDirectory(prefix="bench-archive-") as archive,
        tempfile.TemporaryDirectory(prefix="bench-redis-") as directory,
        tempfile.TemporaryDirectory(prefix="bench-spark-connect-") as server_directory,
    ):
        _spark.spark_environment(
            bench_url,
            Path(archive),
            LAZARETTO_SPARK_PARTITIONS=options.partitions,
            LAZARETTO_REPLAY_SLICE_ROWS=options.slice_rows,
        )
        os.environ.pop("SPARK_REMOTE", None)
        harness.setup_django(bench_url)
        with private_redis(Path(directory)) as redis_server:
            driver_environment(redis_server.url)
            figures.config = _spark.spark_config()
            harness.log(f"spark settings: {figures.config}")
            harness.log(
                f"setup: dead-lettering {options.messages} messages of {options.size} bytes"
            )
            setup = dead_letter(bench_url, options)
            figures.load["start"] = load_average()
            reset(setup)
            harness.log(f"insert_select: {options.messages} messages in one statement")
            figures.results["insert_select"] = run_insert_select(setup)
            with _spark.connect_server(Path(server_directory)) as remote:
                figures.config["remote"] = remote
                reset(setup)
                spark_mode("connect", remote)
                harness.log(f"warmup: {setup.warmup.messages} messages on {remote}")
                figures.warmup = run_warmup(setup, options.spark_timeout)
                reset(setup)
                harness.log(
                    f"spark_connect: replay job for {options.messages} messages on the warm "
                    f"server {remote}"
                )
                result, figures.spark["connect"] = run_spark(
                    bench_url, setup.main, options.spark_timeout, "connect", "spark_connect"
                )
                figures.results["spark_connect"] = result
                figures.firings = run_schedule_firings(
                    options, bench_url, redis_server.url, remote, Path(directory) / "firings"
                )
            spark_mode("classic", None)
            reset(setup)
            harness.log(
                f"spark_classic: replay job for {options.messages} messages, a driver of its "
                f"own on {figures.config['master']}"
            )
            result, figures.spark["classic"] = run_spark(
                bench_url, setup.main, options.spark_timeout, "classic", "spark_classic"
            )
            figures.results["spark_classic"] = result
            reset(setup)
            harness.log(f"orm: {options.orm_sample} messages, one transaction each")
            figures.results["orm"] = run_orm(setup, options.orm_sample)
            figures.load["end"] = load_average()
    return figures


def run_schedule_firings(
    options: Options, bench_url: str, redis_url: str, remote: str, directory: Path
) -> Firings:
    """A replay schedule's firings, its jobs on the warm server at ``remote``."""
    harness.log(f"firings: {options.firings} firings of a replay schedule, its jobs on {remote}")
    firings = run_firings(
        bench_url, redis_url, remote, directory, count=options.firings, size=options.size
    )
    harness.log(
        f"firings: p50 {firings.p50:.2f}s, p99 {firings.p99:.2f}s from due time to first write, "
        f"{firings.skipped} skipped"
    )
    return firings


def end_to_end_limit(figures: Figures) -> float:
    """The most a Spark way's end to end may take: a factor of the single
    statement's time, plus a slack, both in this run."""
    statement = figures.results["insert_select"].seconds
    return TARGETS["end_to_end_vs_insert_select"] * statement + END_TO_END_SLACK_SECONDS


def ratios(figures: Figures) -> dict[str, float]:
    """Per mode: its Spark phase's rate over the single statement's, and its
    end-to-end rate over the ORM loop's."""
    results = figures.results
    found = {}
    for mode, times in figures.spark.items():
        moved = results[f"spark_{mode}"]
        found[f"{mode}_phase_vs_insert_select"] = (
            moved.messages / times.phase / results["insert_select"].rate
        )
        found[f"{mode}_vs_orm"] = moved.rate / results["orm"].rate
    return found


def verdicts(figures: Figures) -> dict[str, str]:
    """PASS or MISS per target and mode; the first-write target is the warm
    server's alone."""
    found = ratios(figures)
    limit = end_to_end_limit(figures)
    judged: dict[str, str] = {}
    for mode, times in figures.spark.items():
        if mode == "connect":
            target = TARGETS["connect_submit_to_first_write_seconds"]
            judged["connect_submit_to_first_write"] = harness.verdict(times.first_write <= target)
        else:
            judged[f"{mode}_submit_to_first_write"] = "n/a (the target is the warm server's)"
        judged[f"{mode}_phase_vs_insert_select"] = harness.verdict(
            found[f"{mode}_phase_vs_insert_select"] >= TARGETS["spark_phase_vs_insert_select"]
        )
        judged[f"{mode}_end_to_end"] = harness.verdict(times.total <= limit)
        judged[f"{mode}_vs_orm"] = harness.verdict(
            found[f"{mode}_vs_orm"] >= TARGETS["spark_vs_orm"]
        )
    if figures.firings is not None:
        judged["schedule_firing_p99"] = harness.verdict(figures.firings.on_target)
    return judged


def mode_summary(mode: str, result: harness.Timed, times: SparkTimes) -> dict[str, Any]:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 2)

    return {
        f"{mode}_end_to_end_seconds": round(times.total, 2),
        f"{mode}_msgs_per_s": round(result.rate, 1),
        f"{mode}_submit_seconds": round(times.submit, 3),
        f"{mode}_submit_to_first_write_seconds": round(times.first_write, 2),
        f"{mode}_submit_to_first_copy_seconds": rounded(times.first_copy),
        f"{mode}_startup_seconds": round(times.ready, 2),
        f"{mode}_startup_exact": times.ready_exact,
        f"{mode}_phase_seconds": round(times.phase, 2),
        f"{mode}_phase_msgs_per_s": round(result.messages / times.phase, 1),
        f"{mode}_driver_started_seconds": round(times.driver_started, 2),
        f"{mode}_first_jdbc_seconds": rounded(times.first_jdbc),
        f"{mode}_finished_seconds": round(times.finished, 2),
        f"{mode}_db_sampled_seconds": times.db_seconds,
        f"{mode}_db_longest_statement_seconds": times.longest_seconds,
    }


def summary(options: Options, figures: Figures) -> dict[str, Any]:
    results = figures.results
    found = ratios(figures)
    figures_by_mode: dict[str, Any] = {}
    for mode, times in figures.spark.items():
        figures_by_mode.update(mode_summary(mode, results[f"spark_{mode}"], times))
    fastest = max(results[f"spark_{mode}"].rate for mode in figures.spark)
    return {
        "bench": "replay",
        "messages": options.messages,
        "payload_bytes": options.size,
        "orm_sample": options.orm_sample,
        "insert_select_seconds": round(results["insert_select"].seconds, 2),
        "insert_select_msgs_per_s": round(results["insert_select"].rate, 1),
        **figures_by_mode,
        "end_to_end_limit_seconds": round(end_to_end_limit(figures), 2),
        "orm_seconds": round(results["orm"].seconds, 2),
        "orm_msgs_per_s": round(results["orm"].rate, 1),
        "orm_is_sample": options.orm_sample < options.messages,
        **{name: round(value, 3) for name, value in found.items()},
        "warmup_messages": figures.warmup.messages if figures.warmup else None,
        "warmup_seconds": round(figures.warmup.seconds, 2) if figures.warmup else None,
        "clock": "seconds from just before replay_job_submit(); end to end: to the launcher's "
        "return after the driver exited; startup: to the driver storing its Spark application "
        "id; phase: startup to end",
        "first_write_definition": FIRST_WRITE_DEFINITION,
        "sqs_redrive_msgs_per_s": SQS_REDRIVE_MSGS_PER_S,
        "spark_vs_sqs_redrive": round(fastest / SQS_REDRIVE_MSGS_PER_S, 1),
        "schedule_firings": figures.firings.summary() if figures.firings else None,
        "load_average": dict(figures.load),
        "verdicts": verdicts(figures),
        "targets": {
            **TARGETS,
            "end_to_end_slack_seconds": END_TO_END_SLACK_SECONDS,
            "schedule_firing_p99_seconds": TARGET_P99_SECONDS,
        },
        "spark": figures.config,
    }


def print_report(options: Options, figures: Figures) -> None:
    results, config = figures.results, figures.config
    warmup = figures.warmup
    harness.title(
        f"replay bench: {options.messages} dead-lettered messages of {options.size} bytes on "
        f"{DLQ}, back to {ORIGIN}",
        f"spark: {config['partitions']} JDBC partitions, slices of "
        f"{config['slice_rows']} rows, fetch {config['fetch_rows']}, "
        f"write batches {config['write_batch_rows']}",
        f"spark_connect: a client of the bench's Spark Connect server ({config.get('remote')}, "
        f"on {config['master']}), warm: it ran a warm-up job of "
        f"{warmup.messages if warmup else '?'} messages first",
        f"spark_classic: a driver of its own on {config['master']}, cold: a new JVM for the job "
        "(its Python loaded ahead, as a pipeline worker keeps a driver)",
        "insert_select: one INSERT ... SELECT, one transaction, unmarked copies (the machine's limit)",
        f"orm: Message.objects.create per message, one transaction each, on a sample of "
        f"{options.orm_sample}",
        f"load average (1 min): {figures.load.get('start')} at the start, "
        f"{figures.load.get('end')} at the end; the machine is shared",
    )
    rows = [
        [name, r.messages, f"{r.seconds:.2f}", f"{r.rate:.0f}"]
        for name, r in ((name, results[name]) for name in WAYS)
    ]
    harness.table(["way", "messages", "seconds", "msgs/s"], rows)
    print()
    rows = []
    for mode, times in figures.spark.items():
        first_copy = "-" if times.first_copy is None else f"{times.first_copy:.2f}"
        rows.append(
            [
                mode,
                f"{times.submit:.2f}",
                f"{times.ready:.2f}{'' if times.ready_exact else '*'}",
                first_copy,
                f"{times.first_write:.2f}",
                f"{times.phase:.2f}",
                f"{results[f'spark_{mode}'].messages / times.phase:.0f}",
                f"{times.total:.2f}",
            ]
        )
    harness.table(
        ["spark", "submit", "startup", "first copy", "first write", "phase", "phase msgs/s", "end"],
        rows,
    )
    print("  seconds from just before replay_job_submit(); * startup seen by polling")
    print(f"  {FIRST_WRITE_DEFINITION}")
    print(
        "  startup: to the driver storing its Spark application id; phase: startup to the "
        "launcher's return (read, route, stage, write, driver exit); end: end to end"
    )
    print()
    print_targets(figures)
    fastest = max(results[f"spark_{mode}"].rate for mode in figures.spark)
    print(
        f"context: SQS's dead-letter redrive tops out at {SQS_REDRIVE_MSGS_PER_S} msgs/s; "
        f"spark moved up to {fastest:.0f} msgs/s ({fastest / SQS_REDRIVE_MSGS_PER_S:.0f}x)"
    )
    harness.print_figures(summary(options, figures))


def print_targets(figures: Figures) -> None:
    found, judged = ratios(figures), verdicts(figures)
    limit = end_to_end_limit(figures)
    statement = figures.results["insert_select"].seconds
    rows = []
    for mode, times in figures.spark.items():
        first = TARGETS["connect_submit_to_first_write_seconds"]
        rows += [
            [
                f"{mode}_submit_to_first_write",
                f"{times.first_write:.2f} s",
                f"<= {first:g} s {judged[f'{mode}_submit_to_first_write']}"
                if mode == "connect"
                else judged[f"{mode}_submit_to_first_write"],
            ],
            [
                f"{mode}_phase_vs_insert_select",
                f"{found[f'{mode}_phase_vs_insert_select']:.2f}",
                f">= {TARGETS['spark_phase_vs_insert_select']:g} "
                f"{judged[f'{mode}_phase_vs_insert_select']}",
            ],
            [
                f"{mode}_end_to_end",
                f"{times.total:.2f} s",
                f"<= {limit:.2f} s ({TARGETS['end_to_end_vs_insert_select']:g} x "
                f"{statement:.2f} + {END_TO_END_SLACK_SECONDS:g}) {judged[f'{mode}_end_to_end']}",
            ],
            [
                f"{mode}_vs_orm",
                f"{found[f'{mode}_vs_orm']:.1f}",
                f">= {TARGETS['spark_vs_orm']:g} {judged[f'{mode}_vs_orm']}",
            ],
        ]
    firings = figures.firings
    if firings is not None:
        rows.append(
            [
                "schedule_firing_p99",
                f"{firings.p99:.2f} s (p50 {firings.p50:.2f}, {len(firings.delays)} firings, "
                f"{firings.skipped} skipped)",
                f"<= {TARGET_P99_SECONDS:g} s {judged['schedule_firing_p99']}",
            ]
        )
    harness.table(["target", "value", "target"], rows, align="<><")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    return harness.main(argv, parse_args, run_all, print_report)


if __name__ == "__main__":
    sys.exit(main())
