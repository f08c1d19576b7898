"""What every consumer process bench/peers.py starts has in common.

Standard library only: the peers' modules run in var/peers-venv, which has
neither Django nor the project's packages. The protocol with the bench:

- the process connects and loads what it needs, then prints ``ready`` on
  stdout and waits for a ``go`` line on stdin, so that start-up is not timed;
- it drains the queue, counting how many messages each fetch returned;
- it prints one line ``report {json}`` on stdout and exits 0.

A peer whose latency the bench measures also has ``listen`` (consume as
messages come, until killed) and ``publish`` (messages arriving at a rate,
each published when it arrives, then a report of each one's time from its
arrival to its acknowledgement: ``Arrivals``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

READY = "ready"
GO = "go"
REPORT = "report "
# What every peer's queue or entrypoint is called.
QUEUE = "bench"
# The seed of a paced publish's arrivals (publish_times).
ARRIVALS_SEED = 20


def wait_for_go() -> None:
    print(READY, flush=True)
    line = sys.stdin.readline()
    if line.strip() != GO:
        raise SystemExit(f"expected {GO!r} on stdin, got {line!r}: the bench went away")


@dataclass
class Tally:
    """How a worker drained its share: each fetch's size, and the clock from
    its first fetch to its last acknowledgement (time.time(): every process
    on the machine reads the same clock)."""

    # Non-empty fetches by the number of messages they returned.
    fetches: Counter[int] = field(default_factory=Counter)
    empty_fetches: int = 0
    acked: int = 0
    first_fetch: float | None = None
    last_ack: float | None = None

    def before_fetch(self) -> None:
        if self.first_fetch is None:
            self.first_fetch = time.time()

    def fetched(self, count: int) -> None:
        if count:
            self.fetches[count] += 1
        else:
            self.empty_fetches += 1

    def ack(self, count: int) -> None:
        self.acked += count
        self.last_ack = time.time()

    def report(self, **extra: Any) -> None:
        print(
            REPORT
            + json.dumps(
                {
                    "fetches": {str(size): count for size, count in sorted(self.fetches.items())},
                    "empty_fetches": self.empty_fetches,
                    "acked": self.acked,
                    "first_fetch": self.first_fetch,
                    "last_ack": self.last_ack,
                    **extra,
                }
            ),
            flush=True,
        )


def arguments(description: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    """``prepare --url U --messages N --size S``, ``work --url U [--batch B]
    [--mode M]``, ``listen --url U [--batch B]`` or ``publish --url U --rate R
    --seconds S``."""
    parser = argparse.ArgumentParser(description=description)
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="install the schema and preload the queue")
    prepare.add_argument("--url", required=True)
    prepare.add_argument("--messages", type=int, required=True)
    prepare.add_argument("--size", type=int, required=True)
    work = commands.add_parser("work", help="drain the queue, then report")
    work.add_argument("--url", required=True)
    work.add_argument("--batch", type=int, default=1)
    work.add_argument("--mode", default="", help="how the peer acknowledges, if it has ways")
    listen = commands.add_parser("listen", help="consume as messages come, until killed")
    listen.add_argument("--url", required=True)
    listen.add_argument("--batch", type=int, default=1)
    publish = commands.add_parser("publish", help="publish as they arrive, report latencies")
    publish.add_argument("--url", required=True)
    publish.add_argument("--rate", type=float, required=True)
    publish.add_argument("--seconds", type=float, required=True)
    publish.add_argument("--size", type=int, required=True)
    publish.add_argument("--seed", type=int, default=0, help="which publisher of several")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Commands:
    """A peer module's commands: ``prepare(url, messages, size)``,
    ``work(url, batch, mode)``, and for a peer whose latency is measured
    ``listen(url, batch)`` and ``publish(url, rate, seconds, size, seed)``
    (Lazaretto's module has only ``publish``: the bench drives the rest in
    its own process)."""

    prepare: Callable[[str, int, int], object] | None = None
    work: Callable[[str, int, str], object] | None = None
    listen: Callable[[str, int], object] | None = None
    publish: Callable[[str, float, float, int, int], object] | None = None


def run_command(doc: str | None, commands: Commands) -> None:
    """A peer module's main: the command the command line names, the module
    docstring's first line as its description; a coroutine a command
    returns is run with asyncio."""
    args = arguments(doc.splitlines()[0] if doc else None)
    if args.command == "prepare" and commands.prepare is not None:
        result = commands.prepare(args.url, args.messages, args.size)
    elif args.command == "work" and commands.work is not None:
        result = commands.work(args.url, args.batch, args.mode)
    elif args.command == "listen" and commands.listen is not None:
        result = commands.listen(args.url, args.batch)
    elif args.command == "publish" and commands.publish is not None:
        result = commands.publish(args.url, args.rate, args.seconds, args.size, args.seed)
    else:
        raise SystemExit(f"this peer has no {args.command} command")
    if isinstance(result, Coroutine):
        asyncio.run(result)


def publish_times(rate: float, seconds: float, seed: int = 0) -> list[float]:
    """When each message of a paced publish is due (time.monotonic()): about
    ``rate`` a second for ``seconds`` from now, at the arrivals of a Poisson
    process (exponential gaps drawn from ARRIVALS_SEED + ``seed``, the same
    for every system; publishers with different seeds together make a
    Poisson process of their summed rate). Messages evenly spaced would fall
    at the same points of every second, so a broker's once-a-second work
    would meet the same message every second, or never, as the two clocks
    happen to line up."""
    arrivals = random.Random(ARRIVALS_SEED + seed)
    due = time.monotonic()
    times = []
    for _ in range(max(1, round(rate * seconds))):
        times.append(due)
        due += arrivals.expovariate(rate)
    return times


class Arrivals:
    """A paced publish: ``due()`` waits for the next arrival and returns
    every arrival due by then, to be published in one call (one message a
    call at a light load; at a heavy one, what arrived while the last call
    ran). Each message's latency runs from its arrival, so a publisher that
    falls behind counts against the system it publishes to."""

    def __init__(self, rate: float, seconds: float, seed: int) -> None:
        self.pending = deque(publish_times(rate, seconds, seed))
        # time.monotonic() + this: the epoch, as the database's clock reads it.
        self.offset = time.time() - time.monotonic()
        self.arrived: dict[int, float] = {}
        self.calls = 0
        self.worst_lag = 0.0
        # When the publisher stops waiting for acknowledgements (monotonic):
        # as long after the last arrival as the arrivals lasted. A system
        # past its capacity would take as long as its backlog needs.
        self.wait_until = self.pending[-1] + seconds

    def wait(self) -> float:
        """Seconds until the next arrival (0 or less: due)."""
        return self.pending[0] - time.monotonic()

    def due(self) -> list[float]:
        now = time.monotonic()
        due = []
        while self.pending and self.pending[0] <= now:
            due.append(self.pending.popleft())
        self.worst_lag = max(self.worst_lag, now - due[0])
        self.calls += 1
        return due

    def published(self, ids: Sequence[int], due: Sequence[float]) -> None:
        """The ids the call gave the messages due at ``due``."""
        if len(ids) != len(due):
            raise SystemExit(f"published {len(due)} messages, got {len(ids)} ids")
        for message_id, at in zip(ids, due, strict=True):
            self.arrived[int(message_id)] = at + self.offset

    def report(self, acked: dict[int, float], stored: dict[int, float]) -> None:
        """Print each message's [arrival epoch, seconds from its arrival to
        ``acked``, seconds from ``stored`` (its publish's commit, on the
        database's clock) to ``acked``]: the whole latency, and the part
        spent in the system; null for one not in ``acked``."""
        latencies: list[list[float | None]] = [
            [at, acked[job] - at, acked[job] - stored[job]] if job in acked else [at, None, None]
            for job, at in sorted(self.arrived.items())
        ]
        print(
            REPORT
            + json.dumps(
                {"latencies": latencies, "calls": self.calls, "worst_lag_s": self.worst_lag}
            ),
            flush=True,
        )


def payload(size: int) -> str:
    """As bench.publish.make_payload: ASCII, so that every peer can carry it
    in its own format (JSON or bytes), and incompressible."""
    return base64.b64encode(os.urandom(size))[:size].decode()


def chunks(total: int, size: int) -> list[int]:
    full, rest = divmod(total, size)
    return [size] * full + ([rest] if rest else [])
