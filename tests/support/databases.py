"""Databases of a test's own on the test server, beside the test database:
for a process that must start on an empty or half-migrated database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import psycopg
from psycopg import sql


@contextmanager
def throwaway_database(url: str, name: str) -> Iterator[str]:
    """The URL of a new, empty database ``name`` on ``url``'s server, dropped
    (and any sessions left on it ended) when the block ends. One left behind
    by a run that was killed is dropped first."""
    server = urlsplit(url)
    maintenance = server._replace(path="/postgres").geturl()
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield server._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute(drop)
