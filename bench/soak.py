"""Soak: steady publishing at 70 % of the measured drain rate, then an idle
transaction that keeps VACUUM from cleaning, then the recovery after it.

The base rate is the drain measured while publishing (idle with
--no-drain-while-publishing): publishing takes its share of the machine, so
70 % of the idle rate would be more than it can deliver while it also
publishes. The time series goes to var/bench/soak-<UTC>.json and
var/bench/soak-latest.json.

--retention full|headers|none makes every queue of the run keep that much of
a delivered message (delivered_retention). Progress is the queues'
delivered counter, which the ack writes in every mode. A sampled message's
latency is its DLVD row's (updated_at - created_at) where the row is kept;
in mode none, where the ack deletes it, the sampler looks its messages up
every GONE_TICK_SECONDS (and after each publish call that sampled some) and
takes the ack as the midpoint between the last lookup that found it live and
the first that did not.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench import _celery
from bench import _harness as harness
from bench._loaders import PUT_APPLICATION, PUT_USER, queue_empty

if TYPE_CHECKING:
    from broker.models import Queue
    from broker.services.publish import NewMessage

PHASES = ("steady", "idle_txn", "recovery")
WINDOW_SECONDS = 10.0
# The publisher publishes what is due every tick, in calls of at most 1000.
PUBLISH_TICK_SECONDS = 0.1
PUBLISH_BATCH_LIMIT = 1000
# The latency sampler looks up its pending messages once a second where the
# ack keeps a DLVD row (whose updated_at is the ack's time)...
SAMPLE_TICK_SECONDS = 1.0
# ... and every 50 ms in mode none, where a message's ack is seen only as its
# row vanishing: the latency is then known within half the time between two
# lookups (the tick and the lookup's own time).
GONE_TICK_SECONDS = 0.05
# Mode none: the oldest pending samples looked up per tick (with those just
# sampled, once, for their publish time). Messages are delivered about in id
# order, so the acks are among the oldest; and a backlog cannot make the
# lookups (a primary key probe each, 20 to 30 times a second) dearer, and so
# slow the deliveries they measure. Half a second of samples at
# LATENCY_SAMPLES_PER_WINDOW: more than a steady phase that keeps up leaves
# pending.
GONE_LOOKUP_LIMIT = 100
RETENTIONS = ("full", "headers", "none")
# About this many latency samples per window: one published message in k is
# followed, k chosen from the rate (every message below 200 msgs/s).
LATENCY_SAMPLES_PER_WINDOW = 2000
# Pending samples looked up per tick, oldest first: five times what a tick
# acks at the publish rate, so a burst of acks is caught up in a few ticks.
LOOKUP_LIMIT = 5 * round(LATENCY_SAMPLES_PER_WINDOW * SAMPLE_TICK_SECONDS / WINDOW_SECONDS)
LOAD_FRACTION = 0.7
CONCURRENCY = 2
BATCH_SIZE = 100
DRAIN_MESSAGES = 20_000
# The drain while publishing: acks counted over this long, after a warm-up
# (workers started, the backlog's growth settled) that is not counted.
LOADED_WARMUP_SECONDS = 10.0
LOADED_SECONDS = 30.0
# The recovery check: p99 of the window starting this long after the idle
# transaction ends, against the steady phase's p99.
RECOVERY_CHECK_SECONDS = 60.0
# The steady phase kept up when it acked at least this share of what it
# published; otherwise the recovery check has no baseline and misses.
STEADY_KEPT_UP = 0.95
TARGETS = {
    # |acked/s of the last steady minute vs the first|, in %.
    "drift_pct": 10.0,
    # Mean dead tuples in the steady phase's second half over its first
    # half's. A stable vacuum sawtooth gives about 1; dead tuples growing
    # linearly from the start give 3. The mean, not the max: one vacuum that
    # comes a naptime late doubles one sample's count and barely moves a mean.
    "dead_tuples_growth": 1.5,
    # p99 RECOVERY_CHECK_SECONDS after the idle transaction, over the steady p99.
    "recovery_p99_vs_steady": 2.0,
    # The live partition's size at the end of the steady phase over its size
    # in the middle: it holds the backlog and the dead tuples between two
    # vacuums, so it should stop growing once the first vacuums have run.
    # (The size counts every page a vacuum freed for reuse: it never shrinks.)
    "live_partition_growth": 1.25,
}
LIVE_PARTITION = "broker_message_live"
DELIVERED_PARTITION = "broker_message_delivered"
QUEUE_NAME = "BENCH.SOAK"
DRAIN_QUEUE_NAME = "BENCH.SOAK.DRAIN"
LOADED_QUEUE_NAME = "BENCH.SOAK.LOADED"
# Progress of the backlog's drain after the publisher stops.
DRAIN_LOG_SECONDS = 30.0

# Dead and live tuples, autovacuum runs and size of broker_message and of
# every partition of it. pg_partition_tree gives no row for a table that is
# not partitioned, hence the union with the table itself. Catalog and
# statistics reads only.
RELATIONS_SQL = """
WITH tree AS (
    SELECT relid, isleaf, level FROM pg_partition_tree('broker_message')
    UNION
    SELECT oid, relkind <> 'p', 0 FROM pg_class WHERE oid = 'broker_message'::regclass
)
SELECT t.relid::regclass::text, t.isleaf,
       coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0), coalesce(s.autovacuum_count, 0),
       s.last_autovacuum, pg_total_relation_size(t.relid)
FROM tree AS t
LEFT JOIN pg_stat_user_tables AS s ON s.relid = t.relid
ORDER BY t.level, t.relid::regclass::text
"""
# The sampled messages acked so far, looked up by primary key. ``state =
# 'DLVD'`` prunes a partitioned table to its delivered partition. The times
# are the publish's and the ack's transaction now() (see BARE_ACK_SQL). Modes
# full and headers.
ACKED_SQL = """
SELECT m.id, extract(epoch FROM m.updated_at)::float8,
       extract(epoch FROM m.updated_at - m.created_at)::float8
FROM unnest(%(ids)s::bigint[]) AS s(id)
JOIN broker_message AS m ON m.id = s.id
WHERE m.state = 'DLVD'
"""
# Mode none: each sampled message's publish time (the publish transaction's
# now()) while it is live, else NULL, and this lookup's time (its snapshot's,
# in autocommit). A primary key lookup per message, whatever the plan;
# ``state <> 'DLVD'`` prunes to the live partition. A message the lookup does
# not find was acknowledged since the last lookup that did.
GONE_SQL = """
SELECT s.id,
       (SELECT extract(epoch FROM m.created_at)::float8 FROM broker_message AS m
        WHERE m.id = s.id AND m.state <> 'DLVD'),
       extract(epoch FROM now())::float8
