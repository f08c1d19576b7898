"""The console and the API as Django's test clients see them: a user's
client, a token's API client, what a page says beside a form field, and a
publish the API refuses."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from broker.models import Message, Queue

# A queue's settings form, filled in validly (every field the form posts).
QUEUE_SETTINGS_FORM = {
    "description": "Orders",
    "consumer": "noop",
    "webhook_timeout": "10",
    "batch_size": "10",
    "lease_seconds": "30",
    "retry_limit": "3",
    "retry_backoff_seconds": "1",
    "crash_threshold": "2",
    "poison_limit": "5",
    "suspect_delay_seconds": "1",
    "poison_action": "quarantine",
    "alarm_webhook_url": "",
    "max_payload_bytes": "1048576",
    "dead_letter_queue": "SYSTEM.DEAD.LETTER.QUEUE",
    "delivered_retention": "full",
}


def logged_in(user: User) -> Client:
    """A test client with ``user``'s session (no login form, no password)."""
    client = Client()
    client.force_login(user)
    return client


def with_key(key: str) -> APIClient:
    """An API client that sends the token ``key`` with every request."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def error_beside(html: str, field: str) -> str:
    """The error the form shows beside ``field`` (templates/console/_form.html),
    its errors one a line joined by ``<br>``; fails the test when there is none."""
    match = re.search(rf'id="id_{field}-error"[^>]*>(.*?)</p>', html, re.S)
    assert match, f"no error beside {field}"
    return unescape(match.group(1))


def publish_refused(api: APIClient, queue: Queue) -> dict[str, Any]:
    """The body of the 503 that publishing "hello" to ``queue`` through the
    API is answered with; fails the test on another status or if the
    message was stored."""
    response = api.post(
        f"/api/v1/queues/{queue.name}/messages/", {"payload": "hello"}, format="json"
    )
    assert response.status_code == 503
    assert not Message.objects.filter(queue=queue).exists()
    body: dict[str, Any] = response.json()
    return body


def chart_data(html: str, key: str) -> dict[str, Any]:
    """The numbers a page gives its chart ``key`` to draw (console/charts.py):
    its json_script element ``chart-<key>``."""
    found = re.search(
        rf'<script id="chart-{key}" type="application/json">(.*?)</script>', html, re.S
    )
    assert found, f"no chart {key!r} in the page"
    return json.loads(found.group(1))
