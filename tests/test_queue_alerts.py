"""Alert thresholds (broker.services.alerts): each reading against its
threshold, episodes that open and end once, audited, and posted to the alarm
webhook firing first, then resolved (broker.services.alarms), against real
HTTP servers on 127.0.0.1."""

from __future__ import annotations

import time

import pytest
from django.db.models.functions import Now

from broker.models import AlertCondition, AuditEvent, NotificationState, Queue, QueueAlert
from broker.services.alarms import alarms_notify_due, notice_key
from broker.services.alerts import alerts_check
from broker.services.counting import minute_count
from broker.services.queues import queue_create, queue_update
from broker.services.transitions.blacklist import messages_release
from broker.services.transitions.discards import messages_purge_waiting
from rig.processes import free_port
from tests.support.messages import blacklisted, claimed, delivered
from tests.support.publishing import published
from tests.support.webhooks import WebhookServer, verified

pytestmark = pytest.mark.django_db(transaction=True)
C = AlertCondition
N = NotificationState


@pytest.fixture(autouse=True)
def alarm_settings(settings, dumps) -> None:
    settings.LAZARETTO_ALARM_WEBHOOK_URL = ""
    settings.LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS = 2.0


def episodes(queue: Queue) -> list[tuple[str, bool]]:
    """The queue's episodes, oldest first: (condition, still open)."""
    return [
        (condition, ended is None)
        for condition, ended in QueueAlert.objects.filter(queue=queue)
        .order_by("id")
        .values_list("condition", "ended_at")
    ]


def make_due(episode_id: int) -> None:
    QueueAlert.objects.filter(id=episode_id).update(notify_next_at=Now())


def statuses(hook: WebhookServer) -> list[tuple[str, str]]:
    return [(post.json()["condition"], post.json()["status"]) for post in hook.received]


def test_too_many_waiting_fires_once_resolves_once_audited_and_posted_signed(hook, settings):
    settings.LAZARETTO_ALARM_WEBHOOK_SECRET = "alert-secret-7d2a9c41"
    settings.LAZARETTO_INSTANCE_NAME = "QM1"
    queue = queue_create(name="ORDERS.IN", alert_waiting_above=3, alarm_webhook_url=hook.url)
    published(queue, 3)
    assert alerts_check().fired == []  # 3 is not more than 3

    published(queue, 2)
    fired = alerts_check()
    assert alerts_check().fired == []  # fires once

    [episode] = QueueAlert.objects.all()
    assert fired.fired == [episode.id]
    assert fired.notify
    assert (episode.condition, episode.threshold, episode.value) == (C.WAITING, 3, 5)
    assert alarms_notify_due().sent == [notice_key(episode)]
    [firing] = hook.received
    assert verified(firing, "alert-secret-7d2a9c41")
    assert firing.headers["Lazaretto-Alert-Id"] == str(episode.id)
    assert firing.json() | {"started_at": None} == {
        "event": "queue_alert",
        "status": "firing",
        "alert_id": episode.id,
        "queue": "ORDERS.IN",
        "condition": "waiting",
        "threshold": 3,
        "value": 5.0,
        "peak": 5.0,
        "summary": "Queue ORDERS.IN: 5 messages waiting, more than 3.",
        "started_at": None,
        "ended_at": None,
        "instance": "QM1",
    }

    published(queue, 2)
    alerts_check()
    episode.refresh_from_db()
    assert (episode.value, episode.peak) == (5, 7)

    delivered(queue, 5)
    resolved = alerts_check()
    assert resolved.resolved == [episode.id]
    assert alerts_check().resolved == []  # resolves once
    assert episodes(queue) == [(C.WAITING, False)]
    alarms_notify_due()
    assert [post.json()["status"] for post in hook.received] == ["firing", "resolved"]
    ended = hook.received[1].json()
    assert (ended["value"], ended["peak"]) == (2.0, 7.0)
    assert (
        ended["summary"] == "Queue ORDERS.IN: messages waiting back within 3 (2 messages waiting)."
    )
    assert ended["ended_at"] is not None
    assert verified(hook.received[1], "alert-secret-7d2a9c41")

    audit = list(
        AuditEvent.objects.filter(queue_name="ORDERS.IN", action__startswith="alert_")
        .order_by("id")
        .values_list("action", "actor_name", "reason")
    )
    assert audit == [
        ("alert_fired", "system", "Queue ORDERS.IN: 5 messages waiting, more than 3."),
        ("alert_resolved", "system", ended["summary"]),
    ]

    published(queue, 5)
    assert len(alerts_check().fired) == 1  # a new episode
    assert episodes(queue) == [(C.WAITING, False), (C.WAITING, True)]


