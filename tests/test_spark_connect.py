"""Spark jobs as clients of a Spark Connect server (SPARK_REMOTE): a server
that is gone, killed midway or without PostgreSQL's JDBC driver fails the
job naming what to fix, and writes nothing twice once it runs again; a
client killed midway leaves nothing that a run again could write twice;
the pipeline worker says which of SPARK_REMOTE and SPARK_MASTER it uses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models import F

from broker.errors import ReplayJobBusy
from broker.models import Message, ReplayJob, ReplayJobStatus
from broker.pipeline.replay import (
    STALE_AFTER,
    replay_job_run_again,
    replay_job_submit,
    replay_stage_once,
    replay_write_staged,
)
from broker.pipeline.selection import ReplaySpec
from broker.services.queues import queue_create
from rig.processes import (
    ROOT,
    RedisServer,
    SparkConnectServer,
    Workers,
    database_url_for_workers,
    free_port,
    process_stat,
    wait_until,
)
from tests.conftest import SPARK_TEST_SETTINGS
from tests.support.messages import dead_lettered
from tests.support.replay import copies_per_source, launched_in_background
from workers.pipeline import replay_job_launch

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"

pytestmark = pytest.mark.slow


def submit(**values: Any) -> ReplayJob:
    return replay_job_submit(
        spec=ReplaySpec(source="dead_letter", source_queue=DLQ, **values), actor=None
    )


def on_orders() -> int:
    return Message.objects.filter(queue__name="ORDERS.IN").count()


def run_again(job: ReplayJob) -> ReplayJob:
    replay_job_run_again(job_id=job.id, actor=None)
    return replay_job_launch(job.id)


@pytest.mark.usefixtures("spark_env")
def test_a_server_killed_midway_fails_the_job_naming_it_and_a_run_once_it_is_back_completes_it(
    spark_connect_server: SparkConnectServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 3000)
    # Three ranges, a second's writing each: the server dies between two.
    monkeypatch.setenv("LAZARETTO_REPLAY_SLICE_ROWS", "1000")
    job = submit(velocity=1000)
    thread, ended = launched_in_background(job)
    wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, written__gt=0).exists(),
        timeout=120,
        what="the first copies",
    )
    spark_connect_server.kill()
    try:
        killed_at = time.monotonic()
        thread.join(timeout=90)
        failed = ended["job"]
        assert failed.status == ReplayJobStatus.FAILED
        assert f"the Spark Connect server at {spark_connect_server.url}" in failed.error
        assert time.monotonic() - killed_at < 45
        assert 0 < on_orders() < 3000

        # While it is down a run fails at once, naming it, and writes nothing.
        started = time.monotonic()
        down = run_again(job)
        assert down.status == ReplayJobStatus.FAILED
        assert down.error.startswith(
            f"SPARK_REMOTE: the Spark Connect server at {spark_connect_server.url} does not answer"
        )
        assert time.monotonic() - started < 30
        assert on_orders() == failed.written
    finally:
        # Back, on the same address, for this test and the session's others.
        spark_connect_server.start()

    again = run_again(job)
    assert again.status == ReplayJobStatus.DONE, again.error
    assert on_orders() == 3000
    assert copies_per_source(job) == Counter(dict.fromkeys(sources, 1))


@pytest.mark.usefixtures("spark_env")
def test_a_client_killed_while_it_stages_leaves_nothing_a_run_again_writes_twice() -> None:
    """The server goes on with a dead client's staging load for a while."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 5000)
    job = submit()
    thread, _ended = launched_in_background(job)

    def staging() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM broker_replaystage WHERE job_id = %s LIMIT 1", [job.id])
            return cursor.fetchone() is not None or on_orders() > 0

    wait_until(staging, timeout=120, interval=0.01, what="the first staged rows")
    driver = ReplayJob.objects.get(id=job.id).driver_pid
    assert driver is not None
    os.killpg(os.getpgid(driver), signal.SIGKILL)
    thread.join(timeout=60)
    killed = ReplayJob.objects.get(id=job.id)
    assert killed.status == ReplayJobStatus.FAILED

    again = run_again(job)
    assert again.status == ReplayJobStatus.DONE, again.error
    assert again.written + killed.written == 5000
    assert on_orders() == 5000
    assert copies_per_source(job) == Counter(dict.fromkeys(sources, 1))


