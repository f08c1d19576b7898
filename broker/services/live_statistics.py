"""The live partition's row count, as the planner sees it, kept near the truth.

PostgreSQL plans from the row counts VACUUM and ANALYZE leave in pg_class.
A queue's live partition (``broker_message_live``, migration 0011) empties and
fills within seconds: autovacuum often finds it all but empty, every message
delivered but the few in flight, while the partition keeps its pages
(migration 0012) and its indexes the entries of what was delivered since.
Believing it empty, the planner rates reading an index whole as cheap as a
lookup: it settles a batch by reading the whole primary key and claims one by
sorting every waiting message, 20-750 ms a batch once a backlog builds, which
makes the backlog grow until the next vacuum or analyze happens to see it,
tens of seconds later.

The depth counters know how many messages the partition holds. When the
planner's count is far below it, the sweeper has the partition analyzed at
once (``live_statistics_refresh``), which takes a sample and sets the count.
"""

from __future__ import annotations

import logging

from django.db import connection

logger = logging.getLogger(__name__)

# Below this many live messages, whatever plan the planner picks is quick.
MIN_LIVE_MESSAGES = 10_000
# The planner's count may fall this many times short before it is refreshed.
UNDERCOUNT = 4

# The planner's count (-1: never counted) and the counters' one: every state
# but DLVD lives in the live partition.
_COUNTS_SQL = """
SELECT c.reltuples,
       (SELECT coalesce(sum(d.count), 0) FROM broker_queuedepth_current AS d WHERE d.state <> 'DLVD')
FROM pg_class AS c WHERE c.oid = 'broker_message_live'::regclass
"""


def live_statistics_refresh() -> bool:
    """ANALYZE the live partition when the planner counts under a
    ``UNDERCOUNT``-th of the messages the depth counters say it holds, and
    they hold at least ``MIN_LIVE_MESSAGES``; True when it did. An analyze
    or vacuum already under way (autovacuum's) is left to finish instead."""
    with connection.cursor() as cursor:
        cursor.execute(_COUNTS_SQL)
        [(planned, held)] = cursor.fetchall()
        if held < MIN_LIVE_MESSAGES or planned * UNDERCOUNT >= held:
            return False
        cursor.execute("ANALYZE (SKIP_LOCKED) broker_message_live")
    logger.info(
        "the planner counted %d live messages, the depth counters %d: analyzed the live partition",
        max(planned, 0),
        held,
    )
    return True
