"""Procrastinate, as bench/peers.py runs it (in var/peers-venv), on psycopg 3.

``prepare`` applies Procrastinate's schema and defers the jobs with
``batch_defer_async``, 1000 a call. ``work`` runs one worker with its
defaults (concurrency 1, finished jobs kept as ``succeeded``) and
``wait=False``, so that it returns once it has caught up with the queue.
Procrastinate has no batch setting: each ``fetch_job`` takes one job and
each ``finish_job`` settles one. The job manager's ``fetch_job`` and
``finish_job`` are wrapped to count the jobs fetched and to time the last
finish.
"""

from __future__ import annotations

import asyncio
from typing import Any

from procrastinate import App, PsycopgConnector  # type: ignore[import-not-found]

from bench._peer_worker import QUEUE, Commands, Tally, chunks, payload, run_command, wait_for_go

PRELOAD_BATCH = 1000


def make_app(url: str) -> Any:
    app = App(connector=PsycopgConnector(conninfo=url, min_size=1, max_size=2))

    @app.task(name="noop", queue=QUEUE)
    async def noop(payload: str) -> None:
        """The no-op consumer."""

    return app


async def prepare(url: str, messages: int, size: int) -> None:
    app = make_app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        body = {"payload": payload(size)}
        task = app.tasks["noop"]
        for count in chunks(messages, PRELOAD_BATCH):
            await task.batch_defer_async(*([body] * count))


def counted(manager: Any, tally: Tally) -> None:
    fetch_job, finish_job = manager.fetch_job, manager.finish_job

    async def counted_fetch_job(*args: Any, **kwargs: Any) -> Any:
        tally.before_fetch()
        job = await fetch_job(*args, **kwargs)
        tally.fetched(0 if job is None else 1)
        return job

    async def counted_finish_job(*args: Any, **kwargs: Any) -> None:
        await finish_job(*args, **kwargs)
        status = kwargs.get("status")
        if status is not None and status.value != "succeeded":
            raise RuntimeError(f"a job ended {status.value}")
        tally.ack(1)

    manager.fetch_job, manager.finish_job = counted_fetch_job, counted_finish_job


async def work(url: str, batch: int, mode: str) -> None:
    """``batch`` and ``mode`` are not used: Procrastinate has neither (see above)."""
    tally = Tally()
    app = make_app(url)
    async with app.open_async():
        counted(app.job_manager, tally)
        await app.check_connection_async()
        await asyncio.to_thread(wait_for_go)
        await app.run_worker_async(queues=[QUEUE], wait=False, install_signal_handlers=False)
    tally.report()


def main() -> None:
    run_command(__doc__, Commands(prepare, work))


if __name__ == "__main__":
    main()
