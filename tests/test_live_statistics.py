"""The live partition's row count, as the planner sees it: when a vacuum
found the partition all but empty just before a backlog built up, the
sweeper has it analyzed, and the ack finds its rows by key again."""

from __future__ import annotations

import pytest
from django.db import connection

from broker.services import live_statistics
from broker.services.live_statistics import live_statistics_refresh
from broker.services.publish import NewMessage
from broker.services.queues import queue_create
from broker.services.transitions.in_flight import ACK_SQL
from tests.support.publishing import published
from workers.tasks import sweep

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("live_partition_without_autovacuum"),
]


def planned_rows() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = 'broker_message_live'")
        return float(cursor.fetchone()[0])


BACKLOG_MESSAGE = NewMessage(payload=b"x" * 100)


def emptied_by_a_vacuum() -> None:
    """A backlog delivered, then a VACUUM that finds the partition empty:
    its pages and index pages stay, the planner's count is 0."""
    queue_create(name="Q", consumer="noop")
    published("Q", 20_000, BACKLOG_MESSAGE)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM broker_message")
        cursor.execute("VACUUM broker_message_live")
    assert planned_rows() == 0


def ack_plan() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id), max(queue_id) FROM broker_message")
        last, queue_id = cursor.fetchone()
        cursor.execute(
            "EXPLAIN " + ACK_SQL,
            {
                "ids": list(range(last - 100, last)),
                "owner": "w:1:1",
                "queue_id": queue_id,
                "handler_errors": 0,
            },
        )
        return "\n".join(row[0] for row in cursor.fetchall())


def test_a_backlog_the_planner_does_not_count_is_analyzed_and_acked_by_key(monkeypatch):
    monkeypatch.setattr(live_statistics, "MIN_LIVE_MESSAGES", 5_000)
    emptied_by_a_vacuum()
    published("Q", 20_000, BACKLOG_MESSAGE)
    # Believing the partition empty, the planner reads an index whole.
    assert "Index Cond: ((id = a.id)" not in ack_plan()

    assert live_statistics_refresh() is True

    assert planned_rows() > 10_000
    assert "Index Cond: ((id = a.id)" in ack_plan()
    # Counted now: nothing more to do.
    assert live_statistics_refresh() is False


def test_the_sweeper_refreshes_the_count(monkeypatch):
    monkeypatch.setattr(live_statistics, "MIN_LIVE_MESSAGES", 5_000)
    emptied_by_a_vacuum()
    published("Q", 20_000, BACKLOG_MESSAGE)

    sweep()

    assert planned_rows() > 10_000


def test_a_small_backlog_is_left_to_autovacuum(monkeypatch):
    monkeypatch.setattr(live_statistics, "MIN_LIVE_MESSAGES", 5_000)
    emptied_by_a_vacuum()
    published("Q", 4_000, BACKLOG_MESSAGE)

    assert live_statistics_refresh() is False
    assert planned_rows() == 0