@pytest.mark.usefixtures("spark_env")
def test_a_driver_stopped_while_it_stages_interrupts_the_servers_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM, as a cancel sends it, while the server loads the staging
    table: the server stops the load, which would otherwise commit its rows
    after the run has ended. The load is held at its first batch (of two) by
    a lock on the table until the driver has exited."""
    monkeypatch.setenv("LAZARETTO_SPARK_PARTITIONS", "1")
    orders = queue_create(name="ORDERS.IN", consumer="")
    dead_lettered(orders, 15_000)
    job = submit()
    database = connection.settings_dict["NAME"]

    def waiting(statement: str) -> bool:
        """Whether ``statement`` (its start) waits for a lock."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'"
                " AND query LIKE %s",
                [database, f"{statement}%"],
            )
            return cursor.fetchone() is not None

    thread, ended = launched_in_background(job)
    # Past the run's first step, which empties the job's staging rows.
    wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, total=15_000).exists(),
        timeout=120,
        interval=0.01,
        what="the job's total",
    )
    with psycopg.connect(database_url_for_workers()) as blocker:
        blocker.execute("LOCK TABLE broker_replaystage IN SHARE MODE")
        wait_until(
            partial(waiting, "INSERT INTO broker_replaystage"),
            timeout=120,
            what="the staging load",
        )
        driver = ReplayJob.objects.get(id=job.id).driver_pid
        assert driver is not None
        os.killpg(os.getpgid(driver), signal.SIGTERM)
        wait_until(lambda: not running(driver), timeout=30, what="the driver to exit")
        # The launcher closes the run, emptying the job's staging rows, in a
        # statement that starts once the lock is gone, as the load goes on.
        wait_until(
            partial(waiting, "DELETE FROM broker_replaystage"),
            timeout=30,
            what="the launcher's clearing",
        )
    thread.join(timeout=60)
    assert ended["job"].status == ReplayJobStatus.FAILED
    time.sleep(5)  # what the load would have committed by now, had it gone on

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM broker_replaystage WHERE job_id = %s", [job.id])
        assert cursor.fetchone() == (0,)
    assert on_orders() == 0


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def writing_through_a_pipeline_worker(
    start_workers: Callable[..., Workers],
) -> tuple[Workers, list[int], ReplayJob]:
    """A pipeline worker running a job over 3,000 dead letters, 1,000 a
    second, once it has written its first copies: the workers, the sources
    and the job as it stood then."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 3000)
    workers = start_workers(pipeline=True)
    job = submit(velocity=1000)
    writing = wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, written__gt=0).first(),
        timeout=120,
        what=f"the first copies; pipeline log:\n{workers.log('pipeline')[-3000:]}",
    )
    return workers, sources, writing


@pytest.mark.usefixtures("spark_env")
def test_a_pipeline_worker_killed_midway_leaves_its_driver_to_finish_the_job(
    start_workers: Callable[..., Workers],
) -> None:
    """The driver runs in a process group of its own: the worker's death is
    not its death, and it closes the job itself."""
    workers, sources, job = writing_through_a_pipeline_worker(start_workers)
    os.killpg(workers.processes["pipeline"].pid, signal.SIGKILL)
    assert job.written < 3000

    done = wait_until(
        lambda: ReplayJob.objects.filter(id=job.id).exclude(status=ReplayJobStatus.RUNNING).first(),
        timeout=120,
        what="the driver to close the job",
    )
    assert (done.status, done.written, done.runs) == (ReplayJobStatus.DONE, 3000, 1)
    assert copies_per_source(job) == Counter(dict.fromkeys(sources, 1))


@pytest.mark.usefixtures("spark_env")
def test_a_pipeline_worker_killed_with_its_driver_leaves_a_job_a_new_worker_completes(
    start_workers: Callable[..., Workers],
) -> None:
    """The whole machine lost midway: the job stays running, silent; once
    its heartbeat is older than a running driver's ever is, it can be run
    again, and the new run writes only what the dead one did not."""
    workers, sources, job = writing_through_a_pipeline_worker(start_workers)
    assert job.driver_pid is not None
    os.killpg(workers.processes["pipeline"].pid, signal.SIGKILL)
    os.killpg(os.getpgid(job.driver_pid), signal.SIGKILL)
    workers.stop()
    silent = ReplayJob.objects.get(id=job.id)
    assert silent.status == ReplayJobStatus.RUNNING
    assert 0 < silent.written < 3000
    with pytest.raises(ReplayJobBusy):
        replay_job_run_again(job_id=job.id, actor=None)

    # Time passes: the dead driver's last heartbeat is now stale.
    ReplayJob.objects.filter(id=job.id).update(
        heartbeat_at=F("heartbeat_at") - STALE_AFTER - timedelta(seconds=1)
    )
    start_workers(pipeline=True)
    replay_job_run_again(job_id=job.id, actor=None)
    again = wait_until(
        lambda: ReplayJob.objects.filter(id=job.id, runs=2, status=ReplayJobStatus.DONE).first(),
        timeout=120,
        what="the new worker to run the job again",
    )
    assert again.written + again.skipped == 3000
    assert again.skipped == silent.written
    assert on_orders() == 3000
    assert copies_per_source(job) == Counter(dict.fromkeys(sources, 1))


def test_a_run_again_writes_a_source_an_earlier_runs_load_staged_too_once(
    transactional_db: None,
) -> None:
    """What a late staging load of a dead run leaves beside a run's own rows."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 20)
    job = submit()
    ReplayJob.objects.filter(id=job.id).update(status=ReplayJobStatus.RUNNING, runs=2)
    with connection.cursor() as cursor:
        for _load in ("this run's", "the dead run's"):
            cursor.executemany(
                "INSERT INTO broker_replaystage (job_id, source_id, target, rule_number,"
                " keep_header) VALUES (%s, %s, 'ORDERS.IN', 0, true)",
                [(job.id, source) for source in sources],
            )
    with transaction.atomic():
        assert replay_stage_once(job_id=job.id, after=0, upto=sources[-1]) == 20
        stored = replay_write_staged(job=job, after=0, upto=sources[-1], progress={})
    assert (stored.written, stored.skipped) == (20, 0)
    assert copies_per_source(job) == Counter(dict.fromkeys(sources, 1))


