"""What every bench shares: its own database, the environment it measured
on, the common options, timing, and the report's layout.

A bench's ``main`` parses its options with :func:`parser` and hands its
measurement to :func:`run_bench`, which makes a fresh database
(``lazaretto_bench_<pid>`` beside DATABASE_URL's, so benches can run side by
side and the dev database is never touched), prints the environment line
(``postgresql: durable (fsync on, ...) on 2 CPUs, Linux x86_64``) and drops
the database afterwards. The report is a few :func:`title` lines, a
:func:`table` and, last, :func:`print_figures`: one JSON object on stdout
with the environment's durability added. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from broker.services.publish import NewMessage

T = TypeVar("T")
Opts = TypeVar("Opts")
R = TypeVar("R")

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = f"lazaretto_bench_{os.getpid()}"
MAINTENANCE_DB = "postgres"
DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes")
BENCH_DIR = ROOT / "var" / "bench"
# Processes a bench starts (gunicorn, Celery, the Spark driver) run as in
# production: DEBUG off, so Django keeps no query log, and so they need a key.
PRODUCTION_ENV = {"DEBUG": "0", "SECRET_KEY": "bench-only-key"}
DEPTH_SQL = "SELECT state, count FROM broker_queuedepth_current WHERE queue_id = %s"
# Messages acknowledged on the queue: the ack counts them in its own
# statement whatever the queue keeps of them, where the DLVD depth counts the
# rows kept (none when its delivered_retention is "none"). The bare ack is
# not counted.
DELIVERED_SQL = "SELECT delivered FROM broker_queuetotal_current WHERE queue_id = %s"
CONTENT_TYPE = "text/plain"
HEADERS = {"source": "bench", "kind": "publish"}
# What run_bench read on the bench database; print_figures adds it to the JSON.
DURABILITY: dict[str, str] = {}


class BenchError(Exception):
    """The bench could not measure what it claims to (wrong count, bad answer)."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- options --------------------------------------------------------------------------


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def batch_list(text: str) -> tuple[int, ...]:
    """``100,10,1`` as (100, 10, 1), each at least 1, repeats dropped."""
    try:
        sizes = [positive_int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of sizes: {text!r}"
        ) from error
    if not sizes:
        raise argparse.ArgumentTypeError("give at least one batch size")
    return tuple(dict.fromkeys(sizes))


Option = tuple[Callable[[str], Any], Any, str | None]


def parser(doc: str | None, **options: Option) -> argparse.ArgumentParser:
    """The bench's parser, described by its docstring's first line: one
    ``--some-name`` for each ``some_name=(type, default, help)``, type
    ``bool`` making a ``--some-name/--no-some-name`` switch."""
    made = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    for name, (kind, default, text) in options.items():
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            made.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=text
            )
        else:
            made.add_argument(flag, type=kind, default=default, help=text)
    return made


def messages(default: int, text: str | None = None) -> Option:
    """``--messages N``: how many messages the bench moves."""
    return (positive_int, default, text)


SIZE: Option = (positive_int, 1024, "payload bytes")


# --- timing ---------------------------------------------------------------------------


def timed(run: Callable[[], None]) -> float:
    """Seconds ``run`` took."""
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def since(started: float) -> float:
    """Seconds since ``started``, a time.perf_counter() reading."""
    return time.perf_counter() - started


def wait_for(condition: Callable[[], T | None], *, timeout: float, interval: float, what: str) -> T:
    """rig.processes.wait_until, failing with a BenchError."""
    from rig.processes import wait_until

    try:
        return wait_until(condition, timeout=timeout, interval=interval, what=what)
    except AssertionError as error:
        raise BenchError(str(error)) from None


# --- the bench database and its environment -------------------------------------------


def database_urls(url: str) -> tuple[str, str]:
    """(bench database URL, maintenance database URL) on the server of ``url``."""
    parts = urlsplit(url)
    bench = parts._replace(path=f"/{BENCH_DB}")
    maintenance = parts._replace(path=f"/{MAINTENANCE_DB}")
    return bench.geturl(), maintenance.geturl()


def drop_database(maintenance_url: str, name: str = BENCH_DB) -> None:
    with psycopg.connect(maintenance_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def create_database(
    maintenance_url: str, name: str = BENCH_DB, *, template: str | None = None
) -> None:
    """Database ``name`` anew: empty, or a copy of ``template``."""
    drop_database(maintenance_url, name)
    copy = sql.SQL(" TEMPLATE {}").format(sql.Identifier(template)) if template else sql.SQL("")
    with psycopg.connect(maintenance_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}{}").format(sql.Identifier(name), copy))


def read_durability(url: str) -> dict[str, str]:
    """The durability settings a new session on ``url`` sees, and their
    profile: ``durable`` when every commit waits for fsynced WAL and full pages
    are logged, else ``fast``."""
    with psycopg.connect(url, autocommit=True) as conn:
        settings = {}
        for name in DURABILITY_SETTINGS:
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            settings[name] = str(row[0]) if row else "?"
    durable = (
        settings["fsync"] == "on"
        and settings["full_page_writes"] == "on"
        and settings["synchronous_commit"] != "off"
    )
    return {"profile": "durable" if durable else "fast", **settings}


def machine() -> str:
    """``2 CPUs, Linux x86_64``: what the figures were measured on."""
    return f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}"


def record_environment(durability: dict[str, str]) -> None:
    """Keep ``durability`` for the JSON line and print the environment line."""
    DURABILITY.clear()
    DURABILITY.update(durability)
    settings = ", ".join(f"{name} {durability[name]}" for name in DURABILITY_SETTINGS)
    # postgresql: durable (fsync on, synchronous_commit on, full_page_writes on) on 2 CPUs, ...
    print(f"postgresql: {durability['profile']} ({settings}) on {machine()}", flush=True)


