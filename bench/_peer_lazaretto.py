"""Lazaretto as bench/peers.py runs it (in .venv, in the bench's process):
its queue made with a ``delivered_retention`` mode, the clock of its Celery
processes draining it, the check of what each mode kept, and the
publisher of its latency runs (``publish``, a process of its own).

The clock stops when the queue's ``delivered`` counter reaches N: the
acknowledgement counts what it acknowledges in its own statement, in every
mode, where the DLVD depth counts only the rows kept (none in mode
``none``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from bench import _celery
from bench._harness import BenchError, delivered, depths, log
from bench._loaders import PUT_APPLICATION, PUT_USER
from bench._peer_worker import Arrivals, Commands, payload, run_command

if TYPE_CHECKING:
    from broker.models import Queue
    from rig.processes import Workers

# Each Lazaretto system of the bench and its queue's delivered_retention.
RETENTIONS = {
    "lazaretto-full": "full",
    "lazaretto-headers": "headers",
    "lazaretto-none": "none",
}
# Each acknowledged message's acknowledgement (the ack statement's now(),
# which it writes as updated_at: the queue keeps its delivered messages) and
# its publish (the publish transaction's now(), created_at).
ACKED_SQL = """
SELECT id, extract(epoch FROM updated_at)::float8, extract(epoch FROM created_at)::float8
FROM broker_message WHERE id = ANY(%s::bigint[]) AND state = 'DLVD'
"""
# How often a publisher counts its acknowledged messages (a count over a
# backlog's ids is not free, and the database serves the deliveries too).
ACK_POLL_SECONDS = 1.0
COUNT_ACKED_SQL = (
    "SELECT count(*) FROM broker_message WHERE id = ANY(%s::bigint[]) AND state = 'DLVD'"
)
# The queue the latency is measured on (mode full, the default batch size).
LATENCY_QUEUE = "BENCH.PEERS.LATENCY"


def make_queue(name: str, *, batch: int, retention: str, size: int, paused: bool) -> Queue:
    """A queue through the service, with the noop consumer."""
    from broker.services.queues import queue_create

    return queue_create(
        name=name,
        consumer="noop",
        batch_size=batch,
        max_payload_bytes=max(size, 1024 * 1024),
        paused=paused,
        delivered_retention=retention,
    )


def wait_all_acknowledged(
    conn: psycopg.Connection[Any], queue_id: int, count: int, workers: Workers
) -> float:
    """perf_counter() when the queue's delivered counter reaches ``count``;
    fails when it stops moving for STALL_TIMEOUT_SECONDS or a task fails."""
    seen, moved, checked = -1, time.perf_counter(), time.perf_counter()
    while True:
        acknowledged = delivered(conn, queue_id)
        now = time.perf_counter()
        if acknowledged >= count:
            return now
        if acknowledged != seen:
            seen, moved = acknowledged, now
        elif now - moved > _celery.STALL_TIMEOUT_SECONDS:
            raise BenchError(
                f"celery: delivery stalled for {_celery.STALL_TIMEOUT_SECONDS:.0f}s at "
                f"{acknowledged} of {count} delivered: {depths(conn, queue_id)}"
            )
        if now - checked > _celery.CHECK_TASKS_SECONDS:
            _celery.check_tasks(workers)
            checked = now
        time.sleep(_celery.POLL_SECONDS)


def drain_paused_queue(
    conn: psycopg.Connection[Any], workers: Workers, queue: Queue, count: int
) -> float:
    """Unpause the queue (the Celery processes all run); seconds from the
    first claim to ``count`` acknowledged."""
    from broker.services.queues import queue_update

    queue_update(queue=queue, paused=False)  # the next dispatch tick wakes it
    released = time.perf_counter()
    first = _celery.wait_first_claim(conn, queue.id, count)
    done = wait_all_acknowledged(conn, queue.id, count, workers)
    _celery.check_tasks(workers)
    log(f"celery: {count} messages in {done - first:.2f}s (first claim {first - released:.2f}s)")
    return done - first


def expected_kept(retention: str, count: int) -> tuple[int, int, int]:
    """(DLVD rows, of them without a payload, rows in all) a queue of
    ``count`` acknowledged messages holds in mode ``retention``."""
    if retention == "none":
        return 0, 0, 0
    return count, count if retention == "headers" else 0, count


def verify_kept(conn: psycopg.Connection[Any], queue_id: int, count: int, retention: str) -> None:
    """Every message was acknowledged once (the delivered counter), none is
    live, and the queue kept what its mode keeps, in the table and in the
    DLVD depth."""
    row = conn.execute(_celery.OUTCOME_SQL, [queue_id]).fetchone()
    dlvd, without_payload, redelivered, rows = row if row else (None, None, None, None)
    depth = depths(conn, queue_id)
    acknowledged = delivered(conn, queue_id)
    live = sum(depth.get(state, 0) for state in _celery.LIVE_STATES)
    kept = expected_kept(retention, count)
    if (dlvd, without_payload, rows) != kept or depth.get("DLVD", 0) != kept[0]:
        raise BenchError(
            f"lazaretto {retention}: expected (DLVD, without payload, rows) {kept}; the table "
            f"has {(dlvd, without_payload, rows)}, the counters say {depth}"
        )
    if live or acknowledged != count:
        raise BenchError(
            f"lazaretto {retention}: {acknowledged} of {count} delivered, {live} still live"
        )
    log(
        f"lazaretto {retention}: verified {acknowledged} delivered, {rows} rows kept "
        f"({without_payload} without payload), {redelivered} delivered more than once"
    )


def publish(url: str, rate: float, seconds: float, size: int, seed: int) -> None:
    """``python -m bench._peer_lazaretto publish``: publish to LATENCY_QUEUE
    with the publish service as the messages arrive (``Arrivals``), those
    due together in one call; then wait for their acknowledgements (at most
    as long as the arrivals lasted) and report each one's time from its
    arrival to its acknowledgement (the ack statement's now(), which it
    writes as updated_at). Runs in .venv with DATABASE_URL naming the
    bench's database."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    from broker.services.publish import messages_publish

    message = _celery.new_message(payload(size).encode())
    arrivals = Arrivals(rate, seconds, seed)
    while arrivals.pending:
        wait = arrivals.wait()
        if wait > 0:
            time.sleep(wait)
            continue
        due = arrivals.due()
        ids = messages_publish(
            queue_name=LATENCY_QUEUE,
            messages=[message] * len(due),
            put_user=PUT_USER,
            put_application=PUT_APPLICATION,
        )
        arrivals.published(ids, due)
    ids = list(arrivals.arrived)
    with psycopg.connect(url, autocommit=True) as conn:
        wait_for_all(
            lambda: int(conn.execute(COUNT_ACKED_SQL, [ids]).fetchone()[0]),  # type: ignore[index]
            len(ids),
            until=arrivals.wait_until,
        )
        rows = conn.execute(ACKED_SQL, [ids]).fetchall()
    arrivals.report({row[0]: row[1] for row in rows}, {row[0]: row[2] for row in rows})


def wait_for_all(count: Callable[[], int], total: int, *, until: float) -> None:
    """Wait until ``count()`` reaches ``total``, or time.monotonic() ``until``."""
    while count() < total and time.monotonic() < until:
        time.sleep(ACK_POLL_SECONDS)


def main() -> None:
    run_command(__doc__, Commands(publish=publish))


if __name__ == "__main__":
    main()
