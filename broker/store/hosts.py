"""Which servers of a multi-host connection string to try, and in what order.

libpq, and psycopg after it, try the hosts of ``host=a,b`` in the order given,
each for up to ``connect_timeout``: while the first one is frozen, every new
session waits that long before it reaches the new primary. Like pgJDBC's
``hostRecheckSeconds``, this process remembers for a few seconds what its
sessions learnt of each host:

- a host that came before the one that took a session refused a read-write
  session or did not answer: it is tried after the others;
- a host on whose session a wait outlived its limit, and whose postmaster then
  did not answer a connection's first message either, is silent (frozen, cut
  off): it is passed over while another host is left. A server that is only
  slow answers that message at once and is not passed over.

With every host passed over, all are tried in the given order.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from typing import Any

# How long what a session learnt of a host holds.
RECHECK_SECONDS = 5.0
# How long a postmaster has to answer the first message of a connection.
ANSWER_SECONDS = 0.5
# The SSLRequest message: its length and its code. A postmaster answers it
# with one byte, S or N, before any authentication.
SSL_REQUEST = struct.pack("!ii", 8, 80877103)

_lock = threading.Lock()
_silent_until: dict[tuple[str, str], float] = {}
_refused_until: dict[tuple[str, str], float] = {}


def _after_fork() -> None:
    """A forked child may inherit the lock held: it gets its own."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def refused(host: str, port: str) -> None:
    """``host:port`` refused a read-write session or did not answer."""
    with _lock:
        _refused_until[(host, port)] = time.monotonic() + RECHECK_SECONDS


def silent_unless_answering(host: str, port: str) -> bool:
    """A wait on ``host:port`` outlived its limit: if its postmaster does not
    answer a connection's first message either, pass it over for a while.
    Whether it was found silent."""
    if answers(host, port):
        return False
    with _lock:
        _silent_until[(host, port)] = time.monotonic() + RECHECK_SECONDS
    return True


def answers(host: str, port: str, timeout: float = ANSWER_SECONDS) -> bool:
    """The postmaster at ``host:port`` (a directory: its Unix socket) answers
    an SSLRequest within ``timeout``."""
    try:
        if host.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: Any = f"{host}/.s.PGSQL.{port or 5432}"
        else:
            sock = socket.socket(
                socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
            )
            address = (host, int(port or 5432))
        with contextlib.closing(sock):
            sock.settimeout(timeout)
            sock.connect(address)
            sock.sendall(SSL_REQUEST)
            return sock.recv(1) in (b"S", b"N")
    except (OSError, ValueError):
        return False


def _until(table: dict[tuple[str, str], float], key: tuple[str, str], now: float) -> bool:
    with _lock:
        return table.get(key, 0.0) > now


def arrange(params: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``params`` with the hosts in the order to try them (silent ones left
    out unless all are), and that order."""
    hosts = str(params.get("host") or "").split(",")
    if len(hosts) < 2:
        return params, []
    ports = str(params.get("port") or "").split(",")
    addresses = str(params.get("hostaddr") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    if len(addresses) == 1:
        addresses = addresses * len(hosts)
    if len(ports) != len(hosts) or len(addresses) != len(hosts):
        return params, []  # libpq will say what is wrong with the lists
    now = time.monotonic()
    entries = list(zip(hosts, ports, addresses, strict=True))
    live = [e for e in entries if not _until(_silent_until, (e[0], e[1]), now)] or entries
    live.sort(key=lambda e: _until(_refused_until, (e[0], e[1]), now))  # stable
    arranged = {
        **params,
        "host": ",".join(e[0] for e in live),
        "port": ",".join(e[1] for e in live),
    }
    if params.get("hostaddr"):
        arranged["hostaddr"] = ",".join(e[2] for e in live)
    return arranged, [(e[0], e[1]) for e in live]
