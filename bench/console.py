"""Console page times on a big table: the real pages beside the same data
read with COUNT(*) and OFFSET pagination.

The naive side times the SQL alone, without rendering, so its ratio
understates the naive page's cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import _harness as harness
from bench._loaders import spread_states

QUEUES = [f"BENCH.Q{n}" for n in range(10)]
TARGET_P95_MS = 300.0
PAGE = 50
# Of every 100 messages: 60 delivered, 20 waiting, 10 blacklisted, 5 failed,
# 5 in flight.
STATES = [("DLVD", 60), ("TBDL", 20), ("NDLV", 10), ("FAIL", 5), ("DLNG", 5)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return harness.parser(
        __doc__, messages=harness.messages(1_000_000), repeat=(harness.positive_int, 20, None)
    ).parse_args(argv)


def seed(total: int) -> None:
    """``total`` messages over QUEUES, written with the publish path's COPY,
    then spread over every state by id, 100 ids at a time."""
    from django.db import connection, transaction

    from broker.services.publish import NewMessage, copy_messages
    from broker.services.queues import queue_create

    per_queue = total // len(QUEUES)
    message = NewMessage(
        payload=json.dumps({"order": 1, "note": "bench"}).encode(),
        content_type="application/json",
        headers={"region": "eu"},
    )
    for name in QUEUES:
        queue = queue_create(name=name, consumer="noop")
        for start in range(0, per_queue, 10_000):
            count = min(10_000, per_queue - start)
            with transaction.atomic(), connection.cursor() as cursor:
                copy_messages(
                    cursor.cursor,
                    queue_id=queue.id,
                    messages=[message] * count,
                    put_user="bench",
                    put_application="bench",
                )
        harness.log(f"seeded {per_queue} messages into {name}")
    spread_states(STATES)
    harness.log("spread the states")


def timings(run: Callable[[], Any], repeat: int) -> dict[str, float]:
    samples = []
    run()  # warm caches and connections once
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        samples.append(harness.since(started) * 1000)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 1),
        "p95_ms": round(samples[min(len(samples) - 1, int(0.95 * len(samples)))], 1),
    }


def sql(*statements: str, params: Sequence[Any] = ()) -> Callable[[], Any]:
    """Run ``statements`` one after the other, as a page would."""
    from django.db import connection

    def run() -> Any:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement, params if "%s" in statement else None)
                cursor.fetchall()

    return run


def page(client: Any, path: str) -> Callable[[], Any]:
    def run() -> Any:
        response = client.get(path)
        if response.status_code != 200:
            raise harness.BenchError(f"{path} answered {response.status_code}")
        return response

    return run


def measure(repeat: int) -> dict[str, dict[str, Any]]:
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from broker.models import Message

    viewer = User.objects.create_user("bench-viewer")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client(SERVER_NAME="localhost")
    client.force_login(viewer)
    newest = Message.objects.order_by("-id").values_list("id", flat=True).first() or 0
    deep = Message.objects.count() // 2
    sample = (
        Message.objects.filter(queue__name=QUEUES[3], state="NDLV")
        .values_list("id", flat=True)
        .first()
    )
    columns = "id, queue_id, state, priority, attempts, crash_count, content_type, created_at"
    pages: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "dashboard": (
            page(client, "/"),
            sql("SELECT queue_id, state, count(*) FROM broker_message GROUP BY queue_id, state"),
        ),
        "browser_first_page": (
            page(client, "/messages/"),
            sql(
                f"SELECT {columns} FROM broker_message ORDER BY id DESC OFFSET 0 LIMIT {PAGE}",
                "SELECT count(*) FROM broker_message",
            ),
        ),
        "browser_deep_page": (
            page(client, f"/messages/?before={newest - deep}"),
            sql(
                f"SELECT {columns} FROM broker_message ORDER BY id DESC OFFSET %s LIMIT {PAGE}",
                params=[deep],
            ),
        ),
        "filtered_search": (
            page(client, f"/messages/?queue={QUEUES[3]}&state=NDLV&reason=format_error"),
            sql(
                "SELECT count(*) FROM broker_message m JOIN broker_queue q ON q.id = m.queue_id "
                "WHERE q.name = %s AND m.state = 'NDLV' AND m.dead_letter->>'reason' = 'format_error'",
                params=[QUEUES[3]],
            ),
        ),
        "blacklist": (
            page(client, "/blacklist/"),
            sql("SELECT count(*) FROM broker_message WHERE state = 'NDLV'"),
        ),
        "message_detail": (
            page(client, f"/messages/{sample}/"),
            page(client, f"/messages/{sample}/"),
        ),
    }
    results = {}
    for name, (ours, naive) in pages.items():
        results[name] = {"console": timings(ours, repeat), "naive": timings(naive, repeat)}
        harness.log(f"{name}: {results[name]}")
    return results


def report(total: int, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    print(f"console bench: {total} messages over {len(QUEUES)} queues; p50 / p95 in ms")
    print("console: the whole page through Django; naive: its naive SQL alone, no rendering")
    print(
        f"{'page':<20} {'console p50':>11} {'p95':>8} {'naive p50':>10} {'p95':>8} "
        f"{'naive/console':>14}  target"
    )
    worst = 0.0
    for name, figures in results.items():
        ours, naive = figures["console"], figures["naive"]
        ratio = naive["p95_ms"] / ours["p95_ms"] if ours["p95_ms"] else 0.0
        figures["naive_over_console_p95"] = round(ratio, 2)
        worst = max(worst, ours["p95_ms"])
        verdict = "PASS" if ours["p95_ms"] < TARGET_P95_MS else "MISS"
        print(
            f"{name:<20} {ours['p50_ms']:>11} {ours['p95_ms']:>8} {naive['p50_ms']:>10} "
            f"{naive['p95_ms']:>8} {ratio:>14.2f}  p95 < {TARGET_P95_MS:.0f} {verdict}"
        )
    return {
        "bench": "console",
        "messages": total,
        "pages": results,
        "worst_console_p95_ms": worst,
        "target_p95_ms": TARGET_P95_MS,
    }


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)

    def measure_all(bench_url: str) -> None:
        harness.setup_django(bench_url)
        seed(options.messages)
        results = measure(options.repeat)
        harness.print_figures(report(options.messages, results))

    return harness.run_bench(measure_all)


if __name__ == "__main__":
    sys.exit(main())
