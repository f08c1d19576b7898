"""message_dead_letter_idx serves what reads dead letters by reason: the
triage pages' grouped counts read the index alone, and a reason filter
finds its messages through it. Each plan is taken with sequential and
bitmap scans off, so that the few rows of a test table cannot hide an
expression that no longer matches the index's."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from broker.models import Queue
from broker.selectors import MessageFilter, dead_letter_groups_of, filtered_messages
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE, dead_lettered

pytestmark = pytest.mark.django_db

INDEX_ON_THE_LIVE_PARTITION = "broker_message_live_queue_id_expr_id_state_enqueued_at_dead_idx"


@pytest.fixture
def planner_prefers_indexes() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")


def analyzed() -> None:
    """The planner's statistics of this test's rows, not those an earlier
    test in the same database left: with few rows, another index of the
    queue's messages could look as cheap."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_message")


@pytest.mark.django_db(transaction=True)
def test_the_grouped_counts_read_the_index_alone(orders):
    """The index holds every column the grouped counts read: with every
    other way to the rows turned off (a plain index scan among them, which
    the planner may prefer while the visibility map lags behind, however
    recent the VACUUM: another index of the queue's messages costs about
    as much), the planner finds an index-only scan of it."""
    dead_lettered(orders, 3, reason="format_error")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) broker_message")
    dlq = Queue.objects.get(name=SYSTEM_DEAD_LETTER_QUEUE)
    with CaptureQueriesContext(connection) as queries:
        dead_letter_groups_of(queue_ids=[dlq.id])
    [grouped] = [query["sql"] for query in queries if "GROUP BY" in query["sql"]]

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute(f"EXPLAIN {grouped}")
        plan = "\n".join(line for (line,) in cursor.fetchall())

    assert f"Index Only Scan using {INDEX_ON_THE_LIVE_PARTITION}" in plan


def test_a_reason_filter_finds_its_messages_through_the_index(orders, planner_prefers_indexes):
    dead_lettered(orders, 2, reason="expired")
    dead_lettered(orders, 20, reason="format_error")
    analyzed()
    filters = MessageFilter(queue=SYSTEM_DEAD_LETTER_QUEUE, state="TBDL", reason="expired")

    plan = filtered_messages(filters).order_by("-id").values_list("id")[:50].explain()

    assert INDEX_ON_THE_LIVE_PARTITION in plan
    assert "dead_letter ->> 'reason'" in plan