def test_the_oldest_waiting_message_older_than_the_threshold(hook):
    queue = queue_create(
        name="ORDERS.IN", alert_oldest_waiting_seconds=1, alarm_webhook_url=hook.url
    )
    assert alerts_check().fired == []  # nothing waits
    published(queue, 1)
    assert alerts_check().fired == []
    time.sleep(1.2)

    assert len(alerts_check().fired) == 1
    [episode] = QueueAlert.objects.all()
    assert episode.condition == C.OLDEST_WAITING
    assert episode.value > 1

    delivered(queue, 1)
    assert alerts_check().resolved == [episode.id]
    episode.refresh_from_db()
    assert episode.end_value is None  # nothing waiting any more


def test_dead_letter_inflow_a_minute_from_a_queue_and_into_a_dead_letter_queue():
    dead = queue_create(name="ORDERS.DLQ", kind="dead_letter", alert_dead_letter_per_minute=10)
    feeding = [
        queue_create(name=name, dead_letter_queue=dead, alert_dead_letter_per_minute=8)
        for name in ("ORDERS.IN", "ORDERS.EU")
    ]
    minute_count(queue_id=feeding[0].id, dead_lettered=9)  # as delivery counts them
    minute_count(queue_id=feeding[1].id, dead_lettered=2)

    fired = alerts_check()

    assert len(fired.fired) == 2
    assert sorted(QueueAlert.objects.values_list("queue__name", "condition", "value")) == [
        ("ORDERS.DLQ", C.DEAD_LETTER_RATE, 11),
        ("ORDERS.IN", C.DEAD_LETTER_RATE, 9),
    ]


def test_blacklisted_above_zero_means_any(hook):
    queue = queue_create(name="ORDERS.IN", alert_blacklisted_above=0, alarm_webhook_url=hook.url)
    [message_id] = blacklisted(queue)

    assert len(alerts_check().fired) == 1
    assert episodes(queue) == [(C.BLACKLISTED, True)]

    messages_release(message_ids=[message_id], actor=None)
    assert len(alerts_check().resolved) == 1


def test_no_acknowledgement_while_messages_wait_is_a_stalled_consumer():
    queue = queue_create(name="ORDERS.IN", consumer="noop", alert_stalled_seconds=1)
    idle = queue_create(name="IDLE.IN", consumer="noop", alert_stalled_seconds=1, paused=True)
    alerts_check()
    time.sleep(1.2)
    # A queue idle for longer than the threshold is not stalled the moment
    # a message arrives: the time counts from when messages began to wait.
    published(queue, 3)
    published(idle, 3)
    assert alerts_check().fired == []
    time.sleep(1.2)

    assert len(alerts_check().fired) == 1
    assert episodes(queue) == [(C.STALLED, True)]
    assert episodes(idle) == []  # paused: its messages wait on purpose

    delivered(queue, 1)
    assert len(alerts_check().resolved) == 1
    assert alerts_check().fired == []  # an acknowledgement a moment ago


def test_clearing_a_threshold_ends_its_open_episode(hook):
    queue = queue_create(name="ORDERS.IN", alert_waiting_above=0, alarm_webhook_url=hook.url)
    published(queue, 1)
    alerts_check()

    queue_update(queue=queue, alert_waiting_above=None)

    assert len(alerts_check().resolved) == 1
    assert episodes(queue) == [(C.WAITING, False)]


def test_an_installation_webhook_serves_a_queue_without_its_own(hook, settings):
    settings.LAZARETTO_ALARM_WEBHOOK_URL = hook.url
    queue = queue_create(name="ORDERS.IN", alert_waiting_above=0)
    published(queue, 1)
    alerts_check()

    alarms_notify_due()

    assert statuses(hook) == [(C.WAITING, "firing")]


def test_without_any_webhook_an_episode_is_kept_and_nothing_is_posted():
    queue = queue_create(name="ORDERS.IN", alert_waiting_above=0)
    published(queue, 1)

    assert not alerts_check().notify

    [episode] = QueueAlert.objects.all()
    assert (episode.notification, episode.notify_event) == (N.NONE, "")
    assert alarms_notify_due().posted == 0


