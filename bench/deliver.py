"""Delivery throughput: a bare SQL claim+ack loop vs real Celery workers, how
fast a killed worker's batch goes back to TBDL, and how long isolating a
poison message keeps its innocent batch-mates waiting.

The Celery processes, the private redis-server and the delivery checks are
bench/_celery.py's, which bench.peers and bench.soak run Lazaretto with too.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import psycopg

from bench import _celery, _spark
from bench import _harness as harness
from bench._loaders import PUT_APPLICATION, PUT_USER

if TYPE_CHECKING:
    from broker.models import Queue
    from rig.processes import Workers

T = TypeVar("T")

# Kill-to-TBDL: one batch of the demo consumer, slow enough to be caught in flight.
KILL_RUNS = 3
KILL_BATCH = 20
KILL_SLEEP_SECONDS = "0.5"
KILL_POLL_SECONDS = 0.02
KILL_TIMEOUT_SECONDS = 30.0
TARGET_RATIO_BATCH = 100
TARGETS = {"ratio_at_100": 0.5, "kill_to_tbdl_s": 2.0}
# Isolation: one batch crashed by a poison message (the demo consumer exits on
# CRASH), on a queue with every setting but its consumer and batch size at its
# default, each case run ISOLATION_RUNS times. Targets: the innocents DLVD
# within 2 s of the crash, the poison NDLV within 5 s (BlazingMQ bounds the
# delay poison isolation adds at 5 s), in every run.
ISOLATION_RUNS = 20
ISOLATION_TARGETS_S = {"innocents_dlvd": 2.0, "poison_ndlv": 5.0}
# console/settings.py's defaults, whatever the caller's environment says.
ISOLATION_ENV = {
    "LAZARETTO_SWEEP_INTERVAL_SECONDS": "1.0",
    "LAZARETTO_DISPATCH_INTERVAL_SECONDS": "1.0",
}
INNOCENT_PAYLOAD = b"bench isolation: innocent"
POISON_PAYLOAD = b"bench isolation: CRASH"
ISOLATION_POLL_SECONDS = 0.05
# No message of the case changing state for this long is a stall.
ISOLATION_STALL_SECONDS = 30.0

LEASED_SQL = "SELECT id, lease_owner FROM broker_message WHERE queue_id = %s AND state = 'DLNG'"
CRASHED_SQL = """
SELECT count(*) FROM broker_message
WHERE id = ANY(%s) AND state = 'TBDL' AND crash_count = 1 AND suspect
"""
DIED_SQL = """
SELECT count(*) FROM broker_message
WHERE id = ANY(%s) AND last_error = 'the delivering worker died'
"""
# Per (poison?, state): how many messages, and when the last of them got there.
ISOLATION_STATES_SQL = """
SELECT id = ANY(%(poisons)s), state, count(*), max(extract(epoch FROM updated_at))::float8
FROM broker_message WHERE queue_id = %(queue_id)s
GROUP BY 1, 2
"""


@dataclass(frozen=True)
class Options:
    messages: int
    batches: tuple[int, ...]
    concurrency: int
    size: int
    # Batch size 1 is the slow one (under 1000 msgs/s on either path): with
    # N = 100000 it takes about two thirds of the default run (6.5 to 8 minutes
    # on 2 cores). This lets a run scale it down alone.
    batch1_messages: int
    isolation: bool
    isolation_runs: int
    beside_spark: bool

    def messages_for(self, batch: int) -> int:
        return self.batch1_messages if batch == 1 else self.messages


@dataclass(frozen=True)
class BatchResult:
    batch: int
    messages: int
    bare_seconds: float
    celery_seconds: float
    # From unpausing the queue (workers ready) to the first claim: the dispatch tick.
    celery_wake_seconds: float

    @property
    def bare_rate(self) -> float:
        return self.messages / self.bare_seconds

    @property
    def celery_rate(self) -> float:
        return self.messages / self.celery_seconds

    @property
    def ratio(self) -> float:
        return self.celery_rate / self.bare_rate


@dataclass(frozen=True)
class KillResult:
    runs: list[float]
    sweep_interval: float

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def max(self) -> float:
        return max(self.runs)


class IsolationCase(NamedTuple):
    """A batch of ``batch`` messages, ``poisons`` of them poison."""

    batch: int
    poisons: int

    @property
    def key(self) -> str:
        """The case's key in the JSON line: the batch size, ``_two_poisons`` added."""
        return str(self.batch) if self.poisons == 1 else f"{self.batch}_two_poisons"

    def queue_name(self, run: int) -> str:
        return f"BENCH.DELIVER.ISOLATION.{self.key.upper()}.{run}"

    def poison_positions(self) -> list[int]:
        """Where the poison messages sit in the batch: spread out, none at an end."""
        return [self.batch * n // (self.poisons + 1) for n in range(1, self.poisons + 1)]


ISOLATION_CASES = (IsolationCase(10, 1), IsolationCase(100, 1), IsolationCase(100, 2))


@dataclass(frozen=True)
class IsolationResult:
    case: IsolationCase
    run: int
    # From the batch's crash (the poison's first delivery, as the demo consumer
    # recorded it) to the last innocent batch-mate DLVD, and to the last poison NDLV.
    seconds: float
    poison_seconds: float
    innocents: int
    # Distinct pids that delivered the case's suspects alone (a crashed pool
    # child comes back with a new pid).
    isolating_processes: int

    @property
    def within_targets(self) -> bool:
        return (
            self.seconds <= ISOLATION_TARGETS_S["innocents_dlvd"]
            and self.poison_seconds <= ISOLATION_TARGETS_S["poison_ndlv"]
        )


# --- arguments ----------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> Options:
    args = harness.parser(
        __doc__,
        messages=harness.messages(100_000, "per path"),
        size=harness.SIZE,
        batches=(harness.batch_list, (1, 10, 100), "e.g. 1,10,100"),
        concurrency=(harness.positive_int, 2, "delivery processes"),
        batch1_messages=(harness.positive_int, None, "messages at batch size 1 (default N)"),
        isolation=(bool, True, "time poison isolation at batch 10 and 100 (default: on)"),
        isolation_runs=(
            harness.positive_int,
            ISOLATION_RUNS,
            f"runs of each isolation case (default {ISOLATION_RUNS})",
        ),
        beside_spark=(
            bool,
            False,
            "time isolation while a Spark Connect server of the bench runs a query taking "
            "both cores, over and over (default: off)",
        ),
    ).parse_args(argv)
    args.batch1_messages = args.batch1_messages or args.messages
    return Options(**vars(args))


def run_bare(bench: _celery.Bench, queue: Queue) -> float:
    """Drain the queue with the service's claim and ack statements on a bare
    psycopg connection: no lease lock, queue lookup, handler or Django."""
    from broker.services.delivery import worker_name

    claim = {
        "queue_id": queue.id,
        "suspect": False,
        "limit": queue.batch_size,
        "owner": f"{worker_name()}:{secrets.randbits(62) + 1}",
        "lease_seconds": queue.lease_seconds,
    }
    delivered = 0
    with psycopg.connect(bench.bench_url, autocommit=True) as conn:
        started = time.perf_counter()
        while batch := _celery.claim_and_ack(conn, claim):
            delivered += batch
        seconds = harness.since(started)
    harness.log(f"bare: {delivered} messages in {seconds:.2f}s")
    return seconds


# --- one batch size -----------------------------------------------------------------


def run_batch(bench: _celery.Bench, batch: int, count: int) -> BatchResult:
    message = _celery.new_message(bench.payload)
    # consumer "" : no worker or dispatcher ever touches the bare path's queue.
    bare_queue = _celery.make_queue(
        f"BENCH.DELIVER.BARE.{batch}", consumer="", batch_size=batch, size=bench.size
    )
    harness.log(f"batch {batch}: publishing {count} messages to {bare_queue.name}")
    _celery.publish_messages(bare_queue, message, count)
    harness.checkpoint()
    bare_seconds = run_bare(bench, bare_queue)
    _celery.verify_delivered(bare_queue, count, f"bare {batch}")

    # Published paused, and the publish wake-ups dropped: nothing is delivered
    # while the Celery processes boot (their start-up would compete for the CPUs).
    queue = _celery.make_queue(
        f"BENCH.DELIVER.CELERY.{batch}",
        consumer="noop",
        batch_size=batch,
        size=bench.size,
        paused=True,
    )
    harness.log(f"batch {batch}: publishing {count} messages to {queue.name}")
    _celery.publish_messages(queue, message, count)
    _celery.flush_redis(bench.redis)
    harness.checkpoint()
    celery_seconds, wake = _celery.run_celery(bench, queue, count)
    _celery.verify_delivered(queue, count, f"celery {batch}")
    return BatchResult(batch, count, bare_seconds, celery_seconds, wake)


# --- kill-to-TBDL ---------------------------------------------------------------------


def leased_batch(conn: psycopg.Connection[Any], queue_id: int) -> tuple[str, list[int]] | None:
    """(lease owner, its message ids) once all KILL_BATCH messages are DLNG."""
    rows = conn.execute(LEASED_SQL, [queue_id]).fetchall()
    if len(rows) < KILL_BATCH:
        return None
    owner = rows[0][1]
    return owner, [message_id for message_id, leased_by in rows if leased_by == owner]


def lease_pid(owner: str, workers: Workers) -> int:
    """The delivery process named in a lease owner ``host:pid:token``; it must
    be one of our pool's children (never kill anything else)."""
    host, pid, _ = owner.rsplit(":", 2)
    if host != socket.gethostname() or int(pid) not in workers.delivery_processes():
        raise harness.BenchError(f"kill: lease owner {owner} is not one of our delivery processes")
    return int(pid)


def kill_and_watch(conn: psycopg.Connection[Any], queue: Queue, pid: int, ids: list[int]) -> float:
    """SIGKILL ``pid``, pause the queue (no redelivery while we watch) and
    return the seconds until all ``ids`` are TBDL, suspect, crash_count 1."""
    from broker.services.queues import queue_update

    def crashed() -> bool:
        return conn.execute(CRASHED_SQL, [ids]).fetchone() == (len(ids),)

    killed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    queue_update(queue=queue, paused=True)
    harness.wait_for(crashed, timeout=KILL_TIMEOUT_SECONDS, interval=KILL_POLL_SECONDS, what="TBDL")
    seconds = harness.since(killed)
    died = conn.execute(DIED_SQL, [ids]).fetchone()
    if died != (len(ids),):
        raise harness.BenchError(
            f"kill: {died} of {len(ids)} messages were swept as dead-worker crashes"
        )
    return seconds


def kill_once(bench: _celery.Bench, workers: Workers, index: int, sweep_interval: float) -> float:
    """Seconds from SIGKILL of the process delivering a batch to its messages
    being TBDL again. The kill waits a random part of a sweep interval first:
    publishing right after the previous run's sweep (or beat's first tick)
    would otherwise always kill just after a sweep, the worst case."""
    queue = _celery.make_queue(
        f"BENCH.DELIVER.KILL.{index}", consumer="demo", batch_size=KILL_BATCH, size=1024
    )
    message = _celery.new_message(b"bench kill-to-TBDL", {"sleep-seconds": KILL_SLEEP_SECONDS})
    _celery.publish_messages(queue, message, KILL_BATCH)
    with psycopg.connect(bench.bench_url, autocommit=True) as conn:
        owner, ids = harness.wait_for(
            lambda: leased_batch(conn, queue.id),
            timeout=KILL_TIMEOUT_SECONDS,
            interval=KILL_POLL_SECONDS,
            what=f"{KILL_BATCH} messages of {queue.name} DLNG",
        )
        pid = lease_pid(owner, workers)
        time.sleep(random.uniform(0, sweep_interval))
        seconds = kill_and_watch(conn, queue, pid, ids)
    harness.log(f"kill {index}: {len(ids)} messages of pid {pid} back in TBDL after {seconds:.3f}s")
    return seconds


def run_kill(bench: _celery.Bench) -> KillResult:
    from django.conf import settings

    interval = settings.LAZARETTO_SWEEP_INTERVAL_SECONDS
    _celery.flush_redis(bench.redis)
    with (
        tempfile.TemporaryDirectory(prefix="bench-deliver-") as directory,
        _celery.celery_processes(bench, Path(directory)) as workers,
    ):
        runs = [kill_once(bench, workers, index, interval) for index in range(1, KILL_RUNS + 1)]
    return KillResult(runs=runs, sweep_interval=interval)


# --- poison isolation -------------------------------------------------------------------


def publish_case(case: IsolationCase, run: int) -> tuple[Queue, list[int], list[int]]:
    """A fresh demo queue (defaults but consumer and batch size) and one batch
    of ``case.batch`` messages in one publish, so that one claim takes them
    all. Returns (queue, poison ids, innocent ids)."""
    from broker.services.publish import messages_publish
    from broker.services.queues import queue_create

    queue = queue_create(name=case.queue_name(run), consumer="demo", batch_size=case.batch)
    positions = set(case.poison_positions())
    ids = messages_publish(
        queue_name=queue.name,
        messages=[
            _celery.new_message(POISON_PAYLOAD if index in positions else INNOCENT_PAYLOAD)
            for index in range(case.batch)
        ],
        put_user=PUT_USER,
        put_application=PUT_APPLICATION,
    )
    poisons = [ids[index] for index in sorted(positions)]
    innocents = [ids[index] for index in range(case.batch) if index not in positions]
    return queue, poisons, innocents


def wait_isolated(
    conn: psycopg.Connection[Any],
    case: IsolationCase,
    queue: Queue,
    poisons: list[int],
    workers: Workers,
) -> tuple[float, float]:
    """Poll until every innocent message of the case is DLVD and every poison
    NDLV; returns the epoch seconds of the last innocent DLVD and of the last
    poison NDLV. Fails at once when a message ends anywhere else (an innocent
    blacklisted, a poison delivered, a message dead-lettered away), when
    nothing changes for ISOLATION_STALL_SECONDS, or when a task fails."""
    innocent_count = case.batch - len(poisons)
    seen: tuple[dict[str, int], dict[str, int]] | None = None
    moved = checked = time.perf_counter()
    while True:
        rows = conn.execute(
            ISOLATION_STATES_SQL, {"poisons": poisons, "queue_id": queue.id}
        ).fetchall()
        innocent = {state: count for is_poison, state, count, _ in rows if not is_poison}
        poison = {state: count for is_poison, state, count, _ in rows if is_poison}
        if (
            innocent.keys() - {"TBDL", "DLNG", "DLVD"}
            or poison.keys() - {"TBDL", "DLNG", "NDLV"}
            or sum(innocent.values()) != innocent_count
            or sum(poison.values()) != len(poisons)
        ):
            raise harness.BenchError(
                f"isolation {case.key}: {innocent_count} innocent messages are {innocent}, "
                f"{len(poisons)} poison {poison}; innocents must end DLVD, poison NDLV"
            )
        if innocent == {"DLVD": innocent_count} and poison == {"NDLV": len(poisons)}:
            last = {(is_poison, state): at for is_poison, state, _, at in rows}
            return last[(False, "DLVD")], last[(True, "NDLV")]
        now = time.perf_counter()
        if (innocent, poison) != seen:
            seen, moved = (innocent, poison), now
        elif now - moved > ISOLATION_STALL_SECONDS:
            raise harness.BenchError(
                f"isolation {case.key}: no message changed state for "
                f"{ISOLATION_STALL_SECONDS:.0f}s: innocent {innocent}, poison {poison}"
            )
        if now - checked > _celery.CHECK_TASKS_SECONDS:
            _celery.check_tasks(workers)
            checked = now
        time.sleep(ISOLATION_POLL_SECONDS)


def batch_crash_time(
    case: IsolationCase, records: list[dict[str, Any]], poisons: list[int]
) -> float:
    """time.time() of the poison's first delivery, which crashed the batch, as
    the demo consumer recorded it just before exiting."""
    delivered = [record for record in records if record["id"] in poisons]
    if not delivered:
        raise harness.BenchError(
            f"isolation {case.key}: the demo consumer never recorded the poison"
        )
    first = min(delivered, key=lambda record: record["time"])
    if first["isolated"]:
        raise harness.BenchError(
            f"isolation {case.key}: the poison was first delivered alone, not in a batch: "
            f"there was no batch crash to time ({first})"
        )
    return float(first["time"])


def isolate_once(
    conn: psycopg.Connection[Any], workers: Workers, case: IsolationCase, run: int
) -> IsolationResult:
    """Publish one batch with ``case.poisons`` poison messages and time from
    its crash to the last innocent DLVD. The database's now() and the
    workers' time.time() read the same clock: all run on this machine."""
    queue, poisons, innocents = publish_case(case, run)
    harness.log(
        f"isolation {case.key}: published {case.batch} messages to {queue.name}, "
        f"poison at {case.poison_positions()}"
    )
    last_innocent, last_poison = wait_isolated(conn, case, queue, poisons, workers)
    records = workers.records()
    crashed = batch_crash_time(case, records, poisons)
    ids = {*poisons, *innocents}
    isolating = {record["pid"] for record in records if record["id"] in ids and record["isolated"]}
    result = IsolationResult(
        case=case,
        run=run,
        seconds=last_innocent - crashed,
        poison_seconds=last_poison - crashed,
        innocents=len(innocents),
        isolating_processes=len(isolating),
    )
    harness.log(
        f"isolation {case.key}: batch crash to last of {len(innocents)} innocents DLVD "
        f"{result.seconds:.3f}s, to poison NDLV {result.poison_seconds:.3f}s; suspects "
        f"delivered by {len(isolating)} processes"
    )
    return result


def run_isolation(
    bench: _celery.Bench, runs: int, beside_spark: bool = False
) -> list[IsolationResult]:
    """Every isolation case in turn, ``runs`` rounds of them, on one set of
    Celery processes running the product's default sweep and dispatch
    intervals; ``beside_spark``, with Spark taking the cores meanwhile."""
    _celery.flush_redis(bench.redis)
    with (
        tempfile.TemporaryDirectory(prefix="bench-deliver-") as directory,
        psycopg.connect(bench.bench_url, autocommit=True) as conn,
        _celery.celery_processes(bench, Path(directory), ISOLATION_ENV) as workers,
        spark_busy(Path(directory)) if beside_spark else contextlib.nullcontext(),
    ):
        results = [
            isolate_once(conn, workers, case, run)
            for run in range(1, runs + 1)
            for case in ISOLATION_CASES
        ]
        _celery.check_tasks(workers)
    return results


@contextlib.contextmanager
def spark_busy(directory: Path) -> Iterator[None]:
    """A Spark Connect server of the bench, started as `make run` starts it
    (at LAZARETTO_SPARK_NICENESS), kept busy on every core until the block
    ends (rig.processes.spark_kept_busy)."""
    from rig.processes import SPARK_LOAD_QUERY, spark_kept_busy

    with _spark.connect_server(directory) as url, spark_kept_busy(url) as finished:
        yield
        harness.log(f"isolation beside spark: {finished()} queries of {SPARK_LOAD_QUERY!r}")


# --- driver and report ------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    results: list[BatchResult]
    kill: KillResult
    # Empty with --no-isolation.
    isolation: list[IsolationResult]


def run_all(options: Options, bench_url: str) -> Figures:
    with _celery.started_bench(bench_url, options.size, options.concurrency) as bench:
        results = [
            run_batch(bench, batch, options.messages_for(batch)) for batch in options.batches
        ]
        kill = run_kill(bench)
        isolation = (
            run_isolation(bench, options.isolation_runs, options.beside_spark)
            if options.isolation
            else []
        )
    return Figures(results, kill, isolation)


def ratio_verdict(result: BatchResult) -> str:
    if result.batch != TARGET_RATIO_BATCH:
        return "-"
    return harness.at_least(result.ratio, TARGETS["ratio_at_100"])


def isolation_summary(isolation: list[IsolationResult]) -> dict[str, Any]:
    """The isolation keys of the JSON line; none with --no-isolation. The end
    states were checked (the bench fails otherwise) and are stated here."""
    if not isolation:
        return {}
    by_case = isolation_by_case(isolation)
    return {
        "isolation_runs": {case.key: len(results) for case, results in by_case.items()},
        "isolation_seconds": {
            case.key: median_and_worst([r.seconds for r in results])
            for case, results in by_case.items()
        },
        "isolation_poison_ndlv_seconds": {
            case.key: median_and_worst([r.poison_seconds for r in results])
            for case, results in by_case.items()
        },
        "isolation_targets_s": dict(ISOLATION_TARGETS_S),
        "isolation_runs_within_targets": {
            case.key: sum(r.within_targets for r in results) for case, results in by_case.items()
        },
        "isolation_within_targets": all(r.within_targets for r in isolation),
        "isolation_checks": {
            case.key: {
                "batch": case.batch,
                "poisons": case.poisons,
                "poison_state": "NDLV",
                "innocents": results[0].innocents,
                "innocents_dlvd": results[0].innocents,
                "innocents_ndlv": 0,
                "isolating_processes": max(r.isolating_processes for r in results),
            }
            for case, results in by_case.items()
        },
        "isolation_clock": "poison's first (batch) delivery to the last innocent DLVD",
        "isolation_intervals_s": {
            "sweep": float(ISOLATION_ENV["LAZARETTO_SWEEP_INTERVAL_SECONDS"]),
            "dispatch": float(ISOLATION_ENV["LAZARETTO_DISPATCH_INTERVAL_SECONDS"]),
        },
    }


def isolation_by_case(
    isolation: list[IsolationResult],
) -> dict[IsolationCase, list[IsolationResult]]:
    by_case: dict[IsolationCase, list[IsolationResult]] = {}
    for result in isolation:
        by_case.setdefault(result.case, []).append(result)
    return by_case


def median_and_worst(seconds: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(seconds), 3), "worst": round(max(seconds), 3)}


