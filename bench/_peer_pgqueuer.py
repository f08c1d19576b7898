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

For the latency, ``listen`` runs a QueueManager with the same no-op
entrypoint in its continuous mode (it waits for jobs on PgQueuer's
LISTEN/NOTIFY channel) until it is killed, and ``publish`` enqueues jobs as
they arrive at a rate with PgQueuer's own ``enqueue`` (those due together in
one call), then reports each job's time from its arrival to its log row's
``created`` (the ``now()`` of the statement that logged it done), as
Lazaretto's is measured to its acknowledgement.
"""

from __future__ import annotations

import asyncio
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
    Arrivals,
    Commands,
    Tally,
    chunks,
    payload,
    run_command,
    wait_for_go,
)

PRELOAD_BATCH = 1000
# ``publish`` counts its jobs logged done this often (a count over a backlog's
# ids is not free).
POLL_SECONDS = 1.0
CREATED_SQL = """
SELECT id, extract(epoch FROM created)::float8 AS at FROM pgqueuer WHERE id = ANY($1::bigint[])
"""
COUNT_LOGGED_SQL = """
SELECT count(*) FROM pgqueuer_log WHERE job_id = ANY($1::bigint[]) AND status = 'successful'
"""
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


async def publish(url: str, rate: float, seconds: float, size: int, seed: int) -> None:
    """Enqueue the jobs as they arrive (``Arrivals``), those due together in
    one ``enqueue``; then wait for every one to be logged done and report
    each one's time from its arrival to its log row."""
    body = payload(size).encode()
    arrivals = Arrivals(rate, seconds, seed)
    # Each job's enqueue, on the database's clock (read before it commits).
    stored: dict[int, float] = {}
    async with connected(url) as conn:
        queries = Queries(AsyncpgDriver(conn))
        while arrivals.pending:
            wait = arrivals.wait()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            due = arrivals.due()
            async with conn.transaction():
                ids = await queries.enqueue([QUEUE] * len(due), [body] * len(due), [0] * len(due))
                for row in await conn.fetch(CREATED_SQL, ids):
                    stored[int(row["id"])] = float(row["at"])
            arrivals.published([int(job_id) for job_id in ids], due)
        logged = await wait_logged(conn, list(arrivals.arrived), arrivals.wait_until)
    arrivals.report(logged, stored)


async def wait_logged(conn: Any, ids: list[int], until: float) -> dict[int, float]:
    """Each job's log row ``created``, once every one of ``ids`` has one
    (counted every POLL_SECONDS) or time.monotonic() is ``until``."""
    while int(await conn.fetchval(COUNT_LOGGED_SQL, ids)) < len(ids):
        if time.monotonic() >= until:
            break
        await asyncio.sleep(POLL_SECONDS)
    rows = await conn.fetch(LOGGED_SQL, ids)
    return {int(row["job_id"]): float(row["at"]) for row in rows}


def main() -> None:
    run_command(__doc__, Commands(prepare, work, listen=listen, publish=publish))


if __name__ == "__main__":
    main()
