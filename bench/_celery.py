"""What the delivery benches (bench.deliver, bench.soak, bench.peers) share:
a private redis-server, queues published through the service, Lazaretto's
Celery processes draining a paused queue, the check that every message was
delivered, and the bare claim+ack step the workers are compared with."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench._harness import (
    DELIVERED_SQL,
    DEPTH_SQL,
    PRODUCTION_ENV,
    BenchError,
    batch_sizes,
    delivered,
    depths,
    log,
    make_payload,
    setup_django,
)
from bench._loaders import PUT_APPLICATION, PUT_USER

if TYPE_CHECKING:
    from broker.models import Queue
    from broker.services.publish import NewMessage
    from rig.processes import RedisServer, Workers

PUBLISH_BATCH = 1000
CONTENT_TYPE = "application/octet-stream"
# Workers run as in production: DEBUG off (no query log), so they need a key.
WORKER_ENV = PRODUCTION_ENV
# Celery clock: polled fast until the first claim shows, then every 50 ms.
START_POLL_SECONDS = 0.01
POLL_SECONDS = 0.05
WAKE_TIMEOUT_SECONDS = 30.0
STALL_TIMEOUT_SECONDS = 60.0
# How often the workers' logs are read for failed tasks (Celery's own wording).
CHECK_TASKS_SECONDS = 1.0
TASK_FAILED = "raised unexpected"

OUTCOME_SQL = """
SELECT count(*) FILTER (WHERE state = 'DLVD'),
       count(*) FILTER (WHERE state = 'DLVD' AND payload IS NULL),
       count(*) FILTER (WHERE attempts > 1),
       count(*)
FROM broker_message WHERE queue_id = %s
"""
LIVE_STATES = ("TBDL", "DLNG", "NDLV", "FAIL")


@dataclass(frozen=True)
class Bench:
    """What every Celery phase needs: the bench database, the private Redis,
    the payload, and the workers' --concurrency and message size."""

    bench_url: str
    redis: RedisServer
    payload: bytes
    concurrency: int
    size: int


# --- helpers --------------------------------------------------------------------


def make_queue(
    name: str,
    *,
    consumer: str,
    batch_size: int,
    size: int,
    paused: bool = False,
    retention: str = "full",
) -> Queue:
    """A queue through the service; ``retention`` is its delivered_retention."""
    from broker.services.queues import queue_create

    return queue_create(
        name=name,
        consumer=consumer,
        batch_size=batch_size,
        max_payload_bytes=max(size, 1024 * 1024),
        paused=paused,
        delivered_retention=retention,
    )


def publish_messages(queue: Queue, message: NewMessage, count: int) -> None:
    """``count`` copies of ``message`` through the publish service, 1000 a call.
    Each call also sends its wake-ups to the (private) Redis."""
    from broker.services.publish import messages_publish

    for size in batch_sizes(count, PUBLISH_BATCH):
        messages_publish(
            queue_name=queue.name,
            messages=[message] * size,
            put_user=PUT_USER,
            put_application=PUT_APPLICATION,
        )


def new_message(payload: bytes, headers: dict[str, str] | None = None) -> NewMessage:
    from broker.services.publish import NewMessage

    return NewMessage(payload=payload, content_type=CONTENT_TYPE, headers=headers or {})


@contextmanager
def private_redis(directory: Path, *, wake_ups: bool = True) -> Iterator[RedisServer]:
    """A redis-server of our own; with ``wake_ups``, this process's Celery app
    sends its wake-ups there (Django must be set up)."""
    from rig.processes import RedisServer, point_celery_at

    server = RedisServer(directory=directory)
    try:
        try:
            server.start()
        except AssertionError as error:  # rig.processes' timeouts
            raise BenchError(f"redis-server: {error}") from None
        if wake_ups:
            point_celery_at(server.url)
        yield server
    finally:
        server.stop()


@contextmanager
def started_bench(bench_url: str, size: int, concurrency: int) -> Iterator[Bench]:
    """Django on the bench database, a private redis-server, and the Bench
    that runs Lazaretto's workers on them with a payload of ``size`` bytes."""
    setup_django(bench_url)
    with (
        tempfile.TemporaryDirectory(prefix="bench-redis-") as directory,
        private_redis(Path(directory)) as server,
    ):
        yield Bench(bench_url, server, make_payload(size), concurrency=concurrency, size=size)


def flush_redis(server: RedisServer) -> None:
    """Drop every wake-up still queued (or left unacked by killed workers)."""
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        client.flushall()
    finally:
        client.close()


