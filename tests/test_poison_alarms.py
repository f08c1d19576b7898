"""Poison alarms posted to their webhook (broker.services.alarms), against
real HTTP servers on 127.0.0.1, and the dashboard's "Last quarantines" panel."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from broker.models import Message, MessageState, NotificationState, PoisonAlarm, Queue
from broker.services.alarms import alarms_notify_due, notice_key
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.transitions.blacklist import messages_purge_poison, messages_quarantine
from broker.services.transitions.in_flight import messages_claim
from rig.processes import free_port, point_celery_at, wait_until
from tests.support.webhooks import WebhookServer, verified

pytestmark = pytest.mark.django_db(transaction=True)
N = NotificationState
S = MessageState


@pytest.fixture(autouse=True)
def alarm_settings(settings, dumps: Path) -> None:
    """No installation-wide alarm webhook, a 2 s timeout, dumps of the test's own."""
    settings.LAZARETTO_ALARM_WEBHOOK_URL = ""
    settings.LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS = 2.0


def quarantine_one(queue: Queue, reason: str = "crashed 2 times") -> int:
    """Publish a message, take it in flight and quarantine it: the real way
    an alarm is raised."""
    [message_id] = messages_publish(queue_name=queue.name, messages=[NewMessage(payload=b"bad")])
    messages_claim(queue_id=queue.id, owner="test:1:1", lease_seconds=30, limit=1, suspect=False)
    with transaction.atomic():
        assert messages_quarantine(reasons={message_id: reason}) == [message_id]
    return message_id


def make_due(alarm: PoisonAlarm) -> None:
    PoisonAlarm.objects.filter(id=alarm.id).update(notify_next_at=Now())


def seconds_to_next_try(alarm: PoisonAlarm) -> float:
    assert alarm.notify_next_at is not None
    return (alarm.notify_next_at - timezone.now()).total_seconds()


# --- posting ------------------------------------------------------------------


def test_an_alarm_is_posted_once_with_its_details_and_marked_sent(hook, settings):
    settings.LAZARETTO_INSTANCE_NAME = "QM1"
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=hook.url)
    message_id = quarantine_one(queue, reason="crashed its consumer 2 times")
    alarm = PoisonAlarm.objects.get()
    assert (alarm.notification, alarm.webhook_url) == (N.PENDING, hook.url)

    result = alarms_notify_due()

    assert result.sent == [notice_key(alarm)]
    [request] = hook.received
    assert request.json() == {
        "event": "poison_message",
        "action": "quarantine",
        "queue": "ORDERS.IN",
        "message_id": message_id,
        "reason": "crashed its consumer 2 times",
        "crash_count": 0,
        "timeout_count": 0,
        "attempts": 1,
        "dump_path": Message.objects.get(id=message_id).dump_path,
        "time": alarm.created_at.isoformat(),
        "instance": "QM1",
    }
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Lazaretto-Alarm-Id"] == str(alarm.id)
    alarm.refresh_from_db()
    assert alarm.notification == N.SENT
    assert alarm.notified_at is not None
    assert alarm.notify_attempts == 0

    assert alarms_notify_due().posted == 0
    assert len(hook.received) == 1


def test_with_a_secret_each_alarm_is_signed_as_a_queues_webhook_signs_its_deliveries(
    hook, settings
):
    settings.LAZARETTO_ALARM_WEBHOOK_SECRET = "alarm-secret-4f1c9e7b"
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=hook.url)
    quarantine_one(queue)

    assert alarms_notify_due().sent

    [request] = hook.received
    assert verified(request, "alarm-secret-4f1c9e7b")
    assert not verified(request, "another-secret-000000")
    assert request.json()["event"] == "poison_message"


def test_without_a_secret_an_alarm_carries_no_signature(hook):
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=hook.url)
    quarantine_one(queue)

    alarms_notify_due()

    [request] = hook.received
    assert "Lazaretto-Signature" not in request.headers
    assert "Lazaretto-Timestamp" not in request.headers


