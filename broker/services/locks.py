"""One runner at a time: a session-level advisory lock that a second runner
fails to take rather than waits for. PostgreSQL frees it when the session
ends, so a runner that dies with its process leaves it free."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def session_lock(*key: int) -> Iterator[bool]:
    """Whether this session took the advisory lock ``key`` (one bigint, or
    two ints); held until the block ends."""
    placeholders = ", ".join(["%s"] * len(key))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_try_advisory_lock({placeholders})", list(key))
        (locked,) = cursor.fetchone()
    try:
        yield bool(locked)
    finally:
        # A lost connection has let the lock go with it.
        if locked and connection.is_usable():
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT pg_advisory_unlock({placeholders})", list(key))
