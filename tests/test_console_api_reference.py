"""The API reference as ReDoc at /api/redoc/, beside Swagger UI at
/api/docs/: signed-in users only, served without a CDN, linked from every
page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator

from console.api.schema import SchemaView

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


def test_the_schema_is_generated_once_and_served_the_same_to_every_caller(viewer_api, monkeypatch):
    """/api/schema/ (which both references fetch on every visit) generates
    the schema on the first request of a process, then serves it as made."""
    monkeypatch.setattr(SchemaView, "generated", {})
    generated = []
    real = SchemaGenerator.get_schema

    def counted(self: SchemaGenerator, *args: Any, **kwargs: Any) -> Any:
        generated.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SchemaGenerator, "get_schema", counted)
    accept = {"HTTP_ACCEPT": "application/vnd.oai.openapi+json"}

    first = viewer_api.get("/api/schema/", **accept)
    second = viewer_api.get("/api/schema/", **accept)

    assert (first.status_code, second.status_code) == (200, 200)
    assert first.json() == second.json()
    assert "/api/v1/queues/" in first.json()["paths"]
    assert len(generated) == 1
