"""Lazaretto beside its peers: delivery throughput of Lazaretto in each
delivered_retention mode beside the peer that keeps as much (PGMQ's archive,
PGMQ's delete, PgQueuer), the bare claim+ack loop, Procrastinate and Celery
with Redis alone; then the publish-to-ack latency of Lazaretto and PgQueuer
at a light load.

One system at a time, on a fresh database per run, every system once a
round, --samples rounds; the peers run in var/peers-venv. The figures also
go to var/bench/peers-<UTC>.json and var/bench/peers-latest.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import psycopg

from bench import _celery
from bench import _harness as harness
from bench import _peer_lazaretto as lazaretto
from bench._peer_report import (
    SYSTEMS,
    TARGETS,
    DatabaseWork,
    Result,
    latency_figures,
    latency_targets,
    print_latency,
    print_results,
    print_targets,
    sampled,
    summary_rows,
    targets_summary,
)
from bench._peer_worker import GO, READY, REPORT
from bench._venv import VenvError, venv_python

if TYPE_CHECKING:
    from rig.processes import RedisServer

__all__ = ["SYSTEMS", "TARGETS", "DatabaseWork", "Result", "main"]

SIZE = 1024
# Worker processes per system: Lazaretto's deliveries worker --concurrency,
# the Celery-alone worker's -c, and the processes started for the others.
WORKERS = 2
# Each drain should last at least 15 s on the development machine: N at
# batch 100 (Lazaretto about 20,000 msgs/s, PGMQ's delete 30,000), and at
# smaller batches a share of N as their rates are (about 2/5 at batch 10).
DEFAULT_MESSAGES = 500_000
BATCH10_SHARE = 0.4
DEFAULT_BATCH1_MESSAGES = 20_000
DEFAULT_PROCRASTINATE_MESSAGES = 15_000
DEFAULT_CELERY_REDIS_MESSAGES = 20_000
DEFAULT_SAMPLES = 5
# Latency: messages arriving a second (Poisson arrivals), for how long at
# each rate (at 20/s, about 1,160 messages counted: the p99 reads the 12th
# slowest), and a last point at this share of each system's own drain rate;
# what arrives in the first seconds (connections, caches) is left out.
DEFAULT_LATENCY_SECONDS = 60.0
DEFAULT_LATENCY_RATES = (20.0, 1000.0, 5000.0)
DEFAULT_CAPACITY_SHARE = 0.7
LATENCY_WARMUP_SECONDS = 2.0
# One publisher process per this many messages a second, at most
# MAX_PUBLISHERS: each publishes what has arrived in one call, so at 5,000/s
# four publishers make calls of a few messages each.
PUBLISHER_RATE = 500.0
MAX_PUBLISHERS = 4
# PgQueuer logs finished jobs in flushes of batch_size jobs, or after 0.1 s:
# at batch_size 1 a lone job is logged at once, its best latency.
PGQUEUER_LATENCY_BATCH = 1
# Lazaretto's latency queue has a queue's default batch size.
LAZARETTO_LATENCY_BATCH = 10
# Time the listeners take to LISTEN once released, before the first publish.
LISTEN_SETTLE_SECONDS = 1.0

PEERS_VENV = harness.ROOT / "var" / "peers-venv"
REQUIREMENTS = harness.ROOT / "bench" / "peers-requirements.txt"

PGBENCH_SCALE = 5
PGBENCH_CLIENTS = 2
PGBENCH_SECONDS = 15
PGBENCH_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)

READY_TIMEOUT_SECONDS = 120.0
# A run fails when the database sees no write for this long.
STALL_TIMEOUT_SECONDS = 60.0
WAIT_POLL_SECONDS = 0.2
# How often the processes' PSS is summed for its peak.
PSS_SAMPLE_SECONDS = 0.25
PROGRESS_POLL_SECONDS = 1.0
# Celery alone: the clock polls Redis as bench.deliver polls the depth counters.
START_POLL_SECONDS = 0.01
POLL_SECONDS = 0.05
WAKE_TIMEOUT_SECONDS = 30.0
# Non-empty fetches that may return fewer messages than the batch: the last
# one or two of each worker, when the queue runs low.
PARTIAL_FETCHES_ALLOWED = 2 * WORKERS

# WAL the cluster has written so far; a run's share is the difference around
# its drain, so the preload and its checkpoint are not counted. The insert
# position, not pg_stat_wal: backends add their WAL to that view up to a
# second late, which a drain of a few seconds would miss.
WAL_SQL = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
# Every write the database has seen: the stall check's sign of progress.
WRITES_SQL = "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
# The table holding a system's messages, and its partitions, if unlogged.
UNLOGGED_SQL = """
SELECT relname FROM pg_class
WHERE relpersistence = 'u' AND relkind IN ('r', 'p')
  AND (oid = %(table)s::regclass
       OR oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %(table)s::regclass))
"""

# Where each system keeps its messages, and what it keeps of delivered ones.
MESSAGE_TABLES = {
    **dict.fromkeys(lazaretto.RETENTIONS, ("broker_message",)),
    "bare": ("broker_message",),
    "pgmq-archive": ("pgmq.q_bench", "pgmq.a_bench"),
    "pgmq-delete": ("pgmq.q_bench",),
    "pgqueuer": ("pgqueuer", "pgqueuer_log"),
    "procrastinate": ("procrastinate_jobs",),
}


@dataclass(frozen=True)
class Options:
    messages: int
    batch10_messages: int
    batch1_messages: int
    batches: tuple[int, ...]
    systems: tuple[str, ...]
    samples: int
    procrastinate_messages: int
    celery_redis_messages: int
    latency_seconds: float
    latency_rates: tuple[float, ...]
    latency_capacity_share: float
    pgbench_seconds: int
    # Write var/bench/peers-<UTC>.json and peers-latest.json.
    keep: bool = True

    def messages_for(self, system: str, batch: int | None) -> int:
        if system == "procrastinate":
            return self.procrastinate_messages
        if system == "celery-redis":
            return self.celery_redis_messages
        if batch == 1:
            return self.batch1_messages
        return self.batch10_messages if batch and batch < 100 else self.messages

    def round(self, sample: int) -> list[tuple[str, int | None, int, int]]:
        """(system, batch, messages, sample) of every run of one round."""
        runs: list[tuple[str, int | None, int, int]] = []
        for name in self.systems:
            batches: Sequence[int | None] = self.batches if SYSTEMS[name].batched else (None,)
            runs += [(name, b, self.messages_for(name, b), sample) for b in batches]
        return runs

    def plan(self) -> list[tuple[str, int | None, int, int]]:
        """Every run, in order: a round of every system, --samples times."""
        return [run for sample in range(1, self.samples + 1) for run in self.round(sample)]

    @property
    def needs_peer_venv(self) -> bool:
        return any(SYSTEMS[name].peer for name in self.systems)

    @property
    def runs_lazaretto(self) -> bool:
        """One of Lazaretto's modes runs: its Celery processes are needed."""
        return bool(set(lazaretto.RETENTIONS) & set(self.systems))

    @property
    def needs_django(self) -> bool:
        return self.runs_lazaretto or "bare" in self.systems

    @property
    def latency_of(self) -> tuple[str, ...]:
        """Whose latency is measured: Lazaretto when one of its modes runs,
        PgQueuer when it does."""
        if not self.latency_seconds:
            return ()
        wanted = {"lazaretto": self.runs_lazaretto, "pgqueuer": "pgqueuer" in self.systems}
        return tuple(name for name, runs in wanted.items() if runs)


