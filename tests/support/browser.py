"""Browser tests' helpers: logging in through the real form in Chromium, and
what a page did that a test did not ask for. The browser and its pages are
fixtures in tests/browser/conftest.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

# Screenshots of failed tests (and of whatever a test keeps), below the
# project's root.
ARTIFACTS_DIR = "test-artifacts"


@dataclass
class BrowserLog:
    """What the page did that a test did not ask for."""

    dialogs: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    dialogs_reported: int = 0  # how many of ``dialogs`` already failed the test

    def render(self) -> str:
        lines = [f"dialog {entry}" for entry in self.dialogs]
        lines += self.console_errors
        return "\n".join(lines)


def login(
    page: Page, live_server: LiveServer, user: User | str, password: str | None = None
) -> None:
    """Log in through the real login form and wait for the dashboard (``/``).
    ``user`` is a User or a username; ``password`` defaults to the one
    tests/conftest.py gives its users (f"{username}-password-1")."""
    username = user if isinstance(user, str) else user.get_username()
    if password is None:
        password = f"{username}-password-1"
    page.goto(f"{live_server.url}/login/")
    page.get_by_label("Username", exact=True).fill(username)
    page.get_by_label("Password", exact=True).fill(password)
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page).to_have_url(f"{live_server.url}/")
    expect(page.get_by_role("button", name="Log out", exact=True)).to_be_visible()
    expect(page.locator("#queue-table")).to_be_visible()  # the dashboard's self-refreshing part