# --- Celery processes -------------------------------------------------------------


def worker_env(bench_url: str) -> dict[str, str]:
    """On top of rig.processes.Workers' env: the bench database, DEBUG off, and
    the sweep and dispatch intervals this process has (the settings' defaults
    unless the caller's environment overrides them), not the rig's 0.25 s."""
    from django.conf import settings

    return {
        **WORKER_ENV,
        "DATABASE_URL": bench_url,
        "LAZARETTO_SWEEP_INTERVAL_SECONDS": str(settings.LAZARETTO_SWEEP_INTERVAL_SECONDS),
        "LAZARETTO_DISPATCH_INTERVAL_SECONDS": str(settings.LAZARETTO_DISPATCH_INTERVAL_SECONDS),
    }


def log_tails(workers: Workers, limit: int = 1500) -> str:
    return "\n".join(
        f"--- {name}.log\n{workers.log(name)[-limit:]}" for name in ("deliveries", "control")
    )


def start_workers(workers: Workers) -> None:
    """Returns once the deliveries and control workers and beat (in the
    control worker) logged that they run."""
    try:
        workers.start()
    except AssertionError as error:  # rig.processes.wait_until timed out
        raise BenchError(f"Celery processes did not start: {error}") from None


@contextmanager
def celery_processes(
    bench: Bench, directory: Path, extra_env: dict[str, str] | None = None
) -> Iterator[Workers]:
    """A deliveries worker (--concurrency C), a control worker running beat, as
    rig.processes.Workers starts them, with ``extra_env`` on top of
    worker_env(); their process groups are killed on the way out, and their
    logs end a failure's message."""
    from rig.processes import Workers

    workers = Workers(
        directory=directory,
        broker_url=bench.redis.url,
        concurrency=bench.concurrency,
        extra_env={**worker_env(bench.bench_url), **(extra_env or {})},
    )
    try:
        start_workers(workers)
        yield workers
    except BenchError as error:
        raise BenchError(f"{error}\n{log_tails(workers)}") from None
    finally:
        workers.stop()


# --- the bare claim + ack step ---------------------------------------------------


def claim_and_ack(conn: psycopg.Connection[Any], claim: dict[str, Any]) -> int:
    """One batch, two transactions as the service does: the claim, then the ack.
    Returns how many messages it delivered (0: nothing left)."""
    from broker.services.transitions.in_flight import BARE_ACK_SQL, CLAIM_SQL

    with conn.transaction():
        ids = [row[0] for row in conn.execute(CLAIM_SQL, claim).fetchall()]
    if not ids:
        return 0
    with conn.transaction():
        acked = conn.execute(BARE_ACK_SQL, {"ids": ids, "owner": claim["owner"]}).rowcount
    if acked != len(ids):
        raise BenchError(f"bare: claimed {len(ids)} messages but acked {acked}")
    return acked


# --- Celery draining a paused queue -------------------------------------------------


def wait_first_claim(conn: psycopg.Connection[Any], queue_id: int, count: int) -> float:
    """perf_counter() when the queue's TBDL counter first drops below ``count``."""
    deadline = time.perf_counter() + WAKE_TIMEOUT_SECONDS
    while depths(conn, queue_id).get("TBDL", 0) >= count:
        if time.perf_counter() > deadline:
            raise BenchError(f"celery: nothing claimed {WAKE_TIMEOUT_SECONDS:.0f}s after unpausing")
        time.sleep(START_POLL_SECONDS)
    return time.perf_counter()


def check_tasks(workers: Workers) -> None:
    """Fail on the first task that raised in the deliveries or control worker
    (a task that dies after each batch would otherwise crawl, never stall)."""
    for name in ("deliveries", "control"):
        text = workers.log(name)
        at = text.find(TASK_FAILED)
        if at >= 0:
            raise BenchError(f"celery: a task failed in the {name} worker:\n{text[at : at + 2000]}")


def acknowledged(conn: psycopg.Connection[Any], queue_id: int, *, counted: bool) -> int:
    """Messages acknowledged on the queue: its delivered counter when
    ``counted`` (right whatever the queue keeps), else its DLVD depth."""
    if counted:
        return delivered(conn, queue_id)
    return depths(conn, queue_id).get("DLVD", 0)


