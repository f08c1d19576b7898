"""A queue's page in a real browser: its charts switch from the last hour to
the last day in place, and a user who picks a time zone sees the charts'
times, and every other, in it; the depth chart draws an alert threshold."""

from __future__ import annotations

import re
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.models import Message, Queue
from broker.services.delivery import queue_deliver
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from console.models import Preference
from tests.support.browser import login

pytestmark = pytest.mark.slow


@pytest.fixture
def payroll(db: None) -> None:
    queue = queue_create(name="PAYROLL", consumer="demo")
    messages_publish(queue_name="PAYROLL", messages=[NewMessage(payload=b"ok")] * 3)
    queue_deliver(queue_id=queue.id)
    messages_publish(queue_name="PAYROLL", messages=[NewMessage(payload=b"ok")] * 2)


def test_the_charts_switch_to_the_last_day_without_leaving_the_page(
    page: Page, live_server: LiveServer, viewer: User, payroll: None
) -> None:
    login(page, live_server, viewer)
    page.goto(f"{live_server.url}/queues/PAYROLL/")
    charts = page.locator("#queue-activity")
    expect(charts.get_by_role("img", name="Messages per minute, last hour")).to_be_visible()
    expect(charts).to_contain_text("5 published")
    expect(charts).to_contain_text("3 acked")
    expect(charts).to_contain_text("TBDL 2 now")

    charts.get_by_role("link", name="Last day").click()

    expect(
        charts.get_by_role("img", name="Messages per minute, averaged over 15 minutes, last day")
    ).to_be_visible()
    expect(page.locator("#queue-activity")).to_contain_text("5 published")
    expect(page.locator("#queue-activity strong")).to_have_text("Last day")
    # Drawn again in place: the day's chart, with its own canvas.
    expect(page.locator("#queue-activity .chart-plot canvas")).to_have_count(2)
    assert page.url == f"{live_server.url}/queues/PAYROLL/"  # swapped in place


def test_a_user_picks_paris_and_the_charts_say_their_times_in_it(
    page: Page, live_server: LiveServer, viewer: User, payroll: None
) -> None:
    login(page, live_server, viewer)
    page.get_by_role("link", name="UTC").click()
    page.get_by_label("Time zone", exact=True).select_option("Europe/Paris")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Times are now shown in Europe/Paris.")

    page.goto(f"{live_server.url}/queues/PAYROLL/")

    expect(page.get_by_role("link", name="Europe/Paris")).to_be_visible()
    since = page.locator("#queue-activity figcaption time").first
    expect(since).to_have_attribute("title", "Europe/Paris")
    expect(since).to_contain_text(re.compile(r"\bCES?T\b"))  # winter or summer time


def _minutes(label: str) -> int:
    hours, minutes = label.split(":")
    return int(hours) * 60 + int(minutes)


def test_the_chart_tells_its_times_in_the_users_zone_and_the_value_under_the_pointer(
    page: Page, live_server: LiveServer, viewer: User, payroll: None
) -> None:
    # +05:30: no time of UTC's last hour reads as one of Kolkata's.
    Preference.objects.create(user=viewer, time_zone="Asia/Kolkata")
    login(page, live_server, viewer)
    page.goto(f"{live_server.url}/queues/PAYROLL/")
    plot = page.locator('[data-chart="chart-rates"]')
    expect(plot.locator("canvas")).to_have_count(1)

    # The time axis: the last hour as Kolkata tells it.
    now = datetime.now(ZoneInfo("Asia/Kolkata"))
    ticks = re.findall(r"\d\d:\d\d", plot.get_attribute("data-time-ticks") or "")
    assert ticks, plot.get_attribute("data-time-ticks")
    now_minutes = now.hour * 60 + now.minute
    for tick in ticks:
        assert 0 <= (now_minutes - _minutes(tick)) % (24 * 60) <= 61, (tick, now)

    # The pointer on the minute the five were published in: the last one,
    # or the one before when a minute began since (the pointer steps left
    # until the legend tells that minute).
    over = plot.locator(".u-over")
    box = over.bounding_box()
    assert box is not None
    legend = plot.locator(".u-legend")
    time_shown = legend.locator("tr.u-series").first.locator(".u-value")
    published_at = Message.objects.filter(queue__name="PAYROLL").latest("id").created_at
    minute = published_at.astimezone(ZoneInfo("Asia/Kolkata")).strftime("%Y-%m-%d %H:%M")
    for step in range(40):
        page.mouse.move(box["x"] + box["width"] - 1 - step, box["y"] + box["height"] / 2)
        if time_shown.inner_text().endswith(minute[-5:]):
            break
    published = legend.locator("tr.u-series", has_text="published").locator(".u-value")
    expect(published).to_have_text("5")
    expect(time_shown).to_contain_text(minute[:10])
    assert abs(_minutes(time_shown.inner_text()[-5:]) - now_minutes) <= 1


def test_the_depth_chart_draws_the_waiting_threshold_with_its_value_in_the_legend(
    page: Page, live_server: LiveServer, viewer: User, payroll: None
) -> None:
    Queue.objects.filter(name="PAYROLL").update(alert_waiting_above=4)
    login(page, live_server, viewer)
    page.goto(f"{live_server.url}/queues/PAYROLL/")
    plot = page.locator('[data-chart="chart-states"]')
    expect(plot.locator("canvas")).to_have_count(1)

    over = plot.locator(".u-over")
    box = over.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] - 1, box["y"] + box["height"] / 2)
    legend = plot.locator(".u-legend")
    threshold = legend.locator("tr.u-series", has_text="alert: TBDL above 4")
    expect(threshold.locator(".u-value")).to_have_text("4")
    expect(legend.locator("tr.u-series", has_text="TBDL").first.locator(".u-value")).to_have_text(
        "2"
    )
