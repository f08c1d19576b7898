"""Launching the Spark jobs (workers.spark) and watching them.

Each job runs in a driver process of its own (``python -m workers.spark``),
so a worker never loads the JVM, a cancel stops the driver outright, and a
killed driver takes nothing down with it. Whatever a driver dies in the
middle of, the state stays consistent: every write is one transaction, and
a replay job run again writes only what is missing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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


def _spawn(kind: str, *args: str) -> subprocess.Popen[bytes]:
    # A process group of its own: stopping the driver stops its JVM too.
    command = driver_command(kind, *args)  # our own module, ids only
    return subprocess.Popen(command, cwd=ROOT, start_new_session=True)  # noqa: S603


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
    process = _spawn("replay", str(job_id))
    cancelled = False
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
    process = _spawn("archive")
    while process.poll() is None:
        time.sleep(POLL_SECONDS)
        if watch is not None:
            archived = ArchiveChunk.objects.filter(id__gt=before).aggregate(rows=Sum("rows"))
            watch(archived["rows"] or 0)
    return process.returncode