def setup_django(bench_url: str) -> None:
    """Django on the bench database, migrated."""
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("DEBUG", "1")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def close_django() -> None:
    from django.apps import apps

    if apps.ready:
        from django.db import connections

        connections.close_all()


def checkpoint() -> None:
    """Flush dirty buffers so one path's writes are not paid for by the next."""
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    except DatabaseError as error:
        log(f"CHECKPOINT skipped: {error}")


def main(
    argv: Sequence[str] | None,
    parse_args: Callable[[Sequence[str] | None], Opts],
    run_all: Callable[[Opts, str], R],
    print_report: Callable[[Opts, R], None],
) -> int:
    """A bench's main: its options parsed, then, on the bench database, its
    figures measured by ``run_all`` and printed by ``print_report``."""
    options = parse_args(argv)
    return run_bench(lambda bench_url: print_report(options, run_all(options, bench_url)))


def run_bench(measure: Callable[[str], None]) -> int:
    """Run ``measure`` on a fresh bench database beside DATABASE_URL's,
    dropped afterwards whatever happens; returns the exit status: 0 when the
    bench ran, 1 when its figures cannot be trusted, 2 without DATABASE_URL.
    First prints the environment line, whose durability print_figures adds
    to the JSON line."""
    source_url = os.environ.get("DATABASE_URL")
    if not source_url:
        log("DATABASE_URL is not set (source var/services.env)")
        return 2
    bench_url, maintenance_url = database_urls(source_url)
    create_database(maintenance_url)
    try:
        record_environment(read_durability(bench_url))
        measure(bench_url)
    except BenchError as error:
        log(f"bench failed: {error}")
        return 1
    finally:
        close_django()
        drop_database(maintenance_url)
    return 0


# --- the workload ---------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRef:
    name: str
    id: int


def make_queue(name: str, size: int, **limits: Any) -> QueueRef:
    """A queue through the service, its payload limit at least ``size``."""
    from broker.services.queues import queue_create

    queue = queue_create(name=name, max_payload_bytes=max(size, 1024 * 1024), **limits)
    return QueueRef(name=queue.name, id=queue.id)


def depths(conn: psycopg.Connection[Any], queue_id: int) -> dict[str, int]:
    """The queue's depth counters by state."""
    return dict(conn.execute(DEPTH_SQL, [queue_id]).fetchall())


def delivered(conn: psycopg.Connection[Any], queue_id: int) -> int:
    """The queue's delivered counter (DELIVERED_SQL)."""
    row = conn.execute(DELIVERED_SQL, [queue_id]).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def batch_sizes(total: int, batch: int) -> list[int]:
    full, rest = divmod(total, batch)
    return [batch] * full + ([rest] if rest else [])


def make_messages(payload: bytes, count: int) -> list[NewMessage]:
    """``count`` times the same text/plain message, as publish and replay send."""
    from broker.services.publish import NewMessage

    return [
        NewMessage(payload=payload, content_type=CONTENT_TYPE, headers=HEADERS)
        for _ in range(count)
    ]


def make_payload(size: int) -> bytes:
    """ASCII (valid UTF-8, so the API can carry it as a string) and incompressible."""
    return base64.b64encode(os.urandom(size))[:size]


class Rated:
    """A result's ``rate``: its ``messages`` over its ``seconds``."""

    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


@dataclass(frozen=True)
class Timed(Rated):
    """``messages`` moved in ``seconds`` by ``name`` (a path, a way)."""

    name: str
    seconds: float
    messages: int


# --- the report -----------------------------------------------------------------------


def title(*lines: str) -> None:
    """The report's opening: what was measured and how, then a blank line."""
    for line in lines:
        print(line)
    print()


def table(
    header: Sequence[str], rows: Sequence[Sequence[Any]], *, align: str = "", indent: str = ""
) -> None:
    """Columns as wide as their widest cell, aligned by ``align`` (one ``<``
    or ``>`` a column; by default the first left, the rest right). Cells are
    printed as given: format numbers first."""
    cells = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[n]) for row in cells if n < len(row)) for n in range(len(header))]
    align = align or "<" + ">" * (len(header) - 1)
    for row in cells:
        line = [
            cell.ljust(widths[n]) if align[n] == "<" else cell.rjust(widths[n])
            for n, cell in enumerate(row)
        ]
        print(indent + "  ".join(line).rstrip())


def verdict(passed: bool) -> str:
    return "PASS" if passed else "MISS"


def at_least(value: float, target: float) -> str:
    """``>= 0.50 PASS``: a ratio against the least it should reach."""
    return f">= {target:.2f} {verdict(value >= target)}"


def keep_run(name: str, figures: dict[str, Any], stamp: str, **series: Any) -> Path:
    """var/bench/<name>-<stamp>.json and <name>-latest.json: the figures with
    the durability, and ``series`` (what the charts draw); returns the first."""
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**figures, "durability": dict(DURABILITY), **series}, indent=1)
    path = BENCH_DIR / f"{name}-{stamp}.json"
    path.write_text(text)
    (BENCH_DIR / f"{name}-latest.json").write_text(text)
    return path


def print_figures(figures: dict[str, Any]) -> None:
    """Print a bench's last line: its figures as one JSON object, with the
    durability profile run_bench measured on."""
    print(json.dumps({**figures, "durability": dict(DURABILITY)}), flush=True)