def test_an_episode_that_ends_while_its_webhook_is_down_posts_firing_then_resolved():
    down = WebhookServer(port=free_port())
    queue = queue_create(name="ORDERS.IN", alert_waiting_above=0, alarm_webhook_url=down.url)
    published(queue, 1)
    alerts_check()
    [episode] = QueueAlert.objects.all()
    assert alarms_notify_due().retrying == [notice_key(episode)]

    messages_purge_waiting(queue_id=queue.id)
    alerts_check()
    episode.refresh_from_db()
    assert (episode.notify_event, episode.notify_attempts) == ("firing", 1)

    down.start()
    try:
        make_due(episode.id)
        result = alarms_notify_due()
    finally:
        down.stop()
    assert result.sent == [notice_key(episode)] * 2
    assert statuses(down) == [(C.WAITING, "firing"), (C.WAITING, "resolved")]
    episode.refresh_from_db()
    assert (episode.notification, episode.notify_event, episode.notify_attempts) == (
        N.SENT,
        "",
        0,
    )


def test_a_firing_given_up_on_still_posts_its_resolution(hook, settings):
    settings.LAZARETTO_ALARM_NOTIFY_ATTEMPTS = 2
    hook.status = 503
    queue = queue_create(name="ORDERS.IN", alert_waiting_above=0, alarm_webhook_url=hook.url)
    published(queue, 1)
    alerts_check()
    [episode] = QueueAlert.objects.all()
    for _ in range(2):
        make_due(episode.id)
        alarms_notify_due()
    episode.refresh_from_db()
    assert (episode.notification, episode.notify_error) == (N.FAILED, "HTTP 503")

    hook.status = 204
    claimed(queue, 1)
    alerts_check()
    alarms_notify_due()

    assert statuses(hook)[-1] == (C.WAITING, "resolved")
    episode.refresh_from_db()
    assert episode.notification == N.SENT


def test_an_alert_webhook_on_an_internal_address_is_refused_as_every_webhook_is(
    admin_api, orders, settings
):
    url = "http://10.1.2.3/hooks/alerts"
    refused = admin_api.patch(
        "/api/v1/queues/ORDERS.IN/", {"alarm_webhook_url": url}, format="json"
    )
    assert refused.status_code == 400
    assert "alarm_webhook_url" in refused.json()["field_errors"]

    # One allowed when the queue was set up, and no longer when posting.
    receiver = WebhookServer()
    receiver.start()
    try:
        queue = queue_create(
            name="PAYROLL.IN", alert_waiting_above=0, alarm_webhook_url=receiver.url
        )
        published(queue, 1)
        alerts_check()
        settings.LAZARETTO_WEBHOOK_ALLOWED_NETWORKS = []

        alarms_notify_due()
    finally:
        receiver.stop()

    assert receiver.received == []
    [episode] = QueueAlert.objects.all()
    assert episode.notify_error.startswith("not an allowed destination: 127.0.0.1")


# --- the API ----------------------------------------------------------------------

ALERTS = "/api/v1/alerts/"


def test_the_api_lists_episodes_newest_first_and_filters_them(viewer_api):
    orders = queue_create(name="ORDERS.IN", alert_waiting_above=0, alert_blacklisted_above=0)
    payroll = queue_create(name="PAYROLL.IN", alert_waiting_above=0)
    published(orders, 1)
    published(payroll, 1)
    blacklisted(orders)
    alerts_check()
    delivered(payroll, 1)
    alerts_check()

    everything = viewer_api.get(ALERTS).json()["results"]
    assert [(e["queue"], e["condition"], e["ended_at"] is None) for e in everything] == [
        ("PAYROLL.IN", "waiting", False),
        ("ORDERS.IN", "blacklisted", True),
        ("ORDERS.IN", "waiting", True),
    ]
    assert everything[0]["value"] == 1.0
    assert everything[0]["end_value"] == 0.0
    assert everything[0]["notification"] == "none"

    def ids(query: str) -> list[tuple[str, str]]:
        return [
            (e["queue"], e["condition"]) for e in viewer_api.get(ALERTS + query).json()["results"]
        ]

    assert ids("?open=true") == [("ORDERS.IN", "blacklisted"), ("ORDERS.IN", "waiting")]
    assert ids("?open=false") == [("PAYROLL.IN", "waiting")]
    assert ids("?queue=ORDERS.IN&condition=waiting") == [("ORDERS.IN", "waiting")]


@pytest.mark.parametrize(
    ("query", "field"),
    [("?open=perhaps", "open"), ("?condition=hot", "condition"), ("?queue=a%20b", "queue")],
)
def test_a_bad_alert_filter_is_a_400_naming_its_field(viewer_api, query, field):
    response = viewer_api.get(ALERTS + query)

    assert response.status_code == 400
    assert field in response.json()["field_errors"]


def test_the_alerts_need_a_signed_in_user(anonymous_api):
    assert anonymous_api.get(ALERTS).status_code in (401, 403)
