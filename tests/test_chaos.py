"""Chaos: worker processes SIGKILLed every 2 s while 5,000 messages flow."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import pytest

from broker.models import Message, MessageState, Queue
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from rig.processes import Workers, wait_until

pytestmark = pytest.mark.slow
S = MessageState

MESSAGES = 5000
KILL_EVERY = 2.0
KILL_FOR = 30.0


def test_random_kills_lose_nothing_and_blacklist_only_the_poison(start_workers):
    queue = chaos_queue()
    workers = start_workers(concurrency=4)
    poison_at = {1234, 3456}
    ids = published_with_poison_at(queue, poison_at)
    poison = {ids[n] for n in poison_at}

    kills = delivery_processes_killed_at_random(workers)

    wait_until(
        lambda: Message.objects.filter(
            queue=queue, state__in=[S.DELIVERED, S.NOT_DELIVERABLE]
        ).count()
        == MESSAGES,
        timeout=180,
        interval=0.5,
        what="every message delivered or blacklisted",
    )
    blacklisted = set(
        Message.objects.filter(queue=queue, state=S.NOT_DELIVERABLE).values_list("id", flat=True)
    )
    assert blacklisted == poison
    deliveries = Counter(record["id"] for record in workers.records())
    assert set(deliveries) == set(ids), "a message was never handed to the consumer"
    duplicated = {message_id for message_id, n in deliveries.items() if n > 1} - poison
    crashed = set(
        Message.objects.filter(queue=queue, crash_count__gt=0).values_list("id", flat=True)
    )
    print(
        f"\nchaos: {kills} kills, {len(crashed - poison)} innocent messages in flight at a kill, "
        f"{len(duplicated)} delivered more than once "
        f"({sum(deliveries[i] - 1 for i in duplicated)} extra deliveries)"
    )
    assert kills >= 14
    # A duplicate only for a message that was in flight when its worker died.
    assert duplicated <= crashed


def chaos_queue() -> Queue:
    """Every message takes 20 ms, so 4 processes need about 25 s: the kills
    land on real deliveries. Small batches and a crash threshold of 3: a
    random kill may also hit an innocent suspect while it is delivered alone,
    and an innocent should need a third such coincidence to be blacklisted."""
    return queue_create(
        name="CHAOS.Q", consumer="demo", batch_size=5, crash_threshold=3, suspect_delay_seconds=0.02
    )


def published_with_poison_at(queue: Queue, poison_at: set[int]) -> list[int]:
    """MESSAGES messages of 20 ms each, published 1,000 at a time; those at
    the positions ``poison_at`` crash their worker."""
    ids: list[int] = []
    for start in range(0, MESSAGES, 1000):
        ids += messages_publish(
            queue_name=queue.name,
            messages=[
                NewMessage(
                    payload=b"CRASH" if n in poison_at else f"m{n}".encode(),
                    headers={"sleep-seconds": "0.02"},
                )
                for n in range(start, start + 1000)
            ],
        )
    return ids


def delivery_processes_killed_at_random(workers: Workers) -> int:
    """A delivery process SIGKILLed every KILL_EVERY seconds for KILL_FOR
    seconds; how many were killed."""
    kills = 0
    started = time.monotonic()
    rng = random.Random(7)
    while time.monotonic() - started < KILL_FOR:
        time.sleep(KILL_EVERY)
        pool = workers.delivery_processes()
        if pool:
            os.kill(rng.choice(pool), signal.SIGKILL)
            kills += 1
    return kills