@dataclass(frozen=True)
class BatchCheck:
    """What a run's fetches returned: how many fetches returned each size."""

    system: str
    batch: int | None
    # The size every fetch but the last few must return.
    expected_size: int
    fetches: dict[int, int]

    @property
    def largest(self) -> int:
        return max(self.fetches, default=0)

    @property
    def partial(self) -> int:
        return sum(count for size, count in self.fetches.items() if size < self.expected_size)


# --- arguments ----------------------------------------------------------------------


def system_list(text: str) -> tuple[str, ...]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one system")
    unknown = [name for name in names if name not in SYSTEMS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown system {unknown[0]!r} (choose from {', '.join(SYSTEMS)})"
        )
    return tuple(dict.fromkeys(names))


def rate_list(text: str) -> tuple[float, ...]:
    """``20,1000`` as (20.0, 1000.0), each more than 0, repeats dropped."""
    rates = [harness.positive_float(part) for part in text.split(",") if part.strip()]
    if not rates:
        raise argparse.ArgumentTypeError("give at least one rate")
    return tuple(dict.fromkeys(rates))


def share(text: str) -> float:
    """A share from 0 (none) to 1."""
    value = not_negative(float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be 1 or less, not {text}")
    return float(value)


def not_negative(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """``kind``'s values from 0 up (0: skip that part)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None) -> Options:
    count = harness.positive_int
    args = harness.parser(
        __doc__,
        messages=harness.messages(
            DEFAULT_MESSAGES, f"per run at batch 100 (default {DEFAULT_MESSAGES})"
        ),
        batch10_messages=(
            count,
            None,
            f"per run at batches under 100 (default {BATCH10_SHARE:g} N)",
        ),
        batch1_messages=(
            count,
            None,
            f"per run at batch 1 (default {DEFAULT_BATCH1_MESSAGES} or N if fewer)",
        ),
        batches=(harness.batch_list, (100, 10), "default 100,10"),
        systems=(system_list, tuple(SYSTEMS), f"comma list, default {','.join(SYSTEMS)}"),
        samples=(count, DEFAULT_SAMPLES, f"rounds of every system (default {DEFAULT_SAMPLES})"),
        procrastinate_messages=(
            count,
            None,
            f"default {DEFAULT_PROCRASTINATE_MESSAGES} or N if fewer",
        ),
        celery_redis_messages=(
            count,
            None,
            f"default {DEFAULT_CELERY_REDIS_MESSAGES} or N if fewer",
        ),
        latency_seconds=(
            not_negative(float),
            DEFAULT_LATENCY_SECONDS,
            f"light-load latency run of each system (default {DEFAULT_LATENCY_SECONDS:g}; 0: none)",
        ),
        latency_rates=(
            rate_list,
            DEFAULT_LATENCY_RATES,
            "messages a second at each latency point, comma list "
            f"(default {','.join(f'{rate:g}' for rate in DEFAULT_LATENCY_RATES)})",
        ),
        latency_capacity_share=(
            share,
            DEFAULT_CAPACITY_SHARE,
            "and a point at this share of each system's own drain rate in the run "
            f"(default {DEFAULT_CAPACITY_SHARE:g}; 0: none)",
        ),
        pgbench_seconds=(
            not_negative(int),
            PGBENCH_SECONDS,
            f"pgbench -N run (default {PGBENCH_SECONDS}; 0: none)",
        ),
        keep=(bool, True, "keep the figures in var/bench/peers-*.json (default)"),
    ).parse_args(argv)
    return Options(**sized(vars(args)))


def sized(values: dict[str, Any]) -> dict[str, Any]:
    """The message counts left unset, from N (--messages): a share of it
    under batch 100, and the slow peers' defaults but never more than N."""
    messages = values["messages"]
    values["batch10_messages"] = values["batch10_messages"] or max(
        1, round(messages * BATCH10_SHARE)
    )
    for name, default in (
        ("batch1_messages", DEFAULT_BATCH1_MESSAGES),
        ("procrastinate_messages", DEFAULT_PROCRASTINATE_MESSAGES),
        ("celery_redis_messages", DEFAULT_CELERY_REDIS_MESSAGES),
    ):
        values[name] = values[name] or min(default, messages)
    return values


# --- the peers' venv -------------------------------------------------------------------


def peers_python() -> Path:
    """var/peers-venv's interpreter, with the pinned peers (bench/_venv.py)."""
    try:
        return venv_python(PEERS_VENV, REQUIREMENTS)
    except VenvError as error:
        raise harness.BenchError(str(error)) from None


# --- pgbench: the machine's yardstick -------------------------------------------------


def pgbench() -> Path:
    """pgbench, beside pg_ctl."""
    from rig.ha import pg_bindir

    try:
        found = pg_bindir() / "pgbench"
    except AssertionError as error:
        raise harness.BenchError(str(error)) from None
    if not found.is_file():
        raise harness.BenchError(f"{found} not found (scripts/services.sh installs PostgreSQL)")
    return found


def libpq_env(url: str, database: str) -> dict[str, str]:
    """DATABASE_URL as libpq's variables, so the password stays off the command line."""
    parts = urlsplit(url)
    env = {**os.environ, "PGDATABASE": database}
    for name, value in (
        ("PGHOST", parts.hostname),
        ("PGPORT", parts.port),
        ("PGUSER", parts.username),
        ("PGPASSWORD", parts.password),
    ):
        if value:
            env[name] = unquote(str(value))
    return env


def run_pgbench(bench_url: str, seconds: int) -> float:
    """``pgbench -N`` TPS over ``seconds`` on its own scratch database,
    dropped afterwards."""
    program = str(pgbench())
    database = f"{harness.BENCH_DB}_pgbench"
    _, maintenance_url = harness.database_urls(bench_url)
    harness.create_database(maintenance_url, database)
    env = libpq_env(bench_url, database)
    try:
        harness.log(f"pgbench: initialising scale {PGBENCH_SCALE} in {database}")
        init = subprocess.run(
            [program, "-i", "-q", "-s", str(PGBENCH_SCALE)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if init.returncode:
            raise harness.BenchError(f"pgbench -i failed:\n{init.stderr[-2000:]}")
        command = [program, "-N", "-c", str(PGBENCH_CLIENTS)]
        command += ["-j", str(PGBENCH_CLIENTS), "-T", str(seconds)]
        harness.log(f"pgbench: {' '.join(command[1:])}")
        run = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        found = PGBENCH_TPS.search(run.stdout)
        if run.returncode or not found:
            raise harness.BenchError(
                f"pgbench -N failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
            )
        return float(found.group(1))
    finally:
        harness.drop_database(maintenance_url, database)


# --- databases ------------------------------------------------------------------------


@dataclass
class Context:
    """What every run needs."""

    options: Options
    bench_url: str
    maintenance_url: str
    directory: Path
    payload: bytes
    peers_python: Path | None = None
    # A migrated Lazaretto database that each Lazaretto or bare run is copied from.
    template: str | None = None
    redis: RedisServer | None = None
    deliver: _celery.Bench | None = None


def fresh_database(ctx: Context, *, template: str | None = None) -> None:
    """Make the bench database anew: empty, or a copy of ``template``."""
    harness.close_django()
    harness.create_database(ctx.maintenance_url, template=template)


def make_template(ctx: Context) -> str:
    """Migrate the bench database once and keep it as the template of the
    Lazaretto and bare runs' databases."""
    harness.setup_django(ctx.bench_url)
    harness.close_django()
    template = f"{harness.BENCH_DB}_template"
    harness.create_database(ctx.maintenance_url, template, template=harness.BENCH_DB)
    return template


def settle(ctx: Context, what: str, relations: Sequence[str]) -> None:
    """After the preload, before the clock: VACUUM ANALYZE, then a CHECKPOINT
    so that no run pays for flushing its own preload. Fails when one of
    ``relations``, where the system keeps its messages, is unlogged: every
    system must write them as durably as the others."""
    harness.close_django()
    with psycopg.connect(ctx.bench_url, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        try:
            conn.execute("CHECKPOINT")
        except psycopg.Error as error:
            harness.log(f"CHECKPOINT skipped: {error}")
        unlogged = [
            row[0]
            for relation in relations
            for row in conn.execute(UNLOGGED_SQL, {"table": relation}).fetchall()
        ]
    if unlogged:
        raise harness.BenchError(f"{what}: {unlogged} unlogged: not the durability of the others")
    harness.log(f"{what}: VACUUM ANALYZE and CHECKPOINT in {harness.since(started):.1f}s")


def writes(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(WRITES_SQL).fetchone()
    return int(row[0]) if row else 0


def wal_written(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(WAL_SQL).fetchone()
    return int(row[0]) if row else 0


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, …), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def server_cpu_seconds(conn: psycopg.Connection[Any]) -> float | None:
    """The CPU time every process of the PostgreSQL server behind ``conn`` has
    used so far: the postmaster's own and that of its children it has reaped
    (cutime, cstime), and each live child's. Exact across a window however
    many backends come and go in it. None when the server is not on this
    machine (no postgres process here has the backend's pid)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    backend = int(row[0]) if row else 0
    try:
        if Path(f"/proc/{backend}/comm").read_text().strip() != "postgres":
            return None
    except OSError:
        return None
    stat = proc_stat(backend)
    if stat is None:
        return None
    postmaster = int(stat[1])
    ticks = os.sysconf("SC_CLK_TCK")
    own = proc_stat(postmaster)
    if own is None:
        return None
    # utime, stime, cutime and cstime: fields 14-17 of stat, 11-14 here.
    total = sum(int(field) for field in own[11:15])
    for child in process_tree(postmaster)[1:]:
        if (stat := proc_stat(child)) is not None:
            total += int(stat[11]) + int(stat[12])
    return total / ticks


@contextmanager
def database_work(conn: psycopg.Connection[Any]) -> Iterator[DatabaseWork]:
    work = DatabaseWork()
    wal, cpu = wal_written(conn), server_cpu_seconds(conn)
    yield work
    work.wal_bytes = wal_written(conn) - wal
    after = server_cpu_seconds(conn)
    work.cpu_seconds = None if cpu is None or after is None else after - cpu


# --- worker processes ------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    pids = [pid]
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with suppress(OSError):
            for child in children.read_text().split():
                pids += process_tree(int(child))
    return pids


def pss_kb(pid: int) -> int:
    """The process's proportional set size now, in kB (0 once it is gone):
    each shared page counted once across the processes that share it, where
    RSS counts a forked worker's pages once in each process."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in rollup.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


class PeakPss:
    """The highest summed PSS of some processes and every process under
    them, sampled every PSS_SAMPLE_SECONDS in a thread while the block runs
    (no counter keeps a peak PSS, as VmHWM does RSS)."""

    def __init__(self, roots: Sequence[int]) -> None:
        self.roots = roots
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-pss", daemon=True)

    def _sample(self) -> None:
        while True:
            tree = {each for root in self.roots for each in process_tree(root)}
            self.peak_kb = max(self.peak_kb, sum(pss_kb(pid) for pid in tree))
            if self._stop.wait(PSS_SAMPLE_SECONDS):
                return

    def __enter__(self) -> PeakPss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def tail(self, limit: int = 3000) -> str:
        text = self.err.read_text(errors="replace") if self.err.exists() else ""
        return f"--- {self.err.name}\n{text[-limit:]}"

    def report(self) -> dict[str, Any]:
        lines = [line for line in self.stdout().splitlines() if line.startswith(REPORT)]
        if not lines:
            raise harness.BenchError(f"{self.out.stem}: no report\n{self.tail()}")
        report: dict[str, Any] = json.loads(lines[-1][len(REPORT) :])
        return report


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill the process group we started (start_new_session), then reap it."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


@contextmanager
def worker_processes(
    ctx: Context,
    name: str,
    command: list[str],
    env: dict[str, str] | None = None,
    *,
    each: Sequence[Sequence[str]] = ((),) * WORKERS,
) -> Iterator[list[Worker]]:
    """A process of ``command`` for each of ``each`` (its own arguments,
    after the command's; WORKERS processes without any by default), each
    with its stdin a pipe and its output in the run's directory; killed
    (their groups) on the way out."""
    workers: list[Worker] = []
    try:
        for index, arguments in enumerate(each):
            out = ctx.directory / f"{name}-{index}.out"
            err = ctx.directory / f"{name}-{index}.err"
            with out.open("wb") as out_file, err.open("wb") as err_file:
                process = subprocess.Popen(
                    [*command, *arguments],
                    cwd=harness.ROOT,
                    env=env or dict(os.environ),
                    stdin=subprocess.PIPE,
                    stdout=out_file,
                    stderr=err_file,
                    start_new_session=True,
                )
            workers.append(Worker(process, out, err))
        yield workers
    finally:
        for worker in workers:
            stop(worker.process)


def wait_ready(name: str, workers: list[Worker]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    for worker in workers:
        while READY not in worker.stdout().splitlines():
            if worker.process.poll() is not None:
                raise harness.BenchError(
                    f"{name}: a worker exited with {worker.process.returncode} before it was "
                    f"ready\n{worker.tail()}"
                )
            if time.monotonic() > deadline:
                raise harness.BenchError(
                    f"{name}: workers not ready after {READY_TIMEOUT_SECONDS:.0f}s"
                )
            time.sleep(WAIT_POLL_SECONDS)


def release(workers: list[Worker]) -> None:
    for worker in workers:
        stdin: IO[bytes] | None = worker.process.stdin
        assert stdin is not None
        stdin.write(f"{GO}\n".encode())
        stdin.close()


def wait_done(ctx: Context, name: str, workers: list[Worker]) -> list[dict[str, Any]]:
    """Wait for every worker to exit 0 and return their reports; fail when
    one fails or when the database sees no write for STALL_TIMEOUT_SECONDS."""
    with psycopg.connect(ctx.bench_url, autocommit=True) as conn:
        seen, moved, checked = writes(conn), time.monotonic(), time.monotonic()
        while any(worker.process.poll() is None for worker in workers):
            for worker in workers:
                if worker.process.returncode:
                    raise harness.BenchError(
                        f"{name}: a worker exited with {worker.process.returncode}\n{worker.tail()}"
                    )
            now = time.monotonic()
            if now - checked >= PROGRESS_POLL_SECONDS:
                checked = now
                count = writes(conn)
                if count != seen:
                    seen, moved = count, now
                elif now - moved > STALL_TIMEOUT_SECONDS:
                    raise harness.BenchError(
                        f"{name}: no write in the database for {STALL_TIMEOUT_SECONDS:.0f}s\n"
                        + "\n".join(worker.tail() for worker in workers)
                    )
            time.sleep(WAIT_POLL_SECONDS)
    for worker in workers:
        if worker.process.returncode:
            raise harness.BenchError(
                f"{name}: a worker exited with {worker.process.returncode}\n{worker.tail()}"
            )
    return [worker.report() for worker in workers]


@dataclass(frozen=True)
class Drained:
    """How a system's worker processes drained its queue."""

    # From the first fetch of any worker to the last acknowledgement of any.
    seconds: float
    # Their summed PSS at its highest.
    peak_pss_kb: int
    # How many fetches returned each size.
    fetches: Counter[int]
    acked: int
    # From their release to their exit.
    database: DatabaseWork


def drain_with_workers(
    ctx: Context, name: str, command: list[str], env: dict[str, str] | None = None
) -> Drained:
    """Start the workers, release them together once all are ready and wait
    for them."""
    with (
        worker_processes(ctx, name, command, env) as workers,
        psycopg.connect(ctx.bench_url, autocommit=True) as conn,
    ):
        wait_ready(name, workers)
        with (
            database_work(conn) as database,
            PeakPss([worker.process.pid for worker in workers]) as memory,
        ):
            release(workers)
            reports = wait_done(ctx, name, workers)
    first = [report["first_fetch"] for report in reports if report["first_fetch"] is not None]
    last = [report["last_ack"] for report in reports if report["last_ack"] is not None]
    if not first or not last:
        raise harness.BenchError(f"{name}: no worker acknowledged anything: {reports}")
    fetches: Counter[int] = Counter()
    for report in reports:
        fetches.update({int(size): count for size, count in report["fetches"].items()})
    acked = sum(int(report["acked"]) for report in reports)
    return Drained(max(last) - min(first), memory.peak_kb, fetches, acked, database)


def check_batches(
    system: str, batch: int | None, expected_size: int, messages: int, fetches: Counter[int]
) -> BatchCheck:
    """The batch setting took effect: the fetches returned every message
    once, none more than ``expected_size`` at a time, and all but the last
    few (PARTIAL_FETCHES_ALLOWED) exactly ``expected_size``."""
    # A run smaller than its batch is one fetch of all its messages.
    full = min(expected_size, messages)
    check = BatchCheck(system, batch, full, dict(sorted(fetches.items())))
    fetched = sum(size * count for size, count in fetches.items())
    where = system if batch is None else f"{system} batch {batch}"
    if fetched != messages:
        raise harness.BenchError(
            f"{where}: the fetches returned {fetched} messages, not {messages}"
        )
    if check.largest != full or check.partial > PARTIAL_FETCHES_ALLOWED:
        raise harness.BenchError(
            f"{where}: the batch setting did not take effect: expected fetches of {full}, "
            f"got (size: fetches) {check.fetches}"
        )
    harness.log(f"{where}: batch check: fetches by size {check.fetches}")
    return check


# --- the systems -------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    seconds: float
    peak_pss_kb: int
    check: BatchCheck | None = None
    database: DatabaseWork | None = None


def run_lazaretto(ctx: Context, batch: int | None, count: int, *, system: str) -> Measured:
    """bench.deliver's Celery path on a queue whose delivered_retention is
    ``system``'s mode: the queue preloaded paused, the Celery processes
    started, the queue unpaused, clocked from the first claim to its
    delivered counter at N."""
    assert batch is not None
    assert ctx.deliver is not None
    assert ctx.redis is not None
    retention = lazaretto.RETENTIONS[system]
    where = f"{system} {batch}"
    fresh_database(ctx, template=ctx.template)
    queue = lazaretto.make_queue(
        f"BENCH.PEERS.{retention.upper()}.{batch}",
        batch=batch,
        retention=retention,
        size=SIZE,
        paused=True,
    )
    harness.log(f"{where}: publishing {count} messages to {queue.name}")
    _celery.publish_messages(queue, _celery.new_message(ctx.payload), count)
    _celery.flush_redis(ctx.redis)
    settle(ctx, where, MESSAGE_TABLES[system])
    with (
        tempfile.TemporaryDirectory(prefix="bench-peers-", dir=ctx.directory) as directory,
        psycopg.connect(ctx.bench_url, autocommit=True) as conn,
        _celery.celery_processes(ctx.deliver, Path(directory)) as workers,
    ):
        trees = {name: PeakPss([process.pid]) for name, process in workers.processes.items()}
        with ExitStack() as sampling:
            for tree in trees.values():
                sampling.enter_context(tree)
            with database_work(conn) as database:
                seconds = lazaretto.drain_paused_queue(conn, workers, queue, count)
        lazaretto.verify_kept(conn, queue.id, count, retention)
    shown = ", ".join(f"{name} {tree.peak_kb / 1024:.0f}" for name, tree in trees.items())
    harness.log(f"{where}: peak PSS MB of each process tree: {shown}")
    return Measured(seconds, sum(tree.peak_kb for tree in trees.values()), database=database)


def run_bare(ctx: Context, batch: int | None, count: int) -> Measured:
    """WORKERS processes of bench.deliver's bare loop on one queue."""
    assert batch is not None
    fresh_database(ctx, template=ctx.template)
    # consumer "": no worker or dispatcher ever touches it.
    queue = _celery.make_queue(
        f"BENCH.PEERS.BARE.{batch}", consumer="", batch_size=batch, size=SIZE
    )
    harness.log(f"bare {batch}: publishing {count} messages to {queue.name}")
    _celery.publish_messages(queue, _celery.new_message(ctx.payload), count)
    settle(ctx, f"bare {batch}", MESSAGE_TABLES["bare"])
    command = [sys.executable, "-m", "bench._peer_bare", "--url", ctx.bench_url]
    command += ["--queue-id", str(queue.id), "--batch", str(batch)]
    command += ["--lease-seconds", str(queue.lease_seconds)]
    env = {**os.environ, **harness.PRODUCTION_ENV}
    drained = drain_with_workers(ctx, f"bare-{batch}", command, env)
    if drained.acked != count:
        raise harness.BenchError(
            f"bare {batch}: the workers acknowledged {drained.acked} of {count} messages"
        )
    _celery.verify_delivered(queue, count, f"bare {batch}")
    check = check_batches("bare", batch, batch, count, drained.fetches)
    return Measured(drained.seconds, drained.peak_pss_kb, check, drained.database)


def prepare_peer(ctx: Context, module: str, count: int) -> None:
    """The peer's ``prepare``: its schema and the preload, in var/peers-venv."""
    assert ctx.peers_python is not None
    command = [str(ctx.peers_python), "-m", module, "prepare", "--url", ctx.bench_url]
    command += ["--messages", str(count), "--size", str(SIZE)]
    started = time.perf_counter()
    answer = subprocess.run(command, cwd=harness.ROOT, capture_output=True, text=True, check=False)
    if answer.returncode:
        raise harness.BenchError(
            f"{module} prepare exited with {answer.returncode}:\n{answer.stderr[-3000:]}"
        )
    harness.log(f"{module}: schema and {count} messages in {harness.since(started):.1f}s")


@dataclass(frozen=True)
class PeerRun:
    """How a peer system runs: its module in var/peers-venv, the mode its
    work command takes, and the counts it must end with."""

    module: str
    mode: str = ""
    # The messages it has left: none afterwards.
    remaining_sql: str = ""
    # What it keeps of the messages it delivered: as many as it delivered.
    kept_sql: str = ""
    # How many one fetch takes (None: the batch size).
    fetch_size: int | None = None


PEER_RUNS = {
    "pgmq-archive": PeerRun(
        "bench._peer_pgmq",
        "archive",
        "SELECT count(*) FROM pgmq.q_bench",
        "SELECT count(*) FROM pgmq.a_bench",
    ),
    "pgmq-delete": PeerRun("bench._peer_pgmq", "delete", "SELECT count(*) FROM pgmq.q_bench"),
    "pgqueuer": PeerRun(
        "bench._peer_pgqueuer",
        remaining_sql="SELECT count(*) FROM pgqueuer",
        kept_sql="SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
    ),
    # Procrastinate has one setting: each fetch_job takes one job.
    "procrastinate": PeerRun(
        "bench._peer_procrastinate",
        remaining_sql="SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
        kept_sql="SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        fetch_size=1,
    ),
}


def count_rows(ctx: Context, query: str) -> int | None:
    if not query:
        return None
    with psycopg.connect(ctx.bench_url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else None


def run_peer(ctx: Context, batch: int | None, count: int, *, system: str) -> Measured:
    """A peer's run: fresh database, prepare, settle, its workers from
    var/peers-venv; fails unless none of its messages is left afterwards,
    it kept what it keeps of each, the workers acknowledged ``count``
    messages and the batch setting took effect."""
    assert ctx.peers_python is not None
    peer = PEER_RUNS[system]
    where = system if batch is None else f"{system} {batch}"
    fresh_database(ctx)
    prepare_peer(ctx, peer.module, count)
    settle(ctx, where, MESSAGE_TABLES[system])
    command = [str(ctx.peers_python), "-m", peer.module, "work", "--url", ctx.bench_url]
    command += ["--batch", str(batch or 1), "--mode", peer.mode]
    drained = drain_with_workers(ctx, where.replace(" ", "-"), command)
    remaining, kept = count_rows(ctx, peer.remaining_sql), count_rows(ctx, peer.kept_sql)
    if drained.acked != count or remaining != 0 or kept not in (None, count):
        raise harness.BenchError(
            f"{where}: {drained.acked} of {count} messages acknowledged, "
            f"{remaining} left in the queue, {kept} kept"
        )
    harness.log(f"{where}: {count} messages in {drained.seconds:.2f}s, none left, {kept} kept")
    check = check_batches(system, batch, peer.fetch_size or batch or 1, count, drained.fetches)
    return Measured(drained.seconds, drained.peak_pss_kb, check, drained.database)


def redis_queued(client: Any, queue: str) -> int:
    """Messages waiting in a kombu Redis queue (every priority's list)."""
    keys = [queue, *(f"{queue}\x06\x16{priority}" for priority in (3, 6, 9))]
    return sum(int(client.llen(key)) for key in keys)


def wait_celery_ready(app: Any, node: str, worker: Worker) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while not app.control.ping(destination=[node], timeout=0.5):
        if worker.process.poll() is not None:
            raise harness.BenchError(f"celery-redis: the worker exited\n{worker.tail()}")
        if time.monotonic() > deadline:
            raise harness.BenchError(f"celery-redis: no answer to ping\n{worker.tail()}")


def run_celery_redis(ctx: Context, batch: int | None, count: int) -> Measured:
    """Celery alone: ``count`` tasks sent to a queue the worker does not
    consume yet, then ``add_consumer``; clocked from the queue's first drop
    to the queue and Redis's ``unacked`` hash both empty (tasks ack late)."""
    import redis

    from bench._peer_celery import BROKER_ENV, IDLE_QUEUE, NODE, QUEUE, TASK, make_app

    assert ctx.redis is not None
    url = ctx.redis.url
    _celery.flush_redis(ctx.redis)
    app = make_app(url)
    payload = ctx.payload.decode()
    client = redis.Redis.from_url(url)
    started = time.perf_counter()
    producers: Any = app.producer_or_acquire()  # one producer for every send
    with producers as producer:
        for _ in range(count):
            app.send_task(TASK, args=[payload], queue=QUEUE, producer=producer)
    if redis_queued(client, QUEUE) != count:
        raise harness.BenchError(
            f"celery-redis: sent {count} tasks, {redis_queued(client, QUEUE)} queued"
        )
    harness.log(f"celery-redis: {count} tasks sent in {harness.since(started):.1f}s")
    node = NODE.replace("%h", socket.gethostname())
    command = [sys.executable, "-m", "celery", "-A", "bench._peer_celery", "worker"]
    command += ["-Q", IDLE_QUEUE, "-c", str(WORKERS), "-n", NODE, "-l", "warning"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    env = {**os.environ, BROKER_ENV: url, "CELERY_BROKER_URL": url}
    out, err = ctx.directory / "celery-redis.out", ctx.directory / "celery-redis.err"
    try:
        with out.open("wb") as out_file, err.open("wb") as err_file:
            process = subprocess.Popen(
                command,
                cwd=harness.ROOT,
                env=env,
                stdout=out_file,
                stderr=err_file,
                start_new_session=True,
            )
        worker = Worker(process, out, err)
        try:
            wait_celery_ready(app, node, worker)
            app.control.add_consumer(QUEUE, destination=[node])
            with PeakPss([process.pid]) as memory:
                seconds = time_celery_drain(client, count, worker)
            stats: dict[str, Any] = app.control.inspect(destination=[node], timeout=5).stats() or {}
        finally:
            stop(process)
    finally:
        client.close()
    executed = int(stats.get(node, {}).get("total", {}).get(TASK, 0))
    if executed != count:
        raise harness.BenchError(f"celery-redis: the worker ran {executed} tasks, not {count}")
    harness.log(f"celery-redis: {count} tasks in {seconds:.2f}s, each run once")
    return Measured(seconds, memory.peak_kb)


def time_celery_drain(client: Any, count: int, worker: Worker) -> float:
    from bench._peer_celery import QUEUE

    deadline = time.perf_counter() + WAKE_TIMEOUT_SECONDS
    while redis_queued(client, QUEUE) >= count:
        if time.perf_counter() > deadline:
            raise harness.BenchError(
                f"celery-redis: nothing consumed after add_consumer\n{worker.tail()}"
            )
        time.sleep(START_POLL_SECONDS)
    first = time.perf_counter()
    left, moved = count, first
    while True:
        queued, unacked = redis_queued(client, QUEUE), int(client.hlen("unacked"))
        now = time.perf_counter()
        if queued == 0 and unacked == 0:
            return now - first
        if queued + unacked != left:
            left, moved = queued + unacked, now
        elif now - moved > STALL_TIMEOUT_SECONDS:
            raise harness.BenchError(
                f"celery-redis: stalled with {queued} queued, {unacked} unacked"
            )
        if worker.process.poll() is not None:
            raise harness.BenchError(f"celery-redis: the worker exited\n{worker.tail()}")
        time.sleep(POLL_SECONDS)


RUNNERS: dict[str, Callable[[Context, int | None, int], Measured]] = {
    **{system: partial(run_lazaretto, system=system) for system in lazaretto.RETENTIONS},
    "bare": run_bare,
    **{system: partial(run_peer, system=system) for system in PEER_RUNS},
    "celery-redis": run_celery_redis,
}


# --- latency at each rate ------------------------------------------------------------------


@dataclass(frozen=True)
class LatencyPoint:
    """A rate the latency is measured at: one of --latency-rates, or a share
    of the system's own drain rate in this run (``basis`` says which)."""

    rate: float
    basis: str = "fixed rate"

    @property
    def publishers(self) -> int:
        return max(1, min(MAX_PUBLISHERS, math.ceil(self.rate / PUBLISHER_RATE)))


# Each latency system's drain figure: its system and the batch of its latency run.
CAPACITY_OF = {
    "lazaretto": ("lazaretto-full", LAZARETTO_LATENCY_BATCH),
    "pgqueuer": ("pgqueuer", PGQUEUER_LATENCY_BATCH),
}


def latency_points(options: Options, name: str, results: Sequence[Result]) -> list[LatencyPoint]:
    """The fixed rates, then the share of the system's drain rate measured
    in this run at the batch nearest its latency run's (none if it did not
    drain)."""
    points = [LatencyPoint(rate) for rate in options.latency_rates]
    system, batch = CAPACITY_OF[name]
    drains = [figure for figure in sampled(results) if figure.system == system]
    if options.latency_capacity_share and drains:
        drain = min(drains, key=lambda figure: abs((figure.batch or 1) - batch))
        share = options.latency_capacity_share
        basis = f"{share:.0%} of {system} batch {drain.batch}'s {drain.rate:,.0f} msgs/s"
        points.append(LatencyPoint(round(share * drain.rate), basis))
    return points


def tree_cpu_seconds(roots: Sequence[int]) -> float:
    """CPU time so far of ``roots`` and every process under them, with the
    children they have reaped."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in {each for root in roots for each in process_tree(root)}:
        if (stat := proc_stat(pid)) is not None:
            total += sum(int(field) for field in stat[11:15])
    return total / ticks


def reaped_cpu_seconds() -> float:
    """CPU time of this process's children that have exited and been reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def cores_used(ctx: Context, consumers: Sequence[int]) -> Iterator[dict[str, float | None]]:
    """Cores each side used on average over the block: the publishers (this
    process's children reaped in it), the consumers (``consumers``' trees)
    and the database server (``server_cpu_seconds``)."""
    cores: dict[str, float | None] = {}
    with psycopg.connect(ctx.bench_url, autocommit=True) as conn:
        started = time.monotonic()
        before = reaped_cpu_seconds(), tree_cpu_seconds(consumers), server_cpu_seconds(conn)
        yield cores
        seconds = time.monotonic() - started
        after = reaped_cpu_seconds(), tree_cpu_seconds(consumers), server_cpu_seconds(conn)
    for side, was, now in zip(("publishers", "consumers", "database"), before, after, strict=True):
        cores[side] = None if was is None or now is None else round((now - was) / seconds, 2)


def run_publishers(
    ctx: Context, name: str, command: list[str], env: dict[str, str], point: LatencyPoint
) -> list[dict[str, Any]]:
    """``point.publishers`` processes of ``command`` publishing at the
    point's rate between them for --latency-seconds, each its own Poisson
    arrivals (--seed); their reports once all have exited 0."""
    share = point.rate / point.publishers
    seconds = ctx.options.latency_seconds
    each = [
        ["--rate", str(share), "--seconds", str(seconds), "--seed", str(seed)]
        for seed in range(point.publishers)
    ]
    with worker_processes(ctx, name, command, env, each=each) as publishers:
        # Publishing, then waiting as long again for the acknowledgements.
        deadline = time.monotonic() + 2 * seconds + READY_TIMEOUT_SECONDS
        for publisher in publishers:
            try:
                publisher.process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise harness.BenchError(f"{name}: a publisher hangs\n{publisher.tail()}") from None
            if publisher.process.returncode:
                raise harness.BenchError(
                    f"{name}: a publisher exited with {publisher.process.returncode}\n"
                    f"{publisher.tail()}"
                )
        return [publisher.report() for publisher in publishers]


Reports = tuple[list[dict[str, Any]], dict[str, float | None]]


def lazaretto_latency(ctx: Context, point: LatencyPoint) -> Reports:
    """The publishers (bench._peer_lazaretto publish) publish to a queue
    (mode full, the default batch size) that the Celery processes deliver
    as the messages come."""
    assert ctx.deliver is not None
    assert ctx.redis is not None
    fresh_database(ctx, template=ctx.template)
    lazaretto.make_queue(
        lazaretto.LATENCY_QUEUE,
        batch=LAZARETTO_LATENCY_BATCH,
        retention="full",
        size=SIZE,
        paused=False,
    )
    _celery.flush_redis(ctx.redis)
    command = [sys.executable, "-m", "bench._peer_lazaretto", "publish"]
    command += ["--url", ctx.bench_url, "--size", str(SIZE)]
    env = {
        **os.environ,
        **_celery.worker_env(ctx.bench_url),
        "CELERY_BROKER_URL": ctx.redis.url,
    }
    with (
        tempfile.TemporaryDirectory(prefix="bench-peers-", dir=ctx.directory) as directory,
        _celery.celery_processes(ctx.deliver, Path(directory)) as workers,
    ):
        consumers = [process.pid for process in workers.processes.values()]
        with cores_used(ctx, consumers) as cores:
            reports = run_publishers(ctx, "lazaretto-publish", command, env, point)
        _celery.check_tasks(workers)
    return reports, cores


def pgqueuer_latency(ctx: Context, point: LatencyPoint) -> Reports:
    """The publishers (bench._peer_pgqueuer publish) enqueue with PgQueuer's
    enqueue; WORKERS listening processes (batch_size PGQUEUER_LATENCY_BATCH)
    consume."""
    assert ctx.peers_python is not None
    module = "bench._peer_pgqueuer"
    fresh_database(ctx)
    prepare_peer(ctx, module, 0)
    python = [str(ctx.peers_python), "-m", module]
    listen = [*python, "listen", "--url", ctx.bench_url, "--batch", str(PGQUEUER_LATENCY_BATCH)]
    publish = [*python, "publish", "--url", ctx.bench_url, "--size", str(SIZE)]
    with worker_processes(ctx, "pgqueuer-listen", listen) as workers:
        wait_ready("pgqueuer listen", workers)
        release(workers)
        time.sleep(LISTEN_SETTLE_SECONDS)
        with cores_used(ctx, [worker.process.pid for worker in workers]) as cores:
            reports = run_publishers(ctx, "pgqueuer-publish", publish, dict(os.environ), point)
        dead = [worker for worker in workers if worker.process.poll() is not None]
        if dead:
            raise harness.BenchError(
                f"pgqueuer latency: {len(dead)} listeners exited\n"
                + "\n".join(worker.tail() for worker in dead)
            )
    return reports, cores


LATENCY_RUNNERS: dict[str, Callable[[Context, LatencyPoint], Reports]] = {
    "lazaretto": lazaretto_latency,
    "pgqueuer": pgqueuer_latency,
}


def point_figures(point: LatencyPoint, measured: Reports) -> dict[str, Any]:
    """p50, p99 and the worst arrival-to-ack time of the publishers' messages
    together; the same of the part from the publish's commit to the ack
    (the time in the system, without the publishers' own delay); how the
    publishers kept to their arrivals; and the cores each side used."""
    reports, cores = measured
    rows = [row for report in reports for row in report["latencies"]]
    arrivals = [float(row[0]) for row in rows]
    span = max(arrivals) - min(arrivals)
    whole = latency_figures([(float(r[0]), r[1]) for r in rows], LATENCY_WARMUP_SECONDS)
    stored = latency_figures([(float(r[0]), r[2]) for r in rows], LATENCY_WARMUP_SECONDS)
    return {
        "rate_per_s": point.rate,
        "basis": point.basis,
        "publishers": point.publishers,
        **whole,
        "from_commit": {key: stored[key] for key in ("p50_ms", "p99_ms", "max_ms")},
        "arrived_per_s": round(len(rows) / span, 1) if span > 0 else None,
        "publish_calls": sum(int(r["calls"]) for r in reports),
        "worst_publish_lag_ms": round(1000 * max(float(r["worst_lag_s"]) for r in reports), 2),
        "cpu_cores": cores,
    }


def run_latency(ctx: Context, results: Sequence[Result]) -> dict[str, list[dict[str, Any]]]:
    """Each system's latency at each of its points."""
    latency: dict[str, list[dict[str, Any]]] = {}
    for name in ctx.options.latency_of:
        for point in latency_points(ctx.options, name, results):
            harness.log(
                f"== {name} latency at {point.rate:g}/s ({point.basis}), "
                f"{point.publishers} publishers, {ctx.options.latency_seconds:g}s"
            )
            figures = point_figures(point, LATENCY_RUNNERS[name](ctx, point))
            harness.log(f"{name} latency: {figures}")
            latency.setdefault(name, []).append(figures)
    return latency


# --- driver and report --------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """What a whole run measured."""

    tps: float | None
    results: list[Result]
    checks: list[BatchCheck]
    latency: dict[str, list[dict[str, Any]]]


def summary(options: Options, run: Run, seconds: float) -> dict[str, Any]:
    return {
        "bench": "peers",
        "messages": options.messages,
        "batch10_messages": options.batch10_messages,
        "batch1_messages": options.batch1_messages,
        "batches": list(options.batches),
        "systems": list(options.systems),
        "samples": options.samples,
        "procrastinate_messages": options.procrastinate_messages,
        "celery_redis_messages": options.celery_redis_messages,
        "payload_bytes": SIZE,
        "workers": WORKERS,
        "pgbench_tps": None if run.tps is None else round(run.tps, 1),
        "pgbench": {
            "mode": "-N",
            "scale": PGBENCH_SCALE,
            "clients": PGBENCH_CLIENTS,
            "seconds": options.pgbench_seconds,
        },
        "results": summary_rows(run.results),
        "targets": targets_summary(sampled(run.results)),
        "latency": run.latency,
        "latency_setup": {
            "rates_per_s": list(options.latency_rates),
            "capacity_share": options.latency_capacity_share,
            "seconds": options.latency_seconds,
            "arrivals": "Poisson, one process per "
            f"{PUBLISHER_RATE:g} msgs/s (at most {MAX_PUBLISHERS}), what has arrived "
            "published in one call",
            "warmup_seconds": LATENCY_WARMUP_SECONDS,
            "lazaretto_queue_batch": LAZARETTO_LATENCY_BATCH,
            "pgqueuer_batch_size": PGQUEUER_LATENCY_BATCH,
        },
        "latency_targets": latency_targets(run.latency) if run.latency else {},
        "batch_checks": [
            {
                "system": check.system,
                "batch": check.batch,
                "expected_size": check.expected_size,
                "fetches_by_size": {str(size): count for size, count in check.fetches.items()},
            }
            for check in run.checks
        ],
        "clock": (
            "lazaretto: first claim (TBDL counter drops) to the delivered counter at N; "
            "celery-redis: first drop of the Redis queue to queue and unacked both empty; the "
            "others: first fetch of any worker to the last acknowledgement of any, on the "
            "workers' clocks; latency: a message's arrival (the publisher's clock) to the ack "
            "statement's now() (the database's, on the same machine)"
        ),
        "total_s": round(seconds, 1),
    }


def print_report(options: Options, run: Run) -> None:
    print(
        f"peers bench: {SIZE}-byte messages, a no-op consumer, {WORKERS} worker processes per "
        "system, one system at a time, a fresh database per run (VACUUM ANALYZE after the "
        f"preload), {options.samples} rounds of every system; medians, min-max of the samples"
    )
    if run.tps is not None:
        print(
            f"pgbench -N: {run.tps:,.0f} tps (scale {PGBENCH_SCALE}, {PGBENCH_CLIENTS} clients, "
            f"{options.pgbench_seconds} s); 'x tps' is msgs/s over it"
        )
    for name in options.systems:
        print(f"  {name:<17} {SYSTEMS[name].label}")
    print()
    print_results(run.results, run.tps)
    print_targets(run.results)
    print_latency(run.latency)


@contextmanager
def shared_redis(ctx: Context, directory: Path) -> Iterator[RedisServer | None]:
    """One private redis-server for Lazaretto's wake-ups and Celery alone;
    this process's Celery app sends to it (bench._celery's private_redis) when
    Django is set up."""
    if not ctx.options.runs_lazaretto and "celery-redis" not in ctx.options.systems:
        yield None
        return
    with _celery.private_redis(directory, wake_ups=ctx.options.needs_django) as server:
        yield server


def measure_one(ctx: Context, system: str, batch: int | None, count: int, sample: int) -> Measured:
    where = system if batch is None else f"{system} batch {batch}"
    harness.log(f"== {where}: {count} messages (sample {sample} of {ctx.options.samples})")
    measured = RUNNERS[system](ctx, batch, count)
    harness.log(f"{where}: {count / measured.seconds:.0f} msgs/s")
    return measured


def run_all(
    ctx: Context,
) -> tuple[list[Result], list[BatchCheck], dict[str, list[dict[str, Any]]]]:
    results: list[Result] = []
    checks: list[BatchCheck] = []
    with ExitStack() as stack:
        if ctx.options.needs_django:
            ctx.template = make_template(ctx)
            stack.callback(harness.drop_database, ctx.maintenance_url, ctx.template)
        ctx.redis = stack.enter_context(shared_redis(ctx, ctx.directory / "redis"))
        if ctx.redis is not None and ctx.options.runs_lazaretto:
            ctx.deliver = _celery.Bench(
                ctx.bench_url, ctx.redis, ctx.payload, concurrency=WORKERS, size=SIZE
            )
        for system, batch, count, sample in ctx.options.plan():
            measured = measure_one(ctx, system, batch, count, sample)
            results.append(
                Result(
                    system,
                    batch,
                    count,
                    measured.seconds,
                    measured.peak_pss_kb,
                    measured.database,
                    sample,
                )
            )
            if measured.check is not None:
                checks.append(measured.check)
        latency = run_latency(ctx, results)
    return results, checks, latency


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    options = parse_args(argv)
    if not os.environ.get("DATABASE_URL"):
        harness.log("DATABASE_URL is not set (source var/services.env)")
        return 2
    python = None
    if options.needs_peer_venv:
        try:
            python = peers_python()
        except harness.BenchError as error:
            harness.log(f"bench failed: {error}")
            return 1

    def measure(bench_url: str) -> None:
        _, maintenance_url = harness.database_urls(bench_url)
        tps = run_pgbench(bench_url, options.pgbench_seconds) if options.pgbench_seconds else None
        if tps is not None:
            print(f"pgbench -N: {tps:,.0f} tps", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as directory:
            (Path(directory) / "redis").mkdir()
            ctx = Context(
                options=options,
                bench_url=bench_url,
                maintenance_url=maintenance_url,
                directory=Path(directory),
                payload=harness.make_payload(SIZE),
                peers_python=python,
            )
            run = Run(tps, *run_all(ctx))
        print_report(options, run)
        seconds = harness.since(started)
        print(f"total {seconds:.0f} s")
        figures = summary(options, run, seconds)
        if options.keep:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            path = harness.keep_run("peers", figures, stamp)
            harness.log(f"figures written to {path.relative_to(harness.ROOT)}")
        harness.print_figures(figures)

    return harness.run_bench(measure)


if __name__ == "__main__":
    sys.exit(main())
