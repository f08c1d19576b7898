"""Lazaretto beside its peers: delivery throughput of Lazaretto, the bare
claim+ack loop, PGMQ, PgQueuer, Procrastinate and Celery with Redis alone.

One system at a time, on a fresh database per run; the peers run in
var/peers-venv. The figures also go to var/bench/peers-<UTC>.json and
var/bench/peers-latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
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
from bench._peer_worker import GO, READY, REPORT, peak_rss_kb
from bench._venv import VenvError, venv_python

if TYPE_CHECKING:
    from rig.processes import RedisServer

SIZE = 1024
# Worker processes per system: Lazaretto's deliveries worker --concurrency,
# the Celery-alone worker's -c, and the processes started for the others.
WORKERS = 2
# Lazaretto's batch that single-setting peers are compared with.
REFERENCE_BATCH = 100
# Slow systems drain fewer messages by default (never more than --messages),
# so that the default run stays within about 20 minutes.
DEFAULT_BATCH1_MESSAGES = 20_000
DEFAULT_PROCRASTINATE_MESSAGES = 10_000
DEFAULT_CELERY_REDIS_MESSAGES = 20_000

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
PROGRESS_POLL_SECONDS = 1.0
# Celery alone: the clock polls Redis as bench.deliver polls the depth counters.
START_POLL_SECONDS = 0.01
POLL_SECONDS = 0.05
WAKE_TIMEOUT_SECONDS = 30.0
# Non-empty fetches that may return fewer messages than the batch: the last
# one or two of each worker, when the queue runs low.
PARTIAL_FETCHES_ALLOWED = 2 * WORKERS

# WAL the cluster has written so far; a run's share is the difference around
# its drain, so the preload and its checkpoint are not counted.
WAL_SQL = "SELECT wal_bytes FROM pg_stat_wal"
# Every write the database has seen: the stall check's sign of progress.
WRITES_SQL = "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
# The table holding a system's messages, and its partitions, if unlogged.
UNLOGGED_SQL = """
SELECT relname FROM pg_class
WHERE relpersistence = 'u' AND relkind IN ('r', 'p')
  AND (oid = %(table)s::regclass
       OR oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %(table)s::regclass))
