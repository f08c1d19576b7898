"""The driver started ahead of its job (LAZARETTO_SPARK_STANDBY): a launch
runs its job on it and readies the next, one started in another
environment is stopped instead of used, and a pipeline worker has one
ready from its start."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.models import ReplayJob, ReplayJobStatus
from broker.pipeline.replay import replay_job_submit
from broker.pipeline.selection import ReplaySpec
from broker.services.queues import queue_create
from rig.processes import Workers, wait_until
from tests.conftest import SPARK_TEST_SETTINGS
from tests.support.messages import dead_lettered
from tests.support.replay import copies_per_source
from workers.pipeline import STANDBY, replay_job_launch

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("spark_env")]

STANDBY_COMMAND = ["-m", "workers.spark", "standby"]


def submit() -> ReplayJob:
    """A replay job of the dead letters that writes 20 a second: running
    long enough to be seen running, its driver named."""
    return replay_job_submit(
        spec=ReplaySpec(source="dead_letter", source_queue="SYSTEM.DEAD.LETTER.QUEUE", velocity=20),
        actor=None,
    )


def launched(job: ReplayJob) -> tuple[ReplayJob, set[int | None]]:
    """``job`` run by this process's launcher, and the drivers seen running it."""
    drivers: set[int | None] = set()
    ended = replay_job_launch(job.id, watch=lambda running: drivers.add(running.driver_pid))
    return ended, drivers - {None}


def command(pid: int) -> list[str]:
    """A process's command line; empty once it is gone (or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[1:-1]
    except OSError:
        return []


def wait_for_standby(pid: int) -> None:
    """Until process ``pid`` runs a standby driver (right after its fork it
    is still a copy of this one)."""
    wait_until(lambda: command(pid) == STANDBY_COMMAND, timeout=10, what=f"a standby as {pid}")


def descendants(pid: int) -> list[int]:
    children = [
        int(child)
        for path in Path(f"/proc/{pid}/task").glob("*/children")
        for child in path.read_text().split()
    ]
    return children + [grandchild for child in children for grandchild in descendants(child)]


def test_a_launch_runs_its_job_on_the_driver_started_ahead_and_readies_the_next(
    settings: Any,
) -> None:
    settings.LAZARETTO_SPARK_STANDBY = True
    sources = dead_lettered(queue_create(name="ORDERS.IN", consumer=""), 50)
    STANDBY.start()
    ahead = STANDBY.pid
    assert ahead is not None
    wait_for_standby(ahead)
    # At LAZARETTO_SPARK_NICENESS (the suite's), from its start.
    niceness = int(SPARK_TEST_SETTINGS["LAZARETTO_SPARK_NICENESS"])
    wait_until(
        lambda: os.getpriority(os.PRIO_PROCESS, ahead) == niceness, timeout=30, what="niceness"
    )

    job, drivers = launched(submit())

    assert (job.status, job.written, drivers) == (ReplayJobStatus.DONE, 50, {ahead}), job.error
    assert copies_per_source(job) == Counter(dict.fromkeys(sources, 1))
    assert command(ahead) == []
    following = STANDBY.pid
    assert following is not None
    assert following != ahead
    wait_for_standby(following)


def test_a_driver_started_in_another_environment_is_stopped_not_used(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver reads its settings from its environment: one started
    before a setting changed would run the job on the old one."""
    settings.LAZARETTO_SPARK_STANDBY = True
    dead_lettered(queue_create(name="ORDERS.IN", consumer=""), 30)
    STANDBY.start()
    stale = STANDBY.pid
    assert stale is not None
    monkeypatch.setenv("LAZARETTO_SPARK_PARTITIONS", "1")

    job, drivers = launched(submit())

    assert (job.status, job.written) == (ReplayJobStatus.DONE, 30), job.error
    assert len(drivers) == 1
    assert stale not in drivers
    assert command(stale) == []


def test_a_pipeline_worker_has_a_driver_ready_for_its_first_job(
    start_workers: Callable[..., Workers],
) -> None:
    dead_lettered(queue_create(name="ORDERS.IN", consumer=""), 30)
    workers = start_workers(pipeline=True, LAZARETTO_SPARK_STANDBY="1")

    def standby() -> int | None:
        tree = descendants(workers.processes["pipeline"].pid)
        return next((pid for pid in tree if command(pid)[-3:] == STANDBY_COMMAND), None)

    ahead = wait_until(standby, timeout=60, what="the pipeline worker's standby driver")
    job = submit()
    running = wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, written__gt=0).first(),
        timeout=120,
        what=f"the job's first copies; pipeline log:\n{workers.log('pipeline')[-3000:]}",
    )
    assert running.driver_pid == ahead
    done = wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, status=ReplayJobStatus.DONE).first(),
        timeout=120,
        what="the job's end",
    )
    assert done.written == 30
