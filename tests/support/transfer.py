"""Messages exported and imported as files (broker.services.transfer) the
way the API's clients do it, and what a test compares after a round trip."""

from __future__ import annotations

import json
from typing import Any

from django.http import StreamingHttpResponse
from rest_framework.test import APIClient

from broker.models import Message, Queue
from broker.services.publish import NewMessage, messages_publish
from tests.support.messages import payload_of

JSON_LINES = "application/x-ndjson"
# Text, JSON, and bytes that are not UTF-8 (they travel as base64).
SAMPLES = [
    NewMessage(payload=b"hello", content_type="text/plain", headers={"source": "web"}),
    NewMessage(payload=b'{"order": 1}', content_type="application/json", priority=7),
    NewMessage(payload=bytes(range(256)), headers={"kind": "binary", "n": "1"}),
]


def published_samples(queue: Queue | str) -> list[int]:
    name = queue if isinstance(queue, str) else queue.name
    return messages_publish(queue_name=name, messages=SAMPLES)


def exported(api: APIClient, **params: str) -> tuple[StreamingHttpResponse, str]:
    """The export the API answers ``params`` with (a 200 stream), and its text."""
    response = api.get("/api/v1/messages/export/", params)
    assert response.status_code == 200, response.content
    assert isinstance(response, StreamingHttpResponse)
    return response, b"".join(response.streaming_content).decode()


def documents(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def imported(api: APIClient, queue: str, body: Any, **params: str) -> Any:
    """POST ``body`` as JSON Lines to the queue's import; the response."""
    query = "&".join(f"{name}={value}" for name, value in params.items())
    return api.generic(
        "POST",
        f"/api/v1/queues/{queue}/messages/import/" + (f"?{query}" if query else ""),
        body,  # bytes pass through as they are
        content_type=JSON_LINES,
    )


def contents(queue: Queue | str) -> list[tuple[bytes, str, dict[str, str], int]]:
    """The queue's messages as a round trip must keep them, oldest first."""
    name = queue if isinstance(queue, str) else queue.name
    rows = Message.objects.filter(queue__name=name).order_by("id")
    return [(payload_of(m), m.content_type, dict(m.headers), m.priority) for m in rows.iterator()]


def sample_contents() -> list[tuple[bytes, str, dict[str, str], int]]:
    return [(m.payload, m.content_type, dict(m.headers), m.priority) for m in SAMPLES]
