"""The replay job's Spark driver.

For each id range of the source (LAZARETTO_REPLAY_SLICE_ROWS rows; the
first ranges of a larger source smaller, FIRST_SLICE_ROWS growing
SLICE_GROWTH-fold, so the first copies are written seconds after the
start): read it over JDBC in LAZARETTO_SPARK_PARTITIONS partitions (or from
the archive's Parquet files), mark what the filter keeps, route it (the
job's target, or the rules table on the executors), load what is to be
written into the staging table, then write the copies with one set-based
statement per range (per second's worth under a velocity limit) that skips
what the job wrote before. A range's write runs in a thread of its own while
Spark reads and routes the next range (``Writes``): two at a time at most,
each committing after the one before it, in the order of the ranges. Counts
are stored after each step, so the console shows progress, and a cancel is
honoured between steps (the launcher also stops the driver outright).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from django.conf import settings
from django.db import connections, transaction
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from broker.models import ReplayJob, ReplayJobStatus, ReplaySource
from broker.pipeline.archive import archive_dir, utc_day
from broker.pipeline.replay import (
    replay_run_finish,
    replay_run_progress,
    replay_run_start,
    replay_stage_analyze,
    replay_stage_bounds,
    replay_stage_clear,
    replay_stage_once,
    replay_write_staged,
)
from broker.pipeline.selection import ReplaySpec
from broker.pipeline.source import source_query, source_range
from broker.rules.routing import FAIL, SKIP, WRITE, route_rows, rules_in
from broker.selectors import queue_names
from workers.spark.session import (
    interrupt_on_sigterm,
    read_range,
    spark_app_id,
    spark_failure,
    spark_session,
    write_table,
)

logger = logging.getLogger(__name__)

FILTERED = "filtered"
MAX_ID = 2**63 - 1  # bigint's largest: an archive replay is one range
# The first range's rows, and how much larger each next one is, up to
# LAZARETTO_REPLAY_SLICE_ROWS.
FIRST_SLICE_ROWS = 5_000
SLICE_GROWTH = 4
SAMPLE_ROWS = 10
# Tests: the driver kills itself right after its first write commits.
KILL_AFTER_WRITE = "LAZARETTO_REPLAY_KILL_AFTER_WRITE"
ROUTED = StructType(
    [
        StructField("id", LongType(), False),
        StructField("verdict", StringType(), False),
        StructField("target", StringType(), True),
        StructField("rule", IntegerType(), False),
        StructField("keep_header", BooleanType(), False),
    ]
)
ROUTED_ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("verdict", pa.string(), False),
        pa.field("target", pa.string()),
        pa.field("rule", pa.int32(), False),
        pa.field("keep_header", pa.bool_(), False),
    ]
)
# What the rules table sees of each source row.
ROUTE_COLUMNS = (
    "id",
    "original_queue",
    "dead_letter",
    "headers",
    "content_type",
    "put_application",
    "put_user",
)
# What a replay from the archive stages besides the route: the message itself.
ARCHIVE_COLUMNS = (
    "payload",
    "content_type",
    "headers",
    "priority",
    "dead_letter",
    "put_application",
    "put_user",
)


class Cancelled(Exception):
    pass


@dataclass
class Tally:
    read: int = 0
    matched: int = 0
    written: int = 0
    skipped: int = 0
    failed: int = 0
    per_target: Counter[str] = field(default_factory=Counter)
    per_rule: Counter[str] = field(default_factory=Counter)
    sample: list[dict[str, Any]] = field(default_factory=list)
    # Of ``skipped``, the sources the rules skipped that no write has stored.
    unstored_skips: int = 0

    def stored(self) -> dict[str, Any]:
        return {
            **self.routed(),
            "skipped": self.skipped,
            "written": self.written,
            "per_target": dict(self.per_target),
        }

    def routed(self) -> dict[str, Any]:
        """What the driver alone counts: what it read and how it routed it."""
        return {
            "read": self.read,
            "matched": self.matched,
            "failed": self.failed,
            "per_rule": dict(self.per_rule),
            "sample": list(self.sample),
        }

    def take_skips(self) -> int:
        """The rules' skips no write has stored, handed to the next write."""
        skips, self.unstored_skips = self.unstored_skips, 0
        return skips


def replay_main(job_id: int) -> int:
    """Run a queued job to its end; the exit status says whether it failed."""
    job = replay_run_start(job_id=job_id, pid=os.getpid())
    if job is None:
        logger.info("replay job %s is not queued; nothing to do", job_id)
        return 0
    try:
        spark = spark_session(f"lazaretto-replay-{job.id}")
        interrupt_on_sigterm(spark)
        replay_run_progress(job_id=job.id, spark_app_id=spark_app_id(spark))
        Replay(spark, job).run()
    except Cancelled:
        replay_run_finish(job_id=job.id, status=ReplayJobStatus.CANCELLED)
        return 0
    except Exception as error:
        logger.exception("replay job %s failed", job.id)
        replay_run_finish(job_id=job.id, status=ReplayJobStatus.FAILED, error=spark_failure(error))
        return 1
    replay_run_finish(job_id=job.id, status=ReplayJobStatus.DONE)
    return 0