FROM unnest(%(ids)s::bigint[]) AS s(id)
"""
# Mode none, after the run: rows of the delivered partition, which nothing
# should have written.
DELIVERED_ROWS_SQL = "SELECT count(*) FROM broker_message WHERE state = 'DLVD'"
# Checkpoints the cluster has started, timed and requested (a CHECKPOINT or
# a DROP DATABASE, by anyone on the cluster): each writes out what is dirty
# and, with full_page_writes, makes the next change of every page log it
# whole. PostgreSQL 17 moved them to pg_stat_checkpointer.
CHECKPOINTS_SQL = {
    False: "SELECT checkpoints_timed, checkpoints_req FROM pg_stat_bgwriter",
    True: "SELECT num_timed, num_requested FROM pg_stat_checkpointer",
}
# What keeps VACUUM from removing dead tuples in the bench database: the
# oldest transaction holding a snapshot or an xid there (seconds since it
# began, and what it is), and how many xids old the xmin of an autovacuum
# worker vacuuming there is (NULL: none at work). The idle transaction is the
# oldest in its phase; afterwards, anything long is something else.
HORIZON_SQL = """
SELECT coalesce(extract(epoch FROM now() - o.xact_start), 0)::float8,
       coalesce(o.backend_type || ' ' || o.state || ': ' || left(o.query, 80), ''),
       (SELECT max(age(backend_xmin)) FROM pg_stat_activity
        WHERE datname = current_database() AND backend_type = 'autovacuum worker')
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT xact_start, backend_type, state, query FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND backend_type <> 'autovacuum worker'
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    ORDER BY xact_start LIMIT 1
) AS o ON true
"""
# The idle transaction: an xid of its own, and a read of broker_message.
IDLE_TXN_SQL = (
    "SELECT txid_current(), pg_backend_pid(), (SELECT count(*) FROM "
    "(SELECT 1 FROM broker_message LIMIT 1) AS one)"
)
IDLE_STATE_SQL = "SELECT state, backend_xid::text FROM pg_stat_activity WHERE pid = %s"
# Celery's words for a task that raised (bench.deliver stops on the first; a
# soak counts them and goes on: the final check says whether anything was lost).
TASK_FAILED = _celery.TASK_FAILED + ": "


# --- arguments ------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    minutes: float
    rate: float | None
    idle_minutes: float
    recovery_minutes: float
    drain_messages: int
    size: int
    drain_while_publishing: bool = True
    retention: str = "full"


def retention_mode(text: str) -> str:
    """A delivered_retention mode: full, headers or none."""
    if text not in RETENTIONS:
        raise argparse.ArgumentTypeError(f"must be full, headers or none, not {text!r}")
    return text


def parse_args(argv: Sequence[str] | None) -> Options:
    minutes = harness.positive_float
    parser = harness.parser(
        __doc__,
        size=harness.SIZE,
        minutes=(minutes, 10.0, "steady phase (default 10)"),
        rate=(
            minutes,
            None,
            "publish this many msgs/s instead of 70 %% of the measured drain rate",
        ),
        idle_minutes=(
            minutes,
            3.0,
            "idle transaction held open after the steady phase (default 3)",
        ),
        recovery_minutes=(
            minutes,
            2.0,
            "publishing on after the idle transaction ends (default 2)",
        ),
        drain_messages=(
            harness.positive_int,
            DRAIN_MESSAGES,
            f"messages drained to measure the drain rate (default {DRAIN_MESSAGES})",
        ),
        drain_while_publishing=(
            bool,
            True,
            "base the rate on the drain measured while publishing (default: on)",
        ),
        retention=(
            retention_mode,
            "full",
            "what every queue of the run keeps of a delivered message: full, headers "
            "or none (its delivered_retention; default full)",
        ),
    )
    args = parser.parse_args(argv)
    least_steady = 2 * WINDOW_SECONDS
    if args.minutes * 60 < least_steady:
        parser.error(
            f"--minutes must be at least {least_steady / 60:.2f} ({least_steady:g} s: "
            "a window for each half of the steady phase)"
        )
    least_recovery = RECOVERY_CHECK_SECONDS + WINDOW_SECONDS
    if args.recovery_minutes * 60 < least_recovery:
        parser.error(
            f"--recovery-minutes must be at least {least_recovery / 60:.2f} "
            f"({least_recovery:g} s: the p99 is checked in the window that starts "
            f"{RECOVERY_CHECK_SECONDS:g} s after the idle transaction ends)"
        )
    return Options(**vars(args))


# --- the plan: phases cut into windows ----------------------------------------------


@dataclass(frozen=True)
class Window:
    """Seconds from the start of publishing; each phase is cut from its own start."""

    phase: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def plan_windows(phase_seconds: Sequence[tuple[str, float]]) -> list[Window]:
    """Consecutive phases, each cut into WINDOW_SECONDS windows from its own
    start. A remainder of half a window or more is a window of its own; a
    shorter one lengthens the phase's last window."""
    windows: list[Window] = []
    start = 0.0
    for phase, seconds in phase_seconds:
        end = start + seconds
        at = start
        while end - at > 1e-9:
            if end - at < WINDOW_SECONDS / 2 and windows and windows[-1].phase == phase:
                windows[-1] = Window(phase, windows[-1].start, end)
                break
            windows.append(Window(phase, at, min(at + WINDOW_SECONDS, end)))
            at += WINDOW_SECONDS
        start = end
    return windows


def phase_bounds(windows: Sequence[Window]) -> dict[str, list[float]]:
    """{phase: [start, end]} in seconds from the start of publishing."""
    bounds: dict[str, list[float]] = {}
    for window in windows:
        if window.phase in bounds:
            bounds[window.phase][1] = window.end
        else:
            bounds[window.phase] = [window.start, window.end]
    return bounds


# --- the figures: pure computations ---------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (an observed value); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def bin_latencies(
    acks: Sequence[tuple[float, float]], windows: Sequence[Window]
) -> list[list[float]]:
    """Latencies (seconds) by the window their ack falls in; ``acks`` are
    (ack time in seconds from the start of publishing, latency). Acks outside
    every window are left out."""
    bins: list[list[float]] = [[] for _ in windows]
    starts = [window.start for window in windows]
    for at, seconds in acks:
        index = bisect.bisect_right(starts, at) - 1
        if index >= 0 and at < windows[index].end:
            bins[index].append(seconds)
    return bins


