"""Publish throughput: bare binary COPY vs ``messages_publish`` vs the REST API.

Each path writes N messages of SIZE bytes in batches of B into its own
queue, and its row count and depth counter are checked afterwards. The
counters' changes are folded once a second meanwhile, as the control
worker's sweep does: a limited publish reads the depth counter, and unfolded
changes pile up under it.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import IO, TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote

import psycopg

from bench import _harness as harness
from bench._loaders import PUT_APPLICATION, PUT_USER, copy_batch

if TYPE_CHECKING:
    from broker.services.publish import NewMessage

TARGETS = {"service_vs_copy": 0.5, "api_vs_copy": 0.25, "limit_vs_service": 0.7}
# Relative to which path each ratio is reported.
BASELINES = {"service": "copy", "api": "copy", "limit": "service", "topic5": "service"}
LIMIT = 1_000_000
TOPIC_SUBSCRIPTIONS = 5
SERVER_START_SECONDS = 60.0
SERVER_STOP_SECONDS = 15.0


class Options(NamedTuple):
    messages: int
    batch: int
    size: int


@dataclass(frozen=True)
class Workload:
    """What every path writes: ``sizes`` batches of the same message."""

    bench_url: str
    sizes: list[int]
    payload: bytes
    messages: list[NewMessage]


def parse_args(argv: Sequence[str] | None) -> Options:
    options = harness.parser(
        __doc__,
        messages=harness.messages(100_000, "messages per path"),
        size=harness.SIZE,
        batch=(harness.positive_int, 1000, "messages per call (<=1000)"),
    )
    args = options.parse_args(argv)
    if args.batch > 1000:
        options.error("--batch may be at most 1000 (the publish limit)")
    return Options(messages=args.messages, batch=args.batch, size=args.size)


def make_limited_queue(name: str, size: int) -> harness.QueueRef:
    """A reject_new queue whose limit is never reached: the cost measured is
    the check itself (lock the queue row, read its counters)."""
    return harness.make_queue(name, size, max_messages=LIMIT, overflow="reject_new")


def make_topic(name: str, size: int) -> harness.QueueRef:
    """A topic with TOPIC_SUBSCRIPTIONS subscriptions that all match; the
    returned ref names the topic and carries the first subscription queue's id."""
    from broker.services.topics import subscription_create, topic_create

    topic = topic_create(name=name, topic_string=name.lower())
    first = None
    for n in range(TOPIC_SUBSCRIPTIONS):
        queue = harness.make_queue(f"{name}.SUB{n}", size)
        subscription_create(
            name=f"{name}.SUB{n}",
            topic=topic,
            queue_name=queue.name,
            topic_filter=f"{topic.topic_string}/#",
        )
        first = first or queue
    assert first is not None
    return harness.QueueRef(name=topic.name, id=first.id)


def topic_queues(topic: harness.QueueRef) -> list[harness.QueueRef]:
    from broker.models import Subscription

    return [
        harness.QueueRef(name=queue_name, id=queue_id)
        for queue_name, queue_id in Subscription.objects.filter(topic__name=topic.name)
        .order_by("name")
        .values_list("queue__name", "queue_id")
    ]