def test_a_purged_poison_message_is_announced_too(hook):
    queue = queue_create(
        name="ORDERS.IN", consumer="noop", poison_action="purge", alarm_webhook_url=hook.url
    )
    [message_id] = messages_publish(queue_name=queue.name, messages=[NewMessage(payload=b"x")])
    with transaction.atomic():
        assert messages_purge_poison(reasons={message_id: "crashed 2 times"}) == [message_id]

    alarms_notify_due()

    [request] = hook.received
    assert (request.json()["action"], request.json()["message_id"]) == ("purge", message_id)
    assert PoisonAlarm.objects.get().notification == N.SENT


def test_a_webhook_that_is_down_is_retried_later_and_sent_once_it_is_up():
    down = WebhookServer(port=free_port())
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=down.url)
    message_id = quarantine_one(queue)

    result = alarms_notify_due()

    alarm = PoisonAlarm.objects.get()
    assert result.retrying == [notice_key(alarm)]
    assert (alarm.notification, alarm.notify_attempts) == (N.PENDING, 1)
    assert "ConnectError" in alarm.notify_error
    assert 1 < seconds_to_next_try(alarm) <= 2  # 2**1 s
    assert alarms_notify_due().posted == 0  # not due yet
    assert Message.objects.get(id=message_id).state == S.NOT_DELIVERABLE

    make_due(alarm)
    alarms_notify_due()
    alarm.refresh_from_db()
    assert alarm.notify_attempts == 2
    assert 3 < seconds_to_next_try(alarm) <= 4  # 2**2 s

    down.start()
    try:
        make_due(alarm)
        assert alarms_notify_due().sent == [notice_key(alarm)]
    finally:
        down.stop()
    [request] = down.received
    assert request.json()["message_id"] == message_id
    alarm.refresh_from_db()
    assert (alarm.notification, alarm.notify_attempts) == (N.SENT, 2)
    assert Message.objects.get(id=message_id).state == S.NOT_DELIVERABLE


@pytest.mark.parametrize(("status", "error"), [(500, "HTTP 500"), (302, "HTTP 302")])
def test_any_answer_but_a_2xx_is_a_failed_attempt(hook, status, error):
    hook.status = status
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=hook.url)
    quarantine_one(queue)

    alarms_notify_due()

    alarm = PoisonAlarm.objects.get()
    assert (alarm.notification, alarm.notify_attempts) == (N.PENDING, 1)
    assert alarm.notify_error.startswith(error)
    assert len(hook.received) == 1  # the redirect is not followed


def test_a_webhook_that_never_answers_is_a_failed_attempt_after_the_timeout(silent_hook, settings):
    settings.LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS = 0.3
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=silent_hook)
    quarantine_one(queue)

    started = time.monotonic()
    alarms_notify_due()

    assert time.monotonic() - started < 2
    alarm = PoisonAlarm.objects.get()
    assert alarm.notify_attempts == 1
    assert "Timeout" in alarm.notify_error


def test_it_gives_up_after_the_configured_attempts_and_keeps_the_alarm(hook, settings, caplog):
    settings.LAZARETTO_ALARM_NOTIFY_ATTEMPTS = 3
    hook.status = 503
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=hook.url)
    message_id = quarantine_one(queue)
    alarm = PoisonAlarm.objects.get()
    caplog.clear()  # the quarantine's own warning, from the same module

    with caplog.at_level(logging.INFO, logger="broker.services.alarms"):
        for _ in range(3):
            make_due(alarm)
            alarms_notify_due()

    alarm.refresh_from_db()
    assert (alarm.notification, alarm.notify_attempts) == (N.FAILED, 3)
    assert alarm.notify_error == "HTTP 503"
    assert alarm.notify_next_at is None
    [warning] = [
        r
        for r in caplog.records
        if r.name == "broker.services.alarms" and r.levelno >= logging.WARNING
    ]
    assert f"message {message_id} on ORDERS.IN" in warning.getMessage()
    assert "gave up" in warning.getMessage()
    make_due(alarm)
    assert alarms_notify_due().posted == 0
    assert len(hook.received) == 3
    assert Message.objects.get(id=message_id).state == S.NOT_DELIVERABLE


