"""The API reference as ReDoc at /api/redoc/, beside Swagger UI at
/api/docs/: signed-in users only, served without a CDN, linked from every
page."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def test_redoc_sends_anonymous_users_to_login(client):
    response = client.get("/api/redoc/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/api/redoc/")


def test_redoc_answers_a_signed_in_user_from_this_server(client, viewer):
    client.force_login(viewer)

    response = client.get("/api/redoc/")

    html = response.content.decode()
    assert response.status_code == 200
    assert "/api/schema/" in html
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any("redoc" in src for src in sources)
    for src in sources:
        assert not src.startswith(("http://", "https://", "//")), src


def test_every_page_links_both_references(client, viewer):
    client.force_login(viewer)

    html = client.get("/").content.decode()

    assert 'href="/api/docs/"' in html
    assert 'href="/api/redoc/"' in html
