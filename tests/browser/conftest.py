"""Fixtures for real-browser tests: Debian's Chromium (``/usr/bin/chromium``,
installed by ``scripts/browser.sh``) driven by Playwright's sync API against
pytest-django's ``live_server``, which makes every test that uses ``page``
transactional (the database is flushed after each test: create what a test
needs in the test).

- ``browser``: one Chromium for the whole tests/browser package.
- ``page``: a fresh browser context and page per test, its ``base_url`` the
  live server (``page.goto("/topics/")``). A JavaScript dialog (alert,
  confirm, prompt) is dismissed and fails the test; console errors and
  uncaught page errors are kept in ``browser_log`` and shown with a failure;
  a failed test leaves a screenshot in test-artifacts/<test name>.png.

Tests log in through the form with ``tests.support.browser.login``.

Mark browser tests ``pytest.mark.slow``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Page,
    sync_playwright,
)
from playwright.sync_api import Error as PlaywrightError
from pytest_django.live_server_helper import LiveServer

from tests.support.browser import ARTIFACTS_DIR, BrowserLog

CHROMIUM = Path("/usr/bin/chromium")
# --headless --no-sandbox (we run as root) and no background traffic: the
# closed network refuses Chromium's own connections.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ACTION_TIMEOUT_MS = 10_000
NAVIGATION_TIMEOUT_MS = 15_000


_LOG = pytest.StashKey[BrowserLog]()
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item (the ``page`` fixture reads it in
    teardown), fail a test whose page opened a JavaScript dialog and show the
    browser's errors with a failed test."""
    report = yield
    log = item.stash.get(_LOG, None)
    if report.when == "call" and log is not None:
        if log.dialogs and report.passed:
            report.outcome = "failed"
            report.longrepr = _dialogs_failure(log.dialogs)
        log.dialogs_reported = len(log.dialogs)
        if report.failed and log.render():
            report.sections.append(("browser console", log.render()))
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def _dialogs_failure(dialogs: list[str]) -> str:
    return "a JavaScript dialog opened (injected script?):\n" + "\n".join(dialogs)


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """Chromium, started once for the tests in this package.

    While Playwright runs, its asyncio loop counts as running in this thread,
    and Django's async-safety check would refuse the ORM calls that tests and
    the transactional flush make (SynchronousOnlyOperation); tests and
    Playwright never run at the same time, so the check is turned off for as
    long as Playwright runs. Package scope (not session): Playwright and the
    setting both end with the last browser test, so the tests after them run
    without either."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `bash scripts/browser.sh` (make test does)")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                yield chromium
            finally:
                chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def browser_log() -> BrowserLog:
    """The dialogs and console errors of this test's ``page`` (live lists)."""
    return BrowserLog()


@pytest.fixture
def page(
    browser: Browser,
    browser_log: BrowserLog,
    live_server: LiveServer,
    transactional_db: None,
    request: pytest.FixtureRequest,
) -> Iterator[Page]:
    """A page in a new browser context (no cookies from other tests) whose
    relative URLs go to the live server. Fails the test if any JavaScript
    dialog opened.

    ``transactional_db`` is named here, not only pulled in by ``live_server``:
    pytest-django orders tests by the fixtures they name, and the flush after
    a transactional test removes the rows migrations made (the system
    dead-letter queue), so these tests must run after the plain ``db`` ones."""
    request.node.stash[_LOG] = browser_log
    context = browser.new_context(base_url=live_server.url)
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
    new_page = context.new_page()

    def on_dialog(dialog: Dialog) -> None:
        browser_log.dialogs.append(f"{dialog.type}({dialog.message!r}) on {new_page.url}")
        dialog.dismiss()

    def on_console(message: ConsoleMessage) -> None:
        # Chromium asks for /favicon.ico, which the console does not serve.
        if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
            where = message.location.get("url", "")
            browser_log.console_errors.append(f"console.error: {message.text} ({where})")

    def on_page_error(error: PlaywrightError) -> None:
        browser_log.console_errors.append(f"uncaught: {error.message} on {new_page.url}")

    new_page.on("dialog", on_dialog)
    new_page.on("console", on_console)
    new_page.on("pageerror", on_page_error)
    try:
        yield new_page
        reports = request.node.stash.get(_REPORTS, {})
        if browser_log.dialogs or any(report.failed for report in reports.values()):
            _screenshot(new_page, request)
    finally:
        context.close()
    # Dialogs seen only now (Playwright hands events over during its own calls).
    if len(browser_log.dialogs) > browser_log.dialogs_reported:
        pytest.fail(_dialogs_failure(browser_log.dialogs), pytrace=False)


def _screenshot(page: Page, request: pytest.FixtureRequest) -> None:
    directory = request.config.rootpath / ARTIFACTS_DIR
    directory.mkdir(exist_ok=True)
    path = directory / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', request.node.name)}.png"
    try:
        page.screenshot(path=path, full_page=True)
    except PlaywrightError as error:  # a crashed page must not hide the real failure
        print(f"browser: no screenshot for {request.node.nodeid}: {error}", file=sys.stderr)
    else:
        print(f"browser: screenshot {path}", file=sys.stderr)
