"""The counters' changes are inserted rows that the sweeper folds in: writers
of one queue never wait for one another on a counter row, readers see exact
figures before and after a fold, and a fold takes only what has committed."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection, transaction

from broker.models import Message, MessageState, QueueDepth, QueueMinute, QueueTotal
from broker.selectors import last_hour, queue_depths
from broker.services.counting import FOLD_LOCK_KEY, counters_fold, minute_count
from broker.services.queues import queue_create, queue_delete
from rig.processes import database_url_for_workers
from tests.support.messages import totals
from tests.support.publishing import published
from workers.tasks import sweep

pytestmark = pytest.mark.django_db(transaction=True)


def pending() -> tuple[int, int]:
    """Rows not folded yet: depth changes, count changes."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM broker_queuedepthdelta),"
            " (SELECT count(*) FROM broker_queuecountdelta)"
        )
        return cursor.fetchone()


def chart() -> tuple[int, int]:
    """Delivered and failed over the dashboard's last hour."""
    minutes = last_hour()
    return sum(m.delivered for m in minutes), sum(m.failed for m in minutes)


def folded_depths(queue_id: int) -> dict[str, int]:
    return dict(QueueDepth.objects.filter(queue_id=queue_id).values_list("state", "count"))


def test_figures_are_exact_before_and_after_a_fold_which_empties_the_changes():
    queue = queue_create(name="Q")
    ids = published("Q", 10)
    Message.objects.filter(id__in=ids[:3]).update(state=MessageState.NOT_DELIVERABLE)
    Message.objects.filter(id__in=ids[3:4]).delete()
    expected = dict.fromkeys(MessageState.values, 0) | {"TBDL": 6, "NDLV": 3}

    assert queue_depths(queue_ids=[queue.id])[queue.id] == expected
    assert totals("Q")["published"] == 10
    minute_count(queue_id=queue.id, delivered=5, failed=2)
    assert chart() == (5, 2)
    assert pending() != (0, 0)
    assert folded_depths(queue.id)["TBDL"] == 0

    assert counters_fold()

    assert pending() == (0, 0)
    assert queue_depths(queue_ids=[queue.id])[queue.id] == expected
    assert folded_depths(queue.id) == expected
    assert totals("Q")["published"] == 10
    assert chart() == (5, 2)
    assert QueueTotal.objects.get(queue=queue).published == 10
    assert QueueMinute.objects.get(queue=queue).published == 10
    assert QueueMinute.objects.get(queue=queue).delivered == 5


def test_a_fold_adds_to_what_earlier_folds_left():
    queue = queue_create(name="Q")
    published("Q", 4)
    counters_fold()
    published("Q", 5)

    assert queue_depths(queue_ids=[queue.id])[queue.id]["TBDL"] == 9
    assert totals("Q")["published"] == 9
    counters_fold()
    assert folded_depths(queue.id)["TBDL"] == 9
    assert QueueTotal.objects.get(queue=queue).published == 9


def test_writers_of_one_queue_do_not_wait_for_each_other():
    queue = queue_create(name="Q")
    [waiting] = published("Q", 1)
    with psycopg.connect(database_url_for_workers(), autocommit=True) as other:
        other.execute("SET lock_timeout = '2s'")
        with transaction.atomic():
            published("Q", 1)  # TBDL +1 and a published count, not committed
            # Another transaction takes a waiting message of the same queue
            # out of TBDL and counts it, while the first is still open.
            other.execute("UPDATE broker_message SET state = 'NDLV' WHERE id = %s", [waiting])
            other.execute(
                "INSERT INTO broker_queuecountdelta (queue_id, minute, blacklisted)"
                " SELECT queue_id, date_trunc('minute', now()), 1 FROM broker_message"
                " WHERE id = %s",
                [waiting],
            )

    expected = dict.fromkeys(MessageState.values, 0) | {"TBDL": 1, "NDLV": 1}
    assert queue_depths(queue_ids=[queue.id])[queue.id] == expected
    assert totals("Q")["published"] == 2
    assert totals("Q")["blacklisted"] == 1


def test_a_fold_leaves_what_has_not_committed_for_the_next_one():
    queue = queue_create(name="Q")
    [message_id] = published("Q", 1)
    counters_fold()
    with psycopg.connect(database_url_for_workers()) as other:
        other.execute("UPDATE broker_message SET state = 'NDLV' WHERE id = %s", [message_id])

        counters_fold()  # the update has not committed

        other.commit()
    assert pending() == (2, 0)  # TBDL -1, NDLV +1
    expected = dict.fromkeys(MessageState.values, 0) | {"NDLV": 1}
    assert queue_depths(queue_ids=[queue.id])[queue.id] == expected
    counters_fold()
    assert pending() == (0, 0)
    assert folded_depths(queue.id) == expected


def test_one_fold_at_a_time():
    queue_create(name="Q")
    published("Q", 3)
    with psycopg.connect(database_url_for_workers()) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", [FOLD_LOCK_KEY])
        assert counters_fold() is False
        assert pending() != (0, 0)
    assert counters_fold() is True
    assert pending() == (0, 0)


def test_a_deleted_queue_leaves_no_changes_behind_and_no_error():
    queue = queue_create(name="Q")
    published("Q", 2)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM broker_message WHERE queue_id = %s", [queue.id])
    queue_delete(queue=queue)

    assert counters_fold()
    assert pending() == (0, 0)
    assert not QueueTotal.objects.exists()
    assert not QueueMinute.objects.exists()


def test_the_sweep_folds_the_counters():
    queue = queue_create(name="Q")
    published("Q", 3)

    sweep()

    assert pending() == (0, 0)
    assert folded_depths(queue.id)["TBDL"] == 3