"""


@dataclass(frozen=True)
class System:
    name: str
    label: str
    # Has a batch setting, run at every --batches size; else one run, batch None.
    batched: bool
    # Runs from var/peers-venv.
    peer: bool


SYSTEMS = {
    system.name: system
    for system in (
        System("lazaretto", "Lazaretto: Celery workers, consumer noop", batched=True, peer=False),
        System("bare", "bare claim+ack loop (bench.deliver's)", batched=True, peer=False),
        System("pgmq", "PGMQ: read B + delete", batched=True, peer=True),
        System("pgqueuer", "PgQueuer: batch_size B", batched=True, peer=True),
        System("procrastinate", "Procrastinate: one job per fetch", batched=False, peer=True),
        System("celery-redis", "Celery with Redis alone: a task per message", False, False),
    )
}


# Where each system keeps its messages.
MESSAGE_TABLES = {
    "lazaretto": "broker_message",
    "bare": "broker_message",
    "pgmq": "pgmq.q_bench",
    "pgqueuer": "pgqueuer",
    "procrastinate": "procrastinate_jobs",
}


@dataclass(frozen=True)
class Target:
    """Lazaretto's msgs/s over the peer's, at ``batch`` (REFERENCE_BATCH for
    Lazaretto when the peer has no batch setting), must be at least ``minimum``."""

    peer: str
    batch: int | None
    minimum: float

    @property
    def key(self) -> str:
        name = f"lazaretto_vs_{self.peer.replace('-', '_')}"
        return name if self.batch is None else f"{name}_{self.batch}"


TARGETS = (
    Target("bare", 100, 0.6),
    Target("bare", 10, 0.5),
    Target("pgmq", 100, 1.2),
    # PgQueuer is judged at both batch sizes the bare loop is.
    Target("pgqueuer", 100, 2.0),
    Target("pgqueuer", 10, 2.0),
    Target("procrastinate", None, 20.0),
    Target("celery-redis", None, 5.0),
)


@dataclass(frozen=True)
class Options:
    messages: int
    batches: tuple[int, ...]
    systems: tuple[str, ...]
    batch1_messages: int
    procrastinate_messages: int
    celery_redis_messages: int

    def messages_for(self, system: str, batch: int | None) -> int:
        if system == "procrastinate":
            return self.procrastinate_messages
        if system == "celery-redis":
            return self.celery_redis_messages
        return self.batch1_messages if batch == 1 else self.messages

    def plan(self) -> list[tuple[str, int | None, int]]:
        """(system, batch, messages) of every run, in order."""
        runs: list[tuple[str, int | None, int]] = []
        for name in self.systems:
            batches: Sequence[int | None] = self.batches if SYSTEMS[name].batched else (None,)
            runs += [(name, batch, self.messages_for(name, batch)) for batch in batches]
        return runs

    @property
    def needs_peer_venv(self) -> bool:
        return any(SYSTEMS[name].peer for name in self.systems)

    @property
    def needs_django(self) -> bool:
        return bool({"lazaretto", "bare"} & set(self.systems))


@dataclass(frozen=True)
class Result(harness.Rated):
    system: str
    batch: int | None
    messages: int
    seconds: float
    # Sum of the peaks (VmHWM) of every process the system ran to consume.
    peak_rss_kb: int
    # What the database server did meanwhile; None: the system has none.
    database: DatabaseWork | None = None

    @property
    def wal_bytes_per_message(self) -> float | None:
        return None if self.database is None else self.database.wal_bytes / self.messages

    @property
    def database_cpu_us_per_message(self) -> float | None:
        if self.database is None or self.database.cpu_seconds is None:
            return None
        return self.database.cpu_seconds / self.messages * 1e6


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


def parse_args(argv: Sequence[str] | None) -> Options:
    slow = {
        "batch1_messages": DEFAULT_BATCH1_MESSAGES,
        "procrastinate_messages": DEFAULT_PROCRASTINATE_MESSAGES,
        "celery_redis_messages": DEFAULT_CELERY_REDIS_MESSAGES,
    }
    args = harness.parser(
        __doc__,
        messages=harness.messages(100_000, "per run (default 100000)"),
        batches=(harness.batch_list, (100, 10, 1), "default 100,10,1"),
        systems=(system_list, tuple(SYSTEMS), f"comma list, default {','.join(SYSTEMS)}"),
        batch1_messages=(
            harness.positive_int,
            None,
            f"messages at batch 1 (default {DEFAULT_BATCH1_MESSAGES} or N if fewer)",
        ),
        procrastinate_messages=(
            harness.positive_int,
            None,
            f"default {DEFAULT_PROCRASTINATE_MESSAGES} or N if fewer",
        ),
        celery_redis_messages=(
            harness.positive_int,
            None,
            f"default {DEFAULT_CELERY_REDIS_MESSAGES} or N if fewer",
        ),
    ).parse_args(argv)
    for name, default in slow.items():
        setattr(args, name, getattr(args, name) or min(default, args.messages))
    return Options(**vars(args))


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


def run_pgbench(bench_url: str) -> float:
    """``pgbench -N`` TPS on its own scratch database, dropped afterwards."""
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
        command += ["-j", str(PGBENCH_CLIENTS), "-T", str(PGBENCH_SECONDS)]
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


def settle(ctx: Context, what: str, relation: str) -> None:
    """After the preload, before the clock: VACUUM ANALYZE, then a CHECKPOINT
    so that no run pays for flushing its own preload. Fails when ``relation``,
    where the system keeps its messages, is unlogged: every system must write
    them as durably as the others."""
    harness.close_django()
    with psycopg.connect(ctx.bench_url, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        try:
            conn.execute("CHECKPOINT")
        except psycopg.Error as error:
            harness.log(f"CHECKPOINT skipped: {error}")
        unlogged = [row[0] for row in conn.execute(UNLOGGED_SQL, {"table": relation}).fetchall()]
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


@dataclass
class DatabaseWork:
    """What the database server did while a system drained: the WAL the
    cluster wrote and the CPU time of all its processes (backends,
    checkpointer, WAL writer, autovacuum); None when it is not on this
    machine."""

    wal_bytes: int = 0
    cpu_seconds: float | None = None


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


def tree_peak_rss_kb(pid: int) -> int:
    """Sum of the peak RSS of ``pid`` and every process under it."""
    return sum(peak_rss_kb(each) for each in process_tree(pid))


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
    ctx: Context, name: str, command: list[str], env: dict[str, str] | None = None
) -> Iterator[list[Worker]]:
    """WORKERS processes of ``command``, each with its stdin a pipe and its
    output in the run's directory; killed (their groups) on the way out."""
    workers: list[Worker] = []
    try:
        for index in range(WORKERS):
            out = ctx.directory / f"{name}-{index}.out"
            err = ctx.directory / f"{name}-{index}.err"
            with out.open("wb") as out_file, err.open("wb") as err_file:
                process = subprocess.Popen(
                    command,
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
    # Their summed peak RSS.
    peak_rss_kb: int
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
        with database_work(conn) as database:
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
    rss = sum(int(report["peak_rss_kb"]) for report in reports)
    return Drained(max(last) - min(first), rss, fetches, acked, database)


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
    peak_rss_kb: int
    check: BatchCheck | None = None
    database: DatabaseWork | None = None


def run_lazaretto(ctx: Context, batch: int | None, count: int) -> Measured:
    """bench.deliver's Celery path: the queue preloaded paused, the Celery
    processes started, the queue unpaused, clocked from the first claim to
    DLVD = N."""
    assert batch is not None
    assert ctx.deliver is not None
    assert ctx.redis is not None
    fresh_database(ctx, template=ctx.template)
    queue = _celery.make_queue(
        f"BENCH.PEERS.LAZARETTO.{batch}", consumer="noop", batch_size=batch, size=SIZE, paused=True
    )
    harness.log(f"lazaretto {batch}: publishing {count} messages to {queue.name}")
    _celery.publish_messages(queue, _celery.new_message(ctx.payload), count)
    _celery.flush_redis(ctx.redis)
    settle(ctx, f"lazaretto {batch}", MESSAGE_TABLES["lazaretto"])
    with (
        tempfile.TemporaryDirectory(prefix="bench-peers-", dir=ctx.directory) as directory,
        psycopg.connect(ctx.bench_url, autocommit=True) as conn,
        _celery.celery_processes(ctx.deliver, Path(directory)) as workers,
    ):
        with database_work(conn) as database:
            seconds, _ = _celery.drain_paused_queue(conn, workers, queue, count)
        peaks = {name: tree_peak_rss_kb(process.pid) for name, process in workers.processes.items()}
    _celery.verify_delivered(queue, count, f"lazaretto {batch}")
    shown = ", ".join(f"{name} {kb / 1024:.0f}" for name, kb in peaks.items())
    harness.log(f"lazaretto {batch}: peak RSS MB of each process tree: {shown}")
    return Measured(seconds, sum(peaks.values()), database=database)


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
    return Measured(drained.seconds, drained.peak_rss_kb, check, drained.database)


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


# A peer's query for the messages it has left, and how many one fetch takes
# (None: the batch size).
PEER_RUNS = {
    "pgmq": ("SELECT count(*) FROM pgmq.q_bench", None),
    "pgqueuer": ("SELECT count(*) FROM pgqueuer", None),
    # Procrastinate has one setting: each fetch_job takes one job.
    "procrastinate": ("SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'", 1),
}


def run_peer(ctx: Context, batch: int | None, count: int, *, system: str) -> Measured:
    """A peer's run: fresh database, prepare, settle, its workers from
    var/peers-venv; fails unless none of its messages is left afterwards,
    the workers acknowledged ``count`` messages and the batch setting took
    effect."""
    assert ctx.peers_python is not None
    remaining_sql, fetch_size = PEER_RUNS[system]
    module = f"bench._peer_{system}"
    where = system if batch is None else f"{system} {batch}"
    fresh_database(ctx)
    prepare_peer(ctx, module, count)
    settle(ctx, where, MESSAGE_TABLES[system])
    command = [str(ctx.peers_python), "-m", module, "work", "--url", ctx.bench_url]
    command += ["--batch", str(batch or 1)]
    drained = drain_with_workers(ctx, where.replace(" ", "-"), command)
    with psycopg.connect(ctx.bench_url, autocommit=True) as conn:
        row = conn.execute(remaining_sql).fetchone()
    remaining = row[0] if row else None
    if drained.acked != count or remaining != 0:
        raise harness.BenchError(
            f"{where}: {drained.acked} of {count} messages acknowledged, "
            f"{remaining} left in the queue"
        )
    harness.log(f"{where}: {count} messages in {drained.seconds:.2f}s, none left")
    check = check_batches(system, batch, fetch_size or batch or 1, count, drained.fetches)
    return Measured(drained.seconds, drained.peak_rss_kb, check, drained.database)


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
            seconds = time_celery_drain(client, count, worker)
            stats: dict[str, Any] = app.control.inspect(destination=[node], timeout=5).stats() or {}
            rss = tree_peak_rss_kb(process.pid)
        finally:
            stop(process)
    finally:
        client.close()
    executed = int(stats.get(node, {}).get("total", {}).get(TASK, 0))
    if executed != count:
        raise harness.BenchError(f"celery-redis: the worker ran {executed} tasks, not {count}")
    harness.log(f"celery-redis: {count} tasks in {seconds:.2f}s, each run once")
    return Measured(seconds, rss)


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
    "lazaretto": run_lazaretto,
    "bare": run_bare,
    **{system: partial(run_peer, system=system) for system in PEER_RUNS},
    "celery-redis": run_celery_redis,
}