def test_without_any_webhook_the_alarm_is_kept_and_nothing_is_posted(hook):
    queue = queue_create(name="ORDERS.IN", consumer="noop")
    quarantine_one(queue)

    result = alarms_notify_due()

    alarm = PoisonAlarm.objects.get()
    assert (alarm.notification, alarm.webhook_url, alarm.notify_next_at) == (N.NONE, "", None)
    assert result.posted == 0
    assert hook.received == []


def test_a_queues_own_webhook_wins_over_the_installations(settings, make_hook):
    installation, own = make_hook(), make_hook()
    settings.LAZARETTO_ALARM_WEBHOOK_URL = installation.url
    mine = queue_create(name="MINE.IN", consumer="noop", alarm_webhook_url=own.url)
    other = queue_create(name="OTHER.IN", consumer="noop")
    mine_id, other_id = quarantine_one(mine), quarantine_one(other)

    alarms_notify_due()

    assert [r.json()["message_id"] for r in own.received] == [mine_id]
    assert [r.json()["message_id"] for r in installation.received] == [other_id]
    assert set(PoisonAlarm.objects.values_list("notification", flat=True)) == {N.SENT}


def test_two_runners_at_once_post_each_alarm_only_once(hook):
    hook.delay = 0.3
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=hook.url)
    message_ids = [quarantine_one(queue) for _ in range(3)]
    start = threading.Barrier(2)
    results = []

    def run() -> None:
        try:
            start.wait()
            results.append(alarms_notify_due(budget_seconds=5))
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert Counter(r.json()["message_id"] for r in hook.received) == Counter(message_ids)
    assert sorted(result.busy for result in results) == [False, True]
    assert set(PoisonAlarm.objects.values_list("notification", flat=True)) == {N.SENT}


def test_a_run_inside_a_transaction_is_refused(hook):
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=hook.url)
    quarantine_one(queue)

    with pytest.raises(RuntimeError), transaction.atomic():
        alarms_notify_due()

    assert hook.received == []


def test_asking_for_alarms_to_be_posted_with_redis_down_only_logs_a_warning(caplog):
    from workers.tasks import _send_notify_alarms

    point_celery_at(f"redis://127.0.0.1:{free_port()}/0")
    try:
        with caplog.at_level(logging.WARNING, logger="workers.tasks"):
            _send_notify_alarms()
    finally:
        from django.conf import settings

        point_celery_at(settings.CELERY_BROKER_URL)
    assert "could not ask for the alarms" in caplog.text


# --- real workers ---------------------------------------------------------------


@pytest.mark.slow
def test_a_silent_alarm_webhook_slows_neither_delivery_nor_the_sweeper(start_workers, silent_hook):
    queue = queue_create(
        name="POISON.Q",
        consumer="demo",
        batch_size=20,
        suspect_delay_seconds=0.05,
        alarm_webhook_url=silent_hook,
    )
    # The first alarm's post will hold one control process for 30 s.
    start_workers(concurrency=2, LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS="30")

    def settle(round_: str) -> int:
        payloads = [f"{round_} order {n}".encode() for n in range(20)]
        payloads[7] = f"{round_} order 7 CRASH".encode()
        ids = messages_publish(
            queue_name=queue.name, messages=[NewMessage(payload=p) for p in payloads]
        )
        wait_until(
            lambda: Message.objects.filter(
                id__in=ids, state__in=[S.DELIVERED, S.NOT_DELIVERABLE]
            ).count()
            == 20,
            timeout=15,
            what=f"{round_}: all 20 settled within 15 s",
        )
        innocents = Message.objects.filter(id__in=ids).exclude(id=ids[7])
        assert innocents.filter(state=S.DELIVERED).count() == 19
        assert Message.objects.get(id=ids[7]).state == S.NOT_DELIVERABLE
        return ids[7]

    first = settle("first")
    # Once its alarm is claimed (leased past the 30 s timeout), one control
    # process waits on the silent socket; the crashes of a second poison
    # message must still be swept as fast.
    wait_until(
        lambda: PoisonAlarm.objects.filter(
            message_id=first, notify_next_at__gt=timezone.now() + timedelta(seconds=30)
        ).exists(),
        timeout=15,
        what="the first alarm's post under way",
    )
    second = settle("second")

    for message_id in (first, second):
        alarm = PoisonAlarm.objects.get(message_id=message_id)
        assert alarm.notification == N.PENDING or alarm.notify_error


