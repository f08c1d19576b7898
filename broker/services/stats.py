"""Small operational records: per-minute and all-time counts of what
happened on each queue (the dashboard's chart and /metrics), the dead-letter
handler's actions by rule, and heartbeats."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.db import connection
from django.db.models.functions import Now

from broker.models import COUNTER_COLUMNS, Heartbeat, Queue

_COLUMNS = ", ".join(COUNTER_COLUMNS)
_PARAMS = ", ".join(f"%({name})s::int" for name in COUNTER_COLUMNS)

# A change of a queue's counts is one inserted row (``QueueCountDelta``),
# which the sweeper folds into its minute and its totals
# (``broker.services.counters``): a count locks no row and waits for no
# other writer, so it may be written inside any transaction.
_COUNT_SQL = f"""
INSERT INTO broker_queuecountdelta (queue_id, minute, {_COLUMNS})
VALUES (%(queue_id)s, date_trunc('minute', now()), {_PARAMS})
"""  # noqa: S608


def minute_count_ctes(**values: str) -> str:
    """``_COUNT_SQL`` as a CTE (``minute_counts``) for a statement that
    counts what it does itself: each counter named in ``values`` takes that
    SQL expression (it may read the statement's other CTEs or parameters),
    the others 0, and ``%(queue_id)s`` names the queue. Nothing is written
    when every counter is 0."""
    listed = ", ".join(values.get(name, "0") for name in COUNTER_COLUMNS)
    return f"""
minute_counts AS (
    INSERT INTO broker_queuecountdelta (queue_id, minute, {_COLUMNS})
    SELECT %(queue_id)s, date_trunc('minute', now()), {listed}
    WHERE {" + ".join(values.values())} > 0
)"""


def minute_count(
    *,
    queue_id: int,
    published: int = 0,
    delivered: int = 0,
    failed: int = 0,
    poisoned: int = 0,
    handler_errors: int = 0,
    crashed: int = 0,
    timed_out: int = 0,
    dead_lettered: int = 0,
    blacklisted: int = 0,
    discarded: int = 0,
) -> None:
    """Add what a batch (a publish, a delivery unit, a sweep) did on a queue
    to its current minute and to its totals (see ``QueueMinute`` for what
    each counter counts; ``poisoned`` is a part of ``failed``)."""
    counts = {
        "published": published,
        "delivered": delivered,
        "failed": failed,
        "poisoned": poisoned,
        "handler_errors": handler_errors,
        "crashed": crashed,
        "timed_out": timed_out,
        "dead_lettered": dead_lettered,
        "blacklisted": blacklisted,
        "discarded": discarded,
    }
    if any(counts.values()):
        with connection.cursor() as cursor:
            cursor.execute(_COUNT_SQL, {"queue_id": queue_id, **counts})


def queue_ids_by_name(names: Iterable[str]) -> dict[str, int]:
    """The ids of the queues named, for counting moves that know queues by name."""
    return dict(Queue.objects.filter(name__in=set(names)).values_list("name", "id"))


# The dead-letter handler's actions by rule: one row per queue, table version,
# rule and action. Rows are taken in key order, so concurrent handlers of one
# queue cannot deadlock on them.
_RULE_ACTIONS_SQL = """
INSERT INTO broker_deadletteractiontotal AS t (queue_id, rule_table_version, rule, action, count)
SELECT %(queue_id)s, a.version, a.rule, a.action, a.n
FROM unnest(%(versions)s::int[], %(rules)s::int[], %(actions)s::text[], %(counts)s::bigint[])
     AS a(version, rule, action, n)
ORDER BY a.version, a.rule, a.action
ON CONFLICT (queue_id, rule_table_version, rule, action) DO UPDATE SET count = t.count + EXCLUDED.count
"""


def dead_letter_actions_count(
    *, queue_id: int, actions: Mapping[tuple[int, int, str], int]
) -> None:
    """Add the dead-letter handler's actions on a queue, by (rules table
    version, rule number, action), to their totals."""
    if not actions:
        return
    keys = sorted(actions)
    with connection.cursor() as cursor:
        cursor.execute(
            _RULE_ACTIONS_SQL,
            {
                "queue_id": queue_id,
                "versions": [version for version, _, _ in keys],
                "rules": [rule for _, rule, _ in keys],
                "actions": [action for _, _, action in keys],
                "counts": [actions[key] for key in keys],
            },
        )


def heartbeat(*, name: str) -> None:
    Heartbeat.objects.update_or_create(name=name, defaults={"seen_at": Now()})
