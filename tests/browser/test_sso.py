"""Single sign-on in a real browser through a real OpenID Connect provider
(django-oauth-toolkit, in its own process with its own database,
tests/support/oidc_provider): the provider's login page, its groups claim
giving a grant, and a user the provider took out of the group having lost
it at their next sign-in."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from pytest_django.live_server_helper import LiveServer

from broker.services.queues import queue_create
from console.grants import Grantee, grant_add, group_create
from tests.support.databases import throwaway_database
from tests.support.oidc import RealProvider

pytestmark = pytest.mark.slow

PASSWORD = "nina-at-acme-7"


@pytest.fixture
def provider(live_server: LiveServer, settings) -> Iterator[RealProvider]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with throwaway_database(os.environ["DATABASE_URL"], f"lazaretto_idp_{worker}") as url:
        served = RealProvider(database_url=url)
        served.start(redirect_uri=f"{live_server.url}/oidc/callback/")
        try:
            for name, value in served.settings().items():
                setattr(settings, name, value)
            settings.AUTHENTICATION_BACKENDS = [
                *settings.AUTHENTICATION_BACKENDS,
                "console.oidc.OidcBackend",
            ]
            yield served
        finally:
            served.stop()


def sign_in(page: Page, live_server: LiveServer) -> None:
    page.goto(f"{live_server.url}/login/")
    page.get_by_role("link", name="Sign in with Acme sign-on").click()
    expect(page.get_by_role("heading", name="Acme sign-on")).to_be_visible()
    page.get_by_label("User name").fill("nina")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in to Acme").click()
    expect(page).to_have_url(f"{live_server.url}/")


def test_a_user_signs_in_through_the_provider_and_its_groups_decide_what_they_see(
    page: Page, live_server: LiveServer, provider: RealProvider
) -> None:
    queue_create(name="ORDERS.IN")
    queue_create(name="PAYMENTS.IN")
    group_create(name="orders-team", actor=None)
    grant_add(pattern="ORDERS.*", role="operator", to=Grantee(group="orders-team"), actor=None)
    provider.person("nina", PASSWORD, "orders-team")

    sign_in(page, live_server)

    expect(page.locator('tr[data-queue="ORDERS.IN"]')).to_be_visible()
    expect(page.locator('tr[data-queue="PAYMENTS.IN"]')).to_have_count(0)
    assert [g.name for g in User.objects.get(username="nina").groups.all()] == ["orders-team"]

    # The provider takes nina out of the team; her next sign-in drops the grant.
    provider.person("nina", PASSWORD)
    page.get_by_role("button", name="Log out", exact=True).click()
    sign_in(page, live_server)

    assert not User.objects.get(username="nina").groups.exists()
    answer = page.goto(f"{live_server.url}/queues/ORDERS.IN/")
    assert answer is not None
    assert answer.status == 403  # signed in, with a role on no queue
