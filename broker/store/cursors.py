"""A cursor that binds its parameters on the server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection


@contextmanager
def bound_cursor() -> Iterator[psycopg.Cursor[Any]]:
    """A cursor on Django's connection (its transaction, if any) that binds
    parameters on the server, for the statements on a hot path. Executed
    with ``prepare=True``, each is parsed and planned once per connection.
    Django's own cursors interpolate parameters on the client, so PostgreSQL
    plans every execution afresh, and a bytea parameter travels as a hex
    literal twice its size."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        yield cursor