# --- ratios and targets ----------------------------------------------------------------


def find(results: Sequence[Result], system: str, batch: int | None) -> Result | None:
    return next((r for r in results if (r.system, r.batch) == (system, batch)), None)


def ratio_to_lazaretto(result: Result, results: Sequence[Result]) -> float | None:
    """The result's msgs/s over Lazaretto's at the same batch (at
    REFERENCE_BATCH for a system without a batch setting)."""
    batch = REFERENCE_BATCH if result.batch is None else result.batch
    lazaretto = find(results, "lazaretto", batch)
    return None if lazaretto is None else result.rate / lazaretto.rate


def target_ratio(target: Target, results: Sequence[Result]) -> float | None:
    """Lazaretto's msgs/s over the peer's; None unless both ran."""
    peer = find(results, target.peer, target.batch)
    lazaretto = find(results, "lazaretto", target.batch or REFERENCE_BATCH)
    if peer is None or lazaretto is None:
        return None
    return lazaretto.rate / peer.rate


def verdict(ratio: float | None, minimum: float) -> str:
    if ratio is None:
        return "n/a"
    return "PASS" if ratio >= minimum else "MISS"


def targets_summary(results: Sequence[Result]) -> dict[str, dict[str, Any]]:
    summary = {}
    for target in TARGETS:
        ratio = target_ratio(target, results)
        summary[target.key] = {
            "peer": target.peer,
            "batch": target.batch,
            "lazaretto_batch": target.batch or REFERENCE_BATCH,
            "minimum": target.minimum,
            "ratio": None if ratio is None else round(ratio, 3),
            "verdict": verdict(ratio, target.minimum),
        }
    return summary


