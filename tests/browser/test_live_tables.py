"""Live regions in a real browser: a table that refreshes itself every few
seconds never destroys what the operator is doing (ticked boxes, keyboard
focus), still shows new rows when the operator is not in the middle of
something, and the bulk-job page stops polling while its tab is hidden.

The pausing is liveRegionIdle in static/js/console.js, called from each
region's hx-trigger filter. /messages/ has no live region (its table changes
only when the operator filters or pages), so there is nothing to test there."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Locator, Page, Request, Route, expect
from pytest_django.live_server_helper import LiveServer

from broker.models import BulkJob, Message
from broker.services.queues import queue_create
from tests.support.browser import BrowserLog, login
from tests.support.messages import blacklisted

pytestmark = pytest.mark.slow

# Longer than two of the blacklist's 2 s polling periods.
TWO_POLLS_MS = 5_000
# A poll comes within 2 s, its answer a moment later.
NEW_ROW_TIMEOUT_MS = 10_000


def _row(page: Page, message_id: int) -> Locator:
    return page.locator(f'tr[data-message="{message_id}"]')


def _box(page: Page, message_id: int) -> Locator:
    return page.get_by_label(f"Select message {message_id}", exact=True)


def on_the_blacklist_with_one_message(page: Page, live_server: LiveServer, operator: User) -> int:
    """The operator logged in and on /blacklist/, which shows one message of
    ORDERS.IN (a queue without consumer); returns its id."""
    queue_create(name="ORDERS.IN")
    [first] = blacklisted("ORDERS.IN", 1)
    login(page, live_server, operator)
    page.goto("/blacklist/")
    return first


def test_ticked_rows_survive_the_blacklist_refresh_and_the_bulk_action_releases_exactly_them(
    page: Page, live_server: LiveServer, operator: User, start_workers
) -> None:
    queue_create(name="ORDERS.IN", consumer="noop")
    ids = blacklisted("ORDERS.IN", 5)
    login(page, live_server, operator)
    page.goto("/blacklist/")
    ticked = [ids[1], ids[3]]
    for message_id in ticked:
        _box(page, message_id).check()

    [late] = blacklisted("ORDERS.IN", 1)  # what a refresh would have had to show
    page.wait_for_timeout(TWO_POLLS_MS)

    for message_id in ticked:
        expect(_box(page, message_id)).to_be_checked()
    expect(_row(page, late)).to_have_count(0)  # the table waited while boxes were ticked
    start_workers(concurrency=1)  # now: workers earlier could deliver `late` before its quarantine
    page.get_by_label("Action").select_option("release")
    page.get_by_role("button", name="Apply to the selected").click()

    expect(page.locator("[data-status]")).to_have_text("Done: 2 of 2 (100%).", timeout=60_000)
    still_blacklisted = Message.objects.filter(id__in=[*ids, late], state="NDLV")
    assert set(still_blacklisted.values_list("id", flat=True)) == {*ids, late} - set(ticked)


def test_a_box_ticked_while_a_refresh_is_on_its_way_is_not_wiped_by_its_answer(
    page: Page, live_server: LiveServer, operator: User
) -> None:
    """The trigger filter runs when a poll is sent; the operator may tick a
    box before its answer is back. The answer is then not swapped in."""
    queue_create(name="ORDERS.IN")
    [first] = blacklisted("ORDERS.IN", 1)
    login(page, live_server, operator)
    held: list[Route] = []

    def hold_the_first_poll(route: Route) -> None:
        if route.request.headers.get("hx-request") and not held:
            held.append(route)  # answered below, once the box is ticked
        else:
            route.continue_()

    page.route("**/blacklist/", hold_the_first_poll)
    page.goto("/blacklist/")
    [late] = blacklisted("ORDERS.IN", 1)
    page.wait_for_timeout(3_000)  # the first poll goes out after 2 s
    assert held, "the blacklist polled"

    _box(page, first).check()
    with page.expect_response(lambda response: response.request == held[0].request):
        held[0].fulfill(response=held[0].fetch())  # an answer with the late row in it
    page.wait_for_timeout(500)  # htmx handles it at once

    expect(_box(page, first)).to_be_checked()
    expect(_row(page, late)).to_have_count(0)


def test_with_nothing_ticked_the_blacklist_shows_a_newly_blacklisted_message_without_a_reload(
    page: Page, live_server: LiveServer, operator: User, browser_log: BrowserLog
) -> None:
    first = on_the_blacklist_with_one_message(page, live_server, operator)
    expect(_row(page, first)).to_be_visible()

    [late] = blacklisted("ORDERS.IN", 1)

    expect(_row(page, late)).to_be_visible(timeout=NEW_ROW_TIMEOUT_MS)
    assert not browser_log.console_errors  # e.g. console.js missing: the filter would throw


def test_the_dashboard_still_refreshes_itself(
    page: Page, live_server: LiveServer, operator: User, browser_log: BrowserLog
) -> None:
    queue_create(name="ORDERS.IN")
    login(page, live_server, operator)  # ends on the dashboard
    expect(page.locator('[data-tile="blacklisted"]')).to_have_text("0")

    blacklisted("ORDERS.IN", 1)

    expect(page.locator('[data-tile="blacklisted"]')).to_have_text("1", timeout=12_000)
    assert not browser_log.console_errors


def test_once_its_boxes_are_unticked_again_the_blacklist_refreshes_itself_again(
    page: Page, live_server: LiveServer, operator: User
) -> None:
    first = on_the_blacklist_with_one_message(page, live_server, operator)
    _box(page, first).check()
    [late] = blacklisted("ORDERS.IN", 1)
    page.wait_for_timeout(TWO_POLLS_MS)
    expect(_row(page, late)).to_have_count(0)

    _box(page, first).uncheck()  # the mouse leaves focus on the box: that alone pauses nothing

    expect(_row(page, late)).to_be_visible(timeout=NEW_ROW_TIMEOUT_MS)


def test_a_row_reached_with_the_keyboard_keeps_its_focus_while_the_blacklist_would_refresh(
    page: Page, live_server: LiveServer, operator: User
) -> None:
    first = on_the_blacklist_with_one_message(page, live_server, operator)
    _box(page, first).focus()
    page.keyboard.press("Tab")  # from the row's box to its message link
    link = _row(page, first).get_by_role("link", name=str(first), exact=True)
    expect(link).to_be_focused()

    [late] = blacklisted("ORDERS.IN", 1)
    page.wait_for_timeout(TWO_POLLS_MS)

    expect(link).to_be_focused()
    expect(_row(page, late)).to_have_count(0)
    page.get_by_role("heading", level=1).click()  # focus leaves the table
    expect(_row(page, late)).to_be_visible(timeout=NEW_ROW_TIMEOUT_MS)


def test_the_bulk_job_page_polls_only_while_its_tab_is_visible(
    page: Page, live_server: LiveServer, operator: User
) -> None:
    """Headless Chromium reports every tab visible, so the test hides this
    one the way the polling filter sees it: ``document.visibilityState``
    (what the browser sets for a background tab) overridden on the document."""
    job = BulkJob.objects.create(action="release", total=3, done=1, status="running")
    polls: list[str] = []

    def count_polls(request: Request) -> None:
        if request.url.endswith(f"/jobs/{job.id}/") and request.headers.get("hx-request"):
            polls.append(request.url)

    page.on("request", count_polls)
    login(page, live_server, operator)
    page.goto(f"/jobs/{job.id}/")
    page.wait_for_timeout(3_500)
    assert len(polls) >= 2, "a visible job page polls every second"

    page.evaluate(
        "Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'})"
    )
    page.wait_for_timeout(300)  # a poll already sent may still be reported
    seen = len(polls)
    page.wait_for_timeout(3_500)
    assert len(polls) == seen, "a hidden job page does not poll"

    BulkJob.objects.filter(id=job.id).update(done=3, status="done")
    page.evaluate("delete document.visibilityState")  # visible again: the prototype's getter
    expect(page.locator("[data-status]")).to_have_text("Done: 3 of 3 (100%).")


def test_filtering_in_place_changes_what_apply_to_all_matching_the_filter_acts_on(
    page: Page, live_server: LiveServer, operator: User
) -> None:
    queue_create(name="ORDERS.IN")
    queue_create(name="OTHER.IN")
    blacklisted("ORDERS.IN", 3)
    [other] = blacklisted("OTHER.IN")
    login(page, live_server, operator)
    page.goto("/blacklist/?queue=ORDERS.IN")

    page.locator("form.filters").get_by_label("Queue").fill("OTHER.IN")
    page.get_by_role("button", name="Filter", exact=True).click()  # htmx swaps #message-table only
    expect(_row(page, other)).to_be_visible()
    page.get_by_label("Action").select_option("fail")
    page.get_by_role("button", name="Apply to all matching the filter…").click()

    expect(page.get_by_role("heading")).to_contain_text("Fail 1 blacklisted message?")
    expect(page.locator('[data-filter="queue"]')).to_have_text("OTHER.IN")
