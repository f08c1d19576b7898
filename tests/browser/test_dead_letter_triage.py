"""Triage starts on the dead-letter queues page, in a real browser: the
counts by reason and by original queue, then "browse" on one reason opens
the message list filtered to that queue and reason."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.services.queues import queue_create
from tests.support.browser import login
from tests.support.messages import dead_lettered

pytestmark = pytest.mark.slow
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def test_an_operator_sees_the_counts_and_browses_one_reason(
    page: Page, live_server: LiveServer, operator: User
) -> None:
    orders = queue_create(name="ORDERS.IN")
    format_errors = dead_lettered(orders, 2, reason="format_error")
    [handler_error] = dead_lettered(orders, 1, reason="handler_error")
    login(page, live_server, operator)

    page.get_by_role("link", name="Dead letters").click()
    expect(page.locator(f'tr[data-queue="{DLQ}"] [data-fact="waiting"]')).to_have_text("3")
    reasons = page.locator(f'section[data-triage="{DLQ}"] [data-panel="reasons"]')
    expect(reasons.locator('tr[data-reason="format_error"] td.num')).to_have_text("2")
    expect(reasons.locator('tr[data-reason="handler_error"] td.num')).to_have_text("1")
    origins = page.locator(f'section[data-triage="{DLQ}"] [data-panel="origins"]')
    expect(origins.locator('tr[data-original="ORDERS.IN"] td.num')).to_have_text("3")

    reasons.locator('tr[data-reason="format_error"]').get_by_role("link", name="browse").click()

    expect(page).to_have_url(
        f"{live_server.url}/messages/?queue={DLQ}&state=TBDL&reason=format_error"
    )
    for message_id in format_errors:
        expect(page.locator(f'tr[data-message="{message_id}"]')).to_be_visible()
    expect(page.locator(f'tr[data-message="{handler_error}"]')).to_have_count(0)