@pytest.mark.usefixtures("spark_env")
def test_a_server_without_the_jdbc_driver_fails_the_job_naming_the_flag_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_the_driver = tmp_path / "empty.jar"
    zipfile.ZipFile(not_the_driver, "w").close()
    server = SparkConnectServer(
        directory=tmp_path,
        extra_env={**SPARK_TEST_SETTINGS, "SPARK_JDBC_JAR": str(not_the_driver)},
    )
    server.start()
    try:
        monkeypatch.setenv("SPARK_REMOTE", server.url)
        orders = queue_create(name="ORDERS.IN", consumer="")
        dead_lettered(orders, 10)
        job = replay_job_launch(submit().id)
    finally:
        server.stop()
    assert job.status == ReplayJobStatus.FAILED
    assert job.error.startswith(
        f"the Spark Connect server at {server.url} (SPARK_REMOTE) has no PostgreSQL JDBC driver"
    )
    assert "--jars" in job.error
    assert "SPARK_JDBC_JAR" in job.error
    assert on_orders() == 0
    assert not Message.objects.filter(replay_job_id__isnull=False).exists()


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (
            {"SPARK_REMOTE": "sc://127.0.0.1:15999", "SPARK_MASTER": "local[2]"},
            "Spark jobs run on the Spark Connect server at sc://127.0.0.1:15999 (SPARK_REMOTE);"
            " SPARK_MASTER=local[2] is ignored (SPARK_REMOTE wins)",
        ),
        (
            {"SPARK_MASTER": "local[2]"},
            "Spark jobs run a driver of their own on SPARK_MASTER=local[2]",
        ),
    ],
)
def test_the_pipeline_worker_says_once_which_spark_it_uses(
    redis_server: RedisServer, tmp_path: Path, values: dict[str, str], said: str
) -> None:
    env = {key: value for key, value in os.environ.items() if key != "SPARK_REMOTE"}
    log = tmp_path / "pipeline.log"
    command = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "pipeline"]
    command += ["-c", "1", "-n", f"pipeline-{free_port()}@%h", "-l", "info"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "CELERY_BROKER_URL": redis_server.url, **values},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "ready." in log.read_text(), timeout=60, what="the worker")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    lines = [line for line in log.read_text().splitlines() if "Spark jobs run" in line]
    assert len(lines) == 1, lines
    assert said in lines[0]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_a_server_elsewhere_is_refused_a_database_host_that_is_this_machine(
    settings: Any, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    """The server would reach its own machine at that address, not PostgreSQL;
    refused before any connection is tried."""
    from django.core.exceptions import ImproperlyConfigured

    from workers.spark.session import spark_session

    settings.SPARK_REMOTE = "sc://spark-connect.invalid:15002"
    monkeypatch.setitem(connection.settings_dict, "HOST", host)
    with pytest.raises(ImproperlyConfigured, match=rf"^DATABASE_URL: {host} is this machine's own"):
        spark_session("lazaretto-test")


def test_the_server_and_its_whole_process_group_run_at_the_spark_niceness(
    spark_connect_server: SparkConnectServer,
) -> None:
    """LAZARETTO_SPARK_NICENESS (the suite's, SPARK_TEST_SETTINGS): the
    server's JVM, and every process of its group, runs at it."""
    assert spark_connect_server.process is not None
    group = spark_connect_server.process.pid
    members = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and process_stat(int(pid))[2:3] == [str(group)]
    ]

    assert members
    niceness = int(SPARK_TEST_SETTINGS["LAZARETTO_SPARK_NICENESS"])
    assert {os.getpriority(os.PRIO_PROCESS, pid) for pid in members} == {niceness}
