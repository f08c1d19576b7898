"""The per-queue counters kept by triggers must always equal the rows."""

import pytest
from django.db import connection

from broker.models import Message, MessageState, QueueDepth
from broker.selectors import queue_depths
from broker.services.queues import queue_create

pytestmark = pytest.mark.django_db


def counted(queue_id: int) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, count(*) FROM broker_message WHERE queue_id = %s GROUP BY state",
            [queue_id],
        )
        actual = dict.fromkeys(MessageState.values, 0)
        actual.update(dict(cursor.fetchall()))
        return actual


def test_a_new_queue_starts_with_a_zero_counter_per_state(db):
    queue = queue_create(name="EMPTY.Q")

    assert queue_depths(queue_ids=[queue.id])[queue.id] == dict.fromkeys(MessageState.values, 0)
    assert QueueDepth.objects.filter(queue=queue).count() == 5


def test_counters_follow_inserts_updates_moves_and_deletes(orders, publish):
    other = queue_create(name="OTHER.Q")
    ids = publish(orders, 10)
    publish(other, 4)

    Message.objects.filter(id__in=ids[:3]).update(state=MessageState.NOT_DELIVERABLE)
    Message.objects.filter(id__in=ids[3:5]).update(queue=other)
    Message.objects.filter(id__in=ids[5:6]).update(priority=9)  # no state change
    Message.objects.filter(id__in=ids[6:8]).delete()

    depths = queue_depths(queue_ids=[orders.id, other.id])
    assert depths[orders.id] == counted(orders.id)
    assert depths[other.id] == counted(other.id)
    assert depths[orders.id]["TBDL"] == 3
    assert depths[orders.id]["NDLV"] == 3
    assert depths[other.id]["TBDL"] == 6
