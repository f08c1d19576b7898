"""Delivery one step at a time, in this process: claims, couriers, sweeper, quarantine."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
import redis
from django.utils import timezone

from broker.consumers import Delivery
from broker.errors import IllegalTransition
from broker.models import AuditEvent, Message, MessageState, PoisonAlarm, Queue
from broker.services.delivery import (
    HEAD_CLAIM_COST_FACTOR,
    HEAD_CLAIM_SECONDS,
    Courier,
    _claim,
    queue_courier,
    queue_deliver,
)
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.sweeper import messages_sweep, overdue_seconds
from broker.services.transitions.blacklist import message_purge, message_release
from broker.services.transitions.in_flight import messages_ack
from rig.processes import database_url_for_workers, wait_until
from tests.support.databases import scalar
from tests.support.messages import totals
from tests.support.publishing import published
from workers.tasks import PUBLISH_WAKE_PRIORITY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("dumps")]
S = MessageState


# A worker's death is simulated the way PostgreSQL sees it: a lease whose
# advisory lock nobody holds.
def lease(queue: Queue, limit: int, owner: str = "host:1:12345") -> list[int]:
    """Claim like a worker that then died: its lock (token 12345) is not held."""
    claimed = [message.id for message in _claim(queue, owner, suspect=False, limit=limit)]
    assert claimed, "nothing to claim"
    return claimed


@contextmanager
def courier_of(queue: Queue) -> Iterator[Courier]:
    """The queue's courier, as worker test:1 holds it while it delivers."""
    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        yield courier


