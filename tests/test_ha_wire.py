"""The nodes' wire refuses what an attacker on the network could send: a
captured request sent again, an answer to another request; and a node with
another secret is told so instead of being met with silence. A broker node
refuses to start on a configuration that would make it unsafe."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.errors import HaNodeUnreachable, HaSecretMismatch
from broker.ha import wire
from rig.processes import ROOT, free_port

SECRET = b"wire-test-secret"


@pytest.fixture
def listener() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    handled: list[dict[str, Any]] = []

    def handle(op: str, body: dict[str, Any]) -> dict[str, Any]:
        handled.append(body)
        return {"name": "A", "role": "primary"}

    address = f"127.0.0.1:{free_port()}"
    server = wire.Listener(address, secret=SECRET, handler=handle)
    server.start()
    try:
        yield address, handled
    finally:
        server.stop()


def send_raw(address: str, line: bytes) -> bytes:
    host, port = wire.parse_address(address)
    with socket.create_connection((host, port), timeout=3) as sock:
        sock.sendall(line)
        sock.shutdown(socket.SHUT_WR)
        return sock.recv(65536)


def test_a_signed_call_is_answered(listener: tuple[str, list[dict[str, Any]]]) -> None:
    address, handled = listener
    assert wire.call(address, "status", secret=SECRET, timeout=2)["role"] == "primary"
    assert len(handled) == 1
    assert len(handled[0]["nonce"]) == 32


def test_a_captured_request_sent_again_is_dropped(
    listener: tuple[str, list[dict[str, Any]]],
) -> None:
    address, handled = listener
    captured = wire._encode(
        SECRET, {"op": "promote", "ts": time.time(), "nonce": "0123456789abcdef0123"}
    )
    assert send_raw(address, captured)  # answered once
    assert send_raw(address, captured) == b""  # within the clock window: dropped
    assert len(handled) == 1


def test_a_request_without_a_nonce_is_dropped(listener: tuple[str, list[dict[str, Any]]]) -> None:
    address, handled = listener
    assert send_raw(address, wire._encode(SECRET, {"op": "status", "ts": time.time()})) == b""
    assert handled == []


def test_an_answer_to_another_request_is_not_taken() -> None:
    """A man in the middle replays a genuine, signed answer to an earlier
    request: the caller refuses it."""
    old_answer = wire._encode(
        SECRET, {"name": "A", "role": "primary", "ts": time.time(), "nonce": "f" * 32}
    )
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"

    def replay() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(old_answer)

    thread = threading.Thread(target=replay, daemon=True)
    thread.start()
    try:
        with pytest.raises(HaNodeUnreachable, match="not to this request"):
            wire.call(address, "status", secret=SECRET, timeout=2)
    finally:
        thread.join(timeout=5)
        server.close()


def test_another_secret_is_refused_and_the_sender_is_told(
    listener: tuple[str, list[dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    address, handled = listener
    with (
        caplog.at_level(logging.ERROR, logger="broker.ha.wire"),
        pytest.raises(HaSecretMismatch, match="HA_SECRET differs"),
    ):
        wire.call(address, "heartbeat", secret=b"another-secret", timeout=2)
    assert handled == []
    assert "is HA_SECRET the same on both nodes?" in caplog.text


def node(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "broker_node", "--name", "A"],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("HA_")},
            "DEBUG": "0",
            "SECRET_KEY": "a-secret-key-for-this-test",
            "HA_LISTEN": f"127.0.0.1:{free_port()}",
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_a_node_of_a_pair_without_ha_secret_outside_debug_refuses_to_start() -> None:
    done = node(HA_PEER=f"127.0.0.1:{free_port()}", HA_PEER_DATABASE_URL="postgres://u:p@h/db")
    assert done.returncode != 0
    assert "HA_SECRET is not set" in done.stderr


def test_a_node_whose_peer_is_itself_refuses_to_start() -> None:
    address = f"127.0.0.1:{free_port()}"
    done = node(HA_SECRET="s" * 32, HA_LISTEN=address, HA_PEER=address)
    assert done.returncode != 0
    assert f"HA_PEER and HA_LISTEN are both {address}" in done.stderr
