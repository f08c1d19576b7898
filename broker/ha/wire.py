"""How broker nodes talk: one JSON request and one JSON answer per TCP
connection, each signed with HMAC-SHA256 under the pair's shared secret.

Heartbeats, status queries and the admin's commands (resolve, switchover)
all travel this way. A request older or newer than ``MAX_SKEW_SECONDS`` by
the receiver's clock, or with a bad signature, is dropped unanswered.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from typing import Any

from broker.errors import HaCommandRefused, HaNodeUnreachable

logger = logging.getLogger(__name__)

MAX_SKEW_SECONDS = 30.0
MAX_MESSAGE_BYTES = 1024 * 1024

Handler = Callable[[str, dict[str, Any]], dict[str, Any]]


def parse_address(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a socket address."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not host:port")
    return host.strip("[]"), int(port)


def _sign(secret: bytes, body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, canonical, hashlib.sha256).hexdigest()


def _encode(secret: bytes, body: dict[str, Any]) -> bytes:
    return json.dumps({"body": body, "mac": _sign(secret, body)}).encode() + b"\n"


def _decode(secret: bytes, line: bytes) -> dict[str, Any]:
    envelope = json.loads(line)
    body, mac = envelope["body"], envelope["mac"]
    if not isinstance(body, dict) or not hmac.compare_digest(_sign(secret, body), str(mac)):
        raise ValueError("bad signature")
    if abs(time.time() - float(body.get("ts", 0))) > MAX_SKEW_SECONDS:
        raise ValueError("stale or future request")
    return body


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n"):
            break
        if size > MAX_MESSAGE_BYTES:
            raise ValueError("message too large")
    return b"".join(chunks)


def call(address: str, op: str, *, secret: bytes, timeout: float, **fields: Any) -> dict[str, Any]:
    """Send ``op`` to the node at ``address`` and return its answer.

    Raises :class:`HaNodeUnreachable` when no valid answer comes within
    ``timeout``, :class:`HaCommandRefused` when the node refused the request.
    """
    body = {"op": op, "ts": time.time(), **fields}
    try:
        host, port = parse_address(address)
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_encode(secret, body))
            answer = _decode(secret, _read_line(sock))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise HaNodeUnreachable(f"The broker node at {address} did not answer: {error}.") from None
    if "error" in answer:
        raise HaCommandRefused(str(answer["error"]))
    return answer


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class Listener:
    """A node's side: answers each signed request with ``handler(op, body)``.

    The handler raises :class:`HaCommandRefused` to refuse a request; the
    caller then gets the refusal's detail.
    """

    def __init__(self, address: str, *, secret: bytes, handler: Handler) -> None:
        secret_ = secret

        class _Request(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5.0)
                try:
                    body = _decode(secret_, _read_line(self.request))
                except (OSError, ValueError, KeyError, TypeError) as error:
                    logger.warning("ha: dropped a request from %s: %s", self.client_address, error)
                    return
                try:
                    answer = handler(str(body.get("op", "")), body)
                except HaCommandRefused as refused:
                    answer = {"error": refused.detail}
                except Exception:
                    logger.exception("ha: request %s failed", body.get("op"))
                    answer = {"error": "the node failed to handle the request; see its log"}
                answer = {**answer, "ts": time.time()}
                with contextlib.suppress(OSError):
                    self.request.sendall(_encode(secret_, answer))

        self._server = _Server(parse_address(address), _Request)
        self.address = address
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ha-listener", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