def verify(queue: harness.QueueRef, expected: int, path: str) -> None:
    """The queue holds exactly ``expected`` rows, and its depth counter agrees."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM broker_message WHERE queue_id = %s),"
            " (SELECT count FROM broker_queuedepth_current WHERE queue_id = %s AND state = 'TBDL')",
            [queue.id, queue.id],
        )
        row = cursor.fetchone()
    rows, depth = row if row else (None, None)
    if rows != expected or depth != expected:
        raise harness.BenchError(
            f"{path}: expected {expected} messages, table has {rows}, depth {depth}"
        )
    harness.log(f"{path}: verified {rows} rows, depth counter {depth}")


# --- path a: bare psycopg COPY ----------------------------------------------


def timed_batches(work: Workload, write: Callable[[list[NewMessage]], object]) -> float:
    """Seconds ``write`` takes over the workload, one call a batch: the
    loop every in-process path (copy, service, limit, topic5) is timed by."""

    def run() -> None:
        for count in work.sizes:
            write(work.messages[:count])

    return harness.timed(run)


def run_copy(work: Workload, queue: harness.QueueRef) -> float:
    with psycopg.connect(work.bench_url, autocommit=True) as conn:
        return timed_batches(work, lambda batch: copy_batch(conn, queue.id, batch))


# --- path b: the publish service --------------------------------------------


def run_service(work: Workload, queue: harness.QueueRef) -> float:
    from broker.services.publish import messages_publish

    publish = partial(
        messages_publish, queue_name=queue.name, put_user=PUT_USER, put_application=PUT_APPLICATION
    )
    return timed_batches(work, lambda batch: publish(messages=batch))


# --- path c: the REST API behind gunicorn -----------------------------------


def api_token() -> str:
    from django.contrib.auth import get_user_model

    from console.tokens import token_create

    user = get_user_model().objects.create_superuser(username="bench", email="", password=None)
    return token_create(user=user, name="bench")[1]


def encode_bodies(payload: bytes, sizes: list[int]) -> dict[int, bytes]:
    """One JSON body per distinct batch size (every message is the same)."""
    item = {
        "payload": payload.decode(),
        "content_type": harness.CONTENT_TYPE,
        "headers": harness.HEADERS,
    }
    return {count: json.dumps({"messages": [item] * count}).encode() for count in set(sizes)}


@contextmanager
def gunicorn(bench_url: str) -> Iterator[int]:
    """A gunicorn serving the project on the bench database; yields its port."""
    from rig.processes import free_port

    port = free_port()
    # Served as in production: DEBUG off, so Django keeps no query log.
    # The per-token request rate is lifted: the bench measures publishing,
    # not the throttle.
    env = {
        **os.environ,
        "DATABASE_URL": bench_url,
        "DEBUG": "0",
        "SECRET_KEY": "bench-only-key",
        "LAZARETTO_API_RATE": "1000000/s",
        # Plain http on loopback, as `make run` serves.
        "SECURE_SSL_REDIRECT": "0",
    }
    env["DJANGO_SETTINGS_MODULE"] = "console.settings"
    command = [sys.executable, "-m", "gunicorn", "console.wsgi:application"]
    command += ["--bind", f"127.0.0.1:{port}", "--workers", "2"]
    with tempfile.TemporaryFile() as server_log:
        process = subprocess.Popen(
            command, cwd=harness.ROOT, env=env, stdout=server_log, stderr=subprocess.STDOUT
        )
        try:
            wait_ready(process, port, server_log)
            yield port
        finally:
            stop(process)


def wait_ready(process: subprocess.Popen[bytes], port: int, server_log: IO[bytes]) -> None:
    """Wait until gunicorn answers HTTP; fail with its log if it dies or hangs."""
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise harness.BenchError(
                f"gunicorn exited with {process.returncode}:\n{tail(server_log)}"
            )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/api/v1/")
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.1)
        finally:
            conn.close()
    raise harness.BenchError(
        f"gunicorn gave no answer in {SERVER_START_SECONDS:.0f}s:\n{tail(server_log)}"
    )


def tail(server_log: IO[bytes], limit: int = 4000) -> str:
    server_log.seek(0)
    return server_log.read().decode(errors="replace")[-limit:]


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=SERVER_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def post(conn: http.client.HTTPConnection, url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST one batch; returns how many messages the server says it stored."""
    conn.request("POST", url, body=body, headers=headers)
    response = conn.getresponse()
    answer = response.read()
    if response.status != 201:
        raise harness.BenchError(f"api: HTTP {response.status}: {answer[:500]!r}")
    return int(json.loads(answer)["count"])


def post_batches(
    port: int, token: str, queue_name: str, bodies: dict[int, bytes], sizes: list[int]
) -> float:
    queue_url = f"/api/v1/queues/{quote(queue_name)}/"
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    # One keep-alive client. gunicorn's sync workers close the connection
    # after every response; http.client then reconnects by itself.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        for _ in range(4):  # warm both workers (first request opens Django's DB connection)
            conn.request("GET", queue_url, headers=headers)
            conn.getresponse().read()

        def run() -> None:
            for count in sizes:
                stored = post(conn, f"{queue_url}messages/", bodies[count], headers)
                if stored != count:
                    raise harness.BenchError(f"api: sent {count} messages, server stored {stored}")

        return harness.timed(run)
    finally:
        conn.close()


def run_api(work: Workload, queue: harness.QueueRef) -> float:
    token = api_token()
    bodies = encode_bodies(work.payload, work.sizes)  # before timing: encoding excluded
    with gunicorn(work.bench_url) as port:
        return post_batches(port, token, queue.name, bodies, work.sizes)


