"""A publish of up to INSERT_MAX_MESSAGES messages to one queue without a
limit is one statement that writes, counts and announces them; a bigger one,
or one to a limited queue, is a transaction with a COPY. Both write the same
rows."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import transaction

from broker.models import Message, Queue
from broker.services.delivery import WAKE_CHANNEL
from broker.services.publish import (
    INSERT_MAX_MESSAGES,
    NewMessage,
    _queue_for_publish,
    messages_publish,
)
from broker.services.queues import queue_create
from rig.processes import database_url_for_workers
from tests.support.messages import payload_of, totals

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = [
    NewMessage(payload=bytes(range(256)), content_type="application/x-raw", priority=9),
    NewMessage(payload=b"", headers={"naïve": 'quote " and {}', "n": "2"}, delay_seconds=30),
    NewMessage(payload=b"{}", content_type="application/json", expires_in_seconds=0.5),
    NewMessage(payload=b"late", delay_seconds=900, expires_in_seconds=3600.25),
]


def rows(ids: list[int]) -> list[dict[str, Any]]:
    """What a reader sees of each message, its times relative to its publish."""
    by_id = {message.id: message for message in Message.objects.filter(id__in=ids)}
    seen = []
    for message_id in ids:
        m = by_id[message_id]
        seen.append(
            {
                "payload": payload_of(m),
                "content_type": m.content_type,
                "headers": m.headers,
                "priority": m.priority,
                "state": m.state,
                "delay": (m.available_at - m.created_at).total_seconds(),
                "expires_in": m.expires_at and (m.expires_at - m.created_at).total_seconds(),
                "put": (m.put_user, m.put_application),
                "updated": m.updated_at == m.created_at,
                "counts": (m.attempts, m.crash_count, m.timeout_count, m.suspect),
            }
        )
    return seen


def publish(queue: str, messages: list[NewMessage]) -> list[int]:
    return messages_publish(
        queue_name=queue, messages=messages, put_user="ann" * 60, put_application="app" * 10
    )


def test_a_small_publish_writes_what_a_large_one_writes(db):
    queue_create(name="SMALL", consumer="noop")
    queue_create(name="LARGE", consumer="noop")
    large = KINDS + [NewMessage(payload=b"x")] * (INSERT_MAX_MESSAGES + 1 - len(KINDS))

    small_ids = publish("SMALL", KINDS)
    large_ids = publish("LARGE", large)

    assert small_ids == sorted(small_ids)
    assert rows(small_ids) == rows(large_ids[: len(KINDS)])
    assert rows(small_ids)[0]["put"] == ("ann" * 50, "app" * 9 + "a")
    assert (totals("SMALL")["published"], totals("LARGE")["published"]) == (4, len(large))


def test_a_small_publish_is_announced_once_at_its_commit_and_not_on_a_rollback(db):
    queue = queue_create(name="Q", consumer="noop")
    with psycopg.connect(database_url_for_workers(), autocommit=True) as listener:
        listener.execute(f"LISTEN {WAKE_CHANNEL}")

        publish("Q", KINDS)
        with transaction.atomic():
            publish("Q", KINDS[:1])
            transaction.set_rollback(True)
        with transaction.atomic():
            publish("Q", KINDS[:2])

        heard = [note.payload for note in listener.notifies(timeout=1)]

    assert heard == [str(queue.id), str(queue.id)]
    assert Message.objects.filter(queue=queue).count() == 6


def test_the_queue_a_publish_reads_is_the_one_the_orm_reads(db):
    """The publish reads its queue with a statement of its own; every field
    comes back as the ORM gives it (none needs a converter)."""
    queue_create(
        name="Q",
        consumer="noop",
        batch_size=7,
        max_messages=50,
        overflow="discard_old",
        webhook_timeout=2.5,
        suspect_delay_seconds=0.25,
        paused=True,
    )
    expected = Queue.objects.get(name="Q")

    read = _queue_for_publish("Q")

    assert [getattr(read, f.attname) for f in Queue._meta.concrete_fields] == [
        getattr(expected, f.attname) for f in Queue._meta.concrete_fields
    ]
    assert read.dead_letter_queue == expected.dead_letter_queue is not None
    assert not read._state.adding