def wait_all_delivered(
    conn: psycopg.Connection[Any],
    queue_id: int,
    count: int,
    workers: Workers,
    *,
    counted: bool = False,
) -> float:
    """perf_counter() when the queue's DLVD depth (with ``counted``, its
    delivered counter) reaches ``count``; fails when it stops moving for
    STALL_TIMEOUT_SECONDS or a task fails."""
    seen, moved, checked = -1, time.perf_counter(), time.perf_counter()
    while True:
        done = acknowledged(conn, queue_id, counted=counted)
        now = time.perf_counter()
        if done >= count:
            return now
        if done != seen:
            seen, moved = done, now
        elif now - moved > STALL_TIMEOUT_SECONDS:
            depth = depths(conn, queue_id)
            raise BenchError(
                f"celery: delivery stalled for {STALL_TIMEOUT_SECONDS:.0f}s at {done} of "
                f"{count}: {depth}"
            )
        if now - checked > CHECK_TASKS_SECONDS:
            check_tasks(workers)
            checked = now
        time.sleep(POLL_SECONDS)


def drain_paused_queue(
    conn: psycopg.Connection[Any],
    workers: Workers,
    queue: Queue,
    count: int,
    *,
    counted: bool = False,
) -> tuple[float, float]:
    """Unpause the queue (the Celery processes all run) and time them
    draining it. Returns (seconds from the first claim to all ``count`` DLVD,
    or with ``counted`` acknowledged by the delivered counter, seconds from
    unpausing to that first claim)."""
    from broker.services.queues import queue_update

    queue_update(queue=queue, paused=False)  # the next dispatch tick wakes it
    released = time.perf_counter()
    first = wait_first_claim(conn, queue.id, count)
    done = wait_all_delivered(conn, queue.id, count, workers, counted=counted)
    check_tasks(workers)
    log(f"celery: {count} messages in {done - first:.2f}s (first claim {first - released:.2f}s)")
    return done - first, first - released


def run_celery(
    bench: Bench, queue: Queue, count: int, *, counted: bool = False
) -> tuple[float, float]:
    """Start the Celery processes and time them draining the paused queue
    (``counted``: drain_paused_queue's)."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-deliver-") as directory,
        psycopg.connect(bench.bench_url, autocommit=True) as conn,
        celery_processes(bench, Path(directory)) as workers,
    ):
        return drain_paused_queue(conn, workers, queue, count, counted=counted)


def expected_kept(retention: str, count: int) -> tuple[int, int, int]:
    """(DLVD rows, of them without a payload, rows in all) a queue of
    ``count`` acknowledged messages holds in delivered_retention mode
    ``retention``."""
    if retention == "none":
        return 0, 0, 0
    return count, count if retention == "headers" else 0, count


def verify_delivered(queue: Queue, expected: int, path: str, *, counted: bool = False) -> None:
    """Every message of the queue was acknowledged, and the queue kept what
    its delivered_retention keeps: in modes full and headers every message
    is DLVD (in headers without its payload) in the table and the depth
    counters; in mode none the queue has no row left, live or delivered. In
    mode none, and with ``counted`` in every mode, the delivered counter
    says ``expected`` too (the bare ack counts nothing)."""
    from django.db import connection

    retention = queue.delivered_retention
    with connection.cursor() as cursor:
        cursor.execute(OUTCOME_SQL, [queue.id])
        row = cursor.fetchone()
        cursor.execute(DEPTH_SQL, [queue.id])
        depth: dict[str, int] = dict(cursor.fetchall())
        cursor.execute(DELIVERED_SQL, [queue.id])
        total = cursor.fetchone()
    dlvd, without_payload, redelivered, rows = row if row else (None, None, None, None)
    acknowledged = int(total[0]) if total and total[0] is not None else 0
    live = sum(depth.get(state, 0) for state in LIVE_STATES)
    kept = expected_kept(retention, expected)
    if (dlvd, without_payload, rows) != kept or depth.get("DLVD", 0) != kept[0] or live:
        raise BenchError(
            f"{path}: expected (DLVD, without payload, rows) {kept} in mode {retention}; the "
            f"table has {(dlvd, without_payload, rows)}, the counters say {depth}"
        )
    if (counted or retention == "none") and acknowledged != expected:
        raise BenchError(f"{path}: expected {expected} delivered; the counter says {acknowledged}")
    if retention == "none":
        log(f"{path}: verified {acknowledged} delivered (counter), no row left (mode none)")
        return
    log(
        f"{path}: verified {dlvd} DLVD (rows and counters) in mode {retention}, "
        f"{redelivered} delivered more than once"
    )
