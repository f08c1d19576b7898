"""Single sign-on with OpenID Connect (console.oidc) against a provider's
token, userinfo and JWKS endpoints on 127.0.0.1 that sign real RS256 ID
tokens: the code flow with state, nonce and PKCE, the user made at first
sign-in, groups from the groups claim (and their grants), and every ID token
or answer that must not sign anyone in."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from broker.models import AuditEvent
from broker.services.queues import queue_create
from console.grants import Grantee, grant_add, group_create
from rig.processes import free_port
from tests.support.oidc import CLIENT_ID, Provider, rsa_key

pytestmark = pytest.mark.django_db

NINA = {"sub": "u-1017", "preferred_username": "nina", "email": "nina@example.com"}


@pytest.fixture
def provider(settings) -> Iterator[Provider]:
    served = Provider(claims={**NINA, "groups": ["orders-team", "unknown-team"]})
    served.start()
    for name, value in served.settings().items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [
        *settings.AUTHENTICATION_BACKENDS,
        "console.oidc.OidcBackend",
    ]
    yield served
    served.stop()


def sign_in(client: Client, provider: Provider, *, state: str | None = None) -> str:
    """The console's redirect to the provider, the provider's ID token for
    its nonce, and the callback; where the callback sends the browser."""
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302
    sent = parse_qs(urlsplit(start["Location"]).query)
    assert start["Location"].startswith(f"{provider.url}/authorize?")
    assert sent["client_id"] == [CLIENT_ID]
    assert sent["code_challenge_method"] == ["S256"]
    provider.nonce = sent["nonce"][0]
    callback = client.get("/oidc/callback/", {"code": "code-1", "state": state or sent["state"][0]})
    return callback["Location"]


def test_a_first_sign_in_makes_the_user_with_the_groups_the_provider_names(client, provider):
    queue_create(name="ORDERS.IN")
    queue_create(name="PAYMENTS.IN")
    group_create(name="orders-team", actor=None)
    grant_add(pattern="ORDERS.*", role="operator", to=Grantee(group="orders-team"), actor=None)

    assert sign_in(client, provider) == "/"

    nina = User.objects.get(username="nina")
    assert [group.name for group in nina.groups.all()] == ["orders-team"]
    assert not nina.has_usable_password()
    page = client.get("/").content.decode()
    assert 'data-queue="ORDERS.IN"' in page
    assert "PAYMENTS.IN" not in page
    assert AuditEvent.objects.filter(action="user.create", details__via="sso").exists()


def test_a_user_the_provider_took_out_of_a_group_has_lost_its_grants_at_the_next_sign_in(
    client, provider
):
    queue_create(name="ORDERS.IN")
    group_create(name="orders-team", actor=None)
    grant_add(pattern="ORDERS.*", role="operator", to=Grantee(group="orders-team"), actor=None)
    sign_in(client, provider)
    client.logout()

    provider.claims = {**NINA, "groups": []}
    sign_in(client, provider)

    assert not User.objects.get(username="nina").groups.exists()
    assert client.get("/queues/ORDERS.IN/").status_code == 403  # no role anywhere now
    [change] = AuditEvent.objects.filter(action="user.groups").order_by("-id")[:1]
    assert (change.details["from"], change.details["to"]) == (["orders-team"], [])


def test_a_role_group_named_by_the_provider_gives_that_role(client, provider):
    Group.objects.get_or_create(name="viewer")
    provider.claims = {**NINA, "groups": ["viewer"]}

    sign_in(client, provider)

    assert client.get("/").status_code == 200


def test_a_user_with_no_group_signs_in_to_no_access(client, provider):
    provider.claims = {**NINA, "groups": []}

    assert sign_in(client, provider) == "/"

    assert client.get("/").status_code == 403


@pytest.mark.parametrize(
    "spoiled",
    [
        pytest.param({"exp": 1_000_000_000}, id="expired"),
        pytest.param({"aud": "another-client"}, id="for another client"),
        pytest.param({"iss": "https://elsewhere.example/"}, id="from another issuer"),
        pytest.param({"nonce": "not-the-one-sent"}, id="another nonce"),
    ],
)
def test_an_id_token_that_does_not_verify_signs_nobody_in(client, provider, spoiled):
    provider.token_overrides = spoiled

    assert sign_in(client, provider) == "/login/?sso=failed"

    assert not User.objects.filter(username="nina").exists()
    assert "_auth_user_id" not in client.session
    assert (
        "Single sign-on did not sign you in." in client.get("/login/?sso=failed").content.decode()
    )


def test_an_id_token_signed_by_another_key_signs_nobody_in(client, provider):
    provider.published_key = rsa_key()

    assert sign_in(client, provider) == "/login/?sso=failed"
    assert not User.objects.filter(username="nina").exists()


def test_a_callback_with_another_state_signs_nobody_in(client, provider):
    assert sign_in(client, provider, state="a-state-nobody-sent") == "/login/?sso=failed"
    assert not User.objects.filter(username="nina").exists()


def test_a_provider_that_does_not_answer_leaves_the_password_login_working(
    client, provider, settings, admin
):
    settings.OIDC_OP_TOKEN_ENDPOINT = f"http://127.0.0.1:{free_port()}/token"

    assert sign_in(client, provider) == "/login/?sso=failed"

    page = client.get("/login/?sso=failed").content.decode()
    assert "The identity provider did not answer." in page
    assert 'name="password"' in page
    admin.set_password("a long enough password 7")
    admin.save()
    signed = client.post(
        "/login/", {"username": admin.username, "password": "a long enough password 7"}
    )
    assert signed.status_code == 302


def test_the_login_page_offers_single_sign_on_beside_the_password(client, provider):
    page = client.get("/login/").content.decode()

    assert 'href="/oidc/authenticate/"' in page
    assert 'name="password"' in page


def test_with_local_login_switched_off_only_single_sign_on_remains(
    client, provider, settings, admin
):
    settings.LAZARETTO_LOCAL_LOGIN = False

    page = client.get("/login/").content.decode()
    refused = client.post("/login/", {"username": admin.username, "password": "x"})

    assert 'name="password"' not in page
    assert 'href="/oidc/authenticate/"' in page
    assert refused.status_code == 403


def test_without_an_issuer_single_sign_on_is_not_there(client):
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/", {"code": "c", "state": "s"}).status_code == 404
    assert "oidc" not in client.get("/login/").content.decode()
