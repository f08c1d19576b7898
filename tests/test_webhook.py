"""Webhook consumers against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from broker.models import Message, MessageState
from broker.services.delivery import queue_deliver
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from tests.harness import free_port

pytestmark = pytest.mark.django_db(transaction=True)
S = MessageState


@dataclass
class Hook:
    url: str
    status: int = 204
    received: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def hook() -> Iterator[Hook]:
    hook = Hook(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            hook.received.append({"body": body, "headers": dict(self.headers)})
            self.send_response(hook.status)
            if hook.status in (301, 302):
                self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/orders"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield hook
    server.shutdown()
    server.server_close()


def publish_one(queue_name: str) -> int:
    [message_id] = messages_publish(
        queue_name=queue_name,
        messages=[
            NewMessage(payload=b'{"order": 7}', content_type="application/json", headers={"a": "1"})
        ],
    )
    return message_id


def test_a_2xx_answer_acknowledges_and_the_post_carries_id_attempt_and_headers(hook):
    queue_create(name="HOOK.Q", consumer=hook.url)
    message_id = publish_one("HOOK.Q")

    queue_deliver(queue_id=Message.objects.get(id=message_id).queue_id)

    assert Message.objects.get(id=message_id).state == S.DELIVERED
    [request] = hook.received
    assert request["body"] == b'{"order": 7}'
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["Lazaretto-Message-Id"] == str(message_id)
    assert request["headers"]["Lazaretto-Attempt"] == "1"
    assert request["headers"]["Lazaretto-Queue"] == "HOOK.Q"
    assert json.loads(request["headers"]["Lazaretto-Headers"]) == {"a": "1"}


@pytest.mark.parametrize("status", [500, 404, 302])
def test_any_other_status_is_a_handler_error(hook, status):
    hook.status = status
    queue = queue_create(name="HOOK.Q", consumer=hook.url)
    message_id = publish_one("HOOK.Q")

    outcome = queue_deliver(queue_id=queue.id)

    assert outcome.retried == 1
    message = Message.objects.get(id=message_id)
    assert message.state == S.TO_BE_DELIVERED
    assert f"answered HTTP {status}" in message.last_error


def test_a_refused_connection_is_a_handler_error(db):
    queue = queue_create(name="HOOK.Q", consumer=f"http://127.0.0.1:{free_port()}/nobody")
    message_id = publish_one("HOOK.Q")

    assert queue_deliver(queue_id=queue.id).retried == 1
    assert "ConnectError" in Message.objects.get(id=message_id).last_error


def test_a_timeout_is_a_handler_error(monkeypatch, db):
    import socket

    from broker import consumers

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # accepts, never answers
    monkeypatch.setattr(consumers, "WEBHOOK_TIMEOUT_SECONDS", 0.3)
    consumers._http_client.cache_clear()
    queue = queue_create(name="HOOK.Q", consumer=f"http://127.0.0.1:{listener.getsockname()[1]}/")
    message_id = publish_one("HOOK.Q")

    try:
        assert queue_deliver(queue_id=queue.id).retried == 1
    finally:
        listener.close()
        consumers._http_client.cache_clear()
    assert "Timeout" in Message.objects.get(id=message_id).last_error
