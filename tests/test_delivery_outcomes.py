"""With real workers: where a message ends after retries, a hang, a format error, a Redis outage."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from broker.models import AuditEvent, Message, MessageState
from broker.services.queues import queue_create
from rig.processes import wait_until
from tests.support.messages import on_the_dead_letter_queue, settled, states
from tests.support.publishing import published_each

pytestmark = pytest.mark.slow
S = MessageState


# Real Celery worker processes, PostgreSQL and Redis. The consumer is the
# ``demo`` handler, steered by payload markers and headers (see
# broker/consumers.py); a consumer that crashes is test_delivery_crashes.py's.


def test_a_handler_that_fails_three_times_then_succeeds_is_delivered_on_attempt_4(
    start_workers,
):
    queue = queue_create(name="FLAKY.Q", consumer="demo", retry_backoff_seconds=0.05)
    start_workers()

    [flaky] = published_each(queue, [b"flaky"], **{"fail-attempts": "3"})
    [broken] = published_each(queue, [b"always FAIL"])

    wait_until(
        lambda: Message.objects.filter(id=flaky, state=S.DELIVERED).exists(),
        timeout=30,
        what="the flaky message delivered",
    )
    assert Message.objects.get(id=flaky).attempts == 4
    dead = on_the_dead_letter_queue(broken, what="the broken message dead-lettered")
    assert dead.attempts == queue.retry_limit + 1
    header = dead.dead_letter or {}
    assert header["reason"] == "handler_error"
    assert header["original_queue"] == "FLAKY.Q"
    assert "the payload says FAIL" in header["error"]


def test_a_message_that_hangs_its_consumer_is_blacklisted_at_the_poison_limit(start_workers):
    # The defaults but a short lease: crash threshold 2, poison limit 5. A hung
    # delivery is killed by Celery's time limit after its lease: a timeout,
    # not a crash, so the crash threshold never fires; the fifth unanswered
    # delivery reaches the poison limit.
    queue = queue_create(name="HANG.Q", consumer="demo", lease_seconds=1)
    workers = start_workers()
    pool_before = set(workers.delivery_processes())

    [hung] = published_each(queue, [b"HANG"])

    message = wait_until(
        lambda: Message.objects.filter(id=hung, state=S.NOT_DELIVERABLE).first(),
        timeout=90,
        what="the hanging message blacklisted",
    )
    assert (message.crash_count, message.timeout_count) == (0, queue.poison_limit) == (0, 5)
    assert message.last_error == "no answer within the lease (1 s)"
    event = AuditEvent.objects.get(action="message_quarantine", message_id=hung)
    assert "poison limit 5" in event.reason
    assert "Hard time limit" in workers.log("deliveries")
    assert pool_before - set(workers.delivery_processes()), "no pool process was replaced"
    assert Counter(r["id"] for r in workers.records())[hung] == 5


def test_messages_published_while_redis_is_down_are_delivered_when_it_returns(
    start_workers, redis_server
):
    queue = queue_create(name="OUTAGE.Q", consumer="demo", batch_size=25)
    start_workers()
    before = published_each(queue, [b"before"] * 50)
    redis_server.stop()

    started = time.monotonic()
    during = []
    while time.monotonic() - started < 10:
        during += published_each(queue, [b"during"] * 20)
        time.sleep(0.5)
    redis_server.start()
    after = published_each(queue, [b"after"] * 50)

    total = len(before) + len(during) + len(after)
    wait_until(lambda: settled(queue, total), timeout=90, what="every message delivered")
    assert states(queue) == Counter({S.DELIVERED: total})


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_message_the_json_handler_cannot_decode_is_dead_lettered_as_format_error(
    start_workers, payload
):
    queue = queue_create(name="JSON.Q", consumer="json")
    start_workers()

    [message_id] = published_each(queue, [payload])

    dead = on_the_dead_letter_queue(message_id, what="the undecodable message dead-lettered")
    assert (dead.dead_letter or {})["reason"] == "format_error"
    assert (dead.attempts, dead.crash_count) == (1, 0)
