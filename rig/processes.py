"""Real processes for delivery tests and benches: a private redis-server and Celery
delivery workers, a control worker and beat, all on the test database.

Each test gets its own Redis (so it may stop it) and its own worker
processes (so it may kill them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str | Callable[[], str] = "",
) -> T:
    """Poll ``condition`` until it returns something truthy; return that.
    ``what`` names it in the error, or makes the name then (a process's log
    as it is at the time)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            named = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {named or condition}")
        time.sleep(interval)


def database_url_for_workers() -> str:
    """The URL of the database pytest-django made for this test run."""
    db = connection.settings_dict
    return (
        f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}"
    )


def _stop(process: subprocess.Popen[bytes], timeout: float = 10) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=timeout)


def process_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (the state
    first); empty once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def cpu_seconds(pid: int) -> float:
    """The processor time process ``pid`` (all its threads) has used."""
    fields = process_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@dataclass
class RedisServer:
    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is missing: scripts/services.sh installs it"
        self.process = subprocess.Popen(
            [
                *(binary, "--bind", self.host, "--port", str(self.port)),
                *("--protected-mode", "no"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.directory)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self._answers, timeout=10, what="redis to answer")

    def _answers(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)
            self.process = None


@dataclass
class SparkConnectServer:
    """A Spark Connect server (python -m workers.spark.connect_server serve)
    on a port of its own, its output in ``directory``; ``extra_env`` is
    added to this process's environment (the server's Spark settings)."""

    directory: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.directory / f"spark-connect-{self.port}.log"

    def start(self, timeout: float = 180) -> None:
        """Start it and wait until it takes connections."""
        from workers.spark.connect_server import answering

        command = [sys.executable, "-m", "workers.spark.connect_server", "serve"]
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [*command, "--port", str(self.port), "--scratch", str(self.directory / "scratch")],
                cwd=ROOT,
                env={**os.environ, **self.extra_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = self.process
        wait_until(
            lambda: answering(self.url) or process.poll() is not None,
            timeout=timeout,
            what=f"the Spark Connect server at {self.url}",
        )
        assert process.poll() is None, f"the Spark Connect server exited:\n{self.log()[-3000:]}"

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def kill(self) -> None:
        """SIGKILL, the whole process group: the JVM and its Python workers."""
        if self.process is not None:
            _stop(self.process, timeout=30)
            self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=20)
        self.kill()


@dataclass
class Workers:
    """Celery processes: delivery workers and a control worker, which runs
    beat beside its pool (``-B``, in a process forked from it: one Django
    start-up fewer for every set of workers a test starts; the schedule and
    the scheduler are the same)."""

    directory: Path
    broker_url: str
    concurrency: int = 2
    extra_env: dict[str, str] = field(default_factory=dict)
    # Also a worker on the pipeline queue (the Spark jobs).
    pipeline: bool = False
    # Beat sends the scheduled duties; without it a broker node does.
    beat: bool = True
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def record_file(self) -> Path:
        return self.directory / "deliveries.jsonl"

    @property
    def dump_dir(self) -> Path:
        return self.directory / "dumps"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": database_url_for_workers(),
            "CELERY_BROKER_URL": self.broker_url,
            "DEBUG": "1",
            "DUMP_DIR": str(self.dump_dir),
            "LAZARETTO_CONSUMER_MODULES": "demo_consumers",
            "LAZARETTO_DEMO_RECORD": str(self.record_file),
            "LAZARETTO_SWEEP_INTERVAL_SECONDS": "0.25",
            "LAZARETTO_DISPATCH_INTERVAL_SECONDS": "0.25",
            # Django's system checks, which each worker runs at start-up
            # (a third of it), check settings the suite checks once
            # (tests/test_deploy_check.py).
            "CELERY_SKIP_CHECKS": "1",
            **self.extra_env,
        }

    def start(self) -> None:
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        celery = [sys.executable, "-m", "celery", "-A", "workers"]
        quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info"]
        # Each test has its own Redis, so fixed node names cannot collide.
        self._spawn(
            "deliveries",
            [*celery, "worker", "-Q", "deliveries", "-c", str(self.concurrency), *quiet],
        )
        beat = ["-B", "--schedule", str(self.directory / "beat")] if self.beat else []
        self._spawn(
            "control",
            [*celery, "worker", "-Q", "control", "-c", "2", "-n", "control@%h", *beat, *quiet],
        )
        signs = [("deliveries", "ready."), ("control", "ready.")]
        if self.beat:
            signs.append(("control", "Sending due"))
        if self.pipeline:
            self._spawn(
                "pipeline",
                [*celery, "worker", "-Q", "pipeline", "-c", "1", "-n", "pipeline@%h", *quiet],
            )
            signs.append(("pipeline", "ready."))
        for name, sign in signs:
            wait_until(partial(self._logged, name, sign), timeout=60, what=f"{name} to start")

    def _logged(self, name: str, text: str) -> bool:
        return text in self.log(name)

    def _spawn(self, name: str, command: list[str]) -> None:
        with (self.directory / f"{name}.log").open("wb") as log:
            self.processes[name] = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def delivery_processes(self) -> list[int]:
        """The prefork pool's child processes, which run the deliveries."""
        parent = self.processes["deliveries"].pid
        pids = []
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            pids += [int(pid) for pid in children.read_text().split()]
        return [pid for pid in pids if _alive(pid)]

    def records(self) -> list[dict[str, Any]]:
        """Every delivery the demo handler saw, in order."""
        if not self.record_file.exists():
            return []
        return [json.loads(line) for line in self.record_file.read_text().splitlines() if line]

    def stop(self) -> None:
        for process in self.processes.values():
            _stop(process)
        self.processes.clear()


# A query that keeps a local Spark busy on every core for seconds at a time.
SPARK_LOAD_QUERY = "SELECT sum(id * id % 7) FROM range(0, 400000000, 1, 8)"
SPARK_CONNECT_MODE_VARIABLES = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


@contextlib.contextmanager
def spark_kept_busy(url: str) -> Iterator[Callable[[], int]]:
    """The Spark Connect server at ``url`` running SPARK_LOAD_QUERY again
    and again, from a client thread, from when its session is up until the
    block ends (the query running then is interrupted); yields how many
    queries it has finished so far. pyspark leaves a process that made a
    remote session in Connect mode (its environment says so): the block
    puts those variables back, so that a classic session can follow."""
    from pyspark.sql import SparkSession

    environment = {name: os.environ.get(name) for name in SPARK_CONNECT_MODE_VARIABLES}
    stop = threading.Event()
    spark = SparkSession.builder.remote(url).create()
    finished = 0

    def load() -> None:
        nonlocal finished
        while not stop.is_set():
            try:
                spark.sql(SPARK_LOAD_QUERY).collect()
            except Exception:
                if stop.is_set():  # interrupted as the block ended
                    return
                raise
            finished += 1

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        yield lambda: finished
    finally:
        stop.set()
        spark.interruptAll()
        thread.join(timeout=60)
        spark.stop()
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def point_celery_at(broker_url: str) -> None:
    """Make this (test) process send its wake-ups to ``broker_url``."""
    from workers.celery import app

    # broker_url itself yields to a CELERY_BROKER_URL environment variable;
    # the write URL (used for sending) does not.
    app.conf.broker_write_url = broker_url
    # Celery caches its connection pools; drop them so the new URL is used.
    app._pool = None  # type: ignore[attr-defined]
    app.amqp._producer_pool = None  # type: ignore[attr-defined]