# --- the dashboard --------------------------------------------------------------


def alarms_panel(html: str) -> str:
    start = html.index('data-panel="alarms"')
    return html[start : html.index("</table>", start)]


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_the_dashboard_lists_the_last_quarantines(request, client, hook, who):
    hook.status = 500
    queue = queue_create(name="ORDERS.IN", consumer="noop", alarm_webhook_url=hook.url)
    quarantined = quarantine_one(queue, reason="crashed 2 times")
    alarms_notify_due()
    purging = queue_create(name="PURGING.IN", consumer="noop", poison_action="purge")
    [purged] = messages_publish(queue_name=purging.name, messages=[NewMessage(payload=b"x")])
    with transaction.atomic():
        messages_purge_poison(reasons={purged: "timed out 3 times"})
    client.force_login(request.getfixturevalue(who))

    html = client.get("/").content.decode()

    assert '<h2 id="last-quarantines">Last quarantines</h2>' in html
    rows = {
        int(row.split('"')[1]): row.split("</tr>")[0]
        for row in alarms_panel(html).split("<tr data-alarm=")[1:]
    }
    by_message = {alarm.message_id: rows[alarm.id] for alarm in PoisonAlarm.objects.all()}
    assert list(rows) == sorted(rows, reverse=True)  # newest first
    assert "PURGING.IN" in by_message[purged]
    assert f'<a href="/messages/{quarantined}/">{quarantined}</a>' in by_message[quarantined]
    assert "crashed 2 times" in by_message[quarantined]
    assert "HTTP 500" in by_message[quarantined]
    assert 'data-notification="pending"' in by_message[quarantined]
    assert Message.objects.get(id=quarantined).dump_path in by_message[quarantined]
    assert f"/messages/{purged}/" not in by_message[purged]
    assert f"<td>{purged}</td>" in by_message[purged]
    assert "purged" in by_message[purged]
    assert 'data-notification="none"' in by_message[purged]


def test_the_dashboard_escapes_what_it_shows_of_an_alarm(client, viewer):
    queue = queue_create(name="ORDERS.IN", consumer="noop")
    quarantine_one(queue, reason="<script>alert('reason')</script>")
    PoisonAlarm.objects.create(
        queue_name="<script>alert('queue')</script>",
        message_id=999999,
        action="purge",
        reason="r",
        crash_count=2,
        timeout_count=0,
        attempts=2,
        dump_path="<b>dump</b>",
        notification=N.FAILED,
        notify_error="<img src=x onerror=alert(1)>",
    )
    client.force_login(viewer)

    panel = alarms_panel(client.get("/").content.decode())

    assert "<script>" not in panel
    assert "<img" not in panel
    assert "<b>" not in panel
    assert "&lt;script&gt;alert(&#x27;reason&#x27;)&lt;/script&gt;" in panel
    assert "&lt;script&gt;alert(&#x27;queue&#x27;)&lt;/script&gt;" in panel
    assert "&lt;img src=x onerror=alert(1)&gt;" in panel


def test_the_dashboard_shows_only_the_last_ten(client, viewer):
    queue = queue_create(name="ORDERS.IN", consumer="noop")
    message_ids = [quarantine_one(queue) for _ in range(12)]
    client.force_login(viewer)

    panel = alarms_panel(client.get("/").content.decode())

    assert panel.count("<tr data-alarm=") == 10
    assert f">{message_ids[-1]}</a>" in panel
    assert f">{message_ids[1]}</a>" not in panel


def test_the_dashboard_says_when_nothing_was_quarantined(client, viewer):
    client.force_login(viewer)

    assert "No message has been quarantined" in alarms_panel(client.get("/").content.decode())
