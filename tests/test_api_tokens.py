"""API tokens: made and revoked in the console (the key shown once) or
through the API, each with a name and a last-used time; the audit log names
the token a write came through; a deactivated user's token is refused; each
token has its own request rate; every error under /api/ is the JSON body."""

from __future__ import annotations

import re

import pytest
from django.core.cache import cache
from django.test import RequestFactory
from rest_framework.test import APIClient

from broker.models import AuditEvent
from console.models import ApiToken
from console.tokens import token_create
from console.views.common import server_error
from tests.support.console import logged_in, with_key

pytestmark = pytest.mark.django_db


def test_a_viewer_makes_a_token_in_the_console_and_sees_its_key_once(viewer):
    console = logged_in(viewer)

    made = console.post("/tokens/", {"name": "grafana"})
    html = made.content.decode()
    [key] = re.findall(r"<code data-new-key>(lzt_[\w-]+)</code>", html)
    again = console.get("/tokens/").content.decode()

    assert "no-store" in made["Cache-Control"]
    assert key not in again
    assert "grafana" in again
    token = ApiToken.objects.get(name="grafana")
    assert key not in token.prefix + token.digest
    answer = with_key(key).get("/api/v1/queues/")
    assert answer.status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None
    assert "never" not in console.get("/tokens/").content.decode().split("grafana")[1][:300]


def test_a_bad_name_is_refused_beside_the_field(viewer):
    console = logged_in(viewer)
    console.post("/tokens/", {"name": "ci"})

    blank = console.post("/tokens/", {"name": "  "}).content.decode()
    twice = console.post("/tokens/", {"name": "ci"}).content.decode()

    assert "This field is required" in blank or "Give the token a name" in blank
    assert "already have a token named" in twice
    assert ApiToken.objects.filter(user=viewer).count() == 1


def test_a_revoked_token_is_refused_at_once(operator):
    token, key = token_create(user=operator, name="deploy")
    client = with_key(key)
    assert client.get("/api/v1/queues/").status_code == 200

    logged_in(operator).post(f"/tokens/{token.id}/revoke/")
    answer = client.get("/api/v1/queues/")

    assert (answer.status_code, answer.json()["code"]) == (401, "authentication_failed")
    assert answer["WWW-Authenticate"].startswith("Token")
    assert AuditEvent.objects.filter(action="token_revoke", details__token="deploy").exists()


def test_a_deactivated_users_token_is_refused(operator):
    _, key = token_create(user=operator, name="nightly")
    operator.is_active = False
    operator.save()

    answer = with_key(key).get("/api/v1/queues/")

    assert (answer.status_code, answer.json()["code"]) == (401, "authentication_failed")


@pytest.mark.parametrize(
    "header",
    ["Token", "Token a b", "Token lzt_unknown", "Bearer lzt_unknown", "Token \u00e9t\u00e9"],
)
def test_a_malformed_or_unknown_key_is_401(db, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    answer = client.get("/api/v1/queues/")

    assert (answer.status_code, answer.json()["code"]) == (401, "authentication_failed")


def test_bearer_works_as_token_does(viewer):
    _, key = token_create(user=viewer, name="prometheus")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    assert client.get("/api/v1/queues/").status_code == 200


def test_tokens_through_the_api_and_who_sees_which(viewer, admin, viewer_api, admin_api):
    made = viewer_api.post("/api/v1/tokens/", {"name": "exporter"}, format="json")
    assert made.status_code == 201
    key, token_id = made.json()["key"], made.json()["id"]
    assert with_key(key).get("/api/v1/queues/").status_code == 200

    listed = viewer_api.get("/api/v1/tokens/").json()
    assert {t["name"] for t in listed} == {"tests", "exporter"}
    assert all("key" not in t for t in listed)
    others = {t["user"] for t in admin_api.get("/api/v1/tokens/").json()}
    assert others == {"vera", "alice"}

    assert viewer_api.delete("/api/v1/tokens/999999/").status_code == 404
    admins_own = ApiToken.objects.get(user=admin).id
    assert viewer_api.delete(f"/api/v1/tokens/{admins_own}/").status_code == 404
    assert admin_api.delete(f"/api/v1/tokens/{token_id}/").status_code == 204
    assert with_key(key).get("/api/v1/queues/").status_code == 401


def test_every_write_through_a_token_names_it_in_the_audit_log(admin_api, admin):
    admin_api.post("/api/v1/queues/", {"name": "AUDITED.Q"}, format="json")

    event = AuditEvent.objects.get(action="queue_create")
    assert (event.actor_name, event.details["via_token"]) == ("alice", "tests")


def test_a_console_write_names_no_token(admin):
    logged_in(admin).post("/tokens/", {"name": "x"})

    event = AuditEvent.objects.get(action="token_create", details__token="x")
    assert "via_token" not in event.details


def test_each_token_has_its_own_rate_and_is_told_when_to_come_back(viewer, settings):
    settings.LAZARETTO_API_RATE = "3/min"
    one, first = token_create(user=viewer, name="first")
    two, second = token_create(user=viewer, name="second")
    # Counts of an earlier test run whose tokens had the same ids.
    cache.delete_many([f"throttle_api_token-{one.pk}", f"throttle_api_token-{two.pk}"])

    answers = [with_key(first).get("/api/v1/queues/") for _ in range(4)]

    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[-1].json()["code"] == "throttled"
    assert 0 < int(answers[-1]["Retry-After"]) <= 60
    assert with_key(second).get("/api/v1/queues/").status_code == 200


# --- one error shape under /api/ -------------------------------------------------


def test_an_unknown_api_path_is_json_404(viewer_api):
    answer = viewer_api.get("/api/v1/no-such-thing/")

    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["code"] == "not_found"


def test_a_wrong_method_is_json_405(admin_api):
    answer = admin_api.put("/api/v1/audit/", {}, format="json")

    assert (answer.status_code, answer.json()["code"]) == (405, "method_not_allowed")


def test_a_server_error_under_api_is_json_and_pages_keep_html():
    api = server_error(RequestFactory().get("/api/v1/queues/"))
    page = server_error(RequestFactory().get("/queues/"))

    assert api.status_code == page.status_code == 500
    assert api["Content-Type"] == "application/json"
    assert api.content.startswith(b'{"code": "server_error"')
    assert page["Content-Type"].startswith("text/html")


def test_the_token_command_creates_lists_and_revokes(operator, capsys):
    from django.core.management import CommandError, call_command

    call_command("token", "create", "oscar", "cron")
    key = capsys.readouterr().out.strip()
    assert with_key(key).get("/api/v1/queues/").status_code == 200
    call_command("token", "list", "oscar")
    [line] = capsys.readouterr().out.strip().splitlines()
    token_id, user, name = line.split("\t")[:3]
    assert (user, name) == ("oscar", "cron")

    call_command("token", "revoke", token_id)

    assert with_key(key).get("/api/v1/queues/").status_code == 401
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("token", "create", "nobody", "x")
    with pytest.raises(CommandError, match="Give the token a name"):
        call_command("token", "create", "oscar", "   ")
