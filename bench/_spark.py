"""What the Spark benches (bench.replay, bench.archive) share: the driver's
environment and settings, its stdout kept off the bench's, the VACUUM
between ways, a Spark Connect server of the bench's own, and a Sampler that
watches the bench database while a driver runs."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench._harness import PRODUCTION_ENV, BenchError, Option, log, positive_int, since

# --partitions of the benches that launch a Spark driver.
PARTITIONS: Option = (positive_int, None, "LAZARETTO_SPARK_PARTITIONS for the driver")

# The Spark driver runs as in production: DEBUG off (no query log), so it needs a key.
DRIVER_ENV = PRODUCTION_ENV
# pgjdbc's default application_name: how the Spark executors' connections show.
JDBC_APPLICATION = "PostgreSQL JDBC Driver"
# The watcher polls fast until the Spark session is up, then samples what
# the database is doing this often.
READY_POLL_SECONDS = 0.01
SAMPLE_SECONDS = 0.1
# A statement of the driver active this long is logged as it happens.
SLOW_STATEMENT_SECONDS = 60.0
# How long the bench's Spark Connect server may take to answer.
CONNECT_START_SECONDS = 300.0
VACUUM_SQL = (
    "VACUUM ANALYZE broker_message, broker_replayjob,"
    " broker_replaystage, broker_queuedepth, broker_queuedepthdelta"
)
# What the other backends of the bench database are busy with.
ACTIVITY_SQL = """
SELECT application_name, left(query, 60), extract(epoch FROM now() - query_start)::float8
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'
"""
FIRST_JDBC_SQL = """
SELECT min(backend_start) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = %s
"""


def spark_environment(bench_url: str, archive_dir: Path, **overrides: int | None) -> None:
    """What the Spark driver (a child process) reads from the environment;
    set before Django starts, so this process's settings say the same.
    ``overrides`` are settings (LAZARETTO_SPARK_PARTITIONS=4) a run asked
    for; None leaves the environment's value or the default."""
    os.environ["DATABASE_URL"] = bench_url
    os.environ["ARCHIVE_DIR"] = str(archive_dir)
    os.environ["SPARK_MASTER"] = os.environ.get("SPARK_MASTER") or "local[*]"
    for name, value in overrides.items():
        if value is not None:
            os.environ[name] = str(value)


def spark_config() -> dict[str, Any]:
    """The settings the driver runs with (it inherits this environment)."""
    from django.conf import settings

    from workers.spark import session

    return {
        "master": settings.SPARK_MASTER,
        "partitions": settings.LAZARETTO_SPARK_PARTITIONS,
        "slice_rows": settings.LAZARETTO_REPLAY_SLICE_ROWS,
        "archive_chunk_rows": settings.LAZARETTO_ARCHIVE_CHUNK_ROWS,
        "fetch_rows": session.FETCH_ROWS,
        "write_batch_rows": session.WRITE_BATCH_ROWS,
        "driver_memory": settings.LAZARETTO_SPARK_DRIVER_MEMORY,
        # A job's launch takes a driver started ahead of it; the classic
        # way's is cold all the same (it starts in another environment).
        "standby": settings.LAZARETTO_SPARK_STANDBY,
    }


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Whatever a child writes to stdout goes to stderr: the bench's stdout
    stays the table and the JSON line."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextmanager
def connect_server(directory: Path, timeout: float = CONNECT_START_SECONDS) -> Iterator[str]:
    """A Spark Connect server of this bench, started as `make run` starts
    one (``python -m workers.spark.connect_server serve --port P``) on a free
    loopback port, with this process's environment (the bench database's
    DATABASE_URL, SPARK_MASTER, the Spark settings) and its log in
    ``directory``; yields its SPARK_REMOTE URL and stops it (its whole
    process group) on the way out."""
    from rig.processes import SparkConnectServer

    server = SparkConnectServer(directory=directory)
    started = time.perf_counter()
    try:
        server.start(timeout=timeout)
    except AssertionError as error:
        server.stop()
        tail = server.log()[-2000:]
        raise BenchError(f"the Spark Connect server did not start: {error}\n{tail}") from None
    log(f"spark connect: server at {server.url} answered after {since(started):.1f}s")
    try:
        yield server.url
    finally:
        server.stop()
        log(f"spark connect: server at {server.url} stopped")


def vacuum(bench_url: str) -> None:
    with psycopg.connect(bench_url, autocommit=True) as conn:
        conn.execute(VACUUM_SQL)


# --- watching the database while a driver runs ----------------------------------------


class Sampler(threading.Thread):
    """Polls the bench database from a connection of its own while a Spark
    driver runs: the first JDBC connection (its backend_start), and every
    SAMPLE_SECONDS which kinds of statement are active (``classify`` names
    them), counted once per sample whatever the number of backends. The sum
    per kind is a sampled estimate of the wall time spent in it; the longest
    time one statement of a kind was seen active is kept too."""

    def __init__(self, bench_url: str, classify: Callable[[str, str], str | None]) -> None:
        super().__init__(daemon=True)
        self.bench_url = bench_url
        self.classify = classify
        self.stopping = threading.Event()
        self.samples: Counter[str] = Counter()
        self.longest: dict[str, float] = {}
        self.slow_logged: set[str] = set()
        self.first_jdbc: datetime | None = None
        self.error: BaseException | None = None
        self.interval = READY_POLL_SECONDS

    def poll(self, conn: psycopg.Connection[Any]) -> None:
        """Subclasses look at more here."""

    def run(self) -> None:
        try:
            with psycopg.connect(self.bench_url, autocommit=True) as conn:
                last = time.perf_counter()
                while not self.stopping.wait(self.interval):
                    self.poll(conn)
                    if self.first_jdbc is None:
                        row = conn.execute(FIRST_JDBC_SQL, [JDBC_APPLICATION]).fetchone()
                        self.first_jdbc = row[0] if row else None
                        if self.first_jdbc is not None:
                            self.interval = SAMPLE_SECONDS / 2
                    now = time.perf_counter()
                    if now - last >= SAMPLE_SECONDS:
                        last = now
                        kinds = set()
                        for application, query, active in conn.execute(ACTIVITY_SQL).fetchall():
                            kind = self.classify(application, query)
                            kinds.add(kind)
                            if kind is not None and active is not None:
                                self.active_for(kind, active)
                        for kind in kinds - {None}:
                            assert kind is not None
                            self.samples[kind] += 1
                        if not kinds - {None}:
                            self.samples["none"] += 1
        except BaseException as error:  # reported by stop()
            self.error = error

    def active_for(self, kind: str, seconds: float) -> None:
        self.longest[kind] = max(seconds, self.longest.get(kind, 0.0))
        if seconds >= SLOW_STATEMENT_SECONDS and kind not in self.slow_logged:
            self.slow_logged.add(kind)
            log(f"watch: one {kind} statement has been active for {seconds:.0f}s")

    def stop(self) -> dict[str, float]:
        """Stop polling; the sampled seconds per kind of statement."""
        self.stopping.set()
        self.join()
        if self.error is not None:
            raise BenchError(f"watching the database failed: {self.error}")
        return {kind: round(n * SAMPLE_SECONDS, 1) for kind, n in sorted(self.samples.items())}