def summary(options: Options, figures: Figures, seconds: float) -> dict[str, Any]:
    results, kill = figures.results, figures.kill
    return {
        "bench": "deliver",
        "messages": options.messages,
        "concurrency": options.concurrency,
        "payload_bytes": options.size,
        "batch1_messages": options.batch1_messages,
        "batches": {
            str(result.batch): {
                "messages": result.messages,
                "bare_msgs_per_s": round(result.bare_rate, 1),
                "celery_msgs_per_s": round(result.celery_rate, 1),
                "ratio": round(result.ratio, 3),
                "bare_s": round(result.bare_seconds, 3),
                "celery_s": round(result.celery_seconds, 3),
                "celery_first_claim_after_unpause_s": round(result.celery_wake_seconds, 3),
            }
            for result in results
        },
        "celery_clock": "first claim after unpausing (workers ready) to all DLVD",
        "worker_debug": _celery.WORKER_ENV["DEBUG"] == "1",
        "kill_to_tbdl_s": {
            "median": round(kill.median, 3),
            "max": round(kill.max, 3),
            "runs": [round(run, 3) for run in kill.runs],
            "sweep_interval_s": kill.sweep_interval,
        },
        **isolation_summary(figures.isolation),
        **(
            {"isolation_beside_spark": {"spark_niceness": spark_niceness()}}
            if options.beside_spark and figures.isolation
            else {}
        ),
        "targets": dict(TARGETS),
        "total_s": round(seconds, 1),
    }


