"""A path under /api/ that names nothing answers the API's JSON 404, with
DEBUG on as with it off (Django's debug 404 page is HTML); a path missing
only its slash is redirected to it, as APPEND_SLASH does."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize(
    "path",
    ["/api/v1/tokens/null,null/", "/api/v1/no-such-thing/", "/api/v2/queues/", "/api/nothing"],
)
def test_an_unknown_api_path_is_a_json_404(admin: User, debug: bool, path: str) -> None:
    client = Client()
    client.force_login(admin)
    with override_settings(DEBUG=debug):
        response = client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"code": "not_found", "detail": f"Nothing is at {path}."}


def test_an_api_path_missing_its_slash_is_redirected_to_it(admin: User) -> None:
    client = Client()
    client.force_login(admin)
    with override_settings(DEBUG=True):
        response = client.get("/api/v1/queues?limit=1")
    assert response.status_code == 301
    assert response["Location"] == "/api/v1/queues/?limit=1"


def test_an_anonymous_caller_gets_the_json_404_too(db: None) -> None:
    with override_settings(DEBUG=True):
        response = Client().get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_a_post_to_an_unknown_api_path_is_a_json_404_not_a_csrf_refusal(admin: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)
    with override_settings(DEBUG=True):
        response = client.post("/api/v1/ha/exports/null,null/republish/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