# --- driver and report --------------------------------------------------------------------


def result_row(result: Result, results: Sequence[Result]) -> dict[str, Any]:
    ratio = ratio_to_lazaretto(result, results)
    wal, cpu = result.wal_bytes_per_message, result.database_cpu_us_per_message
    return {
        "system": result.system,
        "batch": result.batch,
        "messages": result.messages,
        "seconds": round(result.seconds, 3),
        "msgs_per_s": round(result.rate, 1),
        "ratio_to_lazaretto": None if ratio is None else round(ratio, 3),
        "peak_rss_mb": round(result.peak_rss_kb / 1024, 1),
        "wal_bytes_per_msg": None if wal is None else round(wal),
        "database_cpu_us_per_msg": None if cpu is None else round(cpu, 1),
    }


def summary_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    """The JSON's "results": one row per run, with its ratio to Lazaretto."""
    return [result_row(result, results) for result in results]


def summary(
    options: Options,
    tps: float,
    results: Sequence[Result],
    checks: Sequence[BatchCheck],
    seconds: float,
) -> dict[str, Any]:
    return {
        "bench": "peers",
        "messages": options.messages,
        "batches": list(options.batches),
        "systems": list(options.systems),
        "batch1_messages": options.batch1_messages,
        "procrastinate_messages": options.procrastinate_messages,
        "celery_redis_messages": options.celery_redis_messages,
        "payload_bytes": SIZE,
        "workers": WORKERS,
        "pgbench_tps": round(tps, 1),
        "pgbench": {
            "mode": "-N",
            "scale": PGBENCH_SCALE,
            "clients": PGBENCH_CLIENTS,
            "seconds": PGBENCH_SECONDS,
        },
        "results": summary_rows(results),
        "batch_checks": [
            {
                "system": check.system,
                "batch": check.batch,
                "expected_size": check.expected_size,
                "fetches_by_size": {str(size): count for size, count in check.fetches.items()},
            }
            for check in checks
        ],
        "targets": targets_summary(results),
        "clock": (
            "lazaretto: first claim (TBDL counter drops) to DLVD = N; celery-redis: first "
            "drop of the Redis queue to queue and unacked both empty; the others: first fetch "
            "of any worker to the last acknowledgement of any, on the workers' clocks"
        ),
        "total_s": round(seconds, 1),
    }


