"""Replay schedules in a real browser: an operator fills the form, watches
the next five firing times follow the cron line and the time zone as they
are typed, saves the schedule and pauses it from the list."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.models import ReplaySchedule
from tests.support.browser import login

pytestmark = pytest.mark.slow
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def five_at(clock: str) -> list[re.Pattern[str]]:
    """Five firing times at ``clock`` (HH:MM:SS) in UTC, the operator's zone."""
    return [re.compile(rf"^\d{{4}}-\d\d-\d\d {clock} UTC$")] * 5


def test_an_operator_previews_a_schedules_firings_saves_it_and_pauses_it(
    page: Page, live_server: LiveServer, operator: User
) -> None:
    login(page, live_server, operator)
    page.get_by_role("link", name="Schedules", exact=True).click()
    page.get_by_role("link", name="New schedule").click()
    expect(page.get_by_role("heading", name="New replay schedule")).to_be_visible()
    firings = page.locator("#schedule-firings li")

    page.get_by_label("Name", exact=True).fill("nightly")
    page.get_by_label("Source queue").select_option(DLQ)
    page.get_by_label("Cron line").fill("0 3 * * *")
    expect(firings).to_have_text(five_at("03:00:00"))

    page.get_by_label("Cron line").fill("30 6 * * 1")
    expect(firings).to_have_text(five_at("06:30:00"))
    # 06:30 in Tokyo (no daylight saving there) is 21:30 UTC the day before.
    page.get_by_label("Time zone", exact=True).fill("Asia/Tokyo")
    expect(firings).to_have_text(five_at("21:30:00"))
    page.get_by_label("Cron line").fill("30 6 * *")
    expect(page.locator("[data-timing-problems]")).to_contain_text("A cron line has five fields")
    expect(firings).to_have_count(0)
    assert not ReplaySchedule.objects.exists()

    page.get_by_label("Cron line").fill("30 6 * * 1")
    expect(firings).to_have_count(5)
    page.get_by_role("button", name="Save schedule").click()

    schedule = ReplaySchedule.objects.get()
    expect(page).to_have_url(f"{live_server.url}/replay/schedules/{schedule.id}/")
    expect(page.get_by_role("status").first).to_contain_text("Replay schedule nightly saved.")
    expect(page.locator("[data-timing]")).to_have_text("30 6 * * 1 (Asia/Tokyo)")
    assert (schedule.source_queue, schedule.enabled) == (DLQ, True)

    page.get_by_role("link", name="Schedules", exact=True).click()
    row = page.locator(f'tr[data-schedule="{schedule.id}"]')
    expect(row.locator("[data-state]")).to_have_text("enabled")
    row.get_by_role("button", name="Pause").click()

    expect(page.locator("#schedule-table")).to_contain_text("nightly is paused")
    expect(row.locator("[data-state]")).to_have_text("paused")
    expect(row.get_by_role("button", name="Resume")).to_be_visible()
    expect(page).to_have_url(f"{live_server.url}/replay/schedules/")  # swapped in place
    schedule.refresh_from_db()
    assert not schedule.enabled
