"""What happened on each queue, counted: the per-minute and all-time
counters of ``broker.models.Counts`` (the dashboard's chart and /metrics)
and the dead-letter handler's actions by rule, written by the statements
that do what they count, then folded into their rows by the sweeper.

Every change of a queue's depth (the triggers on broker_message) and of its
per-minute counts (``minute_count``, ``minute_count_ctes``) is a row inserted
into ``QueueDepthDelta`` or ``QueueCountDelta`` by the transaction that makes
it: writers lock no counter row and never wait for one another (the models
say what updating in place cost). The sweeper calls ``counters_fold`` every
sweep: one statement per table deletes the pending rows and adds their sums
to ``QueueDepth`` (noting each changed count in ``QueueDepthMinute`` for the
depth chart), or to ``QueueMinute`` and ``QueueTotal``. Readers read
the ``_current`` views (migration 0014), which add the rows not folded yet,
so a fold changes no figure anyone reads.

A fold deletes the rows its snapshot sees, and only those: a change whose
transaction commits meanwhile stays for the next fold. One fold at a time
(an advisory lock), so two never update the same counter rows in different
orders.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping

from django.db import connection, transaction

from broker.models import COUNTER_COLUMNS, Queue

_COLUMNS = ", ".join(COUNTER_COLUMNS)
_PARAMS = ", ".join(f"%({name})s::int" for name in COUNTER_COLUMNS)

# A change of a queue's counts is one inserted row (``QueueCountDelta``),
# which the sweeper folds into its minute and its totals
# (``counters_fold`` below): a count locks no row and waits for no
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


def minute_count(*, queue_id: int, **counts: int) -> None:
    """Add what a batch (a publish, a delivery unit, a sweep) did on a queue
    to its current minute and to its totals: ``counts`` by counter of
    ``broker.models.Counts`` (see there what each counts; ``poisoned`` is a
    part of ``failed``), the others 0."""
    unknown = set(counts) - set(COUNTER_COLUMNS)
    if unknown:
        raise TypeError(f"minute_count: no counter named {', '.join(sorted(unknown))}")
    if any(counts.values()):
        with connection.cursor() as cursor:
            cursor.execute(
                _COUNT_SQL,
                {"queue_id": queue_id, **dict.fromkeys(COUNTER_COLUMNS, 0), **counts},
            )


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


# Negative, so it can never equal a delivery lease's lock, whose keys are
# positive (broker.services.delivery._lease).
FOLD_LOCK_KEY = -0x4C5A_464F_4C44  # "LZFOLD"

_FOLD_DEPTHS_SQL = """
WITH moved AS (
    DELETE FROM broker_queuedepthdelta RETURNING queue_id, state, n
), summed AS (
    SELECT queue_id, state, sum(n)::bigint AS n FROM moved GROUP BY queue_id, state
), changed AS (
    UPDATE broker_queuedepth AS d SET count = d.count + s.n
    FROM summed AS s
    WHERE d.queue_id = s.queue_id AND d.state = s.state AND s.n <> 0
    RETURNING d.queue_id, d.state, d.count - s.n AS count_before, d.count
)
INSERT INTO broker_queuedepthminute AS t (queue_id, state, minute, count_before, count)
SELECT queue_id, state, date_trunc('minute', now()), count_before, count
FROM changed ORDER BY queue_id, state
ON CONFLICT (queue_id, minute, state) DO UPDATE SET count = EXCLUDED.count
"""

# How long the depth chart's rows (``QueueDepthMinute``) are kept, and how
# often a process prunes the older ones (their rows are per minute).
DEPTH_HISTORY = "2 days"
PRUNE_EVERY_SECONDS = 60.0
_pruned_at = -math.inf
_PRUNE_DEPTHS_SQL = f"""
DELETE FROM broker_queuedepthminute WHERE minute < now() - interval '{DEPTH_HISTORY}'
"""  # noqa: S608

_SUMS = ", ".join(f"sum({name})::bigint AS {name}" for name in COUNTER_COLUMNS)
_ADDED = ", ".join(f"{name} = t.{name} + EXCLUDED.{name}" for name in COUNTER_COLUMNS)

# A queue deleted since its changes were written is left out (its counter
# rows went with it).
_FOLD_COUNTS_SQL = f"""
WITH moved AS (
    DELETE FROM broker_queuecountdelta RETURNING *
), by_minute AS (
    SELECT m.queue_id, m.minute, {_SUMS}
    FROM moved AS m JOIN broker_queue AS q ON q.id = m.queue_id
    GROUP BY m.queue_id, m.minute
), minutes AS (
    INSERT INTO broker_queueminute AS t (queue_id, minute, {_COLUMNS})
    SELECT queue_id, minute, {_COLUMNS} FROM by_minute ORDER BY queue_id, minute
    ON CONFLICT (queue_id, minute) DO UPDATE SET {_ADDED}
)
INSERT INTO broker_queuetotal AS t (queue_id, {_COLUMNS})
SELECT queue_id, {_SUMS} FROM by_minute GROUP BY queue_id ORDER BY queue_id
ON CONFLICT (queue_id) DO UPDATE SET {_ADDED}
"""  # noqa: S608


def counters_fold() -> bool:
    """Fold every pending counter change committed so far into the counter
    rows, in one transaction, and about once a minute prune the depth
    chart's rows older than ``DEPTH_HISTORY``. False when another fold was
    under way (it folds them)."""
    global _pruned_at
    prune = time.monotonic() - _pruned_at >= PRUNE_EVERY_SECONDS
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        # A fold lost in a crash is lost whole, the delta rows it deleted
        # with it, and the next fold does it again: its commit need not wait
        # for the WAL to reach the disk, beside the deliveries' commits. Its
        # own transaction (durable=True), whose commit alone the setting
        # changes.
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(%s), set_config('synchronous_commit', 'off', true)",
            [FOLD_LOCK_KEY],
        )
        (locked, _) = cursor.fetchone()
        if not locked:
            return False
        cursor.execute(_FOLD_DEPTHS_SQL)
        if prune:
            cursor.execute(_PRUNE_DEPTHS_SQL)
        cursor.execute(_FOLD_COUNTS_SQL)
    if prune:
        _pruned_at = time.monotonic()
    return True
