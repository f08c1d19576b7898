"""A courier with nothing to deliver waits for its queue to be announced
(broker.services.delivery: a NOTIFY at the commit of whatever made messages
due), so a message published meanwhile is claimed at once, without a
wake-up task going through Redis; and it gives its process up when another
queue is announced."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import cast

import pytest
import redis
from django.db import connection, transaction

from broker.models import Message, MessageState, Queue
from broker.services.delivery import LISTENER_LOCK_CLASS, RELIANCE_LOCK_CLASS, queue_courier
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from rig.processes import RedisServer, Workers, wait_until
from workers.tasks import deliver, wake

pytestmark = pytest.mark.django_db(transaction=True)


def publish(queue_name: str) -> None:
    messages_publish(queue_name=queue_name, messages=[NewMessage(payload=b"{}")])


def in_thread(work: Callable[[], None]) -> None:
    """``work`` on a connection of its own, as another client would."""

    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def listening_for(queue_name: str) -> bool:
    """A delivery task of the queue waits for its announcements: its session
    holds the queue's listener lock and has run a statement since (LISTEN,
    then a claim), and is idle, which it is only while it waits."""
    queue_id = Queue.objects.get(name=queue_name).id
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.state, a.query FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s"
            " AND l.objsubid = 2",
            [LISTENER_LOCK_CLASS, queue_id],
        )
        return any(
            state == "idle" and "advisory_lock" not in query for state, query in cursor.fetchall()
        )


def delivered(queue_name: str) -> int:
    return Message.objects.filter(queue__name=queue_name, state=MessageState.DELIVERED).count()


def test_a_waiting_courier_hears_each_commit_and_nothing_rolled_back(db):
    queue = queue_create(name="Q", consumer="noop")
    other = queue_create(name="R", consumer="noop")

    def rolled_back() -> None:
        with transaction.atomic():
            publish("Q")
            transaction.set_rollback(True)

    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        with courier.listening() as listener:
            assert listener
            in_thread(lambda: publish("Q"))
            assert courier.wait_announced(time.monotonic() + 5) == queue.id
            in_thread(rolled_back)
            assert courier.wait_announced(time.monotonic() + 0.5) is None
            in_thread(lambda: publish("R"))
            assert courier.wait_announced(time.monotonic() + 5) == other.id


def test_one_courier_a_queue_waits(db):
    queue = queue_create(name="Q", consumer="noop")
    heard: list[bool] = []

    def second_courier() -> None:
        with queue_courier(queue_id=queue.id, worker="test:2") as courier:
            assert courier is not None
            with courier.listening() as listener:
                heard.append(listener)

    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        with courier.listening() as listener:
            assert listener
            in_thread(second_courier)
        in_thread(second_courier)

    # Refused while the first waited; taken once it stopped.
    assert heard == [False, True]


def test_a_successor_takes_the_place_of_the_courier_that_waits(db):
    """A task that has delivered while it waited asks for its successor
    before its time is up; the successor waits for its place rather than
    leave the queue without a listener in between."""
    queue = queue_create(name="Q", consumer="noop")
    heard: list[tuple[bool, float]] = []

    def successor(within: float) -> None:
        with queue_courier(queue_id=queue.id, worker="test:2") as courier:
            assert courier is not None
            started = time.monotonic()
            with courier.listening(take_over_within=within) as listener:
                heard.append((listener, time.monotonic() - started))

    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        with courier.listening() as listener:
            assert listener
            in_thread(lambda: successor(0.2))
            waiting = threading.Thread(target=in_thread, args=(lambda: successor(10.0),))
            waiting.start()
            time.sleep(0.5)
        waiting.join()

    [(too_soon, _), (taken, after)] = heard
    assert not too_soon
    assert taken
    # It had its place once the first courier left it, not at its deadline.
    assert 0.3 < after < 5


@pytest.fixture
def quiet_workers(start_workers: Callable[..., Workers]) -> Callable[..., Workers]:
    """Workers whose delivery tasks wait 10 s for more, and whose dispatch
    (the scan that wakes every queue with due messages) runs only at start."""

    def start(concurrency: int = 2) -> Workers:
        return start_workers(
            concurrency=concurrency,
            LAZARETTO_DELIVERY_TASK_SECONDS="10",
            LAZARETTO_DISPATCH_INTERVAL_SECONDS="3600",
        )

    return start


def test_a_message_published_while_a_worker_waits_needs_no_wake_up_task(quiet_workers, monkeypatch):
    queue_create(name="Q", consumer="noop")
    quiet_workers()
    publish("Q")
    wait_until(lambda: delivered("Q") == 1, timeout=30, what="the first message delivered")

    # No wake-up task this time: only the announcement can bring it.
    monkeypatch.setattr("workers.tasks.wake", lambda **kwargs: None)
    publish("Q")

    wait_until(lambda: delivered("Q") == 2, timeout=5, what="the second message delivered")


@pytest.mark.parametrize("second_wake_up", [False, True], ids=["alone", "second-wake-up-behind"])
def test_a_waiting_worker_gives_its_process_up_to_another_queue(quiet_workers, second_wake_up):
    """One process: while its task waits on Q, R's wake-up task waits for
    it. With a second wake-up of Q queued behind the waiting task (as a
    dispatch that saw Q's message due sends), that one finds nothing when
    R is announced and must not wait in its turn, deaf to R's announcement,
    ahead of R's task."""
    queue = queue_create(name="Q", consumer="noop")
    queue_create(name="R", consumer="noop")
    quiet_workers(concurrency=1)
    publish("Q")
    wait_until(lambda: delivered("Q") == 1, timeout=30, what="Q's message delivered")
    wait_until(lambda: listening_for("Q"), timeout=30, what="Q's task waiting")
    if second_wake_up:
        wake(queue_id=queue.id, lease_seconds=queue.lease_seconds)

    started = time.monotonic()
    publish("R")
    wait_until(lambda: delivered("R") == 1, timeout=30, what="R's message delivered")

    # Well within the 10 s a task of Q would otherwise have waited.
    assert time.monotonic() - started < 5


def tasks_queued(server: RedisServer) -> int:
    """Delivery tasks waiting in the broker (one list per priority)."""
    client = redis.Redis.from_url(server.url)
    return sum(cast(int, client.llen(key)) for key in client.scan_iter("deliveries*"))


def test_a_publish_wake_up_is_coalesced_with_the_one_pending(redis_server, settings):
    """Publishes made while a publish's wake-up task has yet to start send
    none of their own: that task, once started, delivers their messages
    too; a publish after it started sends its own."""
    settings.LAZARETTO_DELIVERY_TASK_SECONDS = 0.3
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    for _ in range(3):
        publish("Q")
    assert tasks_queued(redis_server) == 1

    deliver(queue.id, coalesced=True)  # as a worker runs the task

    assert delivered("Q") == 3
    publish("Q")
    assert tasks_queued(redis_server) == 2


def test_a_pending_wake_up_holds_publishes_back_for_a_second_at_most(redis_server, monkeypatch):
    """A pending task lost with its worker or its Redis never starts: its
    mark lapses, and the next publish sends a task again."""
    monkeypatch.setattr("workers.tasks.WAKE_PENDING_SECONDS", 0.5)
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    publish("Q")
    publish("Q")
    assert tasks_queued(redis_server) == 1
    client = redis.Redis.from_url(redis_server.url)
    wait_until(
        lambda: not client.exists(f"lazaretto:wake-pending:{queue.id}"),
        timeout=5,
        what="the pending wake-up's mark lapsed",
    )
    publish("Q")
    assert tasks_queued(redis_server) == 2


def test_a_publish_sends_no_wake_up_task_while_a_courier_waits_for_its_queue(db, monkeypatch):
    """One batch published while the queue's courier waits is left to the
    courier; before it says it waits, after any statement of its since, or
    for more than one batch, a publish wakes a task as before."""
    queue = queue_create(name="Q", consumer="noop", batch_size=2)
    woken: list[int] = []
    monkeypatch.setattr("workers.tasks.wake", lambda **kwargs: woken.append(kwargs.get("tasks", 1)))

    def publish_after(seconds: float, count: int = 1) -> threading.Thread:
        def run() -> None:
            time.sleep(seconds)
            messages_publish(
                queue_name="Q", messages=[NewMessage(payload=b"{}") for _ in range(count)]
            )

        thread = threading.Thread(target=in_thread, args=(run,))
        thread.start()
        return thread

    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        with courier.listening() as listener:
            assert listener
            publish_after(0).join()  # listening, but not waiting yet
            assert woken == [1]

            publisher = publish_after(0.3)
            assert courier.wait_announced(time.monotonic() + 5) == queue.id
            publisher.join()
            assert woken == [1]  # the courier was waiting: no wake-up

            publisher = publish_after(0.3, count=3)
            assert courier.wait_announced(time.monotonic() + 5) == queue.id
            publisher.join()
            assert woken == [1, 2]  # two batches: the second needs a task

            # Claiming, the courier no longer waits.
            assert courier.deliver(suspects=False).claimed == 2
            publish_after(0).join()
            assert woken == [1, 2, 1]


def test_a_courier_that_stops_waiting_looks_again_once_those_who_relied_on_it_commit(
    db, monkeypatch
):
    """A publish that relied on the courier's waiting holds the queue's
    reliance lock, shared, until it commits. The courier, leaving, waits for
    it, then finds its message due, for which the task has another woken."""
    queue = queue_create(name="Q", consumer="noop")
    monkeypatch.setattr("workers.tasks.wake", lambda **kwargs: None)
    relying = threading.Event()

    def relying_publish() -> None:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock_shared(%s, %s)", [RELIANCE_LOCK_CLASS, queue.id]
                )
            publish("Q")
            relying.set()
            time.sleep(0.5)

    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        with courier.listening() as listener:
            assert listener
            assert courier.wait_announced(time.monotonic() + 0.1) is None
            publisher = threading.Thread(target=in_thread, args=(relying_publish,))
            publisher.start()
            assert relying.wait(5)
            leaving = time.monotonic()
        left = time.monotonic() - leaving
        publisher.join()

    assert courier.due_on_leaving
    assert left >= 0.3  # it waited for the commit


def test_a_courier_that_never_said_it_waits_hands_nothing_on(db):
    """No publish can have relied on it: it leaves its due message to the
    wake-up that publish sent, without waiting for the reliance lock."""
    queue = queue_create(name="Q", consumer="noop")
    publish("Q")
    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        with courier.listening() as listener:
            assert listener
        assert not courier.due_on_leaving


def test_a_publish_takes_the_reliance_lock_before_it_looks_for_a_waiting_courier(db):
    """A courier that stops waiting holds the lock: a publish that would
    look meanwhile waits for it, and then finds no courier waiting."""
    queue = queue_create(name="Q", consumer="noop")
    finished: list[float] = []

    def timed_publish() -> None:
        publish("Q")
        finished.append(time.monotonic())

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", [RELIANCE_LOCK_CLASS, queue.id])
        publisher = threading.Thread(target=in_thread, args=(timed_publish,))
        publisher.start()
        time.sleep(0.4)
        released = time.monotonic()
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [RELIANCE_LOCK_CLASS, queue.id])
    publisher.join()

    [done] = finished
    assert done >= released
