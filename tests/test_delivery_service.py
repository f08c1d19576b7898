"""The delivery, sweeper and quarantine services, called in-process against
the real database. Worker deaths are simulated the way PostgreSQL sees them:
a lease whose advisory lock nobody holds."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
import redis
from django.utils import timezone

from broker.errors import IllegalTransition
from broker.models import AuditEvent, Message, MessageState, Queue
from broker.services.delivery import _claim, queue_deliver
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.sweeper import messages_sweep
from broker.services.transitions.blacklist import message_purge, message_release
from broker.services.transitions.in_flight import messages_ack
from tests.harness import database_url_for_workers

pytestmark = pytest.mark.django_db(transaction=True)
S = MessageState


@pytest.fixture(autouse=True)
def dumps(settings, tmp_path: Path) -> Path:
    settings.DUMP_DIR = tmp_path / "dumps"
    return settings.DUMP_DIR


def publish(queue: Queue, count: int, payload: bytes = b"{}", **headers: str) -> list[int]:
    return messages_publish(
        queue_name=queue.name, messages=[NewMessage(payload=payload, headers=headers)] * count
    )


def lease(queue: Queue, limit: int, owner: str = "host:1:12345") -> list[int]:
    """Claim like a worker that then died: its lock (token 12345) is not held."""
    claimed = [message.id for message in _claim(queue, owner, suspect=False, limit=limit)]
    assert claimed, "nothing to claim"
    return claimed


def test_a_batch_is_claimed_delivered_and_acknowledged(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    publish(queue, 25)

    first = queue_deliver(queue_id=queue.id, worker="test:1")

    assert (first.claimed, first.acked, first.isolated) == (10, 10, False)
    assert Message.objects.filter(state=S.DELIVERED).count() == 10
    assert not Message.objects.filter(state=S.DELIVERED).exclude(lease_owner="").exists()


def test_higher_priority_goes_first(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=1)
    [low] = messages_publish(queue_name="Q", messages=[NewMessage(payload=b"a", priority=1)])
    [high] = messages_publish(queue_name="Q", messages=[NewMessage(payload=b"b", priority=8)])

    queue_deliver(queue_id=queue.id)

    assert Message.objects.get(id=high).state == S.DELIVERED
    assert Message.objects.get(id=low).state == S.TO_BE_DELIVERED


def test_paused_queues_and_queues_without_consumer_deliver_nothing(db):
    paused = queue_create(name="P", consumer="noop", paused=True)
    idle = queue_create(name="I")
    publish(paused, 3)
    publish(idle, 3)

    assert queue_deliver(queue_id=paused.id).claimed == 0
    assert queue_deliver(queue_id=idle.id).claimed == 0
    assert Message.objects.filter(state=S.TO_BE_DELIVERED).count() == 6


def test_a_handler_error_retries_with_exponential_backoff(db):
    queue = queue_create(name="Q", consumer="demo", retry_backoff_seconds=10)
    [message_id] = publish(queue, 1, payload=b"FAIL")

    before = timezone.now()
    outcome = queue_deliver(queue_id=queue.id)

    assert outcome.retried == 1
    message = Message.objects.get(id=message_id)
    assert message.state == S.TO_BE_DELIVERED
    assert "the payload says FAIL" in message.last_error
    assert before + timedelta(seconds=9) < message.available_at < before + timedelta(seconds=12)
    Message.objects.filter(id=message_id).update(available_at=timezone.now())
    queue_deliver(queue_id=queue.id)
    message.refresh_from_db()
    assert message.available_at > timezone.now() + timedelta(seconds=18)  # 10 * 2


def test_a_late_answer_after_the_sweeper_took_the_message_back_is_dropped(db):
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = publish(queue, 1)
    lease(queue, 1, owner="host:1:777")
    Message.objects.filter(id=message_id).update(lease_owner="host:2:888")  # someone else's now

    assert messages_ack(message_ids=[message_id], owner="host:1:777") == 0
    assert Message.objects.get(id=message_id).state == S.DELIVERING


def test_the_sweeper_requeues_the_batch_of_a_dead_worker_as_suspects(db):
    queue = queue_create(name="Q", consumer="noop")
    publish(queue, 5)
    ids = lease(queue, 5)

    result = messages_sweep()

    assert sorted(result.requeued) == sorted(ids)
    for message in Message.objects.filter(id__in=ids):
        assert (message.state, message.crash_count, message.suspect) == (S.TO_BE_DELIVERED, 1, True)
        assert message.last_error == "the delivering worker died"


def test_the_sweeper_leaves_a_live_delivery_alone(db):
    queue = queue_create(name="Q", consumer="noop")
    publish(queue, 3)
    ids = lease(queue, 3, owner="host:1:4242")
    # Another session (the "worker") holds the lease's advisory lock.
    with psycopg.connect(database_url_for_workers(), autocommit=True) as worker:
        worker.execute("SELECT pg_advisory_lock(4242)")

        assert not messages_sweep().found

        assert Message.objects.filter(id__in=ids, state=S.DELIVERING).count() == 3
    # The worker's session is gone: now it is a crash.
    assert sorted(messages_sweep().requeued) == sorted(ids)


def test_the_sweeper_takes_back_a_live_delivery_whose_lease_expired(db):
    queue = queue_create(name="Q", consumer="noop")
    publish(queue, 1)
    [message_id] = lease(queue, 1, owner="host:1:4243")
    Message.objects.filter(id=message_id).update(
        lease_deadline=timezone.now() - timedelta(seconds=1)
    )
    with psycopg.connect(database_url_for_workers(), autocommit=True) as worker:
        worker.execute("SELECT pg_advisory_lock(4243)")

        assert messages_sweep().requeued == [message_id]

    assert Message.objects.get(id=message_id).last_error == "the delivery outlived its lease"


def test_a_second_crash_blacklists_the_message_and_dumps_it(db, dumps):
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = messages_publish(
        queue_name="Q",
        messages=[NewMessage(payload=b"\x00poison", headers={"k": "v"}, content_type="x/y")],
    )
    lease(queue, 1)
    messages_sweep()
    Message.objects.filter(id=message_id).update(suspect=False)  # let the batch claim take it
    lease(queue, 1)

    result = messages_sweep()

    assert result.quarantined == [message_id]
    message = Message.objects.get(id=message_id)
    assert (message.state, message.crash_count) == (S.NOT_DELIVERABLE, 2)
    assert Path(message.dump_path) == dumps / f"queue-{queue.id}" / f"message-{message_id}.json"
    dump = json.loads(Path(message.dump_path).read_text())
    assert dump["payload_base64"] == "AHBvaXNvbg=="
    assert (dump["headers"], dump["content_type"], dump["queue"]) == ({"k": "v"}, "x/y", "Q")
    event = AuditEvent.objects.get(action="message_quarantine")
    assert (event.message_id, event.actor_name) == (message_id, "system")
    assert event.details["dump_path"] == message.dump_path


def test_the_poison_limit_blacklists_after_that_many_unacknowledged_attempts(db):
    queue = queue_create(name="Q", consumer="noop", crash_threshold=10, poison_limit=3)
    [message_id] = publish(queue, 1)
    Message.objects.filter(id=message_id).update(attempts=2)
    lease(queue, 1)  # attempt 3

    assert messages_sweep().quarantined == [message_id]
    assert "poison limit 3" in AuditEvent.objects.get(message_id=message_id).reason


def test_suspects_are_delivered_alone_one_at_a_time(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=10, suspect_delay_seconds=5)
    publish(queue, 3)
    suspects = lease(queue, 3)
    messages_sweep()
    publish(queue, 4)

    first = queue_deliver(queue_id=queue.id)
    second = queue_deliver(queue_id=queue.id)

    assert (first.claimed, first.isolated) == (1, True)
    # The throttle holds the next suspect back; innocent messages still flow.
    assert (second.claimed, second.isolated) == (4, False)
    assert Message.objects.filter(id__in=suspects, state=S.DELIVERED).count() == 1
    Queue.objects.filter(id=queue.id).update(suspect_next_at=None)
    assert queue_deliver(queue_id=queue.id).isolated


def test_two_suspects_of_a_queue_are_never_in_flight_together(db):
    queue = queue_create(name="Q", consumer="noop", suspect_delay_seconds=0)
    publish(queue, 2)
    lease(queue, 2)
    messages_sweep()
    from broker.services.delivery import _claim_suspect

    first = _claim_suspect(queue, "host:1:1")
    Queue.objects.filter(id=queue.id).update(suspect_next_at=None)

    assert len(first) == 1
    assert _claim_suspect(queue, "host:1:2") == []


def test_a_queue_without_a_dead_letter_queue_blacklists_exhausted_messages(db):
    queue = queue_create(name="Q", consumer="demo", retry_limit=0, dead_letter_queue=None)
    [message_id] = publish(queue, 1, payload=b"FAIL")

    queue_deliver(queue_id=queue.id)

    message = Message.objects.get(id=message_id)
    assert message.state == S.NOT_DELIVERABLE
    assert "no dead-letter queue" in AuditEvent.objects.get(message_id=message_id).reason


def test_an_operator_purges_a_blacklisted_message_and_the_audit_keeps_it(db, operator):
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = publish(queue, 1)
    lease(queue, 1)
    Message.objects.filter(id=message_id).update(crash_count=1)
    messages_sweep()
    dump = Message.objects.get(id=message_id).dump_path

    message_purge(message_id=message_id, actor=operator, reason="known bad order")

    assert not Message.objects.filter(id=message_id).exists()
    event = AuditEvent.objects.get(action="message_purge")
    assert (event.message_id, event.queue_name, event.actor_name) == (message_id, "Q", "oscar")
    assert (event.reason, event.details["dump_path"]) == ("known bad order", dump)


def test_purge_and_release_refuse_messages_that_are_not_blacklisted(db, operator):
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = publish(queue, 1)

    with pytest.raises(IllegalTransition, match="only blacklisted"):
        message_purge(message_id=message_id, actor=operator)
    with pytest.raises(IllegalTransition, match="is TBDL"):
        message_release(message_id=message_id, actor=operator)
    assert Message.objects.get(id=message_id).state == S.TO_BE_DELIVERED


@pytest.mark.django_db  # inside a test transaction, so the commit can be held back
def test_publishing_wakes_delivery_only_after_commit(
    db, redis_server, django_capture_on_commit_callbacks
):
    queue = queue_create(name="Q", consumer="noop", batch_size=100)
    client = redis.Redis.from_url(redis_server.url)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        publish(queue, 250)
    assert client.llen("deliveries") == 0
    for callback in callbacks:
        callback()

    assert client.llen("deliveries") == 3  # one task per batch of the backlog


def test_publishing_succeeds_while_redis_is_down(
    db, redis_server, django_capture_on_commit_callbacks
):
    queue = queue_create(name="Q", consumer="noop")
    redis_server.stop()

    with django_capture_on_commit_callbacks(execute=True):
        ids = publish(queue, 5)

    assert Message.objects.filter(id__in=ids, state=S.TO_BE_DELIVERED).count() == 5
