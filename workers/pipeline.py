"""Launching the Spark jobs (workers.spark) and watching them.

Each job runs in a driver process of its own (``python -m workers.spark``),
so a worker never loads the JVM, a cancel stops the driver outright, and a
killed driver takes nothing down with it. Whatever a driver dies in the
middle of, the state stays consistent: every write is one transaction, and
a replay job run again writes only what is missing. A launch takes the
driver started ahead of it (``Standby``) when there is one.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from django.conf import settings
from django.db.models import Max, Sum

from broker.models import ArchiveChunk, ReplayJob, ReplayJobStatus
from broker.pipeline.replay import replay_run_finish

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
# The Celery queue of the Spark jobs (CELERY_TASK_ROUTES).
PIPELINE_QUEUE = "pipeline"
POLL_SECONDS = 0.5
# A driver asked to stop gets this long to do so before it is killed.
STOP_GRACE_SECONDS = 10.0


def spark_choice() -> str:
    """Where the drivers run their jobs, as the pipeline worker says at
    start-up: SPARK_REMOTE wins over SPARK_MASTER when both are set."""
    master = os.environ.get("SPARK_MASTER")
    if settings.SPARK_REMOTE:
        said = (
            f"Spark jobs run on the Spark Connect server at {settings.SPARK_REMOTE} (SPARK_REMOTE)"
        )
        if master:
            said += f"; SPARK_MASTER={master} is ignored (SPARK_REMOTE wins)"
        return said
    return f"Spark jobs run a driver of their own on SPARK_MASTER={settings.SPARK_MASTER}"


def driver_command(kind: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "workers.spark", kind, *args]


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the driver's process group (the JVM with it), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _start(*arguments: str, stdin: int | None = None) -> subprocess.Popen[bytes]:
    # A process group of its own: stopping the driver stops its JVM too.
    command = driver_command(*arguments)  # our own module, ids only
    return subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdin=stdin)  # noqa: S603


class Standby:
    """A driver started before its job is known (``python -m workers.spark
    standby``): the interpreter, Django and the Spark client loaded, it waits
    on its standard input for the job's arguments, and exits when that input
    closes (as it does when this process dies). ``take`` hands it a job when
    it was started in the environment a new driver would get now, the one it
    reads its settings from; ``start`` readies the next (each launch does,
    and the pipeline worker at start-up). LAZARETTO_SPARK_STANDBY: off, every
    driver starts with its job."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._environment: dict[str, str] = {}

    @property
    def pid(self) -> int | None:
        """The waiting driver's process id, if one waits."""
        return self._process.pid if self._ready() and self._process else None

    def start(self) -> None:
        """Have a driver wait for the next job, unless one already does."""
        if not settings.LAZARETTO_SPARK_STANDBY or self._ready():
            return
        self.discard()
        self._process = _start("standby", stdin=subprocess.PIPE)
        self._environment = dict(os.environ)

    def take(self, *arguments: str) -> subprocess.Popen[bytes] | None:
        """The waiting driver, running the job ``arguments`` name, if it is
        ready for it; else None, and it is gone."""
        process, self._process = self._process, None
        if process is None or process.stdin is None or not self._fits(process):
            _discard(process)
            return None
        try:
            process.stdin.write(" ".join(arguments).encode() + b"\n")
            process.stdin.close()
        except BrokenPipeError:  # it died just now
            process.wait()
            return None
        return process

    def discard(self) -> None:
        """Stop the waiting driver, if any."""
        process, self._process = self._process, None
        _discard(process)

    def _ready(self) -> bool:
        return self._process is not None and self._fits(self._process)

    def _fits(self, process: subprocess.Popen[bytes]) -> bool:
        """Alive, and started in the environment a driver would get now."""
        return process.poll() is None and self._environment == dict(os.environ)


def _discard(process: subprocess.Popen[bytes] | None) -> None:
    """Stop a driver that has done nothing yet."""
    if process is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


STANDBY = Standby()
atexit.register(STANDBY.discard)


@contextlib.contextmanager
def _driver(kind: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """The job's driver: the standby, or one started now. The next standby
    starts once the job is over, not beside it on the cores it runs on."""
    try:
        yield STANDBY.take(kind, *args) or _start(kind, *args)
    finally:
        STANDBY.start()


def _exit_text(code: int) -> str:
    if code < 0:
        return f"the Spark driver was killed by signal {signal.Signals(-code).name}"
    return f"the Spark driver exited with status {code}"


def replay_job_launch(
    job_id: int, *, watch: Callable[[ReplayJob], None] | None = None
) -> ReplayJob:
    """Run a queued replay job's driver to its end; stop it when a cancel
    is asked for. ``watch`` sees the job as it stands at every poll.
    Returns the job as it ended."""
    cancelled = False
    with _driver("replay", str(job_id)) as process:
        while process.poll() is None:
            time.sleep(POLL_SECONDS)
            job = ReplayJob.objects.get(id=job_id)
            if watch is not None:
                watch(job)
            if not cancelled and job.cancel_requested:
                logger.info("replay job %s: cancel asked for; stopping the Spark driver", job_id)
                cancelled = True
                _stop(process)
    job = ReplayJob.objects.get(id=job_id)
    if job.status == ReplayJobStatus.RUNNING and job.driver_pid == process.pid:
        # Our driver did not close its run: it was stopped or it died.
        if cancelled:
            return replay_run_finish(job_id=job_id, status=ReplayJobStatus.CANCELLED)
        error = _exit_text(process.returncode or 0)
        logger.warning("replay job %s: %s", job_id, error)
        return replay_run_finish(job_id=job_id, status=ReplayJobStatus.FAILED, error=error)
    return job


def archive_launch(*, watch: Callable[[int], None] | None = None) -> int:
    """Run the archive's driver to its end; ``watch`` sees at every poll how
    many messages this run has archived so far (the rows of the chunks it
    recorded). Returns the driver's exit status."""
    before = ArchiveChunk.objects.aggregate(last=Max("id"))["last"] or 0
    with _driver("archive") as process:
        while process.poll() is None:
            time.sleep(POLL_SECONDS)
            if watch is not None:
                archived = ArchiveChunk.objects.filter(id__gt=before).aggregate(rows=Sum("rows"))
                watch(archived["rows"] or 0)
    return process.returncode
