"""How broker nodes talk: one JSON request and one JSON answer per TCP
connection, each signed with HMAC-SHA256 under the pair's shared secret.

Heartbeats, status queries and the admin's commands (resolve, switchover)
all travel this way. Each request carries a random nonce besides its time:
a request older or newer than ``MAX_SKEW_SECONDS`` by the receiver's clock,
or whose nonce the receiver has seen within that window (a captured request
sent again), is dropped unanswered, and an answer counts only if it signs
the nonce of the request it answers. A request with a bad signature gets one
unsigned word back, ``{"refused": "signature"}``, so that its sender can
tell a peer with another secret from a silent one (and not take over from a
live node over a configuration error).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from typing import Any

from broker.errors import HaCommandRefused, HaNodeUnreachable, HaSecretMismatch

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


SIGNATURE_REFUSED = b'{"refused": "signature"}\n'


def _decode(secret: bytes, line: bytes) -> dict[str, Any]:
    envelope = json.loads(line)
    if envelope == {"refused": "signature"}:
        raise HaSecretMismatch(
            "The peer refused this node's signature: HA_SECRET differs between the nodes."
        )
    body, mac = envelope["body"], envelope["mac"]
    if not isinstance(body, dict) or not hmac.compare_digest(_sign(secret, body), str(mac)):
        raise BadSignature("bad signature")
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
    body = {"op": op, "ts": time.time(), "nonce": secrets.token_hex(16), **fields}
    try:
        host, port = parse_address(address)
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_encode(secret, body))
            answer = _decode(secret, _read_line(sock))
        if answer.get("nonce") != body["nonce"]:
            raise ValueError("the answer is not to this request")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise HaNodeUnreachable(f"The broker node at {address} did not answer: {error}.") from None
    if "error" in answer:
        raise HaCommandRefused(str(answer["error"]))
    return answer


class BadSignature(ValueError):
    """A message not signed with this node's secret."""


class _Nonces:
    """The nonces of the requests accepted within the clock window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}

    def first(self, nonce: Any) -> bool:
        """Whether ``nonce`` is well formed and new; it is then kept."""
        if not isinstance(nonce, str) or not 16 <= len(nonce) <= 64:
            return False
        now = time.monotonic()
        with self._lock:
            if nonce in self._seen:
                return False
            # Past twice the skew a replay is refused by its time anyway.
            horizon = now - 2 * MAX_SKEW_SECONDS
            for old in [n for n, at in self._seen.items() if at < horizon]:
                del self._seen[old]
            self._seen[nonce] = now
            return True


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
        seen = _Nonces()

        class _Request(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5.0)
                try:
                    body = _decode(secret_, _read_line(self.request))
                    if not seen.first(body.get("nonce")):
                        raise ValueError("a request seen before (replayed) or without a nonce")
                except BadSignature as error:
                    logger.error(
                        "ha: refused a request from %s: %s (is HA_SECRET the same on both nodes?)",
                        self.client_address,
                        error,
                    )
                    with contextlib.suppress(OSError):
                        self.request.sendall(SIGNATURE_REFUSED)
                    return
                except (OSError, ValueError, KeyError, TypeError, HaSecretMismatch) as error:
                    logger.warning("ha: dropped a request from %s: %s", self.client_address, error)
                    return
                try:
                    answer = handler(str(body.get("op", "")), body)
                except HaCommandRefused as refused:
                    answer = {"error": refused.detail}
                except Exception:
                    logger.exception("ha: request %s failed", body.get("op"))
                    answer = {"error": "the node failed to handle the request; see its log"}
                answer = {**answer, "ts": time.time(), "nonce": body["nonce"]}
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