def test_a_batch_is_claimed_delivered_and_acknowledged(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    published(queue, 25)

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
    published(paused, 3)
    published(idle, 3)

    assert queue_deliver(queue_id=paused.id).claimed == 0
    assert queue_deliver(queue_id=idle.id).claimed == 0
    assert Message.objects.filter(state=S.TO_BE_DELIVERED).count() == 6


def test_a_handler_error_retries_with_exponential_backoff(db):
    queue = queue_create(name="Q", consumer="demo", retry_backoff_seconds=10)
    [message_id] = published(queue, 1, NewMessage(payload=b"FAIL"))

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


def test_a_courier_that_goes_on_claims_its_next_batch_with_the_ack(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    published(queue, 25)
    in_flight = Message.objects.filter(state=S.DELIVERING)

    with courier_of(queue) as courier:
        first = courier.deliver(claim_next=True)
        assert first.acked == 10
        assert sorted(in_flight.values_list("id", flat=True)) == [
            message.id for message in courier.claimed_next
        ]
        assert set(in_flight.values_list("lease_owner", flat=True)) == {courier.owner}
        second = courier.deliver(claim_next=False)
        third = courier.deliver(claim_next=False)

    assert (second.claimed, second.acked, third.acked) == (10, 10, 5)
    assert Message.objects.filter(state=S.DELIVERED).count() == 25
    assert not in_flight.exists()


def test_the_consumer_gets_each_message_as_published_whichever_claim_brought_it(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=2)
    sent = [
        NewMessage(
            payload=bytes(range(256)),
            content_type="application/x-raw",
            headers={"kind": "binary", "naïve": 'ü\\n"{}"'},
        ),
        NewMessage(payload=b"", content_type="text/plain"),
        NewMessage(payload=b"{}", content_type="application/json", headers={"n": "3"}),
    ]
    ids = messages_publish(queue_name="Q", messages=sent)
    seen: list[Delivery] = []

    with courier_of(queue) as courier:
        courier.handler = seen.append
        courier.deliver(claim_next=True)  # the first claim; its ack claims the next batch
        courier.deliver(claim_next=False)

    assert [(d.message_id, d.payload, d.content_type, d.headers, d.attempt) for d in seen] == [
        (message_id, m.payload, m.content_type, dict(m.headers), 1)
        for message_id, m in zip(ids, sent, strict=True)
    ]
    assert all(isinstance(d.payload, bytes) for d in seen)


def test_a_batch_with_a_handler_error_is_settled_and_the_next_one_claimed_together(db):
    queue = queue_create(name="Q", consumer="demo", batch_size=3, retry_backoff_seconds=10)
    failing, *fine = published(queue, 1, NewMessage(payload=b"FAIL")) + published(queue, 4)

    with courier_of(queue) as courier:
        first = courier.deliver(claim_next=True)
        claimed_next = [message.id for message in courier.claimed_next]
        second = courier.deliver(claim_next=False)

    assert (first.acked, first.retried, second.acked) == (2, 1, 2)
    assert claimed_next == fine[2:]
    assert Message.objects.get(id=failing).state == S.TO_BE_DELIVERED
    assert Message.objects.filter(state=S.DELIVERED).count() == 4


def publish_urgent() -> int:
    """One message of the highest priority on queue Q."""
    [urgent] = messages_publish(queue_name="Q", messages=[NewMessage(payload=b"{}", priority=9)])
    return urgent


@pytest.fixture
def three_batches(db: None) -> Queue:
    """Queue Q, delivering batches of ten, with thirty messages waiting."""
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    published(queue, 30)
    return queue


def test_a_courier_reads_on_from_its_last_batch_and_from_the_head_once_a_second(three_batches):
    with courier_of(three_batches) as courier:
        courier.deliver()
        urgent = publish_urgent()
        # Read on from the last batch: the message of higher priority,
        # published behind that point, waits...
        assert courier.deliver(claim_next=True).acked == 10
        assert Message.objects.get(id=urgent).state == S.TO_BE_DELIVERED
        # ...until the next claim from the queue's head, a second after the last.
        courier.head.claimed_at -= HEAD_CLAIM_SECONDS
        assert courier.deliver(claim_next=True).acked == 10
        assert [message.id for message in courier.claimed_next] == [urgent]
        courier.deliver()

    assert Message.objects.get(id=urgent).state == S.DELIVERED
    assert Message.objects.filter(state=S.DELIVERED).count() == 31


def test_the_next_courier_of_a_queue_reads_on_where_the_last_one_ended(three_batches):
    with courier_of(three_batches) as courier:
        courier.deliver()
    urgent = publish_urgent()

    with courier_of(three_batches) as courier:
        assert courier.deliver().acked == 10

    assert Message.objects.get(id=urgent).state == S.TO_BE_DELIVERED


def test_a_claim_from_the_head_that_took_long_comes_that_much_less_often(three_batches):
    with courier_of(three_batches) as courier:
        courier.deliver()
        urgent = publish_urgent()
        # The last claim from the head took 0.5 s: the next one comes 5 s after it.
        courier.head.seconds = 0.5
        courier.head.claimed_at -= 4
        assert courier.deliver().acked == 10
        assert Message.objects.get(id=urgent).state == S.TO_BE_DELIVERED
        courier.head.claimed_at -= 1
        assert courier.deliver().acked == 10
        # Timed again: quick, so back to once a second.
        assert courier.head.seconds < HEAD_CLAIM_SECONDS / HEAD_CLAIM_COST_FACTOR

    assert Message.objects.get(id=urgent).state == S.DELIVERED


def test_a_resumed_claim_takes_the_rest_from_the_head_when_its_range_runs_short(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    ids = published(queue, 6)

    claimed = _claim(queue, "host:1:12345", suspect=False, limit=10, after=(4, ids[3]))

    # All six, each once, highest priority first, then oldest.
    assert [message.id for message in claimed] == ids
    assert Message.objects.filter(state=S.DELIVERING).count() == 6


def test_a_resumed_claim_takes_no_more_than_its_limit(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    ids = published(queue, 6)

    claimed = _claim(queue, "host:1:12345", suspect=False, limit=3, after=(4, ids[4]))

    assert [message.id for message in claimed] == [ids[0], ids[1], ids[5]]


def test_a_delivery_task_drains_its_queue_claiming_each_batch_with_the_last_ack(db, settings):
    from workers import tasks

    # Ample for 4 batches; the task then waits for more until the budget ends.
    settings.LAZARETTO_DELIVERY_TASK_SECONDS = 3
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    published(queue, 35)

    tasks.deliver(queue.id)

    assert Message.objects.filter(state=S.DELIVERED).count() == 35
    assert not Message.objects.filter(state=S.DELIVERING).exists()


def test_a_delivery_task_whose_budget_ends_leaves_nothing_claimed(db, settings, monkeypatch):
    from workers import tasks

    settings.LAZARETTO_DELIVERY_TASK_SECONDS = 0
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    published(queue, 25)
    woken: list[int] = []
    monkeypatch.setattr(tasks, "wake", lambda *, queue_id, **_: woken.append(queue_id))

    tasks.deliver(queue.id)

    assert Message.objects.filter(state=S.DELIVERED).count() == 10
    assert Message.objects.filter(state=S.TO_BE_DELIVERED).count() == 15
    assert not Message.objects.filter(state=S.DELIVERING).exists()
    assert woken == [queue.id]


def test_a_late_answer_after_the_sweeper_took_the_message_back_is_dropped(db):
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = published(queue, 1)
    lease(queue, 1, owner="host:1:777")
    Message.objects.filter(id=message_id).update(lease_owner="host:2:888")  # someone else's now

    assert messages_ack(queue_id=queue.id, message_ids=[message_id], owner="host:1:777") == []
    assert Message.objects.get(id=message_id).state == S.DELIVERING


def test_the_sweeper_requeues_the_batch_of_a_dead_worker_as_suspects(db):
    queue = queue_create(name="Q", consumer="noop")
    published(queue, 5)
    ids = lease(queue, 5)

    result = messages_sweep()

    assert sorted(result.requeued) == sorted(ids)
    for message in Message.objects.filter(id__in=ids):
        assert (message.state, message.crash_count, message.suspect) == (S.TO_BE_DELIVERED, 1, True)
        assert message.last_error == "the delivering worker died"


def advisory_lock_free(key: int) -> Callable[[], bool]:
    def free() -> bool:
        return bool(
            scalar(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
                " AND objid = %s AND granted)",
                [key],
            )
        )

    return free


def test_the_sweeper_leaves_a_live_delivery_alone(db):
    queue = queue_create(name="Q", consumer="noop")
    published(queue, 3)
    ids = lease(queue, 3, owner="host:1:4242")
    # Another session (the "worker") holds the lease's advisory lock.
    with psycopg.connect(database_url_for_workers(), autocommit=True) as worker:
        worker.execute("SELECT pg_advisory_lock(4242)")

        assert not messages_sweep().found

        assert Message.objects.filter(id__in=ids, state=S.DELIVERING).count() == 3
    # The worker's session is gone (its backend exits a moment after the
    # connection closes): now it is a crash.
    wait_until(advisory_lock_free(4242), timeout=10, what="the worker's session to end")
    assert sorted(messages_sweep().requeued) == sorted(ids)


def test_the_sweeper_takes_back_a_live_delivery_long_past_its_lease_as_a_timeout(db):
    queue = queue_create(name="Q", consumer="noop")
    published(queue, 2)
    late, recent = lease(queue, 2, owner="host:1:4243")
    # Celery kills a hung task by the loop budget after the lease ends; the
    # sweeper waits that long (and a grace) before it takes back a live one.
    overdue = overdue_seconds()
    Message.objects.filter(id=late).update(
        lease_deadline=timezone.now() - timedelta(seconds=overdue + 1)
    )
    Message.objects.filter(id=recent).update(
        lease_deadline=timezone.now() - timedelta(seconds=overdue - 1)
    )
    with psycopg.connect(database_url_for_workers(), autocommit=True) as worker:
        worker.execute("SELECT pg_advisory_lock(4243)")

        assert messages_sweep().requeued == [late]

    message = Message.objects.get(id=late)
    assert (message.crash_count, message.timeout_count, message.suspect) == (0, 1, True)
    assert message.last_error == "no answer within the lease (30 s)"
    assert Message.objects.get(id=recent).state == S.DELIVERING


def test_a_dead_worker_past_its_lease_timed_out_rather_than_crashed(db):
    queue = queue_create(name="Q", consumer="noop")
    published(queue, 1)
    [message_id] = lease(queue, 1)
    Message.objects.filter(id=message_id).update(
        lease_deadline=timezone.now() - timedelta(seconds=1)
    )

    messages_sweep()

    message = Message.objects.get(id=message_id)
    assert (message.crash_count, message.timeout_count) == (0, 1)


def crash_alone(queue: Queue, owner: str = "host:1:12345") -> int:
    """Claim the next due suspect alone under a lease whose worker is dead."""
    [suspect] = _claim(queue, owner, suspect=True, limit=1)
    return suspect.id


def time_out_alone(queue: Queue) -> int:
    """Claim the next due suspect alone; its lease runs out (the worker was
    killed for hanging)."""
    message_id = crash_alone(queue)
    Message.objects.filter(id=message_id).update(
        lease_deadline=timezone.now() - timedelta(seconds=1)
    )
    return message_id


def test_a_second_crash_blacklists_the_message_and_dumps_it(db, dumps):
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = messages_publish(
        queue_name="Q",
        messages=[NewMessage(payload=b"\x00poison", headers={"k": "v"}, content_type="x/y")],
    )
    lease(queue, 1)
    messages_sweep()
    crash_alone(queue)

    result = messages_sweep()

    assert result.quarantined == [message_id]
    message = Message.objects.get(id=message_id)
    assert (message.state, message.crash_count, message.timeout_count) == (S.NOT_DELIVERABLE, 2, 0)
    assert Path(message.dump_path) == dumps / f"queue-{queue.id}" / f"message-{message_id}.json"
    dump = json.loads(Path(message.dump_path).read_text())
    assert dump["payload_base64"] == "AHBvaXNvbg=="
    assert (dump["headers"], dump["content_type"], dump["queue"]) == ({"k": "v"}, "x/y", "Q")
    assert "queue_webhook_url" not in dump
    event = AuditEvent.objects.get(action="message_quarantine")
    assert (event.message_id, event.actor_name) == (message_id, "system")
    assert event.details["dump_path"] == message.dump_path
    assert "crashed 2 times" in event.reason
    assert "crash threshold 2" in event.reason


def test_with_the_defaults_a_message_that_keeps_timing_out_is_blacklisted_at_the_poison_limit(db):
    queue = queue_create(name="Q", consumer="noop", suspect_delay_seconds=0)
    assert (queue.crash_threshold, queue.poison_limit) == (2, 5)
    [message_id] = published(queue, 1)
    lease(queue, 1)
    Message.objects.filter(id=message_id).update(
        lease_deadline=timezone.now() - timedelta(seconds=1)
    )
    messages_sweep()
    for _ in range(3):
        time_out_alone(queue)
        assert messages_sweep().requeued == [message_id]

    time_out_alone(queue)
    result = messages_sweep()

    assert result.quarantined == [message_id]
    message = Message.objects.get(id=message_id)
    assert (message.state, message.crash_count, message.timeout_count) == (S.NOT_DELIVERABLE, 0, 5)
    event = AuditEvent.objects.get(action="message_quarantine", message_id=message_id)
    assert event.reason == (
        "5 deliveries ended without an answer (0 crashed, 5 timed out; poison limit 5)"
    )


def test_crashes_and_timeouts_add_up_to_the_poison_limit(db):
    queue = queue_create(name="Q", consumer="noop", suspect_delay_seconds=0)
    [message_id] = published(queue, 1)
    lease(queue, 1)
    messages_sweep()  # a crash in its batch: 1 of 5, 1 of 2 crashes
    for _ in range(3):
        time_out_alone(queue)
        assert messages_sweep().requeued == [message_id]
    time_out_alone(queue)

    assert messages_sweep().quarantined == [message_id]
    assert Message.objects.filter(id=message_id).values_list(
        "crash_count", "timeout_count"
    ).get() == (1, 4)


def test_a_suspect_that_keeps_failing_alone_backs_off_more_each_time_up_to_5_s(db):
    queue = queue_create(
        name="Q", consumer="noop", suspect_delay_seconds=1, crash_threshold=20, poison_limit=20
    )
    [message_id] = published(queue, 1)
    lease(queue, 1)
    backoffs = []
    for attempt in range(6):
        if attempt:
            Message.objects.filter(id=message_id).update(available_at=timezone.now())
            time_out_alone(queue)
        messages_sweep()
        message = Message.objects.get(id=message_id)
        backoffs.append(round((message.available_at - message.updated_at).total_seconds(), 3))

    # After its batch crashed: at once; then 1, 2, 4 s, never more than 5 s.
    assert backoffs == [0, 1, 2, 4, 5, 5]


def test_suspects_of_one_queue_are_delivered_alone_by_several_workers_at_once(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    published(queue, 3)
    suspects = lease(queue, 3)
    messages_sweep()
    published(queue, 4)

    first = _claim(queue, "host:1:1", suspect=True, limit=1)
    second = _claim(queue, "host:2:2", suspect=True, limit=1)

    assert len(first) == len(second) == 1
    assert first[0].id != second[0].id
    assert Message.objects.filter(id__in=suspects, state=S.DELIVERING).count() == 2
    # A courier takes the last suspect alone, then the innocent batch.
    third = queue_deliver(queue_id=queue.id)
    assert (third.claimed, third.isolated) == (1, True)
    fourth = queue_deliver(queue_id=queue.id)
    assert (fourth.claimed, fourth.isolated) == (4, False)


def test_a_crash_while_two_suspects_are_in_flight_blames_only_the_dead_workers_one(db):
    queue = queue_create(name="Q", consumer="noop")
    published(queue, 2)
    lease(queue, 2)
    messages_sweep()
    poison = crash_alone(queue, owner="host:1:111")  # its worker died
    with psycopg.connect(database_url_for_workers(), autocommit=True) as worker:
        worker.execute("SELECT pg_advisory_lock(222)")
        innocent = crash_alone(queue, owner="host:2:222")  # alive, still delivering

        result = messages_sweep()

        assert result.quarantined == [poison]
        assert Message.objects.get(id=innocent).state == S.DELIVERING
    assert len(messages_ack(queue_id=queue.id, message_ids=[innocent], owner="host:2:222")) == 1


def test_the_purge_poison_action_deletes_the_message_and_keeps_its_dump_audit_and_alarm(
    db, dumps, caplog
):
    queue = queue_create(name="Q", consumer="noop", poison_action="purge")
    [message_id] = published(queue, 1, NewMessage(payload=b"poison"))
    lease(queue, 1)
    messages_sweep()
    crash_alone(queue)

    with caplog.at_level(logging.WARNING, logger="broker.services.alarms"):
        result = messages_sweep()

    assert (result.purged, result.quarantined) == ([message_id], [])
    assert not Message.objects.filter(id=message_id).exists()
    dump_path = dumps / f"queue-{queue.id}" / f"message-{message_id}.json"
    assert json.loads(dump_path.read_text())["payload_base64"] == "cG9pc29u"
    event = AuditEvent.objects.get(action="message_purge_poison")
    assert (event.message_id, event.queue_name) == (message_id, "Q")
    assert event.details["dump_path"] == str(dump_path)
    alarm = PoisonAlarm.objects.get()
    assert (alarm.action, alarm.message_id, alarm.crash_count) == ("purge", message_id, 2)
    assert alarm.dump_path == str(dump_path)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    for part in (f"message {message_id}", "on Q", "purged", "crash count 2", str(dump_path)):
        assert part in warning.getMessage()
    assert totals("Q")["poisoned"] == 1


def test_every_quarantine_raises_an_alarm_logged_and_counted(db, dumps, caplog):
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = published(queue, 1)
    lease(queue, 1)
    messages_sweep()
    crash_alone(queue)

    with caplog.at_level(logging.WARNING, logger="broker.services.alarms"):
        messages_sweep()

    message = Message.objects.get(id=message_id)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    for part in (
        f"message {message_id}",
        "on Q",
        "quarantined",
        "crash count 2",
        message.dump_path,
    ):
        assert part in warning.getMessage()
    alarm = PoisonAlarm.objects.get()
    assert (alarm.action, alarm.queue_name, alarm.dump_path) == (
        "quarantine",
        "Q",
        message.dump_path,
    )
    assert alarm.notification == "none"
    assert totals("Q")["poisoned"] == 1


def test_a_queue_without_a_dead_letter_queue_blacklists_exhausted_messages(db):
    queue = queue_create(name="Q", consumer="demo", retry_limit=0, dead_letter_queue=None)
    [message_id] = published(queue, 1, NewMessage(payload=b"FAIL"))

    queue_deliver(queue_id=queue.id)

    message = Message.objects.get(id=message_id)
    assert message.state == S.NOT_DELIVERABLE
    assert "no dead-letter queue" in AuditEvent.objects.get(message_id=message_id).reason


def test_an_operator_purges_a_blacklisted_message_and_the_audit_keeps_it(db, operator):
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = published(queue, 1)
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
    [message_id] = published(queue, 1)

    with pytest.raises(IllegalTransition, match="only blacklisted"):
        message_purge(message_id=message_id, actor=operator)
    with pytest.raises(IllegalTransition, match="is TBDL"):
        message_release(message_id=message_id, actor=operator)
    assert Message.objects.get(id=message_id).state == S.TO_BE_DELIVERED


@pytest.mark.slow
@pytest.mark.django_db  # inside a test transaction, so the commit can be held back
def test_publishing_wakes_delivery_only_after_commit(
    db, redis_server, django_capture_on_commit_callbacks
):
    queue = queue_create(name="Q", consumer="noop", batch_size=100)
    client = redis.Redis.from_url(redis_server.url)

    # kombu's list for the deliveries queue's tasks of PUBLISH_WAKE_PRIORITY.
    publish_wake_ups = f"deliveries\x06\x16{PUBLISH_WAKE_PRIORITY}"

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        published(queue, 250)
    assert client.llen(publish_wake_ups) == 0
    for callback in callbacks:
        callback()

    assert client.llen(publish_wake_ups) == 3  # one task per batch of the backlog
    assert client.llen("deliveries") == 0  # where a successor's would go, ahead of them


@pytest.mark.slow
def test_publishing_succeeds_while_redis_is_down(
    db, redis_server, django_capture_on_commit_callbacks
):
    queue = queue_create(name="Q", consumer="noop")
    redis_server.stop()

    with django_capture_on_commit_callbacks(execute=True):
        ids = published(queue, 5)

    assert Message.objects.filter(id__in=ids, state=S.TO_BE_DELIVERED).count() == 5