def run_topic(work: Workload, topic: harness.QueueRef) -> float:
    from broker.services.publish import topic_publish

    publish = partial(
        topic_publish, topic_name=topic.name, put_user=PUT_USER, put_application=PUT_APPLICATION
    )
    return timed_batches(work, lambda batch: publish(messages=batch))


@dataclass(frozen=True)
class BenchPath:
    name: str
    prepare: Callable[[str, int], harness.QueueRef]
    run: Callable[[Workload, harness.QueueRef], float]
    # The queues to count afterwards (a topic writes into several).
    queues: Callable[[harness.QueueRef], list[harness.QueueRef]] = lambda target: [target]


PATHS: tuple[BenchPath, ...] = (
    BenchPath("copy", harness.make_queue, run_copy),
    BenchPath("service", harness.make_queue, run_service),
    BenchPath("api", harness.make_queue, run_api),
    BenchPath("limit", make_limited_queue, run_service),
    BenchPath("topic5", make_topic, run_topic, topic_queues),
)


# --- driver and report --------------------------------------------------------


@contextmanager
def folding() -> Iterator[None]:
    """The counters' changes folded every LAZARETTO_SWEEP_INTERVAL_SECONDS
    in a thread of its own meanwhile, as the control worker's sweep does."""
    from django.conf import settings
    from django.db import connections

    from broker.services.counting import counters_fold

    stop = threading.Event()

    def fold() -> None:
        try:
            while not stop.wait(settings.LAZARETTO_SWEEP_INTERVAL_SECONDS):
                counters_fold()
        finally:
            connections.close_all()

    thread = threading.Thread(target=fold, name="fold", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run_all(options: Options, bench_url: str) -> list[harness.Timed]:
    harness.setup_django(bench_url)
    payload = harness.make_payload(options.size)
    work = Workload(
        bench_url=bench_url,
        sizes=harness.batch_sizes(options.messages, options.batch),
        payload=payload,
        messages=harness.make_messages(payload, options.batch),
    )
    results = []
    for path in PATHS:
        target = path.prepare(f"BENCH.PUBLISH.{path.name.upper()}", options.size)
        harness.checkpoint()
        harness.log(f"{path.name}: publishing {options.messages} messages to {target.name}")
        with folding():
            seconds = path.run(work, target)
        for queue in path.queues(target):
            verify(queue, options.messages, path.name)
        results.append(harness.Timed(path.name, seconds, options.messages))
    return results


def summary(options: Options, results: list[harness.Timed]) -> dict[str, Any]:
    rates = {result.name: result.rate for result in results}
    ratios = {
        f"{path}_vs_{base}": round(rates[path] / rates[base], 3) for path, base in BASELINES.items()
    }
    return {
        "bench": "publish",
        "messages": options.messages,
        "batch": options.batch,
        "payload_bytes": options.size,
        **{f"{path}_msgs_per_s": round(rate, 1) for path, rate in rates.items()},
        **ratios,
        "targets": dict(TARGETS),
    }


def print_report(options: Options, results: list[harness.Timed]) -> None:
    rates = {result.name: result.rate for result in results}
    harness.title(
        f"publish bench: {options.messages} messages of {options.size} bytes "
        f"in batches of {options.batch}, one queue per path",
        "api: JSON bodies encoded before timing (client-side encoding excluded);",
        "     gunicorn --workers 2 (sync), one sequential stdlib HTTP client",
        f"limit: reject_new queue with max_messages {LIMIT:,} (never reached)",
        f"topic5: topic with {TOPIC_SUBSCRIPTIONS} matching subscriptions; msgs/s counts publishes",
    )
    rows = []
    for result in results:
        row = [result.name, f"{result.seconds:.2f}", f"{result.rate:.0f}"]
        if (baseline := BASELINES.get(result.name)) is not None:
            ratio = result.rate / rates[baseline]
            target = TARGETS.get(f"{result.name}_vs_{baseline}")
            row += [
                f"{ratio:.2f}",
                baseline,
                "-" if target is None else harness.at_least(ratio, target),
            ]
        rows.append(row)
    harness.table(["path", "seconds", "msgs/s", "ratio", "vs", "target"], rows, align="<>>><<")
    harness.print_figures(summary(options, results))


def main(argv: Sequence[str] | None = None) -> int:
    return harness.main(argv, parse_args, run_all, print_report)


if __name__ == "__main__":
    sys.exit(main())