def print_table(options: Options, tps: float, results: Sequence[Result]) -> None:
    print(
        f"peers bench: {SIZE}-byte messages, a no-op consumer, {WORKERS} worker processes per "
        "system, one system at a time, a fresh database per run (VACUUM ANALYZE after the preload)"
    )
    print(
        f"pgbench -N: {tps:,.0f} tps (scale {PGBENCH_SCALE}, {PGBENCH_CLIENTS} clients, "
        f"{PGBENCH_SECONDS} s); 'x tps' is msgs/s over it"
    )
    for name in options.systems:
        print(f"  {name:<14} {SYSTEMS[name].label}")
    batched = any(SYSTEMS[name].batched for name in options.systems) and 1 in options.batches
    notes = [
        f"{what} drains {count} (--{what.replace(' ', '')}-messages)"
        for what, count, applies in (
            ("batch 1", options.batch1_messages, batched),
            ("procrastinate", options.procrastinate_messages, "procrastinate" in options.systems),
            ("celery-redis", options.celery_redis_messages, "celery-redis" in options.systems),
        )
        if applies and count != options.messages
    ]
    if notes:
        print(f"messages: {options.messages} per run, but " + "; ".join(notes))
    print()
    header = ["system", "batch", "messages", "seconds", "msgs/s", "x tps", "vs lazaretto"]
    header += ["peak RSS MB", "WAL B/msg", "DB CPU us/msg"]
    harness.table(header, [result_cells(result, results, tps) for result in results])


def result_cells(result: Result, results: Sequence[Result], tps: float) -> list[str]:
    ratio = ratio_to_lazaretto(result, results)
    versus = "-" if ratio is None else f"{ratio:.2f}"
    if ratio is not None and result.batch is None:
        versus += f" (@{REFERENCE_BATCH})"
    wal, cpu = result.wal_bytes_per_message, result.database_cpu_us_per_message
    return [
        result.system,
        "-" if result.batch is None else str(result.batch),
        str(result.messages),
        f"{result.seconds:.2f}",
        f"{result.rate:.0f}",
        f"{result.rate / tps:.2f}",
        versus,
        f"{result.peak_rss_kb / 1024:.1f}",
        "-" if wal is None else f"{wal:.0f}",
        "-" if cpu is None else f"{cpu:.1f}",
    ]


def print_targets(results: Sequence[Result]) -> None:
    print()
    print("targets: Lazaretto's msgs/s over the peer's")
    for target in TARGETS:
        ratio = target_ratio(target, results)
        where = f"batch {target.batch}" if target.batch else f"Lazaretto batch {REFERENCE_BATCH}"
        shown = "-" if ratio is None else f"{ratio:.2f}"
        print(
            f"  lazaretto / {target.peer:<14} {where:<22} {shown:>7}  "
            f">= {target.minimum:g} {verdict(ratio, target.minimum)}"
        )


@contextmanager
def shared_redis(ctx: Context, directory: Path) -> Iterator[RedisServer | None]:
    """One private redis-server for Lazaretto's wake-ups and Celery alone;
    this process's Celery app sends to it (bench._celery's private_redis) when
    Django is set up."""
    if not {"lazaretto", "celery-redis"} & set(ctx.options.systems):
        yield None
        return
    with _celery.private_redis(directory, wake_ups=ctx.options.needs_django) as server:
        yield server


def run_all(ctx: Context) -> tuple[list[Result], list[BatchCheck]]:
    results: list[Result] = []
    checks: list[BatchCheck] = []
    with ExitStack() as stack:
        if ctx.options.needs_django:
            ctx.template = make_template(ctx)
            stack.callback(harness.drop_database, ctx.maintenance_url, ctx.template)
        ctx.redis = stack.enter_context(shared_redis(ctx, ctx.directory / "redis"))
        if ctx.redis is not None and "lazaretto" in ctx.options.systems:
            ctx.deliver = _celery.Bench(
                ctx.bench_url, ctx.redis, ctx.payload, concurrency=WORKERS, size=SIZE
            )
        for system, batch, count in ctx.options.plan():
            where = system if batch is None else f"{system} batch {batch}"
            harness.log(f"== {where}: {count} messages")
            measured = RUNNERS[system](ctx, batch, count)
            results.append(
                Result(
                    system, batch, count, measured.seconds, measured.peak_rss_kb, measured.database
                )
            )
            if measured.check is not None:
                checks.append(measured.check)
            harness.log(f"{where}: {count / measured.seconds:.0f} msgs/s")
    return results, checks


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
        tps = run_pgbench(bench_url)
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
            results, checks = run_all(ctx)
        print_table(options, tps, results)
        print_targets(results)
        seconds = harness.since(started)
        print(f"total {seconds:.0f} s")
        figures = summary(options, tps, results, checks, seconds)
        path = harness.keep_run("peers", figures, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
        harness.log(f"figures written to {path.relative_to(harness.ROOT)}")
        harness.print_figures(figures)

    return harness.run_bench(measure)


if __name__ == "__main__":
    sys.exit(main())
