"""The console's queue forms in a real browser: an admin makes a queue on
the dashboard (a bad name refused beside the field first), then publishes a
test message to it from its page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.models import Message, Queue
from tests.support.browser import login
from tests.support.messages import payload_of

pytestmark = pytest.mark.slow


def test_an_admin_makes_a_queue_and_publishes_a_test_message_to_it(
    page: Page, live_server: LiveServer, admin: User
) -> None:
    login(page, live_server, admin)
    form = page.locator("#queue-new")

    form.get_by_label("Name").fill("PAY ROLL")
    form.get_by_role("button", name="Create queue").click()
    expect(page.locator("#id_name-error")).to_contain_text("Use 1 to 48 ASCII letters")
    assert not Queue.objects.filter(name__startswith="PAY").exists()
    page.locator("#queue-new").get_by_label("Name").fill("PAYROLL.IN")
    page.locator("#queue-new").get_by_role("button", name="Create queue").click()
    expect(page.locator("#queue-new")).to_contain_text("Queue PAYROLL.IN created.")
    expect(page.locator('tr[data-queue="PAYROLL.IN"]')).to_be_visible(timeout=15_000)

    page.locator('tr[data-queue="PAYROLL.IN"]').get_by_role("link", name="PAYROLL.IN").click()
    page.get_by_label("Payload", exact=True).fill("hello")
    page.get_by_label("Headers", exact=True).fill("region=eu")
    page.get_by_role("button", name="Publish", exact=True).click()

    expect(page.get_by_role("status")).to_contain_text("Published message")
    expect(page.locator('#queue-panel td[data-state="TBDL"]')).to_have_text("1")
    message = Message.objects.get(queue__name="PAYROLL.IN")
    assert (payload_of(message), message.headers) == (b"hello", {"region": "eu"})