def print_table(options: Options, results: list[BatchResult]) -> None:
    scaled = 1 in options.batches and options.batch1_messages != options.messages
    harness.title(
        f"deliver bench: {options.size}-byte payloads, consumer noop, Celery deliveries worker "
        f"--concurrency {options.concurrency} (DEBUG off), a fresh queue per path and batch size",
        "bare:   the service's CLAIM_SQL then ACK_SQL, two commits per batch, one psycopg conn",
        "celery: queue published paused; unpaused once the workers and beat are ready; clock",
        "        from the first claim (TBDL counter drops) to DLVD = N, counters polled",
        *(
            [
                f"batch 1 runs {options.batch1_messages} messages, not {options.messages} (--batch1-messages)"
            ]
            if scaled
            else []
        ),
    )
    rows = [
        [
            r.batch,
            r.messages,
            f"{r.bare_rate:.0f}",
            f"{r.celery_rate:.0f}",
            f"{r.ratio:.2f}",
            ratio_verdict(r),
        ]
        for r in results
    ]
    header = ["batch", "messages", "bare msg/s", "celery msg/s", "ratio", "target (celery/bare)"]
    harness.table(header, rows, align=">>>>><")


def print_kill(kill: KillResult) -> None:
    runs = ", ".join(f"{run:.3f}" for run in kill.runs)
    target = TARGETS["kill_to_tbdl_s"]
    print()
    print(
        f"kill-to-TBDL: consumer demo, batch {KILL_BATCH}, {KILL_SLEEP_SECONDS} s per message, "
        f"SIGKILL of the delivering process at a random phase of the sweep "
        f"(every {kill.sweep_interval:g} s)"
    )
    print(
        f"  median {kill.median:.3f} s, max {kill.max:.3f} s (runs {runs})  "
        f"target max < {target:g} s {harness.verdict(kill.max < target)}"
    )