def latency_ms(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p95 and p99 in milliseconds."""
    return {
        f"p{q}_ms": None if (value := percentile(values, q)) is None else round(value * 1000, 1)
        for q in (50, 95, 99)
    }


@dataclass(frozen=True)
class Sample:
    """One window of the time series (the JSON file's "samples")."""

    t: float  # the window's end, seconds from the start of publishing
    window_s: float
    phase: str
    published_per_s: float
    acked_per_s: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    latency_samples: int
    dead_tuples: int  # at the window's end, summed over the table and its partitions
    live_tuples: int
    table_bytes: int
    backlog: int  # TBDL + DLNG at the window's end
    # The machine's 1-minute load average at the window's end (2 cores: above
    # 2, something waits for a CPU).
    loadavg_1m: float = 0.0
    relations: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Checkpoints the cluster started in the window (timed and requested).
    checkpoints_timed: int = 0
    checkpoints_requested: int = 0
    # At the window's end, in the bench database: seconds since the oldest
    # transaction holding a snapshot or an xid began, and what it is (when
    # over HOLDER_SECONDS); the xid age of a working autovacuum's xmin.
    oldest_snapshot_s: float = 0.0
    oldest_holder: str = ""
    vacuum_xmin_age: int | None = None

    @property
    def start(self) -> float:
        return self.t - self.window_s


def phase_samples(samples: Sequence[Sample], phase: str) -> list[Sample]:
    return [sample for sample in samples if sample.phase == phase]


def rate_over(samples: Sequence[Sample], attribute: str) -> float | None:
    """Messages per second over several windows (weighted by their length)."""
    seconds = sum(sample.window_s for sample in samples)
    if not seconds:
        return None
    return sum(getattr(sample, attribute) * sample.window_s for sample in samples) / seconds


def drift_windows(steady: Sequence[Sample]) -> tuple[list[Sample], list[Sample]]:
    """The steady phase's first and last minute (its halves when it is
    shorter than two minutes), as whole windows."""
    if not steady:
        return [], []
    begin, end = steady[0].start, steady[-1].t
    span = min(60.0, (end - begin) / 2)
    first = [sample for sample in steady if sample.t <= begin + span + 1e-9]
    last = [sample for sample in steady if sample.start >= end - span - 1e-9]
    return first, last


def drift_pct(samples: Sequence[Sample], attribute: str = "acked_per_s") -> float | None:
    """Change of the rate from the steady phase's first minute to its last, in %."""
    first, last = drift_windows(phase_samples(samples, "steady"))
    before, after = rate_over(first, attribute), rate_over(last, attribute)
    if before is None or after is None or before == 0:
        return None
    return (after - before) / before * 100


@dataclass(frozen=True)
class DeadTuples:
    """Dead tuples in each half of the steady phase: the mean of the samples
    (what the growth compares) and the most."""

    first_half_mean: float
    second_half_mean: float
    first_half_max: int
    second_half_max: int

    @property
    def growth(self) -> float | None:
        if self.first_half_mean == 0:
            return None if self.second_half_mean else 1.0
        return self.second_half_mean / self.first_half_mean

    @property
    def bounded(self) -> bool:
        growth = self.growth
        return growth is not None and growth <= TARGETS["dead_tuples_growth"]


def dead_tuples_halves(samples: Sequence[Sample]) -> DeadTuples:
    """Dead tuples in each half of the steady phase (windows by their end)."""
    steady = phase_samples(samples, "steady")
    if not steady:
        return DeadTuples(0, 0, 0, 0)
    middle = (steady[0].start + steady[-1].t) / 2
    first = [sample.dead_tuples for sample in steady if sample.t <= middle + 1e-9]
    second = [sample.dead_tuples for sample in steady if sample.t > middle + 1e-9]
    return DeadTuples(
        statistics.fmean(first) if first else 0.0,
        statistics.fmean(second) if second else 0.0,
        max(first, default=0),
        max(second, default=0),
    )


@dataclass(frozen=True)
class Recovery:
    steady_p99_ms: float | None
    # The window starting RECOVERY_CHECK_SECONDS after the idle transaction ended.
    check_t: float | None
    check_p99_ms: float | None
    # Seconds from the end of the idle transaction to the start of the first
    # window from which every window's p99 is within the bound; None: never.
    recovered_after_s: float | None
    idle_max_p99_ms: float | None
    # Acked/s over published/s in the steady phase. Below STEADY_KEPT_UP the
    # steady phase built a backlog, and its p99 is no baseline to recover to.
    steady_acked_ratio: float | None = None

    @property
    def steady_kept_up(self) -> bool:
        return self.steady_acked_ratio is not None and self.steady_acked_ratio >= STEADY_KEPT_UP

    @property
    def bound_ms(self) -> float | None:
        if self.steady_p99_ms is None:
            return None
        return self.steady_p99_ms * TARGETS["recovery_p99_vs_steady"]

    @property
    def passed(self) -> bool:
        bound = self.bound_ms
        return (
            self.steady_kept_up
            and bound is not None
            and self.check_p99_ms is not None
            and self.check_p99_ms <= bound
        )


def recovery_check(samples: Sequence[Sample], steady_p99_ms: float | None) -> Recovery:
    """Is the p99 back within the bound RECOVERY_CHECK_SECONDS after the idle
    transaction ended (the start of the recovery phase)?"""
    recovery = phase_samples(samples, "recovery")
    idle = phase_samples(samples, "idle_txn")
    idle_p99 = [sample.p99_ms for sample in idle if sample.p99_ms is not None]
    steady = phase_samples(samples, "steady")
    published, acked = rate_over(steady, "published_per_s"), rate_over(steady, "acked_per_s")
    ratio = None if not published or acked is None else acked / published
    if not recovery:
        return Recovery(steady_p99_ms, None, None, None, max(idle_p99, default=None), ratio)
    ended = recovery[0].start
    check = next(
        (sample for sample in recovery if sample.start >= ended + RECOVERY_CHECK_SECONDS - 1e-9),
        None,
    )
    bound = None if steady_p99_ms is None else steady_p99_ms * TARGETS["recovery_p99_vs_steady"]
    recovered_after = None
    if bound is not None:
        for sample in reversed(recovery):
            if sample.p99_ms is None or sample.p99_ms > bound:
                break
            recovered_after = sample.start - ended
    return Recovery(
        steady_p99_ms=steady_p99_ms,
        check_t=None if check is None else check.start,
        check_p99_ms=None if check is None else check.p99_ms,
        recovered_after_s=recovered_after,
        idle_max_p99_ms=max(idle_p99, default=None),
        steady_acked_ratio=ratio,
    )


def relation_summary(
    samples: Sequence[Sample], at_start: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per relation (the table, or each partition): max dead tuples per
    phase, size at the end, autovacuum runs since ``at_start``."""
    if not samples:
        return {}
    last = samples[-1].relations
    return {
        name: {
            "max_dead_tuples": {
                phase: max(
                    (sample.relations[name]["dead_tuples"] for sample in rows),
                    default=0,
                )
                for phase in PHASES
                if (rows := phase_samples(samples, phase))
            },
            "bytes_end": rel["bytes"],
            "autovacuums": rel["autovacuum_count"] - at_start.get(name, rel)["autovacuum_count"],
        }
        for name, rel in last.items()
    }


def relation_bytes(sample: Sample | None, name: str) -> int | None:
    """The size of relation ``name`` at the end of the sample's window."""
    if sample is None or name not in sample.relations:
        return None
    return int(sample.relations[name]["bytes"])


@dataclass(frozen=True)
class PartitionGrowth:
    """A partition's size (bytes, indexes and TOAST included) as the
    publisher started, in the middle and at the end of the steady phase,
    and at the end of the run; the messages acked in the steady phase."""

    name: str
    at_start: int | None
    steady_middle: int | None
    steady_end: int | None
    at_end: int | None
    steady_acked: float

    @property
    def steady_second_half_growth(self) -> float | None:
        """Size at the end of the steady phase over its size in the middle."""
        if not self.steady_middle or self.steady_end is None:
            return None
        return self.steady_end / self.steady_middle

    @property
    def steady_bytes_per_acked(self) -> float | None:
        """Growth over the steady phase per message acked in it."""
        if self.at_start is None or self.steady_end is None or not self.steady_acked:
            return None
        return (self.steady_end - self.at_start) / self.steady_acked

    @property
    def flat(self) -> bool:
        growth = self.steady_second_half_growth
        return growth is not None and growth <= TARGETS["live_partition_growth"]

    def figures(self) -> dict[str, Any]:
        return {
            "bytes_start": self.at_start,
            "bytes_steady_middle": self.steady_middle,
            "bytes_steady_end": self.steady_end,
            "bytes_end": self.at_end,
            "steady_second_half_growth": _round(self.steady_second_half_growth, 3),
            "steady_bytes_per_acked": _round(self.steady_bytes_per_acked, 1),
        }


def partition_growth(
    samples: Sequence[Sample], at_start: dict[str, dict[str, Any]], name: str
) -> PartitionGrowth:
    """How partition ``name`` grew: its size as the publisher started
    (``at_start``, the first reading's relations), at the end of the steady
    phase's first half and at its end, and at the end of the run."""
    steady = phase_samples(samples, "steady")
    middle = (steady[0].start + steady[-1].t) / 2 if steady else 0.0
    first_half = [sample for sample in steady if sample.t <= middle + 1e-9]
    start = at_start.get(name)
    return PartitionGrowth(
        name=name,
        at_start=None if start is None else int(start["bytes"]),
        steady_middle=relation_bytes(first_half[-1] if first_half else None, name),
        steady_end=relation_bytes(steady[-1] if steady else None, name),
        at_end=relation_bytes(samples[-1] if samples else None, name),
        steady_acked=sum(sample.acked_per_s * sample.window_s for sample in steady),
    )


def build_samples(
    windows: Sequence[Window],
    readings: Sequence[Reading],
    latencies: Sequence[Sequence[float]],
) -> list[Sample]:
    """One sample per window from the readings at its two ends."""
    samples = []
    for window, before, after, values in zip(
        windows, readings[:-1], readings[1:], latencies, strict=True
    ):
        seconds = after.t - before.t
        figures: dict[str, Any] = {name: getattr(after, name) for name in READING_FIELDS}
        figures.update(latency_ms(values))
        samples.append(
            Sample(
                t=round(window.end, 3),
                window_s=round(window.seconds, 3),
                phase=window.phase,
                published_per_s=round((after.published - before.published) / seconds, 1),
                acked_per_s=round((after.acked - before.acked) / seconds, 1),
                latency_samples=len(values),
                checkpoints_timed=after.checkpoints[0] - before.checkpoints[0],
                checkpoints_requested=after.checkpoints[1] - before.checkpoints[1],
                **figures,
            )
        )
    return samples


# --- readings ----------------------------------------------------------------------------

# What a sample takes from the reading at its window's end.
READING_FIELDS = [
    "dead_tuples",
    "live_tuples",
    "table_bytes",
    "backlog",
    "loadavg_1m",
    "relations",
    "oldest_snapshot_s",
    "oldest_holder",
    "vacuum_xmin_age",
]
# An oldest transaction older than this is named in the sample.
HOLDER_SECONDS = 5.0


@dataclass(frozen=True)
class Reading:
    """What the clock loop reads at a window boundary."""

    t: float  # seconds from the start of publishing, as read
    published: int
    acked: int
    backlog: int
    relations: dict[str, dict[str, Any]]
    loadavg_1m: float = 0.0
    # The cluster's checkpoints so far: (timed, requested).
    checkpoints: tuple[int, int] = (0, 0)
    oldest_snapshot_s: float = 0.0
    oldest_holder: str = ""
    vacuum_xmin_age: int | None = None

    @property
    def dead_tuples(self) -> int:
        return sum(int(rel["dead_tuples"]) for rel in self.relations.values())

    @property
    def live_tuples(self) -> int:
        return sum(int(rel["live_tuples"]) for rel in self.relations.values())

    @property
    def table_bytes(self) -> int:
        return sum(int(rel["bytes"]) for rel in self.relations.values())


def read_checkpoints(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """The cluster's checkpoints so far: (timed, requested)."""
    row = conn.execute(CHECKPOINTS_SQL[conn.info.server_version >= 170000]).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def read_horizon(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """HORIZON_SQL's figures, as Reading's fields."""
    row = conn.execute(HORIZON_SQL).fetchone()
    seconds, holder, vacuum_age = row if row else (0.0, "", None)
    return {
        "oldest_snapshot_s": round(float(seconds), 1),
        "oldest_holder": holder if seconds >= HOLDER_SECONDS else "",
        "vacuum_xmin_age": None if vacuum_age is None else int(vacuum_age),
    }


def read_relations(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "leaf": leaf,
            "dead_tuples": dead,
            "live_tuples": live,
            "autovacuum_count": vacuums,
            "last_autovacuum": None if last is None else last.isoformat(),
            "bytes": size,
        }
        for name, leaf, dead, live, vacuums, last, size in conn.execute(RELATIONS_SQL).fetchall()
    }


# --- the publisher and the latency sampler ----------------------------------------------


class Publisher(threading.Thread):
    """Publishes ``rate`` messages a second through ``messages_publish``:
    every PUBLISH_TICK_SECONDS, whatever the schedule says is due since the
    start (so a slow call is caught up on, not dropped), in calls of at most
    PUBLISH_BATCH_LIMIT. Every ``sample_every``-th message is handed to the
    latency sampler, with the time (epoch) its publish call began."""

    def __init__(self, *, queue_name: str, rate: float, message: NewMessage, sample_every: int):
        super().__init__(name="soak-publisher", daemon=True)
        self.queue_name = queue_name
        self.rate = rate
        self.message = message
        self.sample_every = sample_every
        self.stopping = threading.Event()
        # Set when a call has sampled messages (the sampler of mode none
        # looks them up at once).
        self.handed = threading.Event()
        self.lock = threading.Lock()
        self.published = 0
        self.calls = 0
        self.sampled: list[tuple[int, float]] = []
        self.error: BaseException | None = None
        self.started_at = 0.0
        self.longest_call_s = 0.0

    def count(self) -> int:
        with self.lock:
            return self.published

    def take_sampled(self) -> list[tuple[int, float]]:
        with self.lock:
            ids, self.sampled = self.sampled, []
        return ids

    def scheduled(self, now: float) -> int:
        return int(self.rate * (now - self.started_at))

    def run(self) -> None:
        from django.db import connection

        try:
            self.started_at = time.monotonic()
            tick = self.started_at
            while not self.stopping.is_set():
                due = self.scheduled(time.monotonic()) - self.published
                for size in harness.batch_sizes(due, PUBLISH_BATCH_LIMIT) if due > 0 else []:
                    self.publish(size)
                tick += PUBLISH_TICK_SECONDS
                self.stopping.wait(max(0.0, tick - time.monotonic()))
        except BaseException as error:  # reported by the clock loop
            self.error = error
        finally:
            connection.close()

    def publish(self, size: int) -> None:
        from broker.services.publish import messages_publish

        began, began_epoch = time.monotonic(), time.time()
        ids = messages_publish(
            queue_name=self.queue_name,
            messages=[self.message] * size,
            put_user=PUT_USER,
            put_application=PUT_APPLICATION,
        )
        self.longest_call_s = max(self.longest_call_s, time.monotonic() - began)
        # Systematic sample: the messages whose rank in the whole run is a
        # multiple of sample_every.
        offset = -self.published % self.sample_every
        with self.lock:
            self.sampled.extend((id_, began_epoch) for id_ in ids[offset :: self.sample_every])
            self.published += len(ids)
            self.calls += 1
        if len(ids) > offset:
            self.handed.set()


@dataclass
class Followed:
    """Mode none: a sampled message not yet seen acknowledged. ``published``
    is the publish transaction's now() once a lookup has found the row (until
    then the time the publish call began, a little earlier); ``last_seen``
    the time of the last lookup that found it live (until then, the same)."""

    published: float
    last_seen: float
    seen: bool = False


def vanished(followed: Followed, looked_at: float) -> tuple[float, float, float]:
    """Mode none: (ack time, publish-to-ack seconds, uncertainty) of a
    message the lookup at ``looked_at`` no longer found: acknowledged between
    the last lookup that found it and this one, taken as their midpoint,
    within half their distance."""
    at = (followed.last_seen + looked_at) / 2
    return at, at - followed.published, (looked_at - followed.last_seen) / 2


class LatencySampler(threading.Thread):
    """Follows the sampled messages until their ack, on its own connection,
    and keeps (ack time, publish-to-ack seconds) of each.

    Modes full and headers (the ack keeps a DLVD row): once a second it
    looks up the oldest LOOKUP_LIMIT pending ones by primary key
    (ACKED_SQL) and takes the times of those now DLVD from their rows.
    Messages are delivered about in id order, so the oldest pending are the
    ones due; one acked out of order is found once it is among the oldest,
    and the last lookups (``drain``) take every one left. Each latency is
    binned by its ack time, so finding it late changes nothing.

    Mode none (the ack deletes the row): every GONE_TICK_SECONDS, and as soon
    as the publisher has sampled messages, it looks up the oldest
    GONE_LOOKUP_LIMIT pending ones in the live partition (GONE_SQL); one no
    longer there was acknowledged since the last lookup that found it
    (``vanished``). Here finding it late does change the figure, hence the
    short tick; the uncertainty of each is kept."""

    def __init__(self, *, bench_url: str, publisher: Publisher, retention: str = "full"):
        super().__init__(name="soak-latency", daemon=True)
        self.bench_url = bench_url
        self.publisher = publisher
        self.retention = retention
        self.gone = retention == "none"
        self.tick = GONE_TICK_SECONDS if self.gone else SAMPLE_TICK_SECONDS
        self.limit = GONE_LOOKUP_LIMIT if self.gone else LOOKUP_LIMIT
        self.stopping = threading.Event()
        # Ascending: the publisher hands ids over in the order they were made.
        self.pending: list[int] = []
        # Mode none: what is known of each pending message.
        self.followed: dict[int, Followed] = {}
        self.acks: list[tuple[float, float]] = []  # (ack epoch, seconds)
        # Mode none: each ack's uncertainty (seconds either side), and how
        # many were acknowledged before any lookup found them.
        self.uncertainty: list[float] = []
        self.acked_unseen = 0
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.queries = 0
        self.query_seconds = 0.0
        self.longest_query_s = 0.0
        self.most_pending = 0

    def run(self) -> None:
        try:
            with psycopg.connect(self.bench_url, autocommit=True) as conn:
                while not self.stopping.is_set():
                    self.wait()
                    self.sample(conn, self.limit)
                self.take()
                while self.pending and self.sample(conn, self.limit * 10):
                    pass
        except BaseException as error:  # reported by the clock loop
            self.error = error

    def wait(self) -> None:
        """Until the next lookup: a tick; in mode none, at most a tick, and
        no longer once the publisher has sampled messages, so that most are
        found live at least once (and their publish time read from the row)."""
        if not self.gone:
            self.stopping.wait(self.tick)
            return
        self.publisher.handed.wait(self.tick)
        self.publisher.handed.clear()  # before take(): a later hand-over sets it again

    def take(self) -> list[int]:
        """The messages the publisher sampled since the last call."""
        taken = []
        for message_id, began in self.publisher.take_sampled():
            taken.append(message_id)
            if self.gone:
                self.followed[message_id] = Followed(published=began, last_seen=began)
        self.pending += taken
        return taken

    def sample(self, conn: psycopg.Connection[Any], limit: int) -> int:
        """Look up the oldest ``limit`` pending messages (in mode none, and
        those just sampled); returns how many were acked."""
        taken = self.take()
        self.most_pending = max(self.most_pending, len(self.pending))
        oldest = self.pending[:limit]
        if self.gone and len(self.pending) > limit:
            oldest += taken[max(0, limit - len(self.pending) + len(taken)) :]
        if not oldest:
            return 0
        began = time.perf_counter()
        rows = conn.execute(GONE_SQL if self.gone else ACKED_SQL, {"ids": oldest}).fetchall()
        seconds = harness.since(began)
        self.queries += 1
        self.query_seconds += seconds
        self.longest_query_s = max(self.longest_query_s, seconds)
        acks = self.gone_acks(rows) if self.gone else {row[0]: (row[1], row[2]) for row in rows}
        if acks:
            self.pending = [message_id for message_id in self.pending if message_id not in acks]
        with self.lock:
            self.acks += acks.values()
        return len(acks)

    def gone_acks(
        self, rows: Sequence[tuple[int, float | None, float]]
    ) -> dict[int, tuple[float, float]]:
        """Mode none: the lookup's rows (id, publish time or None when the
        message is no longer live, lookup time): note the live ones as seen
        now, and return {id: (ack time, latency)} of the others."""
        acks = {}
        for message_id, created, looked_at in rows:
            followed = self.followed[message_id]
            if created is not None:
                followed.published, followed.last_seen, followed.seen = created, looked_at, True
                continue
            at, latency, uncertainty = vanished(self.followed.pop(message_id), looked_at)
            acks[message_id] = (at, latency)
            self.uncertainty.append(uncertainty)
            self.acked_unseen += not followed.seen
        return acks

    def recent(self, since_epoch: float, until_epoch: float) -> list[float]:
        with self.lock:
            return [seconds for at, seconds in self.acks if since_epoch <= at < until_epoch]


def sample_every(rate: float) -> int:
    """One message in k followed, for about LATENCY_SAMPLES_PER_WINDOW a window."""
    return max(1, round(rate * WINDOW_SECONDS / LATENCY_SAMPLES_PER_WINDOW))


# --- the idle transaction ------------------------------------------------------------------


class IdleTransaction:
    """A connection that opens a transaction, takes an xid and reads
    broker_message, then stays idle in it: no dead tuple younger than its
    xid can be removed (by VACUUM or by index scans) until it ends."""

    def __init__(self, bench_url: str):
        self.bench_url = bench_url
        self.conn: psycopg.Connection[Any] | None = None
        self.pid = 0
        self.xid = 0

    def open(self) -> None:
        self.conn = psycopg.connect(self.bench_url)  # not autocommit: BEGIN on first statement
        self.conn.execute("SET idle_in_transaction_session_timeout = 0")
        row = self.conn.execute(IDLE_TXN_SQL).fetchone()
        assert row is not None
        self.xid, self.pid, _ = row
        harness.log(f"idle transaction open: backend {self.pid}, xid {self.xid}")

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """Still idle in its transaction, holding its xid (read on ``conn``)."""
        row = conn.execute(IDLE_STATE_SQL, [self.pid]).fetchone()
        if row is None or row[0] != "idle in transaction" or row[1] != str(self.xid):
            raise harness.BenchError(
                f"the idle transaction (backend {self.pid}) ended early: {row}"
            )

    def close(self) -> None:
        if self.conn is None:
            return
        try:
            self.conn.rollback()
        except psycopg.Error as error:
            raise harness.BenchError(
                f"the idle transaction had ended before its time: {error}"
            ) from None
        finally:
            self.conn.close()
            self.conn = None
        harness.log(f"idle transaction ended (backend {self.pid})")


# --- failed tasks ------------------------------------------------------------------------------


class TaskWatch:
    """Reads what the deliveries and control workers logged since the last
    look and keeps the error of every task that raised."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.offsets = {"deliveries": 0, "control": 0}
        self.errors: list[str] = []

    def look(self) -> list[str]:
        """The errors of the tasks that failed since the last look."""
        new = []
        for name, offset in self.offsets.items():
            path = self.directory / f"{name}.log"
            if not path.exists():
                continue
            with path.open("rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            # Only whole lines; a line being written is read next time.
            whole = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[name] = offset + len(whole)
            new += task_errors(whole.decode(errors="replace"))
        self.errors += new
        return new


def task_errors(text: str) -> list[str]:
    """The error of each failed task in a worker's log text."""
    errors = []
    for line in text.splitlines():
        at = line.find(TASK_FAILED)
        if at >= 0:
            errors.append(line[at + len(TASK_FAILED) :].split(" data=", 1)[0])
    return errors


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drain(harness.Rated):
    """``rate`` is the idle drain: pre-published messages, nothing else running."""

    messages: int
    seconds: float
    first_claim_s: float
    # Acked/s while a publisher offered ``rate`` (measure_loaded_drain).
    loaded_rate: float | None = None

    @property
    def base(self) -> float:
        """The rate the soak publishes a fraction of."""
        return self.rate if self.loaded_rate is None else self.loaded_rate


@dataclass
class Run:
    options: Options
    drain: Drain | None
    rate: float
    layout: str
    windows: list[Window]
    samples: list[Sample]
    # Each window's latencies (seconds), by ack time.
    latencies: list[list[float]]
    # The relations as the publisher started.
    relations_at_start: dict[str, dict[str, Any]]
    published: int
    # TBDL + DLNG when the publisher stopped, and the seconds until all was DLVD.
    backlog_at_end: int
    backlog_drained_s: float
    acked_in_run: int
    latency_sample_every: int
    acks_outside: int
    sampler: dict[str, Any]
    publisher: dict[str, Any]
    idle: dict[str, Any]
    # The error of every Celery task that raised during the soak.
    task_errors: list[str]
    started_utc: str
    # Mode none: rows in the delivered partition after the run (None: not counted).
    delivered_rows_at_end: int | None = None


def measure_drain(bench: _celery.Bench, count: int, retention: str = "full") -> Drain:
    """bench.deliver's Celery path (bench._celery): ``count`` messages
    published paused to a fresh noop queue (batch size 100, delivered_retention
    ``retention``), drained by 2 delivery processes; the clock runs from the
    first claim to all acknowledged (the delivered counter). The messages
    are deleted afterwards, so the soak starts on an empty table."""
    queue = _celery.make_queue(
        DRAIN_QUEUE_NAME,
        consumer="noop",
        batch_size=BATCH_SIZE,
        size=bench.size,
        paused=True,
        retention=retention,
    )
    harness.log(f"drain: publishing {count} messages to {queue.name}")
    _celery.publish_messages(queue, _celery.new_message(bench.payload), count)
    _celery.flush_redis(bench.redis)
    harness.checkpoint()
    seconds, first_claim = _celery.run_celery(bench, queue, count, counted=True)
    _celery.verify_delivered(queue, count, "drain", counted=True)
    drain = Drain(count, seconds, first_claim)
    harness.log(f"drain: {drain.rate:.0f} msgs/s")
    queue_empty(bench.bench_url, queue.id)
    return drain


def measure_loaded_drain(bench: _celery.Bench, offered: float, retention: str = "full") -> float:
    """Messages acknowledged per second (the delivered counter) while a
    publisher offers ``offered`` msgs/s to a fresh noop queue (batch size
    100, delivered_retention ``retention``) and 2 delivery processes deliver
    them, counted over LOADED_SECONDS after LOADED_WARMUP_SECONDS. The
    backlog is drained and the messages deleted afterwards."""
    queue = _celery.make_queue(
        LOADED_QUEUE_NAME,
        consumer="noop",
        batch_size=BATCH_SIZE,
        size=bench.size,
        retention=retention,
    )
    publisher = Publisher(
        queue_name=queue.name,
        rate=offered,
        message=_celery.new_message(bench.payload),
        sample_every=sys.maxsize,
    )
    harness.log(f"drain while publishing: offering {offered:.0f} msgs/s to {queue.name}")
    with (
        tempfile.TemporaryDirectory(prefix="bench-soak-") as directory,
        psycopg.connect(bench.bench_url, autocommit=True) as conn,
        _celery.celery_processes(bench, Path(directory)),
    ):

        def check() -> None:
            if publisher.error is not None:
                raise harness.BenchError(f"publisher failed: {publisher.error!r}")

        publisher.start()
        try:
            time.sleep(LOADED_WARMUP_SECONDS)
            check()
            began, before = time.monotonic(), harness.delivered(conn, queue.id)
            time.sleep(LOADED_SECONDS)
            ended, after = time.monotonic(), harness.delivered(conn, queue.id)
        finally:
            publisher.stopping.set()
            publisher.join()
        check()
        wait_drained(conn, queue.id, publisher.count(), check)
    queue_empty(bench.bench_url, queue.id)
    rate = (after - before) / (ended - began)
    harness.log(f"drain while publishing: {rate:.0f} msgs/s acknowledged")
    return rate


@dataclass
class Clock:
    """The clock loop's view: one reading per window boundary."""

    conn: psycopg.Connection[Any]
    queue_id: int
    publisher: Publisher
    started: float = 0.0

    def read(self) -> Reading:
        t = time.monotonic() - self.started
        published = self.publisher.count()
        depth = harness.depths(self.conn, self.queue_id)
        acked = harness.delivered(self.conn, self.queue_id)
        relations = read_relations(self.conn)
        return Reading(
            t=t,
            published=published,
            acked=acked,
            backlog=depth.get("TBDL", 0) + depth.get("DLNG", 0),
            relations=relations,
            loadavg_1m=round(os.getloadavg()[0], 2),
            checkpoints=read_checkpoints(self.conn),
            **read_horizon(self.conn),
        )


def describe(reading: Reading, before: Reading, window: Window, p99_ms: float | None) -> str:
    seconds = reading.t - before.t
    p99 = "-" if p99_ms is None else f"{p99_ms:.0f} ms"
    return (
        f"t={reading.t:6.0f}s {window.phase:<8} "
        f"published {(reading.published - before.published) / seconds:6.0f}/s "
        f"acked {(reading.acked - before.acked) / seconds:6.0f}/s "
        f"backlog {reading.backlog:7d}  dead {reading.dead_tuples:8d} "
        f"live {reading.live_tuples:8d}  {reading.table_bytes / 1e6:7.1f} MB  "
        f"oldest xact {reading.oldest_snapshot_s:4.0f} s vacuum xmin age "
        f"{'-' if reading.vacuum_xmin_age is None else reading.vacuum_xmin_age}  "
        f"p99 {p99} (acks seen so far)"
    )


def run_windows(
    clock: Clock,
    windows: Sequence[Window],
    sampler: LatencySampler,
    idle: IdleTransaction,
    check: Callable[[], None],
) -> tuple[list[Reading], float]:
    """Start the publisher and the sampler, then read at every window's end;
    opens the idle transaction as its phase starts and ends it as the next
    one starts. Returns the readings (one more than windows) and the epoch
    time of the start."""
    clock.started = time.monotonic()
    started_epoch = time.time()
    clock.publisher.start()
    sampler.start()
    readings = [clock.read()]
    phase = ""
    for window in windows:
        if window.phase != phase:
            if phase == "idle_txn":
                idle.close()
            if window.phase == "idle_txn":
                idle.open()
            phase = window.phase
            harness.log(f"--- {phase} from t={window.start:.0f}s")
        time.sleep(max(0.0, clock.started + window.end - time.monotonic()))
        reading = clock.read()
        if phase == "idle_txn":
            idle.check(clock.conn)
        check()
        recent = sampler.recent(started_epoch + window.start, started_epoch + window.end)
        harness.log(describe(reading, readings[-1], window, latency_ms(recent)["p99_ms"]))
        readings.append(reading)
    if phase == "idle_txn":
        idle.close()
    return readings, started_epoch


def soak_rate(options: Options, drain: Drain | None) -> float:
    """--rate, or LOAD_FRACTION of the drain rate measured."""
    if options.rate is not None:
        return options.rate
    if drain is not None:
        return drain.base * LOAD_FRACTION
    raise harness.BenchError("no rate: neither --rate nor a drain measurement")


def soak_queue(bench_url: str, size: int, retention: str = "full") -> Queue:
    """The soak's queue (delivered_retention ``retention``), on a vacuumed
    and checkpointed table."""
    queue = _celery.make_queue(
        QUEUE_NAME, consumer="noop", batch_size=BATCH_SIZE, size=size, retention=retention
    )
    with psycopg.connect(bench_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE broker_message")
    harness.checkpoint()
    return queue


@dataclass(frozen=True)
class Recorded:
    """What the soak recorded while the workers ran: a reading at every
    window boundary, and how publishing ended."""

    layout: str
    readings: list[Reading]
    # The epoch time publishing started: the latencies are binned from it.
    started_epoch: float
    published: int
    backlog_drained_s: float
    task_errors: list[str]


def phase_minutes(options: Options) -> dict[str, float]:
    return {
        "steady": options.minutes,
        "idle_txn": options.idle_minutes,
        "recovery": options.recovery_minutes,
    }


def run_soak(options: Options, bench: _celery.Bench, drain: Drain | None) -> Run:
    """Publish at the soak's rate through its phases, drain the backlog,
    and gather every window's figures."""
    rate = soak_rate(options, drain)
    queue = soak_queue(bench.bench_url, options.size, options.retention)
    windows = plan_windows(
        [(name, minutes * 60) for name, minutes in phase_minutes(options).items()]
    )
    every = sample_every(rate)
    publisher = Publisher(
        queue_name=queue.name,
        rate=rate,
        message=_celery.new_message(bench.payload),
        sample_every=every,
    )
    sampler = LatencySampler(
        bench_url=bench.bench_url, publisher=publisher, retention=options.retention
    )
    idle = IdleTransaction(bench.bench_url)
    started_utc = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    harness.log(
        f"soak: {rate:.0f} msgs/s to {queue.name} (retention {options.retention}) for "
        f"{windows[-1].end:.0f} s "
        f"(steady {options.minutes:g} min, idle transaction {options.idle_minutes:g} min, "
        f"recovery {options.recovery_minutes:g} min); latency of 1 message in {every}"
    )
    recorded = record_soak(bench, queue, windows, publisher, sampler, idle)
    _celery.verify_delivered(queue, recorded.published, "soak", counted=True)
    readings = recorded.readings
    acks = [(at - recorded.started_epoch, seconds) for at, seconds in sampler.acks]
    binned = bin_latencies(acks, windows)
    return Run(
        options=options,
        drain=drain,
        rate=rate,
        layout=recorded.layout,
        windows=list(windows),
        samples=build_samples(windows, readings, binned),
        latencies=binned,
        relations_at_start=readings[0].relations,
        published=recorded.published,
        backlog_at_end=readings[-1].backlog,
        backlog_drained_s=recorded.backlog_drained_s,
        acked_in_run=readings[-1].acked - readings[0].acked,
        latency_sample_every=every,
        acks_outside=len(acks) - sum(len(values) for values in binned),
        sampler=sampler_figures(sampler),
        publisher={
            "calls": publisher.calls,
            "longest_call_ms": round(1000 * publisher.longest_call_s, 1),
        },
        idle={"backend_pid": idle.pid, "xid": idle.xid},
        task_errors=recorded.task_errors,
        started_utc=started_utc,
        delivered_rows_at_end=delivered_rows(bench.bench_url)
        if options.retention == "none"
        else None,
    )


def delivered_rows(bench_url: str) -> int | None:
    """The delivered partition's rows (none are kept under retention none)."""
    with psycopg.connect(bench_url, autocommit=True) as conn:
        row = conn.execute(DELIVERED_ROWS_SQL).fetchone()
    return int(row[0]) if row else None


def record_soak(
    bench: _celery.Bench,
    queue: Queue,
    windows: Sequence[Window],
    publisher: Publisher,
    sampler: LatencySampler,
    idle: IdleTransaction,
) -> Recorded:
    """With the Celery workers running: read at every window's end while
    the publisher runs, then stop it and wait until its backlog is
    delivered and the sampler has looked up its last messages. Fails on
    the first error of the publisher or the sampler; a failed task is
    logged and counted."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-soak-") as directory,
        psycopg.connect(bench.bench_url, autocommit=True) as conn,
        _celery.celery_processes(bench, Path(directory)),
    ):
        relations = read_relations(conn)
        leaves = [name for name, rel in relations.items() if rel["leaf"]]
        layout = "plain" if len(relations) == 1 else f"partitioned ({', '.join(leaves)})"
        tasks = TaskWatch(Path(directory))

        def check() -> None:
            if publisher.error is not None:
                raise harness.BenchError(f"publisher failed: {publisher.error!r}")
            if sampler.error is not None:
                raise harness.BenchError(f"latency sampler failed: {sampler.error!r}")
            for error in tasks.look():
                harness.log(f"a task failed: {error[:300]}")

        clock = Clock(conn=conn, queue_id=queue.id, publisher=publisher)
        try:
            readings, started_epoch = run_windows(clock, windows, sampler, idle, check)
        except BaseException:
            sampler.stopping.set()
            raise
        finally:
            publisher.stopping.set()
            publisher.join()
            idle.close()
        check()
        published = publisher.count()
        harness.log(f"soak: publisher stopped after {published} messages; draining the backlog")
        backlog_drained_s = wait_drained(conn, queue.id, published, check)
        time.sleep(SAMPLE_TICK_SECONDS)  # the sampler's last lookups
        sampler.stopping.set()
        sampler.join()
        check()
    return Recorded(layout, readings, started_epoch, published, backlog_drained_s, tasks.errors)


def sampler_figures(sampler: LatencySampler) -> dict[str, Any]:
    """How the latency sampler kept up: messages followed and acked, and
    its lookups; in mode none, how precisely it dated the acks."""
    figures: dict[str, Any] = {
        "method": "vanished" if sampler.gone else "dlvd_row",
        "tick_s": sampler.tick,
        "followed": len(sampler.acks) + len(sampler.pending),
        "acked": len(sampler.acks),
        "queries": sampler.queries,
        "mean_query_ms": round(1000 * sampler.query_seconds / max(sampler.queries, 1), 2),
        "longest_query_ms": round(1000 * sampler.longest_query_s, 1),
        "most_pending": sampler.most_pending,
    }
    if sampler.gone:
        figures |= {
            "acked_unseen": sampler.acked_unseen,
            "uncertainty_ms": {
                f"p{q}": _round(
                    None if (v := percentile(sampler.uncertainty, q)) is None else v * 1000, 1
                )
                for q in (50, 99, 100)
            },
        }
    return figures


def wait_drained(
    conn: psycopg.Connection[Any], queue_id: int, count: int, check: Callable[[], None]
) -> float:
    """Wait until the queue's delivered counter reaches ``count``, logging
    the progress every DRAIN_LOG_SECONDS; fails when it stops moving for
    _celery.STALL_TIMEOUT_SECONDS. Returns the seconds it took: after an
    overloaded run, the backlog is drained after the clock."""
    began = logged = time.monotonic()
    delivered, moved = -1, began
    while (now_delivered := harness.delivered(conn, queue_id)) < count:
        now = time.monotonic()
        if now_delivered != delivered:
            delivered, moved = now_delivered, now
        elif now - moved > _celery.STALL_TIMEOUT_SECONDS:
            raise harness.BenchError(
                f"soak: delivery stalled at {delivered} of {count} delivered "
                f"for {_celery.STALL_TIMEOUT_SECONDS:.0f}s"
            )
        if now - logged >= DRAIN_LOG_SECONDS:
            harness.log(f"draining: {count - delivered} left after {now - began:.0f} s")
            logged = now
        check()
        time.sleep(_celery.POLL_SECONDS * 10)
    return time.monotonic() - began


def run_all(options: Options, bench_url: str) -> Run:
    retention = options.retention
    with _celery.started_bench(bench_url, options.size, CONCURRENCY) as bench:
        drain = (
            None
            if options.rate is not None
            else measure_drain(bench, options.drain_messages, retention)
        )
        if drain is not None and options.drain_while_publishing:
            _celery.flush_redis(bench.redis)
            loaded = measure_loaded_drain(bench, drain.rate, retention)
            drain = dataclasses.replace(drain, loaded_rate=loaded)
        _celery.flush_redis(bench.redis)
        return run_soak(options, bench, drain)


# --- report ------------------------------------------------------------------------------------


def phase_latencies(run: Run, phase: str) -> list[float]:
    """Every latency sampled in a phase's windows, pooled."""
    return [
        value
        for window, values in zip(run.windows, run.latencies, strict=True)
        if window.phase == phase
        for value in values
    ]


def summary(run: Run, steady_latency: dict[str, float | None]) -> dict[str, Any]:
    """The figures of a run (the JSON object printed last): what was run,
    the three checks against TARGETS and their verdicts, and how the
    bench's own threads and the workers fared."""
    samples = run.samples
    drift = drift_pct(samples)
    dead = dead_tuples_halves(samples)
    recovery = recovery_check(samples, steady_latency["p99_ms"])
    idle = phase_samples(samples, "idle_txn")
    drift_pass = drift is not None and abs(drift) < TARGETS["drift_pct"]
    live = partition_growth(samples, run.relations_at_start, LIVE_PARTITION)
    delivered = partition_growth(samples, run.relations_at_start, DELIVERED_PARTITION)
    verdicts = {
        "drift": "PASS" if drift_pass else "MISS",
        "dead_tuples_bounded": "PASS" if dead.bounded else "MISS",
        "recovery_p99": "PASS" if recovery.passed else "MISS",
        "live_partition_flat": "PASS" if live.flat else "MISS",
    }
    if run.options.retention == "none":
        verdicts["delivered_partition_empty"] = harness.verdict(
            run.delivered_rows_at_end == 0 and delivered.at_end == delivered.at_start
        )
    return {
        **settings_figures(run),
        **throughput_figures(samples, drift),
        "steady_latency_ms": steady_latency,
        "idle_max_p99_ms": recovery.idle_max_p99_ms,
        "idle_max_backlog": max((sample.backlog for sample in idle), default=None),
        # Anything but the idle transaction holding a snapshot this long
        # after it ended keeps VACUUM from recovering.
        "recovery_max_oldest_snapshot_s": max(
            (sample.oldest_snapshot_s for sample in phase_samples(samples, "recovery")),
            default=None,
        ),
        "recovery_holders": sorted(
            {s.oldest_holder for s in phase_samples(samples, "recovery") if s.oldest_holder}
        ),
        **dead_tuple_figures(samples, dead),
        "backlog_at_end": run.backlog_at_end,
        "backlog_drained_s": round(run.backlog_drained_s, 1),
        **recovery_figures(recovery),
        "partitions": {LIVE_PARTITION: live.figures(), DELIVERED_PARTITION: delivered.figures()},
        "delivered_rows_at_end": run.delivered_rows_at_end,
        "targets": dict(TARGETS),
        "verdicts": verdicts,
        "sampler": run.sampler,
        "publisher": run.publisher,
        "acks_outside_windows": run.acks_outside,
        "task_failures": len(run.task_errors),
        "task_errors": dict(Counter(error[:300] for error in run.task_errors).most_common(5)),
        "relations": relation_summary(samples, run.relations_at_start),
        "loadavg_1m": {
            "mean": round(sum(sample.loadavg_1m for sample in samples) / len(samples), 2),
            "max": max(sample.loadavg_1m for sample in samples),
        },
        "checkpoints": checkpoint_figures(samples, recovery),
        "code": code_version(),
    }


def settings_figures(run: Run) -> dict[str, Any]:
    """What was run: the phases, the workers, and the rate and where it
    came from."""
    return {
        "bench": "soak",
        "retention": run.options.retention,
        "layout": run.layout,
        "minutes": run.options.minutes,
        "idle_minutes": run.options.idle_minutes,
        "recovery_minutes": run.options.recovery_minutes,
        "payload_bytes": run.options.size,
        "concurrency": CONCURRENCY,
        "batch_size": BATCH_SIZE,
        "drain_messages": None if run.drain is None else run.drain.messages,
        "drain_msgs_per_s": None if run.drain is None else round(run.drain.rate, 1),
        "drain_while_publishing_msgs_per_s": (
            None
            if run.drain is None or run.drain.loaded_rate is None
            else round(run.drain.loaded_rate, 1)
        ),
        "load_fraction": None if run.drain is None else LOAD_FRACTION,
        "rate_msgs_per_s": round(run.rate, 1),
        "rate_given": run.drain is None,
        "published": run.published,
        "window_s": WINDOW_SECONDS,
        "latency_sample_every": run.latency_sample_every,
        "latency_clock": LATENCY_CLOCKS[run.options.retention == "none"],
    }


# How a sampled message's latency is measured: where the ack keeps its row,
# and in mode none.
LATENCY_CLOCKS = {
    False: "created_at (publish transaction) to updated_at (ack transaction), from the DLVD row",
    True: (
        f"created_at (publish transaction) to the midpoint of the last lookup that found the "
        f"row live and the first that did not, looked up every {GONE_TICK_SECONDS:g} s; "
        f"within half their distance (sampler.uncertainty_ms)"
    ),
}


def throughput_figures(samples: Sequence[Sample], drift: float | None) -> dict[str, Any]:
    """The steady phase's rates, and their drift from its first minute to
    its last."""
    steady = phase_samples(samples, "steady")
    first, last = drift_windows(steady)
    return {
        "steady_published_per_s": round(rate_over(steady, "published_per_s") or 0, 1),
        "steady_acked_per_s": round(rate_over(steady, "acked_per_s") or 0, 1),
        "first_minute_acked_per_s": round(rate_over(first, "acked_per_s") or 0, 1),
        "last_minute_acked_per_s": round(rate_over(last, "acked_per_s") or 0, 1),
        "drift_pct": None if drift is None else round(drift, 2),
        "published_drift_pct": _round(drift_pct(samples, "published_per_s"), 2),
    }


def dead_tuple_figures(samples: Sequence[Sample], dead: DeadTuples) -> dict[str, Any]:
    """Dead tuples in each half of the steady phase, their growth and
    peak, and the table's size at the end."""
    peak = max(samples, key=lambda sample: sample.dead_tuples)
    return {
        "dead_tuples_first_half_mean": round(dead.first_half_mean),
        "dead_tuples_second_half_mean": round(dead.second_half_mean),
        "dead_tuples_first_half_max": dead.first_half_max,
        "dead_tuples_second_half_max": dead.second_half_max,
        "dead_tuples_growth": _round(dead.growth, 3),
        "dead_tuples_peak": peak.dead_tuples,
        "dead_tuples_peak_t": peak.t,
        "table_bytes_end": samples[-1].table_bytes,
    }


def recovery_figures(recovery: Recovery) -> dict[str, Any]:
    """The p99 after the idle transaction against its bound, and whether
    the steady phase it is measured against kept up."""
    return {
        "recovery_check_t": recovery.check_t,
        "recovery_check_p99_ms": recovery.check_p99_ms,
        "recovery_bound_ms": _round(recovery.bound_ms, 1),
        "recovered_after_s": recovery.recovered_after_s,
        "steady_acked_vs_published": _round(recovery.steady_acked_ratio, 3),
        "steady_kept_up": recovery.steady_kept_up,
    }


def checkpoint_figures(samples: Sequence[Sample], recovery: Recovery) -> dict[str, Any]:
    """The cluster's checkpoints during the run, timed and requested (by
    anyone on the cluster), and those in the window the recovery checks."""
    checked = [sample for sample in samples if sample.start == recovery.check_t]
    return {
        "timed": sum(sample.checkpoints_timed for sample in samples),
        "requested": sum(sample.checkpoints_requested for sample in samples),
        "in_recovery_check_window": sum(
            sample.checkpoints_timed + sample.checkpoints_requested for sample in checked
        ),
    }


def code_version() -> dict[str, Any]:
    """The commit measured, and whether the work tree differed from it."""

    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", *args], cwd=harness.ROOT, capture_output=True, text=True, check=False
        )
        return result.stdout.strip()

    # Untracked files (a bench being written) do not change what is measured.
    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed)}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def print_report(run: Run) -> None:
    steady_latency = latency_ms(phase_latencies(run, "steady"))
    figures = summary(run, steady_latency)
    path = harness.keep_run(
        "soak",
        figures,
        run.started_utc.replace("-", "").replace(":", ""),
        started_utc=run.started_utc,
        phases=phase_bounds(run.windows),
        idle_transaction=run.idle,
        samples=[asdict(sample) for sample in run.samples],
    )
    figures["series_file"] = str(path.relative_to(harness.ROOT))
    print(
        f"soak bench: {run.options.size}-byte payloads, consumer noop, batch size {BATCH_SIZE}, "
        f"Celery deliveries worker --concurrency {CONCURRENCY} (DEBUG off); broker_message "
        f"{run.layout}; delivered_retention {run.options.retention}"
    )
    print_rate(run)
    bounds = phase_bounds(run.windows)
    print(
        "phases: "
        + ", ".join(f"{name} {start:.0f}-{end:.0f} s" for name, (start, end) in bounds.items())
    )
    print()
    print_phases(run)
    print()
    print_verdicts(figures, steady_latency)
    if len(figures["relations"]) > 1:
        print()
        print_relations(figures["relations"])
    load = figures["loadavg_1m"]
    print(
        f"load average (1 min, {os.cpu_count()} CPUs): mean {load['mean']:.1f}, max {load['max']:.1f}"
    )
    checkpoints = figures["checkpoints"]
    print(
        f"checkpoints on the cluster: {checkpoints['timed']} timed, {checkpoints['requested']} "
        f"requested; {checkpoints['in_recovery_check_window']} in the window the recovery checks"
    )
    print(f"time series: {figures['series_file']}")
    harness.print_figures(figures)


def print_rate(run: Run) -> None:
    """The rate published, and the drain rates it was derived from."""
    if run.drain is None:
        print(f"rate: {run.rate:.0f} msgs/s (--rate)")
        return
    print(
        f"drain: {run.drain.messages} messages in {run.drain.seconds:.2f} s = "
        f"{run.drain.rate:.0f} msgs/s idle"
    )
    if run.drain.loaded_rate is not None:
        print(
            f"drain while publishing {run.drain.rate:.0f} msgs/s: "
            f"{run.drain.loaded_rate:.0f} msgs/s acknowledged"
        )
    print(f"publishing at {LOAD_FRACTION:.0%} of {run.drain.base:.0f}: {run.rate:.0f} msgs/s")


def print_phases(run: Run) -> None:
    """A row per phase: rates, latency percentiles, the most dead tuples
    and backlog, and the table's size at its end."""
    rows = []
    for phase in PHASES:
        if samples := phase_samples(run.samples, phase):
            lat = latency_ms(phase_latencies(run, phase))
            rows.append(
                [
                    phase,
                    f"{rate_over(samples, 'published_per_s') or 0:.0f}",
                    f"{rate_over(samples, 'acked_per_s') or 0:.0f}",
                    *(_ms(lat[key]) for key in ("p50_ms", "p95_ms", "p99_ms")),
                    max(sample.dead_tuples for sample in samples),
                    max(sample.backlog for sample in samples),
                    f"{samples[-1].table_bytes / 1e6:.1f}",
                    sum(s.checkpoints_timed + s.checkpoints_requested for s in samples),
                ]
            )
    header = ["phase", "pub/s", "acked/s", "p50 ms", "p95 ms", "p99 ms", "max dead"]
    harness.table([*header, "max backlog", "MB at end", "checkpoints"], rows)


def print_verdicts(figures: dict[str, Any], steady_latency: dict[str, float | None]) -> None:
    """The three checks against TARGETS: throughput drift, dead tuples'
    growth, and the p99's recovery after the idle transaction."""
    verdicts = figures["verdicts"]
    drift = figures["drift_pct"]
    print(
        f"throughput drift (acked/s, last steady minute vs first): "
        f"{figures['first_minute_acked_per_s']:.0f} -> {figures['last_minute_acked_per_s']:.0f} "
        f"msgs/s, {'-' if drift is None else f'{drift:+.1f} %'}  target |drift| < "
        f"{TARGETS['drift_pct']:g} % {verdicts['drift']}"
    )
    growth = figures["dead_tuples_growth"]
    print(
        f"dead tuples (steady phase, mean per half): {figures['dead_tuples_first_half_mean']} -> "
        f"{figures['dead_tuples_second_half_mean']}, x{'-' if growth is None else f'{growth:.2f}'}"
        f"  target <= x{TARGETS['dead_tuples_growth']:g} {verdicts['dead_tuples_bounded']}"
        f" (most {figures['dead_tuples_first_half_max']} -> "
        f"{figures['dead_tuples_second_half_max']})"
    )
    print(
        f"recovery: steady p99 {_ms(steady_latency['p99_ms'])} ms; p99 of the window "
        f"{RECOVERY_CHECK_SECONDS:g} s after the idle transaction ended "
        f"{_ms(figures['recovery_check_p99_ms'])} ms  target <= "
        f"{TARGETS['recovery_p99_vs_steady']:g}x steady ({_ms(figures['recovery_bound_ms'])} ms) "
        f"{verdicts['recovery_p99']}"
    )
    recovered = figures["recovered_after_s"]
    print(
        "  every later window within the bound from "
        + ("never" if recovered is None else f"{recovered:.0f} s after it ended")
        + f"; idle transaction's worst p99 {_ms(figures['idle_max_p99_ms'])} ms"
    )
    print_partitions(figures)
    if not figures["steady_kept_up"]:
        print(
            f"  MISS whatever the p99: the steady phase did not keep up (acked "
            f"{figures['steady_acked_per_s']:.0f} of {figures['steady_published_per_s']:.0f} "
            f"msgs/s published, backlog growing), so its p99 is no baseline"
        )


def print_partitions(figures: dict[str, Any]) -> None:
    """The live partition's growth in the steady phase's second half
    (judged), and what the delivered partition took (in mode none, nothing)."""
    verdicts = figures["verdicts"]
    live = figures["partitions"][LIVE_PARTITION]
    growth = live["steady_second_half_growth"]
    print(
        f"live partition (MB): {_mb(live['bytes_start'])} at the start, "
        f"{_mb(live['bytes_steady_middle'])} mid-steady, {_mb(live['bytes_steady_end'])} at the "
        f"steady end, {_mb(live['bytes_end'])} at the end; steady second half "
        f"x{'-' if growth is None else f'{growth:.2f}'}  target <= "
        f"x{TARGETS['live_partition_growth']:g} {verdicts['live_partition_flat']}"
    )
    delivered = figures["partitions"][DELIVERED_PARTITION]
    if "delivered_partition_empty" in verdicts:
        print(
            f"delivered partition: {figures['delivered_rows_at_end']} rows after the run, "
            f"{_mb(delivered['bytes_start'])} MB at the start and {_mb(delivered['bytes_end'])} "
            f"at the end  target: nothing written {verdicts['delivered_partition_empty']}"
        )
        return
    per = delivered["steady_bytes_per_acked"]
    print(
        f"delivered partition: {_mb(delivered['bytes_start'])} -> "
        f"{_mb(delivered['bytes_steady_end'])} MB over the steady phase, "
        f"{'-' if per is None else f'{per:.0f}'} bytes per message acked"
    )


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f}"


def print_relations(relations: dict[str, dict[str, Any]]) -> None:
    header = ["relation", *(f"max dead {phase}" for phase in PHASES), "MB at end", "autovacuums"]
    rows = [
        [
            name,
            *(rel["max_dead_tuples"].get(phase, 0) for phase in PHASES),
            f"{rel['bytes_end'] / 1e6:.1f}",
            rel["autovacuums"],
        ]
        for name, rel in relations.items()
    ]
    harness.table(header, rows)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    return harness.run_bench(lambda bench_url: print_report(run_all(options, bench_url)))


if __name__ == "__main__":
    sys.exit(main())
