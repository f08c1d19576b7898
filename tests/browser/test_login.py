"""The console in a real browser: logging in, the self-refreshing dashboard,
role-dependent forms and HTML escaping of stored text."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.models import QueueKind
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.topics import topic_create
from tests.support.browser import BrowserLog, login

pytestmark = pytest.mark.slow

SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE_BREAKOUT = '"><img src=x onerror=alert(1)>'


def test_admin_logs_in_and_sees_the_queue_table(
    page: Page, live_server: LiveServer, admin: User
) -> None:
    # The migration's system dead-letter queue survives only until the first
    # transactional test's flush; a standard queue brings it back.
    queue_create(name="ORDERS.IN")
    dead_letters = settings.LAZARETTO_DEFAULT_DEAD_LETTER_QUEUE

    login(page, live_server, admin, "alice-password-1")

    for name in (dead_letters, "ORDERS.IN"):
        row = page.locator(f'tr[data-queue="{name}"]')
        expect(row).to_be_visible()
        expect(row.get_by_role("rowheader")).to_have_text(name)
        expect(row.locator('td[data-state="TBDL"]')).to_have_text("0")
    expect(page.locator("form.account .role")).to_have_text("admin")
    # The last hour's deliveries, drawn with a legend of its two lines.
    chart = page.get_by_role("img", name="Deliveries and failures per minute over the last hour")
    expect(chart.locator("canvas")).to_have_count(1)
    expect(chart.locator(".u-legend th")).to_have_text(["Time", "delivered", "failed"])


def test_a_wrong_password_is_refused_on_the_login_form(
    page: Page, live_server: LiveServer, admin: User
) -> None:
    page.goto("/login/")
    page.get_by_label("Username", exact=True).fill("alice")
    page.get_by_label("Password", exact=True).fill("not-the-password")
    page.get_by_role("button", name="Log in", exact=True).click()

    expect(page.get_by_role("alert")).to_contain_text(
        "Please enter a correct username and password."
    )
    expect(page).to_have_url(re.compile(r"/login/$"))
    expect(page.get_by_label("Username", exact=True)).to_have_value("alice")
    expect(page.get_by_label("Password", exact=True)).to_have_value("")
    expect(page.get_by_role("button", name="Log out")).to_have_count(0)


def test_an_anonymous_visit_lands_on_the_login_page_and_comes_back(
    page: Page, live_server: LiveServer, viewer: User
) -> None:
    page.goto("/")

    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    expect(page.locator("table.depths")).to_have_count(0)

    page.get_by_label("Username", exact=True).fill("vera")
    page.get_by_label("Password", exact=True).fill("vera-password-1")
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page).to_have_url(f"{live_server.url}/")


def test_the_dashboard_refreshes_itself(
    page: Page, live_server: LiveServer, operator: User
) -> None:
    queue_create(name="ORDERS.IN")
    login(page, live_server, operator)
    waiting = page.locator('tr[data-queue="ORDERS.IN"] td[data-state="TBDL"]')
    expect(waiting).to_have_text("0")
    # Survives an htmx swap, not a reload.
    page.evaluate("window.notReloaded = true")

    messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"x")] * 3)

    # The table polls every 5 s.
    expect(waiting).to_have_text("3", timeout=10_000)
    assert page.evaluate("window.notReloaded") is True


@pytest.mark.parametrize(("user_fixture", "sees_form"), [("admin", True), ("viewer", False)])
def test_only_an_admin_sees_the_new_topic_form(
    page: Page,
    live_server: LiveServer,
    request: pytest.FixtureRequest,
    user_fixture: str,
    sees_form: bool,
) -> None:
    login(page, live_server, request.getfixturevalue(user_fixture))

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Topics").click()

    expect(page.get_by_role("heading", name="Topics and subscriptions")).to_be_visible()
    expect(page.get_by_role("heading", name="New topic")).to_have_count(1 if sees_form else 0)
    expect(page.get_by_role("button", name="Create topic")).to_have_count(1 if sees_form else 0)


def test_stored_markup_is_shown_as_text(
    page: Page, live_server: LiveServer, browser_log: BrowserLog, viewer: User
) -> None:
    topic_create(name="T1", topic_string="t1", description=SCRIPT)
    topic_create(name="T2", topic_string="t2", description=ATTRIBUTE_BREAKOUT)
    queue_create(name="ORDERS.IN", description=ATTRIBUTE_BREAKOUT)
    queue_create(name="ORDERS.DLQ", kind=QueueKind.DEAD_LETTER, description=SCRIPT)
    login(page, live_server, viewer)

    page.goto("/topics/")
    for name, text in (("T1", SCRIPT), ("T2", ATTRIBUTE_BREAKOUT)):
        description = page.locator(f'tr[data-topic="{name}"] td').nth(1)
        expect(description).to_have_text(text)
        expect(description.locator("script, img")).to_have_count(0)
    expect(page.locator('img[src="x"]')).to_have_count(0)

    page.goto("/queues/ORDERS.IN/")
    expect(page.locator("main")).to_contain_text(ATTRIBUTE_BREAKOUT)
    expect(page.locator('img[src="x"]')).to_have_count(0)

    page.goto("/dead-letters/")
    expect(page.locator('tr[data-queue="ORDERS.DLQ"]')).to_contain_text(SCRIPT)
    expect(page.locator("main script")).to_have_count(0)

    page.goto("/")
    expect(page.locator('tr[data-queue="ORDERS.IN"]')).to_be_visible()
    assert browser_log.dialogs == []


def test_markup_typed_into_the_new_topic_form_is_shown_as_text(
    page: Page, live_server: LiveServer, browser_log: BrowserLog, admin: User
) -> None:
    login(page, live_server, admin)
    page.goto("/topics/")
    form = page.locator("form", has=page.get_by_role("heading", name="New topic"))

    form.get_by_label("Name", exact=True).fill("T1")
    form.get_by_label("Topic string", exact=True).fill("t1")
    form.get_by_label("Description", exact=True).fill(SCRIPT)
    form.get_by_role("button", name="Create topic").click()

    # htmx swaps the answer in (and would run a <script> in it).
    expect(page.get_by_role("status")).to_contain_text("Topic T1 created.")
    expect(page.locator('tr[data-topic="T1"] td').nth(1)).to_have_text(SCRIPT)
    expect(page).to_have_url(f"{live_server.url}/topics/")
    assert browser_log.dialogs == []