def spark_niceness() -> int:
    from django.conf import settings

    return int(settings.LAZARETTO_SPARK_NICENESS)


def print_isolation(options: Options, isolation: list[IsolationResult]) -> None:
    if not isolation:
        return
    print()
    beside = (
        f", beside a busy Spark Connect server at niceness {spark_niceness()}"
        if options.beside_spark
        else ""
    )
    harness.title(
        f"poison isolation: consumer demo, one batch holding the poison (CRASH), queue "
        f"defaults (crash threshold 2, poison limit 5, suspect delay 1 s), sweep and "
        f"dispatch every {ISOLATION_ENV['LAZARETTO_SWEEP_INTERVAL_SECONDS']} s, "
        f"--concurrency {options.concurrency}, {options.isolation_runs} runs a case{beside}"
    )
    innocents, poison = ISOLATION_TARGETS_S["innocents_dlvd"], ISOLATION_TARGETS_S["poison_ndlv"]
    rows = []
    for case, results in isolation_by_case(isolation).items():
        dlvd = median_and_worst([r.seconds for r in results])
        ndlv = median_and_worst([r.poison_seconds for r in results])
        within = sum(r.within_targets for r in results)
        rows.append(
            [
                case.batch,
                case.poisons,
                f"{dlvd['median']:.3f} / {dlvd['worst']:.3f} s",
                f"{ndlv['median']:.3f} / {ndlv['worst']:.3f} s",
                f"{within}/{len(results)} {harness.verdict(within == len(results))}",
            ]
        )
    header = [
        "batch",
        "poisons",
        "to last innocent DLVD (median / worst)",
        "to poison NDLV (median / worst)",
        f"runs within {innocents:g} s / {poison:g} s",
    ]
    harness.table(header, rows, align=">>>><")


def print_report(options: Options, figures: Figures, seconds: float) -> None:
    print_table(options, figures.results)
    print_kill(figures.kill)
    print_isolation(options, figures.isolation)
    print(f"total {seconds:.0f} s")
    harness.print_figures(summary(options, figures, seconds))


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    options = parse_args(argv)
    # The kill and isolation queues have the demo consumer, and a queue's
    # consumer must be registered where it is created: the bench process
    # loads the module its workers load (rig.processes.Workers).
    os.environ["LAZARETTO_CONSUMER_MODULES"] = "demo_consumers"

    def measure(bench_url: str) -> None:
        figures = run_all(options, bench_url)
        print_report(options, figures, harness.since(started))

    return harness.run_bench(measure)


if __name__ == "__main__":
    sys.exit(main())
