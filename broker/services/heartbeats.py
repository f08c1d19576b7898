"""When each Celery queue last had a worker take a task from it (the
dashboard's worker status, /readyz)."""

from __future__ import annotations

from django.db import connection, transaction

from broker.models import Heartbeat

# Committed without waiting for the WAL to reach the disk (or a synchronous
# standby): a heartbeat lost in a crash is written again by the next one, and
# the sweep that writes one every second waits on no flush beside the
# deliveries' commits. The statement makes the setting itself, local to its
# transaction.
_BEAT_SQL = f"""
INSERT INTO {Heartbeat._meta.db_table} (name, seen_at)
SELECT %s, now() FROM (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous
ON CONFLICT (name) DO UPDATE SET seen_at = excluded.seen_at
"""  # noqa: S608


def heartbeat(*, name: str) -> None:
    # Durable: its own transaction, whose commit alone the setting changes.
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(_BEAT_SQL, [name])
