"""Which server of a multi-host URL a new session tries first
(broker.store.hosts)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from django.db import connection

from broker.store import hosts


@pytest.fixture(autouse=True)
def forget() -> Iterator[None]:
    yield
    hosts._silent_until.clear()
    hosts._refused_until.clear()


def params(*ports: int) -> dict[str, str]:
    return {
        "host": ",".join("127.0.0.1" for _ in ports),
        "port": ",".join(map(str, ports)),
        "dbname": "x",
    }


def test_a_live_postmaster_answers_and_a_silent_listener_does_not() -> None:
    db = connection.settings_dict
    assert hosts.answers(db["HOST"] or "127.0.0.1", str(db["PORT"] or 5432))
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = str(silent.getsockname()[1])
        assert not hosts.answers("127.0.0.1", port, timeout=0.3)
        assert hosts.silent_unless_answering("127.0.0.1", port)
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = str(closed.getsockname()[1])
    assert not hosts.answers("127.0.0.1", port, timeout=0.3)


def test_a_silent_host_is_passed_over_while_another_is_left() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        hosts.silent_unless_answering("127.0.0.1", str(port))
    arranged, order = hosts.arrange(params(port, 6001))
    assert arranged["port"] == "6001"
    assert order == [("127.0.0.1", "6001")]
    # Every host silent: all are tried, in the given order.
    hosts._silent_until[("127.0.0.1", "6001")] = hosts._silent_until[("127.0.0.1", str(port))]
    assert hosts.arrange(params(port, 6001))[0]["port"] == f"{port},6001"


def test_a_host_that_refused_is_tried_last_and_one_host_is_left_alone() -> None:
    hosts.refused("127.0.0.1", "6001")
    arranged, order = hosts.arrange(params(6001, 6002, 6003))
    assert arranged["port"] == "6002,6003,6001"
    assert [port for _, port in order] == ["6002", "6003", "6001"]
    single = params(6001)
    assert hosts.arrange(single) == (single, [])


def test_a_slow_but_live_server_is_not_taken_for_silent() -> None:
    db = connection.settings_dict
    host, port = db["HOST"] or "127.0.0.1", str(db["PORT"] or 5432)
    assert not hosts.silent_unless_answering(host, port)
    assert hosts.arrange(params(int(port), 6001))[0]["port"] == f"{port},6001"
