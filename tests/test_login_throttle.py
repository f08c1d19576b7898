"""Failed sign-ins are throttled per user name and per address: past the
limit the right password is refused too, the page says when to try again,
and the lockout is an audit event. Behind a trusted proxy the address is the
one X-Forwarded-For names; from anywhere else that header is ignored, for
the throttle as for /metrics."""

from __future__ import annotations

from ipaddress import ip_network
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from broker.models import AuditEvent

LIMIT = 5
# The operator fixture's user.
NAME, PASSWORD = "oscar", "oscar-password-1"
PROXY = "10.9.0.1"


@pytest.fixture(autouse=True)
def throttle(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = LIMIT
    settings.LAZARETTO_TRUSTED_PROXIES = []


def sign_in(username: str, password: str, **meta: Any) -> Any:
    return Client().post("/login/", {"username": username, "password": password}, **meta)


def signed_in(response: Any) -> bool:
    return response.status_code == 302 and response.wsgi_request.user.is_authenticated


def test_a_user_name_is_locked_out_after_the_limit_and_the_page_says_when(
    operator: User,
) -> None:
    for _ in range(LIMIT - 1):
        failed = sign_in(NAME, "wrong", REMOTE_ADDR="203.0.113.7")
        assert failed.status_code == 200
        assert "Please enter a correct username and password" in failed.content.decode()
    # The failure that reaches the limit locks the name out at once…
    assert sign_in(NAME, "wrong", REMOTE_ADDR="203.0.113.7").status_code == 429
    # …and the right password from anywhere is refused while it lasts.
    locked = sign_in(NAME, PASSWORD, REMOTE_ADDR="198.51.100.9")
    assert locked.status_code == 429
    assert not locked.wsgi_request.user.is_authenticated
    page = locked.content.decode()
    assert "Too many failed sign-ins for this user name or from this address." in page
    assert "Try again in 15 minutes." in page
    assert locked["Retry-After"] == "900"
    first = AuditEvent.objects.filter(action="login.locked_out").earliest("id")
    assert first.actor_name == "system"
    assert first.details == {"username": NAME, "address": "203.0.113.7"}


def test_an_address_is_locked_out_whatever_names_it_tries(operator: User) -> None:
    for number in range(LIMIT):
        sign_in(f"guess-{number}", "wrong", REMOTE_ADDR="203.0.113.7")
    assert sign_in(NAME, PASSWORD, REMOTE_ADDR="203.0.113.7").status_code == 429
    # The user name itself is not locked: from another address it signs in.
    assert signed_in(sign_in(NAME, PASSWORD, REMOTE_ADDR="203.0.113.8"))


def test_a_successful_sign_in_resets_the_count(operator: User) -> None:
    for _ in range(LIMIT - 1):
        sign_in(NAME, "wrong", REMOTE_ADDR="203.0.113.7")
    assert signed_in(sign_in(NAME, PASSWORD, REMOTE_ADDR="203.0.113.7"))
    for _ in range(LIMIT - 1):
        sign_in(NAME, "wrong", REMOTE_ADDR="203.0.113.7")
    assert signed_in(sign_in(NAME, PASSWORD, REMOTE_ADDR="203.0.113.7"))


def test_x_forwarded_for_from_an_untrusted_address_is_ignored(operator: User) -> None:
    for number in range(LIMIT):
        sign_in(
            f"guess-{number}", "wrong", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=f"192.0.2.{number}"
        )
    refused = sign_in(NAME, PASSWORD, REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="192.0.2.99")
    assert refused.status_code == 429


def test_behind_a_trusted_proxy_each_client_is_counted_apart(operator: User, settings: Any) -> None:
    settings.LAZARETTO_TRUSTED_PROXIES = [ip_network("10.9.0.0/24")]
    for number in range(LIMIT):
        # A client may write anything left of what the proxy appends.
        sign_in(
            f"guess-{number}",
            "wrong",
            REMOTE_ADDR=PROXY,
            HTTP_X_FORWARDED_FOR=f"1.2.3.4, 192.0.2.10, {PROXY}",
        )
    assert (
        sign_in(NAME, PASSWORD, REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="192.0.2.10").status_code
        == 429
    )
    assert signed_in(sign_in(NAME, PASSWORD, REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="192.0.2.11"))
    addresses = {
        event.details["address"] for event in AuditEvent.objects.filter(action="login.locked_out")
    }
    assert addresses == {"192.0.2.10"}


def test_metrics_sees_the_client_behind_a_trusted_proxy(db: None, settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    local: dict[str, Any] = {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "203.0.113.7"}
    # Untrusted: the connecting address (loopback) counts, not the header.
    assert Client().get("/metrics", **local).status_code == 200
    # The proxy on this host is trusted: the outside client is refused.
    settings.LAZARETTO_TRUSTED_PROXIES = [ip_network("127.0.0.1/32")]
    refused = Client().get("/metrics", **local)
    assert refused.status_code == 403
    assert refused.json()["code"] == "permission_denied"
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
