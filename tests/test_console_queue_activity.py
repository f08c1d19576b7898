"""A queue's page charts the last hour or day: its publish, ack, dead-letter
and quarantine rates from the per-minute counters, and its depth by state
from the counts the sweeper's fold notes each minute they change.

Time passes here by moving the fold's rows back: PostgreSQL's clock, which
dates them, cannot be travelled."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from broker.activity import Window, queue_activity
from broker.models import Queue, QueueDepthMinute, QueueMinute
from broker.services import counting
from broker.services.counting import counters_fold
from broker.services.delivery import queue_deliver
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create, queue_update
from broker.services.transitions.blacklist import messages_quarantine
from tests.support.console import chart_data, logged_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(db: None) -> Queue:
    return queue_create(name="PAYROLL", consumer="demo", retry_limit=0, batch_size=10)


def publish(count: int, payload: bytes = b"ok") -> list[int]:
    return messages_publish(queue_name="PAYROLL", messages=[NewMessage(payload=payload)] * count)


def age_rows(minutes: int) -> None:
    """What the fold wrote so far happened ``minutes`` earlier."""
    for rows in (QueueDepthMinute.objects, QueueMinute.objects):
        for row in rows.all():
            row.minute -= timedelta(minutes=minutes)
            row.save(update_fields=["minute"])


def this_minute() -> datetime:
    return timezone.now().replace(second=0, microsecond=0)


def test_the_fold_notes_each_changed_count_with_the_count_before_it(queue: Queue) -> None:
    publish(5)
    counters_fold()
    publish(2)
    counters_fold()

    [row] = QueueDepthMinute.objects.filter(queue=queue)
    assert (row.state, row.count_before, row.count) == ("TBDL", 0, 7)
    assert row.minute == this_minute()


def test_the_fold_forgets_counts_older_than_two_days_once_a_minute(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(1)
    counters_fold()
    QueueDepthMinute.objects.update(minute=this_minute() - timedelta(days=2, minutes=1))
    publish(1)
    counters_fold()
    # The first fold pruned; the next prune comes a minute after it.
    assert sorted(QueueDepthMinute.objects.values_list("count", flat=True)) == [1, 2]

    monkeypatch.setattr(counting, "_pruned_at", counting._pruned_at - counting.PRUNE_EVERY_SECONDS)
    counters_fold()
    assert list(QueueDepthMinute.objects.values_list("count", flat=True)) == [2]


def test_the_hour_shows_each_minutes_rates_and_the_depth_at_its_end(
    queue: Queue, django_capture_on_commit_callbacks
) -> None:
    publish(4)
    counters_fold()
    age_rows(30)
    publish(4)
    publish(2, payload=b"FAIL")
    queue_deliver(queue_id=queue.id)
    [poison] = publish(1)
    with django_capture_on_commit_callbacks(execute=True):
        messages_quarantine(reasons={poison: "crashed twice"})
    counters_fold()

    activity = queue_activity(queue=queue, window=Window.HOUR)

    assert len(activity.slots) == 60
    assert activity.slots[-1] == this_minute()
    assert activity.totals == {"published": 11, "delivered": 8, "dead_lettered": 2, "poisoned": 1}
    assert activity.rates["published"][-31] == 4.0
    assert activity.rates["published"][-1] == 7.0
    tbdl = activity.depths["TBDL"]
    assert tbdl[:29] == [0] * 29
    assert tbdl[29:59] == [4] * 30
    assert tbdl[-1] == 0
    assert activity.depths["DLVD"][-1] == 8
    assert (activity.depths["NDLV"][-2], activity.depths["NDLV"][-1]) == (0, 1)


def test_the_day_adds_up_quarter_hours_as_a_rate_per_minute(queue: Queue) -> None:
    publish(30)
    counters_fold()
    age_rows(6 * 60)

    activity = queue_activity(queue=queue, window=Window.DAY)

    assert len(activity.slots) == 96
    assert all(slot.minute % 15 == 0 for slot in activity.slots)
    assert activity.slots[-1] <= timezone.now() < activity.slots[-1] + timedelta(minutes=15)
    assert activity.totals["published"] == 30
    assert [rate for rate in activity.rates["published"] if rate] == [2.0]
    first_full = activity.depths["TBDL"].index(30)
    assert activity.depths["TBDL"][first_full - 1] == 0
    assert activity.depths["TBDL"][first_full:] == [30] * (96 - first_full)


def test_a_queue_that_never_changed_in_the_window_is_flat_at_todays_count(queue: Queue) -> None:
    publish(3)
    counters_fold()
    age_rows(3 * 60)
    assert queue_activity(queue=queue, window=Window.HOUR).depths["TBDL"] == [3] * 60


def test_the_queue_page_draws_both_charts_with_their_figures(queue: Queue, viewer: User) -> None:
    publish(3)
    queue_deliver(queue_id=queue.id)

    html = logged_in(viewer).get("/queues/PAYROLL/").content.decode()

    assert 'aria-label="Messages per minute, last hour"' in html
    assert 'aria-label="Messages by state, last hour"' in html
    assert "3 published" in html
    assert "3 acked" in html
    assert "TBDL 0 now" in html
    rates, states = chart_data(html, "rates"), chart_data(html, "states")
    assert len(rates["times"]) == 60
    assert rates["times"] == sorted(rates["times"])
    assert rates["zone"] == "UTC"
    published = next(line for line in rates["series"] if line["name"] == "published")
    assert (published["label"], sum(published["values"]), len(published["values"])) == (
        "published",
        3,
        60,
    )
    assert "state-ndlv" in {line["name"] for line in states["series"]}
    assert '<div class="chart-plot" role="img" aria-label="Messages by state, last hour"' in html
    assert "vendor/uplot/uPlot.iife.min.js" in html
    assert 'href="/queues/PAYROLL/?window=day"' in html


def test_the_charts_draw_the_queues_alert_thresholds_they_can_show(
    queue: Queue, viewer: User
) -> None:
    queue_update(
        queue=queue,
        alert_waiting_above=500,
        alert_blacklisted_above=0,
        alert_dead_letter_per_minute=30,
        alert_stalled_seconds=120,
    )

    html = logged_in(viewer).get("/queues/PAYROLL/?window=day").content.decode()

    assert chart_data(html, "states")["thresholds"] == [
        {"name": "state-tbdl", "label": "alert: TBDL above 500", "value": 500},
        {"name": "state-ndlv", "label": "alert: NDLV above 0", "value": 0},
    ]
    assert chart_data(html, "rates")["thresholds"] == [
        {"name": "dead_lettered", "label": "alert: dead-lettered above 30", "value": 30},
    ]
    assert 'class="state-tbdl threshold" data-threshold="500"' in html


def test_a_queue_without_thresholds_draws_none(queue: Queue, viewer: User) -> None:
    html = logged_in(viewer).get("/queues/PAYROLL/").content.decode()

    assert chart_data(html, "states")["thresholds"] == []
    assert "No alert has fired." in html


def test_the_day_window_comes_as_the_charts_alone_to_htmx(queue: Queue, viewer: User) -> None:
    client = logged_in(viewer)

    answer = client.get("/queues/PAYROLL/activity/?window=day", HTTP_HX_REQUEST="true")

    html = answer.content.decode()
    assert answer.status_code == 200
    assert html.lstrip().startswith('<section id="queue-activity"')
    assert "Messages per minute, averaged over 15 minutes, last day" in html
    assert "<strong>Last day</strong>" in html
    assert "<h1>" not in html


@pytest.mark.parametrize(
    "path", ["/queues/PAYROLL/?window=week", "/queues/PAYROLL/activity/?window="]
)
def test_an_unknown_window_is_a_404_that_names_the_choices(
    queue: Queue, viewer: User, path: str
) -> None:
    answer = logged_in(viewer).get(path)
    assert answer.status_code == 404
    assert "choose hour or day" in answer.content.decode()


def test_the_charts_need_a_signed_in_user(client, queue: Queue) -> None:
    answer = client.get("/queues/PAYROLL/activity/")
    assert answer.status_code == 302
    assert answer["Location"].startswith("/login/")


def test_the_charts_of_an_unknown_queue_are_a_404(viewer: User) -> None:
    assert logged_in(viewer).get("/queues/NOPE/activity/").status_code == 404
