"""Alert thresholds crossed by real traffic, watched by real Celery workers
(the control worker's check every second, beat, the delivery workers) and
posted to real webhook receivers on 127.0.0.1: a paused consumer, a failing
one, a dead-letter burst, a crashing one, and a receiver that refuses
connections for 30 s."""

from __future__ import annotations

import time
from functools import partial

import pytest

from broker.models import AlertCondition, Message, MessageState, Queue, QueueAlert
from broker.services.publish import NewMessage
from broker.services.queues import queue_create, queue_pause, queue_update
from broker.services.transitions.blacklist import messages_fail
from rig.processes import free_port, wait_until
from tests.support.console import logged_in
from tests.support.publishing import published
from tests.support.webhooks import Post, WebhookServer, verified

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
C = AlertCondition
SECRET = "alert-secret-5e8b0d17"
# The acceptance bound: an episode fires (or resolves) within this many
# seconds of its reading crossing its threshold (or going back).
WITHIN = 5.0


def within(queue: Queue, condition: str, since: float, *, ended: bool = False) -> float:
    """Seconds from ``since`` (``time.time()``) until the queue's episode of
    ``condition`` opened (``ended``: ended), by the episode's own times: the
    checks above it may have waited longer on a busy machine."""
    state = "resolved" if ended else "open"
    episode = wait_until(
        lambda: QueueAlert.objects.filter(
            queue=queue, condition=condition, ended_at__isnull=not ended
        ).first(),
        timeout=WITHIN + 5,
        interval=0.1,
        what=f"{queue.name}: a {condition} alert {state}",
    )
    moment = episode.ended_at if ended else episode.started_at
    assert moment is not None
    return moment.timestamp() - since


def posts_of(hook: WebhookServer, queue: str) -> list[Post]:
    """The queue's alert posts (its poison alarms go to the same webhook)."""
    return [
        post
        for post in hook.received
        if post.json()["event"] == "queue_alert" and post.json()["queue"] == queue
    ]


def test_thresholds_crossed_by_real_traffic_fire_and_resolve_once_each(
    start_workers, make_hook, admin
):
    hook = make_hook()
    refusing = WebhookServer(port=free_port())  # nothing listens there for 30 s
    watched = {"alarm_webhook_url": hook.url}
    backlog = queue_create(
        name="BACKLOG.Q",
        consumer="demo",
        paused=True,
        alert_waiting_above=5,
        alert_oldest_waiting_seconds=3,
        **watched,
    )
    failing = queue_create(
        name="FAILING.Q",
        consumer="demo",
        retry_limit=1000,
        retry_backoff_seconds=0.5,
        alert_stalled_seconds=3,
        **watched,
    )
    burst_dlq = queue_create(
        name="BURST.DLQ", kind="dead_letter", alert_dead_letter_per_minute=5, **watched
    )
    burst = queue_create(
        name="BURST.Q", consumer="demo", retry_limit=0, dead_letter_queue=burst_dlq
    )
    crashy = queue_create(
        name="CRASHY.Q",
        consumer="demo",
        suspect_delay_seconds=0.05,
        alert_blacklisted_above=0,
        **watched,
    )
    refused = queue_create(
        name="REFUSED.Q",
        consumer="demo",
        paused=True,
        alert_waiting_above=0,
        alarm_webhook_url=refusing.url,
    )
    start_workers(
        LAZARETTO_ALARM_WEBHOOK_SECRET=SECRET,
        LAZARETTO_ALARM_RETRY_MAX_SECONDS="3",
        LAZARETTO_ALARM_NOTIFY_ATTEMPTS="40",
    )

    started = time.time()
    published(backlog, 8)
    published(refused, 1)
    published(failing, 3, NewMessage(payload=b"FAIL"))
    published(burst, 10, NewMessage(payload=b"FAIL"))
    [poison] = published(crashy, 1, NewMessage(payload=b"CRASH"))

    # A paused consumer: too many waiting at once, too old three seconds on.
    assert within(backlog, C.WAITING, started) <= WITHIN
    assert within(refused, C.WAITING, started) <= WITHIN
    assert within(backlog, C.OLDEST_WAITING, started + 3) <= WITHIN
    # A failing consumer: no acknowledgement for three seconds.
    assert within(failing, C.STALLED, started + 3) <= WITHIN
    # A burst of dead letters: ten in a second or two, five allowed a minute.
    assert within(burst_dlq, C.DEAD_LETTER_RATE, started) <= WITHIN
    # A crashing consumer: its message blacklisted after two crashes.
    wait_until(
        lambda: Message.objects.filter(id=poison, state=MessageState.NOT_DELIVERABLE).exists(),
        timeout=30,
        what="the CRASH message blacklisted",
    )
    assert within(crashy, C.BLACKLISTED, time.time()) <= WITHIN

    # Back: the consumer resumed, the failing one mended, the poison failed.
    back = time.time()
    queue_pause(queue=backlog, paused=False)
    queue_update(queue=failing, consumer="noop")
    messages_fail(message_ids=[poison], actor=None)
    # First: the waits below (a mended consumer's back-off) would count
    # against it.
    assert within(crashy, C.BLACKLISTED, back, ended=True) <= WITHIN
    assert within(backlog, C.WAITING, back, ended=True) <= WITHIN
    assert within(backlog, C.OLDEST_WAITING, back, ended=True) <= WITHIN
    # The mended consumer acknowledges once a failed message's retry is due
    # (its back-off has grown meanwhile): the queue is back from that moment.
    wait_until(
        lambda: Message.objects.filter(queue=failing, state=MessageState.DELIVERED).exists(),
        timeout=30,
        interval=0.05,
        what="the mended consumer's first acknowledgement",
    )
    assert within(failing, C.STALLED, time.time(), ended=True) <= WITHIN
    queue_pause(queue=refused, paused=False)
    assert within(refused, C.WAITING, time.time(), ended=True) <= WITHIN

    # Each posted once firing and once resolved, in that order, signed.
    for queue, conditions in [
        (backlog, [C.WAITING, C.OLDEST_WAITING]),
        (failing, [C.STALLED]),
        (crashy, [C.BLACKLISTED]),
    ]:
        expected = 2 * len(conditions)
        wait_until(
            partial(lambda name, n: len(posts_of(hook, name)) == n, queue.name, expected),
            timeout=10,
            what=f"{queue.name}'s alerts posted",
        )
        for condition in conditions:
            posts = [
                post for post in posts_of(hook, queue.name) if post.json()["condition"] == condition
            ]
            assert [post.json()["status"] for post in posts] == ["firing", "resolved"]
            assert all(verified(post, SECRET) for post in posts)
    [dlq_firing] = posts_of(hook, "BURST.DLQ")
    assert dlq_firing.json()["status"] == "firing"

    # A receiver that refused connections for 30 s still gets both, in order.
    time.sleep(max(0.0, started + 30 - time.time()))
    refusing.start()
    try:
        wait_until(lambda: len(refusing.received) == 2, timeout=15, what="the refused alert")
    finally:
        refusing.stop()
    assert [post.json()["status"] for post in refusing.received] == ["firing", "resolved"]
    assert all(verified(post, SECRET) for post in refusing.received)

    # Once each, and the dashboard shows every episode with its start and end.
    episodes = list(QueueAlert.objects.values_list("queue__name", "condition", "ended_at"))
    assert len(episodes) == len({(name, condition) for name, condition, _ in episodes}) == 6
    html = logged_in(admin).get("/").content.decode()
    for episode in QueueAlert.objects.all():
        assert f'data-alert="{episode.id}"' in html
    assert html.count('data-open="true"') == 1  # the dead-letter burst, a minute long
