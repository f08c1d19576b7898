"""Databases of a test's own on the test server, beside the test database:
for a process that must start on an empty or half-migrated database; and
one value read on the test's own connection."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import psycopg
from django.db import connection
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


def scalar(query: str, params: Sequence[Any] = ()) -> Any:
    """The one value ``query`` selects, on the test's own connection."""
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()[0]
