"""One webhook receiver for every test that posts to one: a queue's webhook
consumer and a poison alarm's webhook. A real HTTP server on 127.0.0.1 that
records each POST and answers as the test says; a receiver that accepts
connections and never answers; and the check of a signed POST a receiver
makes."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Post:
    """One POST as the receiver read it."""

    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookServer:
    """Records every POST in ``received`` and answers ``status`` (with a
    Location for a redirect) after ``delay`` seconds. Port 0 takes a free
    one at ``start``; a server given a port can be down first and ``start``
    there later, as a webhook that comes back."""

    port: int = 0
    path: str = "/hook"
    status: int = 204
    delay: float = 0.0
    received: list[Post] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> None:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append(Post(body=body, headers=dict(self.headers)))
                time.sleep(hook.delay)
                self.send_response(hook.status)
                if 300 <= hook.status < 400:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        # A client that gave up waiting closed the connection: not news.
        self._server.handle_error = lambda *args: None  # type: ignore[method-assign]
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@contextmanager
def silent_receiver(path: str = "/hook") -> Iterator[str]:
    """The URL of a receiver that accepts every connection and never says a
    word, for as long as the block runs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}{path}"
    finally:
        listener.close()
        for connection in held:
            connection.close()


def verified(request: Post, secret: str, now: float | None = None) -> bool:
    """What a receiver does (README, "Signed webhooks"): recompute the
    signature over the timestamp and the raw body, compare in constant time,
    and refuse a timestamp more than 5 minutes from now."""
    timestamp = request.headers["Lazaretto-Timestamp"]
    signed = timestamp.encode() + b"." + request.body
    expected = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs((now or time.time()) - int(timestamp)) <= 300
    return hmac.compare_digest(expected, request.headers["Lazaretto-Signature"]) and fresh
