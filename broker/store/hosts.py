"""Which servers of a multi-host connection string to try, and in what order.

libpq, and psycopg after it, try the hosts of ``host=a,b`` in the order given,
each for up to ``connect_timeout``: while the first one is frozen, every new
session waits that long before it reaches the new primary. Like pgJDBC's
``hostRecheckSeconds``, a host that let a session down (a wait past its
deadline, or it came before the host that took the session, so it refused or
timed out) is passed over for a while when another host is left to try.
With every host suspect, all are tried in the given order.
"""

from __future__ import annotations

import threading
import time
from typing import Any

_lock = threading.Lock()
_suspect_until: dict[tuple[str, str], float] = {}


def suspect(host: str, port: str, seconds: float) -> None:
    """Pass over ``host:port`` for ``seconds`` where another host is left."""
    with _lock:
        _suspect_until[(host, port)] = time.monotonic() + seconds


def _is_suspect(host: str, port: str, now: float) -> bool:
    with _lock:
        return _suspect_until.get((host, port), 0.0) > now


def arrange(params: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``params`` with the suspect hosts left out (unless all are), and the
    hosts in the order they will be tried."""
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
    chosen = [e for e in entries if not _is_suspect(e[0], e[1], now)] or entries
    arranged = {
        **params,
        "host": ",".join(e[0] for e in chosen),
        "port": ",".join(e[1] for e in chosen),
    }
    if params.get("hostaddr"):
        arranged["hostaddr"] = ",".join(e[2] for e in chosen)
    return arranged, [(e[0], e[1]) for e in chosen]
