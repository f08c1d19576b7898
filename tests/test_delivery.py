"""Delivery with real Celery worker processes, real SIGKILLs, real PostgreSQL
and Redis. The consumer is the ``demo`` handler, steered by payload markers
and headers (see broker/consumers.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from broker.models import AuditEvent, Message, MessageState, Queue
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create, queue_update
from tests.harness import wait_until

pytestmark = pytest.mark.slow
S = MessageState


def states(queue: Queue) -> Counter[str]:
    return Counter(Message.objects.filter(queue=queue).values_list("state", flat=True))


def settled(queue: Queue, count: int) -> bool:
    done = states(queue)
    return done[S.DELIVERED] + done[S.NOT_DELIVERABLE] == count


def publish(queue: Queue, payloads: list[bytes], **headers: str) -> list[int]:
    return messages_publish(
        queue_name=queue.name,
        messages=[NewMessage(payload=payload, headers=headers) for payload in payloads],
    )


def test_a_poison_message_is_blacklisted_and_its_49_batch_mates_delivered(start_workers):
    queue = queue_create(
        name="POISON.Q", consumer="demo", batch_size=50, suspect_delay_seconds=0.05
    )
    workers = start_workers(concurrency=2)
    payloads = [f"order {n}".encode() for n in range(50)]
    payloads[17] = b"order 17 CRASH"

    ids = publish(queue, payloads)

    wait_until(lambda: settled(queue, 50), timeout=60, what="all 50 settled")
    poison = Message.objects.get(id=ids[17])
    assert poison.state == S.NOT_DELIVERABLE
    assert poison.crash_count == queue.crash_threshold == 2
    dump = json.loads(Path(poison.dump_path).read_text())
    assert dump["id"] == poison.id
    assert dump["payload_base64"] == "b3JkZXIgMTcgQ1JBU0g="
    assert poison.dump_path.startswith(str(workers.dump_dir))
    event = AuditEvent.objects.get(action="message_quarantine", message_id=poison.id)
    assert "crashed 2 times" in event.reason
    innocents = Message.objects.filter(queue=queue).exclude(id=poison.id)
    assert innocents.filter(state=S.DELIVERED).count() == 49
    assert not innocents.filter(state=S.NOT_DELIVERABLE).exists()
    assert not innocents.filter(suspect=True).exists()

    # The pool lost a process twice and still delivers.
    more = publish(queue, [b"after"] * 10)
    wait_until(
        lambda: Message.objects.filter(id__in=more, state=S.DELIVERED).count() == 10,
        timeout=30,
        what="deliveries after the crashes",
    )


def test_a_sigkilled_batch_comes_back_as_suspects_delivered_alone_in_parallel(start_workers):
    queue = queue_create(name="SLOW.Q", consumer="demo", batch_size=20, suspect_delay_seconds=0.1)
    workers = start_workers(concurrency=2)
    ids = publish(queue, [f"slow {n}".encode() for n in range(20)], **{"sleep-seconds": "0.25"})
    wait_until(lambda: states(queue)[S.DELIVERING] == 20, timeout=30, what="the batch in flight")
    owner = Message.objects.filter(id=ids[0]).values_list("lease_owner", flat=True).get()
    pid = int(owner.split(":")[1])
    assert pid in workers.delivery_processes()
    time.sleep(0.6)  # a few deliveries into the batch

    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    # Hold redelivery back so every suspect can be seen waiting in TBDL.
    queue_update(queue=queue, paused=True)

    wait_until(
        lambda: Message.objects.filter(
            id__in=ids, state=S.TO_BE_DELIVERED, crash_count=1, suspect=True
        ).count()
        == 20,
        timeout=10,
        what="all 20 back in TBDL as suspects",
    )
    assert time.monotonic() - killed_at < 5

    queue_update(queue=queue, paused=False)
    wait_until(lambda: settled(queue, 20), timeout=60, what="the suspects delivered")
    assert states(queue) == Counter({S.DELIVERED: 20})
    assert not Message.objects.filter(id__in=ids, suspect=True).exists()
    redeliveries = [r for r in workers.records() if r["isolated"]]
    assert sorted(r["id"] for r in redeliveries) == sorted(ids)
    # Alone, but on both processes at once: some isolated deliveries of the
    # two processes began less than one delivery (0.25 s) apart.
    assert len({r["pid"] for r in redeliveries}) == 2
    starts = sorted((r["time"], r["pid"]) for r in redeliveries)
    assert any(b[0] - a[0] < 0.25 and a[1] != b[1] for a, b in pairwise(starts))


def test_a_handler_that_fails_three_times_then_succeeds_is_delivered_on_attempt_4(
    start_workers,
):
    queue = queue_create(name="FLAKY.Q", consumer="demo", retry_backoff_seconds=0.05)
    start_workers()

    [flaky] = publish(queue, [b"flaky"], **{"fail-attempts": "3"})
    [broken] = publish(queue, [b"always FAIL"])

    wait_until(
        lambda: Message.objects.filter(id=flaky, state=S.DELIVERED).exists(),
        timeout=30,
        what="the flaky message delivered",
    )
    assert Message.objects.get(id=flaky).attempts == 4
    dead = wait_until(
        lambda: Message.objects.filter(id=broken, queue__name="SYSTEM.DEAD.LETTER.QUEUE").first(),
        timeout=30,
        what="the broken message dead-lettered",
    )
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

    [hung] = publish(queue, [b"HANG"])

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
    before = publish(queue, [b"before"] * 50)
    redis_server.stop()

    started = time.monotonic()
    during = []
    while time.monotonic() - started < 10:
        during += publish(queue, [b"during"] * 20)
        time.sleep(0.5)
    redis_server.start()
    after = publish(queue, [b"after"] * 50)

    total = len(before) + len(during) + len(after)
    wait_until(lambda: settled(queue, total), timeout=90, what="every message delivered")
    assert states(queue) == Counter({S.DELIVERED: total})


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_message_the_json_handler_cannot_decode_is_dead_lettered_as_format_error(
    start_workers, payload
):
    queue = queue_create(name="JSON.Q", consumer="json")
    start_workers()

    [message_id] = publish(queue, [payload])

    dead = wait_until(
        lambda: Message.objects.filter(
            id=message_id, queue__name="SYSTEM.DEAD.LETTER.QUEUE"
        ).first(),
        timeout=30,
        what="the undecodable message dead-lettered",
    )
    assert (dead.dead_letter or {})["reason"] == "format_error"
    assert (dead.attempts, dead.crash_count) == (1, 0)