class Replay:
    def __init__(self, spark: SparkSession, job: ReplayJob) -> None:
        self.spark = spark
        self.job = job
        self.spec = ReplaySpec.of(job)
        self.tally = Tally()
        self.from_archive = job.source == ReplaySource.ARCHIVE
        # The rules table's rules, numbered from 1 (0: none matched).
        self.rules = rules_in(self.spec.rules_text)
        self.queues = queue_names()
        self.writes = Writes()

    def run(self) -> None:
        replay_stage_clear(job_id=self.job.id)
        with self.writes:
            self._run()
            self._settled(self.writes.settle())
        self._report()

    def _run(self) -> None:
        if self.from_archive:
            # Kept (memory, then disk) so the count and the routing read the
            # Parquet files once.
            frame = self._archive_frame().persist()
            try:
                total = frame.count()
                self._report(total=total)
                if total:
                    self._slice(frame, 0, MAX_ID)
            finally:
                frame.unpersist()
            return
        source = source_range(self.spec)
        self._report(total=source.rows)
        if not source.rows:
            return
        query = source_query(self.spec, with_payload=bool(self.spec.filter.payload_text))
        for first, last in id_ranges(
            source.first_id, source.last_id, source.rows, settings.LAZARETTO_REPLAY_SLICE_ROWS
        ):
            self._slice(read_range(self.spark, query, first, last), first - 1, last)

    # --- reading -----------------------------------------------------------------

    def _archive_frame(self) -> DataFrame:
        root = archive_dir()
        if not any(root.glob("queue=*/day=*/*.parquet")):
            return self.spark.createDataFrame([], ROUTED)
        frame = self.spark.read.option("basePath", str(root)).parquet(str(root))
        # A message archived without its payload has nothing to replay.
        frame = frame.where(F.col("payload").isNotNull())
        window = self.spec.filter
        if window.queues:
            frame = frame.where(F.col("queue").isin(list(window.queues)))
        if window.since:
            frame = frame.where(F.col("day") >= utc_day(window.since))
            frame = frame.where(F.col("created_at") >= F.lit(window.since))
        if window.until:
            frame = frame.where(F.col("day") <= utc_day(window.until))
            frame = frame.where(F.col("created_at") < F.lit(window.until))
        return frame.withColumn("original_queue", F.col("queue")).withColumn(
            "queue_name", F.col("queue")
        )

    def _kept(self) -> Column:
        """What the filter keeps, beyond the source, queues and time range
        the read already applied."""
        window = self.spec.filter
        kept = F.lit(True)
        if window.reason:
            kept = kept & (F.get_json_object("dead_letter", "$.reason") == window.reason)
        pair = window.header_pair
        if pair is not None:
            headers = F.from_json("headers", "map<string,string>")
            kept = kept & (headers.getItem(pair[0]) == pair[1])
        if window.payload_text:
            kept = kept & F.col("payload").cast("string").contains(window.payload_text)
        return F.coalesce(kept, F.lit(False))

    # --- routing -----------------------------------------------------------------

    def _routed(self, frame: DataFrame) -> DataFrame:
        marked = frame.withColumn("kept", self._kept())
        dropped = marked.where(~F.col("kept")).select(
            "id",
            F.lit(FILTERED).alias("verdict"),
            F.lit(None).cast("string").alias("target"),
            F.lit(0).alias("rule"),
            F.lit(True).alias("keep_header"),
        )
        kept = marked.where(F.col("kept"))
        if self.spec.rules_text.strip():
            routed = route_frame(
                kept,
                rules_text=self.spec.rules_text,
                target=self.spec.target_queue,
                queue_manager=settings.LAZARETTO_INSTANCE_NAME,
            )
        else:
            target = (
                F.lit(self.spec.target_queue) if self.spec.target_queue else F.col("original_queue")
            )
            routed = kept.select(
                "id",
                F.when(target.isNull() | (target == ""), F.lit(FAIL))
                .otherwise(F.lit(WRITE))
                .alias("verdict"),
                target.alias("target"),
                F.lit(0).alias("rule"),
                F.lit(True).alias("keep_header"),
            )
        known = F.col("target").isin(self.queues)
        routed = routed.withColumn(
            "verdict",
            F.when((F.col("verdict") == WRITE) & ~known, F.lit(FAIL)).otherwise(F.col("verdict")),
        )
        everything = routed.unionByName(dropped)
        if self.from_archive:
            everything = everything.join(frame.select("id", *ARCHIVE_COLUMNS), "id")
        return everything

    # --- one id range ------------------------------------------------------------

    def _slice(self, frame: DataFrame, after: int, upto: int) -> None:
        routed = self._routed(frame)
        if self.job.dry_run:
            self._dry_run(routed)
        elif self._count(self._stage(routed)):
            if self.job.velocity is None:
                self._settled(self.writes.room())
                progress, skips = self.tally.routed(), self.tally.take_skips()
                self.writes.submit(
                    lambda before: self._write_staged(after, upto, progress, skips, before)
                )
            else:
                self._settled(self.writes.settle())
                self._write_paced(after, upto)
        self._report()

    def _dry_run(self, routed: DataFrame) -> None:
        """A dry run's range: its routing counted, and a sample of what it
        would write."""
        routed = routed.persist()
        try:
            self._count(routed.groupBy("verdict", "target", "rule").count().collect())
            self._sample(routed)
        finally:
            routed.unpersist()

    def _count(self, groups: list[Any]) -> int:
        """Add a range's routing to the tally; returns the messages to write."""
        tally = self.tally
        to_write = 0
        for verdict, target, rule, count in groups:
            tally.read += count
            if verdict == FILTERED:
                continue
            tally.matched += count
            if self.spec.rules_text.strip():
                tally.per_rule[str(rule)] += count  # 0: no rule matched
            if verdict == FAIL:
                tally.failed += count
            elif verdict == SKIP:
                tally.skipped += count
                tally.unstored_skips += count
            elif verdict == WRITE:
                to_write += count
                if self.job.dry_run:
                    tally.written += count
                    tally.per_target[target] += count
        return to_write

    def _sample(self, routed: DataFrame) -> None:
        if len(self.tally.sample) >= SAMPLE_ROWS:
            return
        rows = (
            routed.where(F.col("verdict") == WRITE)
            .orderBy("id")
            .limit(SAMPLE_ROWS - len(self.tally.sample))
            .collect()
        )
        self.tally.sample += [
            {"message": row["id"], "target": row["target"], "rule": row["rule"]} for row in rows
        ]

    def _stage(self, routed: DataFrame) -> list[tuple[str, None, int, int]]:
        """Load the range's copies to write into the staging table, and count
        how its rows were routed as they go by (one Spark job for both):
        the (verdict, target, rule, rows) groups ``_count`` takes, without
        the targets, which the write counts."""
        groups = [(FILTERED, 0)] + [
            (verdict, rule) for verdict in (FAIL, SKIP, WRITE) for rule in range(self.rules + 1)
        ]
        observation = Observation()
        routed = routed.observe(
            observation,
            *(
                F.count_if((F.col("verdict") == verdict) & (F.col("rule") == rule)).alias(
                    f"{verdict}_{rule}"
                )
                for verdict, rule in groups
            ),
        )
        columns: list[Column | str] = [
            F.lit(self.job.id).cast("long").alias("job_id"),
            F.col("id").alias("source_id"),
            "target",
            F.col("rule").alias("rule_number"),
            "keep_header",
        ]
        if self.from_archive:
            columns += [
                F.col(name).cast("int").alias(name) if name == "priority" else name
                for name in ARCHIVE_COLUMNS
            ]
        write_table(routed.where(F.col("verdict") == WRITE).select(*columns), "broker_replaystage")
        counts = observation.get
        counted = [
            (verdict, None, rule, counts[f"{verdict}_{rule}"])
            for verdict, rule in groups
            if counts[f"{verdict}_{rule}"]
        ]
        if any(verdict == WRITE for verdict, *_ in counted):
            replay_stage_analyze()
        return counted

    # --- writing -----------------------------------------------------------------

    def _write_paced(self, after: int, upto: int) -> None:
        """Write the range's staged copies under the job's velocity limit,
        in statements of at most ``velocity`` messages, a second apart."""
        assert self.job.velocity is not None
        bounds = replay_stage_bounds(
            job_id=self.job.id, after=after, upto=upto, velocity=self.job.velocity
        )
        skips = self.tally.take_skips()
        for upper in bounds:
            started = time.monotonic()
            self._settled(self._write_staged(after, upper, self.tally.routed(), skips))
            after, skips = upper, 0
            if upper != bounds[-1]:
                self._report()
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

    def _write_staged(
        self,
        after: int,
        upto: int,
        progress: dict[str, Any],
        skips: int,
        before: Callable[[], None] | None = None,
    ) -> ReplayJob:
        """One write of the staged copies of (after, upto], which stores
        ``progress`` (the run's counts as they stood when the range was
        staged) and ``skips`` with what it wrote, as it commits: after
        ``before`` returns, when it is given (broker.pipeline.replay's
        replay_write_staged)."""
        with transaction.atomic():
            if self.job.runs > 1:
                # A staging load an earlier run left running (on a Spark
                # Connect server its client's death does not stop it) may
                # have staged these sources too.
                replay_stage_once(job_id=self.job.id, after=after, upto=upto)
            stored = replay_write_staged(
                job=self.job,
                after=after,
                upto=upto,
                progress=progress,
                skipped=skips,
                before=before,
            )
        if os.environ.get(KILL_AFTER_WRITE):
            os.kill(os.getpid(), signal.SIGKILL)
        return stored

    def _settled(self, stored: ReplayJob | None) -> None:
        """The tally goes on from what a write stored (once no write is
        under way, all of it)."""
        if stored is not None:
            self.tally.written = stored.written
            self.tally.skipped = stored.skipped + self.tally.unstored_skips
            self.tally.per_target = Counter(stored.per_target)

    def _report(self, **extra: Any) -> None:
        """Store the run's counts. While a write is under way, only those
        the driver keeps alone: the write stores the others as it commits."""
        counts = self.tally.stored() if self.writes.settled else self.tally.routed()
        if replay_run_progress(job_id=self.job.id, **counts, **extra):
            raise Cancelled


