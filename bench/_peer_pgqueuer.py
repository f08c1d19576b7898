"""PgQueuer, as bench/peers.py runs it (in var/peers-venv), on asyncpg, its
own driver: each process has one connection, which also LISTENs. (On
PgQueuer's psycopg driver a worker's queries wait while the connection waits
for a notification, up to a second at a light load.)

``prepare`` installs PgQueuer's schema (its default durability: every table
logged) and enqueues the jobs, 1000 a call, for the entrypoint ``bench``.
``work`` runs a QueueManager with a no-op entrypoint in drain mode (it
returns once the queue is empty) with ``run(batch_size=B)``: each dequeue
picks up to B jobs and the finished jobs are logged (deleted from the queue
table, a row without the payload written to its log table) in flushes of up
to B. The repository's ``dequeue`` and ``log_jobs`` are wrapped to count
what each dequeue returned and to time the last flush.

For the latency at a light load, ``listen`` runs a QueueManager with the
same no-op entrypoint in its continuous mode (it waits for jobs on
PgQueuer's LISTEN/NOTIFY channel) until it is killed, and ``publish``
enqueues one job at a time at a rate with PgQueuer's own ``enqueue``, then
reports each job's time from its ``created`` (the enqueue's ``now()``) to
its log row's ``created`` (the ``now()`` of the statement that logged it
done): the database's clock at both ends, as Lazaretto's acknowledgement
measures its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg  # type: ignore[import-not-found]
from pgqueuer import QueueManager  # type: ignore[import-not-found]
from pgqueuer.db import AsyncpgDriver  # type: ignore[import-not-found]
from pgqueuer.models import Job  # type: ignore[import-not-found]
from pgqueuer.queries import Queries  # type: ignore[import-not-found]
from pgqueuer.types import QueueExecutionMode  # type: ignore[import-not-found]

from bench._peer_worker import (
    QUEUE,
    REPORT,
    Commands,
    Tally,
    chunks,
    payload,
    publish_times,
    run_command,
    wait_for_go,
)

PRELOAD_BATCH = 1000
# How long ``publish`` waits for its last jobs to be logged done.
SETTLE_TIMEOUT_SECONDS = 60.0
CREATED_SQL = "SELECT extract(epoch FROM created)::float8 FROM pgqueuer WHERE id = $1"
LOGGED_SQL = """
SELECT job_id, extract(epoch FROM created)::float8 AS at FROM pgqueuer_log
WHERE job_id = ANY($1::bigint[]) AND status = 'successful'
"""


@asynccontextmanager
async def connected(url: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def prepare(url: str, messages: int, size: int) -> None:
    async with connected(url) as conn:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        body = payload(size).encode()
        for count in chunks(messages, PRELOAD_BATCH):
            await queries.enqueue([QUEUE] * count, [body] * count, [0] * count)


def counted(queries: Any, tally: Tally) -> None:
    """Count each dequeue's jobs and each flush of finished jobs."""
    dequeue, log_jobs = queries.dequeue, queries.log_jobs

    async def counted_dequeue(*args: Any, **kwargs: Any) -> Any:
        tally.before_fetch()
        jobs = await dequeue(*args, **kwargs)
        tally.fetched(len(jobs))
        return jobs

    async def counted_log_jobs(job_status: list[Any]) -> None:
        await log_jobs(job_status)
        failed = [status for _, status, _ in job_status if status != "successful"]
        if failed:
            raise RuntimeError(f"{len(failed)} jobs ended {failed[0]}")
        tally.ack(len(job_status))

    queries.dequeue, queries.log_jobs = counted_dequeue, counted_log_jobs


def manager_with_noop(queries: Any) -> Any:
    manager = QueueManager(queries)

    @manager.entrypoint(QUEUE)
    async def noop(job: Job) -> None:
        """The no-op consumer."""

    return manager


async def work(url: str, batch: int, mode: str) -> None:
    """``mode`` is not used: PgQueuer logs every finished job one way."""
    tally = Tally()
    async with connected(url) as conn:
        queries = Queries(AsyncpgDriver(conn))
        counted(queries, tally)
        manager = manager_with_noop(queries)
        await asyncio.to_thread(wait_for_go)
        await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
    tally.report()


async def listen(url: str, batch: int) -> None:
    async with connected(url) as conn:
        manager = manager_with_noop(Queries(AsyncpgDriver(conn)))
        await asyncio.to_thread(wait_for_go)
        await manager.run(batch_size=batch, mode=QueueExecutionMode.continuous)


async def publish(url: str, rate: float, seconds: float, size: int) -> None:
    """Enqueue a job at each of ``publish_times(rate, seconds)``, each in a
    transaction that also reads its ``created``; then wait for every one to
    be logged done and report ``[created, seconds to its log row]`` of each."""
    body = payload(size).encode()
    created: dict[int, float] = {}
    async with connected(url) as conn:
        queries = Queries(AsyncpgDriver(conn))
        for due in publish_times(rate, seconds):
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            async with conn.transaction():
                (job_id,) = await queries.enqueue(QUEUE, body, 0)
                created[int(job_id)] = float(await conn.fetchval(CREATED_SQL, job_id))
        logged = await wait_logged(conn, list(created))
    latencies = [[created[job], logged[job] - created[job]] for job in sorted(created)]
    print(REPORT + json.dumps({"latencies": latencies}), flush=True)


async def wait_logged(conn: Any, ids: list[int]) -> dict[int, float]:
    """Each job's log row ``created``, once every one of ``ids`` has one."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    while True:
        rows = await conn.fetch(LOGGED_SQL, ids)
        logged = {int(row["job_id"]): float(row["at"]) for row in rows}
        if len(logged) == len(ids):
            return logged
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(ids) - len(logged)} of {len(ids)} jobs never logged done")
        await asyncio.sleep(0.1)


def main() -> None:
    run_command(__doc__, Commands(prepare, work, listen=listen, publish=publish))


if __name__ == "__main__":
    main()
