"""Triage in a real browser with real workers: a poison message reaches the
blacklist while the operator watches, is released once its consumer is
fixed, and is delivered; 500 blacklisted messages failed by filter; a rules
table checked, dry-run and activated; payloads that try to run script."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.models import Message, Queue
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create, queue_update
from rig.processes import wait_until
from tests.support.browser import login
from tests.support.messages import blacklisted, quarantined

pytestmark = pytest.mark.slow
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def test_a_poison_message_shows_up_on_the_blacklist_live_and_is_released_and_delivered(
    page: Page, live_server: LiveServer, operator: User, start_workers
) -> None:
    queue = queue_create(name="ORDERS.IN", consumer="demo", suspect_delay_seconds=0.05)
    start_workers()
    login(page, live_server, operator)
    page.goto("/blacklist/")

    [poison] = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"CRASH")])

    row = page.locator(f'tr[data-message="{poison}"]')
    expect(row).to_be_visible(timeout=45_000)  # no reload: the table refreshes itself
    expect(row.locator(".state")).to_have_text("NDLV")
    queue_update(queue=queue, consumer="noop")  # the consumer is fixed
    row.get_by_role("button", name="Release").click()
    expect(page.locator(f'tr[data-message="{poison}"] .outcome')).to_contain_text("released")
    wait_until(
        lambda: Message.objects.filter(id=poison, state="DLVD").exists(),
        timeout=30,
        what="the released message delivered",
    )
    page.goto(f"/messages/{poison}/")
    expect(page.locator("h1 .state")).to_have_text("DLVD")


def test_an_operator_fails_500_blacklisted_messages_by_filter(
    page: Page, live_server: LiveServer, operator: User, start_workers
) -> None:
    queue_create(name="ORDERS.IN")
    queue_create(name="OTHER.IN")
    ids = blacklisted("ORDERS.IN", 500)
    [other] = blacklisted("OTHER.IN")
    start_workers(concurrency=1)
    login(page, live_server, operator)

    page.goto("/blacklist/?queue=ORDERS.IN")
    page.get_by_label("Action").select_option("fail")
    page.get_by_role("button", name="Apply to all matching the filter…").click()
    expect(page.get_by_role("heading")).to_contain_text("Fail 500 blacklisted messages?")
    page.get_by_role("button", name="Yes, fail 500").click()

    expect(page.locator("[data-status]")).to_have_text("Done: 500 of 500 (100%).", timeout=60_000)
    assert Message.objects.filter(id__in=ids, state="FAIL").count() == 500
    assert Message.objects.get(id=other).state == "NDLV"


def test_an_admin_sees_a_rules_error_at_its_line_then_dry_runs_and_activates(
    page: Page, live_server: LiveServer, admin: User
) -> None:
    queue_create(name="ORDERS.IN")
    dlq = Queue.objects.get(name=DLQ)
    [dead] = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"x")])
    Message.objects.filter(id=dead).update(
        queue=dlq, dead_letter={"reason": "format_error", "original_queue": "ORDERS.IN"}
    )
    login(page, live_server, admin)
    page.goto(f"/dead-letters/{DLQ}/rules/")
    editor = page.get_by_label("Rules table (runmqdlq syntax)")

    editor.fill("* park format errors\nREASON(MQRC_FORMAT_ERROR) ACTION(FWD)\nACTION(IGNORE)\n")
    page.get_by_role("button", name="Check").click()
    expect(page.locator('.error[data-line="2"]')).to_contain_text("ACTION(FWD) requires FWDQ")

    editor.fill(
        "* park format errors\nREASON(MQRC_FORMAT_ERROR) ACTION(FWD) FWDQ(ORDERS.IN)\nACTION(IGNORE)\n"
    )
    page.get_by_role("button", name="Dry-run against the queue").click()
    expect(page.locator('tr[data-rule="1"] [data-hits]')).to_have_text("1")
    page.get_by_role("button", name="Save and activate").click()

    expect(page.get_by_role("status")).to_contain_text("Version 1 is active")
    expect(page.locator('tr[data-version="1"]')).to_contain_text("Active")
    assert Message.objects.get(id=dead).queue.name == DLQ  # the handler acts at its next scan


@pytest.mark.parametrize("payload", ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>'])
def test_payloads_that_try_to_run_script_show_as_text(
    page: Page, live_server: LiveServer, viewer: User, payload: str
) -> None:
    queue_create(name="ORDERS.IN")
    [message_id] = messages_publish(
        queue_name="ORDERS.IN",
        messages=[
            NewMessage(payload=payload.encode(), content_type="text/html", headers={"h": payload})
        ],
    )
    quarantined([message_id], reason=payload)
    login(page, live_server, viewer)

    page.goto(f"/messages/{message_id}/")
    expect(page.locator("pre.payload")).to_have_text(payload)
    page.goto("/blacklist/")
    expect(page.locator(f'tr[data-message="{message_id}"]')).to_be_visible()
    expect(page.get_by_role("button", name="Release")).to_have_count(0)  # viewers get no buttons
    page.goto("/audit/")
    expect(page.get_by_text(payload).first).to_be_visible()
    # The page fixture fails the test if any dialog opened.