def id_ranges(first: int, last: int, rows: int, slice_rows: int) -> Iterator[tuple[int, int]]:
    """[first, last] as consecutive id ranges of about ``slice_rows`` of its
    ``rows`` rows each (ids spread evenly), the first ones smaller:
    FIRST_SLICE_ROWS, then SLICE_GROWTH times as many each. A source of one
    slice or less is one range: its first write comes soon anyway, and each
    range costs its own Spark jobs."""
    if rows <= slice_rows:
        yield first, last
        return
    per_id = rows / (last - first + 1)
    size = min(FIRST_SLICE_ROWS, slice_rows)
    while first <= last:
        upto = min(first + max(1, math.ceil(size / per_id)) - 1, last)
        yield first, upto
        first, size = upto + 1, min(size * SLICE_GROWTH, slice_rows)


class Writes:
    """A run's range writes, each in a thread of its own (with a database
    connection of its own) while the driver goes on with the next range: up
    to DEPTH under way at once, PostgreSQL inserting the copies of two
    ranges on two cores. They commit in the order they were submitted: each
    is given a ``before`` that returns once the write before it committed
    (or raises its error). ``room`` and ``settle`` wait for writes under way
    and return what the last of them stored, or raise its error."""

    DEPTH = 2

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=self.DEPTH, thread_name_prefix="replay-write")
        self._pending: deque[Future[ReplayJob]] = deque()

    def submit(self, write: Callable[[Callable[[], None]], ReplayJob]) -> None:
        """Start ``write(before)``; there must be room for it."""
        assert len(self._pending) < self.DEPTH, "no room for another write"
        previous = self._pending[-1] if self._pending else None

        def before() -> None:
            if previous is not None:
                previous.result()

        def run() -> ReplayJob:
            try:
                return write(before)
            finally:
                connections.close_all()

        self._pending.append(self._pool.submit(run))

    def room(self) -> ReplayJob | None:
        """Wait until another write may start; what the writes that ended
        stored last."""
        stored = None
        while self._pending and (len(self._pending) >= self.DEPTH or self._pending[0].done()):
            stored = self._pending.popleft().result()
        return stored

    def settle(self) -> ReplayJob | None:
        """Wait for every write under way; what the last one stored."""
        stored = None
        while self._pending:
            stored = self._pending.popleft().result()
        return stored

    @property
    def settled(self) -> bool:
        """No write is under way."""
        return not self._pending

    def __enter__(self) -> Writes:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        try:
            if kind is None:
                self.settle()
            else:
                # The run failed or was cancelled: each write under way
                # commits or not as a whole, and the run's error is the one
                # to report.
                wait(self._pending)
        finally:
            self._pool.shutdown()


def route_frame(frame: DataFrame, *, rules_text: str, target: str, queue_manager: str) -> DataFrame:
    """``frame``'s rows (ROUTE_COLUMNS) routed by the rules table in
    ``rules_text`` on the executors (``broker.rules.routing.route_rows``), as
    ROUTED rows. Arrow batches in and out (mapInArrow): the same on a
    driver's own session and on a Spark Connect server, which has no RDDs."""

    def route(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            routed = list(
                route_rows(
                    batch.to_pylist(),
                    rules_text=rules_text,
                    target=target,
                    queue_manager=queue_manager,
                )
            )
            columns = list(zip(*routed, strict=True)) if routed else [()] * len(ROUTED_ARROW)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(column, type=spec.type)
                    for column, spec in zip(columns, ROUTED_ARROW, strict=True)
                ],
                schema=ROUTED_ARROW,
            )

    return frame.select(*ROUTE_COLUMNS).mapInArrow(route, ROUTED)
