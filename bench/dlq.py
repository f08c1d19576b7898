"""Dead-letter handling: messages handled per second by a 20-rule table, and
the rules matcher alone in rule checks per second.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench import _harness as harness
from bench._loaders import move_to_dead_letters

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
ORIGINS = [f"APP{n}.IN" for n in range(10)]
REASONS = ["handler_error", "format_error", "max_messages_reached", "crash_blacklisted"]
BATCH = 1000
MATCHER_SECONDS = 2.0

# 20 rules: 17 that match nothing here, then forwards, a discard and a
# catch-all, so most messages are checked against most of the table.
TABLE = "\n".join(
    [
        "* bench table: the first 17 rules match no message",
        "WAIT(NO) RETRYINT(60)",
        *[f"DESTQ(OTHER{n}.*) APPLNAME('never') ACTION(FWD) FWDQ(PARKED.Q)" for n in range(17)],
        "REASON(MQRC_FORMAT_ERROR) ACTION(DISCARD)",
        "REASON(LZRC_HANDLER_ERROR) DESTQ(APP?.IN) ACTION(FWD) FWDQ(&DESTQ) HEADER(NO)",
        "ACTION(FWD) FWDQ(PARKED.Q) HEADER(YES)",
    ]
)


def parse_args(argv: Sequence[str] | None) -> int:
    return int(
        harness.parser(__doc__, messages=harness.messages(100_000)).parse_args(argv).messages
    )


def dead_letter(total: int) -> None:
    """``total`` messages on the dead-letter queue with realistic headers,
    written in bulk: published to their origin queues, then moved with one
    statement per batch, as dead-lettering leaves them."""
    from broker.services.publish import NewMessage, messages_publish
    from broker.services.queues import queue_create

    for name in [*ORIGINS, "PARKED.Q"]:
        queue_create(name=name)
    message = NewMessage(payload=b'{"order": 1}', content_type="application/json")
    for start in range(0, total, BATCH):
        count = min(BATCH, total - start)
        origin = ORIGINS[(start // BATCH) % len(ORIGINS)]
        ids = messages_publish(queue_name=origin, messages=[message] * count)
        reasons = [REASONS[(start + n) % len(REASONS)] for n in range(count)]
        move_to_dead_letters(ids=ids, reasons=reasons, origin=origin, dlq=DLQ)


def activate_table() -> None:
    from broker.models import Queue
    from broker.services.rule_tables import rule_table_activate, rule_table_create

    table = rule_table_create(queue=Queue.objects.get(name=DLQ), text=TABLE)
    rule_table_activate(table=table)


def run_handler(total: int) -> tuple[float, dict[str, int]]:
    from broker.models import Message, Queue
    from broker.services.dead_letters import dead_letter_scan

    started = time.perf_counter()
    result = dead_letter_scan(queue=Queue.objects.get(name=DLQ))
    seconds = harness.since(started)
    left = Message.objects.filter(queue__name=DLQ).count()
    if result.examined != total or left:
        raise harness.BenchError(
            f"handler examined {result.examined} of {total}; {left} left on the queue"
        )
    outcome = {
        "forwarded": result.forwarded,
        "discarded": result.discarded,
        "retried": result.retried,
    }
    harness.log(f"handler: {outcome} in {seconds:.2f}s")
    return seconds, outcome


def matcher_rate() -> tuple[float, Counter[int]]:
    """Rule checks per second of ``matching_rules`` over varied messages."""
    from broker.rules import matching_rules, parse, reason_code

    table = parse(TABLE).table
    assert table is not None
    messages: list[dict[str, str | int]] = [
        {
            "DESTQ": ORIGINS[n % len(ORIGINS)],
            "REASON": reason_code(REASONS[n % len(REASONS)]),
            "APPLNAME": "webshop",
            "USERID": "svc",
            "FORMAT": "MQSTR",
            "PERSIST": 1,
            "MSGTYPE": 8,
        }
        for n in range(100)
    ]
    first_hits: Counter[int] = Counter()
    calls = 0
    started = time.perf_counter()
    while harness.since(started) < MATCHER_SECONDS:
        for message in messages:
            matches = matching_rules(table, message)
            first_hits[matches[0][0] if matches else 0] += 1
        calls += len(messages)
    seconds = harness.since(started)
    return calls * len(table.rules) / seconds, first_hits


def main(argv: Sequence[str] | None = None) -> int:
    total = parse_args(argv)

    def measure(bench_url: str) -> None:
        harness.setup_django(bench_url)
        harness.log(f"dead-lettering {total} messages")
        dead_letter(total)
        activate_table()
        seconds, outcome = run_handler(total)
        checks_per_second, first_hits = matcher_rate()
        report(total, seconds, outcome, checks_per_second, first_hits)

    return harness.run_bench(measure)


def report(
    total: int,
    seconds: float,
    outcome: dict[str, int],
    checks_per_second: float,
    first_hits: Counter[int],
) -> None:
    figures: dict[str, Any] = {
        "bench": "dlq",
        "messages": total,
        "rules": 20,
        "handled_per_s": round(total / seconds, 1),
        "handler_seconds": round(seconds, 2),
        "outcome": outcome,
        "matcher_rule_checks_per_s": round(checks_per_second),
        "first_match_by_rule": {str(rule): n for rule, n in sorted(first_hits.items())},
    }
    print(f"dlq bench: {total} dead-lettered messages, one scan under a 20-rule table")
    print(f"handler   {seconds:>8.2f} s   {total / seconds:>10.0f} messages/s   {outcome}")
    print(f"matcher   {checks_per_second:>10.0f} rule checks/s (matching_rules, 20 rules)")
    harness.print_figures(figures)


if __name__ == "__main__":
    sys.exit(main())
