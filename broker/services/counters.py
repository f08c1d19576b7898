"""Fold the counters' pending changes into their rows.

Every change of a queue's depth (the triggers on broker_message) and of its
per-minute counts (``broker.services.stats``) is a row inserted into
``QueueDepthDelta`` or ``QueueCountDelta`` by the transaction that makes it:
writers lock no counter row and never wait for one another (the models say
what updating in place cost). The sweeper calls ``counters_fold`` every
sweep: one statement per table deletes the pending rows and adds their sums
to ``QueueDepth``, or to ``QueueMinute`` and ``QueueTotal``. Readers read the
``_current`` views (migration 0014), which add the rows not folded yet, so a
fold changes no figure anyone reads.

A fold deletes the rows its snapshot sees, and only those: a change whose
transaction commits meanwhile stays for the next fold. One fold at a time
(an advisory lock), so two never update the same counter rows in different
orders.
"""

from __future__ import annotations

from django.db import connection, transaction

from broker.models import COUNTER_COLUMNS

# Negative, so it can never equal a delivery lease's lock, whose keys are
# positive (broker.services.delivery._lease).
FOLD_LOCK_KEY = -0x4C5A_464F_4C44  # "LZFOLD"

_FOLD_DEPTHS_SQL = """
WITH moved AS (
    DELETE FROM broker_queuedepthdelta RETURNING queue_id, state, n
), summed AS (
    SELECT queue_id, state, sum(n)::bigint AS n FROM moved GROUP BY queue_id, state
)
UPDATE broker_queuedepth AS d SET count = d.count + s.n
FROM summed AS s
WHERE d.queue_id = s.queue_id AND d.state = s.state AND s.n <> 0
"""

_SUMS = ", ".join(f"sum({name})::bigint AS {name}" for name in COUNTER_COLUMNS)
_COLUMNS = ", ".join(COUNTER_COLUMNS)
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
    rows, in one transaction. False when another fold was under way (it
    folds them)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [FOLD_LOCK_KEY])
        (locked,) = cursor.fetchone()
        if not locked:
            return False
        cursor.execute(_FOLD_DEPTHS_SQL)
        cursor.execute(_FOLD_COUNTS_SQL)
    return True
