"""Console page and API list times on a big table: every page a viewer
reaches and every API list, some beside the same data read with COUNT(*)
and OFFSET pagination.

The naive side times the SQL alone, without rendering, so its ratio
understates the naive page's cost.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import _harness as harness
from bench._loaders import seed_console

QUEUES = [f"BENCH.Q{n:02}" for n in range(50)]
DEAD_LETTER_QUEUES = ["SYSTEM.DEAD.LETTER.QUEUE", "BENCH.DLQ"]
TARGET_P95_MS = 300.0
PAGE = 50
COLUMNS = "id, queue_id, state, priority, attempts, crash_count, content_type, created_at"
# Search terms: common ones match many messages, rare ones a handful
# (bench._loaders.CONSOLE_SEED_SQL says how often each occurs).
COMMON_TEXT, RARE_TEXT = "express", "recall lot 77-A"
COMMON_HEADER, RARE_HEADER = "region=apac", "tenant=t42"
RARE_REASON = "max_messages_reached"

Run = Callable[[], Any]


def parse_args(argv: Sequence[str] | None) -> Any:
    return harness.parser(
        __doc__, messages=harness.messages(10_000_000), repeat=(harness.positive_int, 20, None)
    ).parse_args(argv)


def seed(bench_url: str, total: int) -> None:
    """The queues through the service, then ``total`` messages written by
    the loader; checks every depth counter against the table."""
    from broker.models import Queue, QueueKind
    from broker.services.queues import queue_create

    queue_create(name=DEAD_LETTER_QUEUES[1], consumer="", kind=QueueKind.DEAD_LETTER)
    queues = [(queue_create(name=name, consumer="noop").id, name) for name in QUEUES]
    dlqs = list(
        Queue.objects.filter(name__in=DEAD_LETTER_QUEUES)
        .order_by("-name")
        .values_list("id", flat=True)
    )
    started = time.perf_counter()
    seed_console(bench_url, total=total, queues=queues, dead_letter_queues=dlqs)
    harness.log(f"seeded {total} messages in {harness.since(started):.0f} s")
    check_depths(total)


def check_depths(total: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue_id, state, count(*) FROM broker_message GROUP BY 1, 2 "
            "EXCEPT SELECT queue_id, state, count FROM broker_queuedepth_current WHERE count > 0"
        )
        wrong = cursor.fetchall()
        cursor.execute("SELECT sum(count) FROM broker_queuedepth_current")
        counted = cursor.fetchone()[0]
    if wrong or counted != total:
        raise harness.BenchError(f"depth counters {counted} for {total} messages: {wrong[:5]}")


def timings(run: Run, repeat: int) -> dict[str, float]:
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


def sql(*statements: str, params: Sequence[Any] = ()) -> Run:
    """Run ``statements`` one after the other, as a page would."""
    from django.db import connection

    def run() -> Any:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement, params if "%s" in statement else None)
                cursor.fetchall()

    return run


def page(client: Any, path: str) -> Run:
    def run() -> Any:
        response = client.get(path)
        if response.status_code != 200:
            raise harness.BenchError(f"{path} answered {response.status_code}")
        return response

    return run


def naive_sql(newest: int, deep: int) -> dict[str, Run]:
    """What a naive page would run: COUNT(*) over what it shows, OFFSET pages."""
    return {
        "dashboard": sql(
            "SELECT queue_id, state, count(*) FROM broker_message GROUP BY queue_id, state"
        ),
        "browser_first_page": sql(
            f"SELECT {COLUMNS} FROM broker_message ORDER BY id DESC OFFSET 0 LIMIT {PAGE}",
            "SELECT count(*) FROM broker_message",
        ),
        "browser_deep_page": sql(
            f"SELECT {COLUMNS} FROM broker_message ORDER BY id DESC OFFSET %s LIMIT {PAGE}",
            params=[deep],
        ),
        "filtered_dlq_rare_reason": sql(
            "SELECT count(*) FROM broker_message m JOIN broker_queue q ON q.id = m.queue_id "
            "WHERE q.name = %s AND m.state = 'TBDL' AND m.dead_letter->>'reason' = %s",
            params=[DEAD_LETTER_QUEUES[0], RARE_REASON],
        ),
        "blacklist": sql("SELECT count(*) FROM broker_message WHERE state = 'NDLV'"),
    }


def console_pages(sample: int, middle: int) -> dict[str, str]:
    dlq, queue = DEAD_LETTER_QUEUES[0], QUEUES[3]
    return {
        "dashboard": "/",
        "browser_first_page": "/messages/",
        "browser_deep_page": f"/messages/?before={middle}",
        "filtered_dlq_rare_reason": f"/messages/?queue={dlq}&state=TBDL&reason={RARE_REASON}",
        "filtered_queue_ndlv": f"/messages/?queue={queue}&state=NDLV",
        "header_search_common": f"/messages/?header={COMMON_HEADER}",
        "header_search_rare": f"/messages/?header={RARE_HEADER}",
        "text_search_common": f"/messages/?text={COMMON_TEXT}",
        "text_search_rare": f"/messages/?text={RARE_TEXT}",
        "blacklist": "/blacklist/",
        "dead_letter_triage": "/dead-letters/",
        "dead_letter_queue": f"/dead-letters/{dlq}/",
        "queue_page": f"/queues/{queue}/",
        "topics": "/topics/",
        "audit_log": "/audit/",
        "message_detail": f"/messages/{sample}/",
        "replay_jobs": "/replay/",
    }


def api_lists(sample: int) -> dict[str, str]:
    dlq, queue = DEAD_LETTER_QUEUES[0], QUEUES[3]
    return {
        "api_queues": "/api/v1/queues/",
        "api_queue": f"/api/v1/queues/{queue}/",
        "api_queue_messages": f"/api/v1/queues/{queue}/messages/",
        "api_messages": "/api/v1/messages/",
        "api_messages_filtered": f"/api/v1/messages/?queue={dlq}&state=TBDL&reason={RARE_REASON}",
        "api_blacklist": "/api/v1/messages/?state=NDLV",
        "api_header_common": f"/api/v1/messages/?header={COMMON_HEADER}",
        "api_header_rare": f"/api/v1/messages/?header={RARE_HEADER}",
        "api_text_common": f"/api/v1/messages/?text={COMMON_TEXT}",
        "api_text_rare": f"/api/v1/messages/?text={RARE_TEXT}",
        "api_dead_letter_queue": f"/api/v1/dead-letter-queues/{dlq}/",
        "api_message": f"/api/v1/messages/{sample}/",
        "api_audit": "/api/v1/audit/",
        "api_topics": "/api/v1/topics/",
        "api_subscriptions": "/api/v1/subscriptions/",
        "api_rule_tables": "/api/v1/rule-tables/",
        "api_replay_jobs": "/api/v1/replay-jobs/",
    }


def measure(repeat: int) -> dict[str, dict[str, Any]]:
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from broker.models import Message

    viewer = User.objects.create_user("bench-viewer")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client(SERVER_NAME="localhost")
    client.force_login(viewer)
    newest = Message.objects.order_by("-id").values_list("id", flat=True).first() or 0
    deep = newest // 2
    sample = Message.objects.filter(queue__name=QUEUES[3], state="NDLV").order_by("id")[0].id
    paths = {**console_pages(sample, newest - deep), **api_lists(sample)}
    naive = naive_sql(newest, deep)
    results: dict[str, dict[str, Any]] = {}
    for name, path in paths.items():
        results[name] = {"path": path, "console": timings(page(client, path), repeat)}
        if name in naive:
            results[name]["naive"] = timings(naive[name], repeat)
        harness.log(f"{name}: {results[name]}")
    return results


def report(total: int, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    print(
        f"console bench: {total} messages of 1 KB over {len(QUEUES)} queues and "
        f"{len(DEAD_LETTER_QUEUES)} dead-letter queues; p50 / p95 in ms"
    )
    print("console: the whole page or answer through Django; naive: its naive SQL alone")
    print(
        f"{'page':<26} {'console p50':>11} {'p95':>8} {'naive p50':>10} {'p95':>8} "
        f"{'naive/console':>14}  target"
    )
    worst = 0.0
    for name, figures in results.items():
        ours, naive = figures["console"], figures.get("naive")
        worst = max(worst, ours["p95_ms"])
        figures["pass"] = ours["p95_ms"] < TARGET_P95_MS
        naive_columns = f"{'-':>10} {'-':>8} {'-':>14}"
        if naive:
            ratio = naive["p95_ms"] / ours["p95_ms"] if ours["p95_ms"] else 0.0
            figures["naive_over_console_p95"] = round(ratio, 2)
            naive_columns = f"{naive['p50_ms']:>10} {naive['p95_ms']:>8} {ratio:>14.2f}"
        print(
            f"{name:<26} {ours['p50_ms']:>11} {ours['p95_ms']:>8} {naive_columns}  "
            f"p95 < {TARGET_P95_MS:.0f} {harness.verdict(figures['pass'])}"
        )
    return {
        "bench": "console",
        "messages": total,
        "pages": results,
        "worst_console_p95_ms": worst,
        "all_pass": all(figures["pass"] for figures in results.values()),
        "target_p95_ms": TARGET_P95_MS,
    }


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)

    def measure_all(bench_url: str) -> None:
        harness.setup_django(bench_url)
        seed(bench_url, options.messages)
        results = measure(options.repeat)
        harness.print_figures(report(options.messages, results))

    return harness.run_bench(measure_all)


if __name__ == "__main__":
    sys.exit(main())
