"""PgQueuer, as bench/peers.py runs it (in var/peers-venv), on psycopg 3.

``prepare`` installs PgQueuer's schema (its default durability: every table
logged) and enqueues the jobs, 1000 a call, for the entrypoint ``bench``.
``work`` runs a QueueManager with a no-op entrypoint in drain mode (it
returns once the queue is empty) with ``run(batch_size=B)``: each dequeue
picks up to B jobs and the finished jobs are logged (deleted from the queue
table) in flushes of up to B. The repository's ``dequeue`` and ``log_jobs``
are wrapped to count what each dequeue returned and to time the last flush.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from pgqueuer import QueueManager  # type: ignore[import-not-found]
from pgqueuer.db import PsycopgDriver  # type: ignore[import-not-found]
from pgqueuer.models import Job  # type: ignore[import-not-found]
from pgqueuer.queries import Queries  # type: ignore[import-not-found]
from pgqueuer.types import QueueExecutionMode  # type: ignore[import-not-found]

from bench._peer_worker import QUEUE, Tally, chunks, payload, run_command, wait_for_go

PRELOAD_BATCH = 1000


async def prepare(url: str, messages: int, size: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
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


async def work(url: str, batch: int) -> None:
    tally = Tally()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        counted(queries, tally)
        manager = QueueManager(queries)

        @manager.entrypoint(QUEUE)
        async def noop(job: Job) -> None:
            """The no-op consumer."""

        await asyncio.to_thread(wait_for_go)
        await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
    tally.report()


def main() -> None:
    run_command(__doc__, prepare, work)


if __name__ == "__main__":
    main()
