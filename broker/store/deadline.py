"""How long a caller waits on the store, whatever the server does.

A server that is frozen (a stopped process, a paused machine) or cut off
answers nothing, and a statement sent to it waits for ever: its kernel may
even go on acknowledging TCP keepalives. So the waits themselves are bounded.
Inside :func:`limit` every wait of a :class:`StoreConnection` on the server
(a statement, a commit, a COPY, a health check) ends by a deadline: when it
passes, a watchdog thread shuts the session's socket down, the wait fails
with psycopg's ``OperationalError`` (the connection is lost, which the HA
guard reports as ``store_unavailable``), and the next connection goes to
whichever server the multi-host URL finds read-write.

Outside any limit (migrations, management commands) nothing is bounded.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import psycopg
from psycopg.abc import PQGen

from broker.store import hosts

RV = TypeVar("RV")


@dataclass(frozen=True)
class Limit:
    """Waits end by ``until`` (monotonic) and each lasts at most ``each`` seconds."""

    until: float | None = None
    each: float | None = None
    what: str = ""

    def bound(self, now: float) -> float | None:
        candidates = [t for t in (self.until, None if self.each is None else now + self.each) if t]
        return min(candidates) if candidates else None


_LIMIT: ContextVar[Limit | None] = ContextVar("lazaretto_store_limit", default=None)


@contextlib.contextmanager
def limit(
    *, total: float | None = None, each: float | None = None, what: str = ""
) -> Iterator[None]:
    """Bound the store waits of the code inside: all of them together by
    ``total`` seconds from now, each one by ``each`` seconds. An inner limit
    never loosens an outer one."""
    outer = _LIMIT.get()
    now = time.monotonic()
    until = None if total is None else now + total
    if outer is not None and outer.until is not None:
        until = outer.until if until is None else min(until, outer.until)
    if outer is not None and outer.each is not None:
        each = outer.each if each is None else min(each, outer.each)
    token = _LIMIT.set(Limit(until=until, each=each, what=what or (outer.what if outer else "")))
    try:
        yield
    finally:
        _LIMIT.reset(token)


def limit_every_wait(seconds: float, what: str) -> None:
    """Bound each store wait of this thread from now on (a worker process)."""
    _LIMIT.set(Limit(each=seconds, what=what))


class StoreTimeout(psycopg.OperationalError):
    """A wait on the store outlived its limit; the session was closed."""


class _Watchdog:
    """One thread per process that shuts down the sockets of waits past
    their deadline."""

    def __init__(self) -> None:
        self._tokens = itertools.count()
        self._reset()
        # A forked child (gunicorn, Celery's prefork) has none of the
        # parent's threads, and may inherit the lock held: it starts afresh.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int, int]] = []
        self._armed: dict[int, int] = {}
        self._fired: set[int] = set()
        self._running = False

    def _ensure_thread(self) -> None:
        if not self._running:
            self._running = True
            threading.Thread(target=self._run, name="store-deadline", daemon=True).start()

    def arm(self, fd: int, deadline: float) -> int:
        with self._lock:
            self._ensure_thread()
            token = next(self._tokens)
            self._armed[token] = fd
            heapq.heappush(self._heap, (deadline, token, fd))
            self._lock.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Forget the wait; True when its deadline had fired."""
        with self._lock:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        with self._lock:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._lock.wait()
                    continue
                deadline, token, fd = self._heap[0]
                delay = deadline - time.monotonic()
                if delay > 0:
                    self._lock.wait(delay)
                    continue
                heapq.heappop(self._heap)
                # Under the lock, so the waiting thread cannot have closed
                # (and the process reused) the descriptor: it disarms first.
                del self._armed[token]
                self._fired.add(token)
                _shut_down(fd)


def _shut_down(fd: int) -> None:
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


_WATCHDOG = _Watchdog()


# The hosts a connection of this thread is about to try, in order.
_TRYING: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("lazaretto_store_trying", default=())


class StoreConnection(psycopg.Connection[Any]):
    """A psycopg connection whose waits on the server keep the caller's
    limit, and whose connection attempts pass over hosts that let a session
    down moments ago (:mod:`broker.store.hosts`)."""

    @classmethod
    def _get_connection_params(cls, conninfo: str, **kwargs: Any) -> dict[str, Any]:
        params, trying = hosts.arrange(super()._get_connection_params(conninfo, **kwargs))
        _TRYING.set(tuple(trying))
        return params

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        connection = super().connect(conninfo, **kwargs)
        trying, winner = _TRYING.get(), (connection.info.host, str(connection.info.port))
        if winner in trying:
            # Those before it refused a read-write session or did not answer.
            for passed in trying[: trying.index(winner)]:
                hosts.refused(*passed)
        return connection

    def wait(self, gen: PQGen[RV], *args: Any, **kwargs: Any) -> RV:
        current = _LIMIT.get()
        deadline = None if current is None else current.bound(time.monotonic())
        if deadline is None:
            return super().wait(gen, *args, **kwargs)
        token = _WATCHDOG.arm(self.pgconn.socket, deadline)
        fired = False
        try:
            return super().wait(gen, *args, **kwargs)
        except psycopg.OperationalError as error:
            fired = _WATCHDOG.disarm(token)
            if fired:
                assert current is not None
                hosts.silent_unless_answering(self.info.host, str(self.info.port))
                raise StoreTimeout(
                    f"the store did not answer within the limit of {current.what or 'this caller'}"
                    "; the session was closed"
                ) from error
            raise
        finally:
            if not fired:
                _WATCHDOG.disarm(token)
