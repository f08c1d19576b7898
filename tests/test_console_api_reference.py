"""The API reference as ReDoc at /api/redoc/, beside Swagger UI at
/api/docs/: signed-in users only, served without a CDN, linked from every
page."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer, OpenApiYamlRenderer

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
    the schema on the first request of a process, then serves it as made,
    in each format as first written out."""
    monkeypatch.setattr(SchemaView, "generated", {})
    monkeypatch.setattr(SchemaView, "rendered", {})
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


def test_each_format_of_the_schema_is_written_out_once(viewer_api, monkeypatch):
    """YAML and JSON are each rendered on their first request, then served
    as written, with the renderer's content type."""
    monkeypatch.setattr(SchemaView, "rendered", {})
    rendered = []
    for renderer in (OpenApiYamlRenderer, OpenApiJsonRenderer):
        real = renderer.render

        def counted(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            rendered.append(type(self).__name__)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(renderer, "render", counted)
    as_yaml = {"HTTP_ACCEPT": "application/vnd.oai.openapi"}
    as_json = {"HTTP_ACCEPT": "application/vnd.oai.openapi+json"}

    answers = [viewer_api.get("/api/schema/", **accept) for accept in (as_yaml, as_json) * 2]

    assert [answer.status_code for answer in answers] == [200] * 4
    assert rendered == ["OpenApiYamlRenderer", "OpenApiJsonRenderer"]
    assert answers[0].content == answers[2].content
    assert answers[1].content == answers[3].content
    assert answers[0]["Content-Type"] == "application/vnd.oai.openapi; charset=utf-8"
    assert answers[1]["Content-Type"] == "application/vnd.oai.openapi+json"
    assert yaml.safe_load(answers[0].content) == answers[1].json()
    assert answers[0]["Content-Disposition"] == 'inline; filename="Lazaretto API.yaml"'
