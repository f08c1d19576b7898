"""Quarantine: the way into NDLV. A blacklisted message is never delivered
again automatically; its payload and metadata are dumped to a file for the
operator, and an audit event says why."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from broker.models import AuditEvent
from broker.services.audit import SYSTEM_ACTOR

# The conditional update is the transition: only messages still waiting or
# in flight are blacklisted, so a message delivered meanwhile stays delivered.
_QUARANTINE_SQL = """
UPDATE broker_message AS m
SET state = 'NDLV', lease_owner = '', lease_deadline = NULL, updated_at = now()
FROM broker_queue AS q
WHERE m.id = ANY(%(ids)s) AND m.state IN ('TBDL', 'DLNG') AND q.id = m.queue_id
RETURNING m.id, q.id, q.name, m.payload, m.content_type, m.headers, m.attempts,
          m.crash_count, m.last_error, m.dead_letter, m.put_application, m.put_user,
          m.created_at
"""
_DUMP_PATH_SQL = """
UPDATE broker_message AS m SET dump_path = d.path
FROM unnest(%(ids)s::bigint[], %(paths)s::text[]) AS d(id, path)
WHERE m.id = d.id
"""
_COLUMNS = (
    "id",
    "queue_id",
    "queue",
    "payload",
    "content_type",
    "headers",
    "attempts",
    "crash_count",
    "last_error",
    "dead_letter",
    "put_application",
    "put_user",
    "created_at",
)


def dump_path_for(*, queue_id: int, message_id: int) -> Path:
    """Named from ids only: nothing a publisher wrote reaches the file system."""
    return Path(settings.DUMP_DIR) / f"queue-{queue_id}" / f"message-{message_id}.json"


def _dump(row: dict[str, Any], reason: str) -> Path:
    path = dump_path_for(queue_id=row["queue_id"], message_id=row["id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        **{key: value for key, value in row.items() if key != "payload"},
        "created_at": row["created_at"].isoformat(),
        "reason": reason,
        "payload_base64": base64.b64encode(bytes(row["payload"])).decode(),
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True))
    return path


def messages_quarantine(*, reasons: dict[int, str]) -> list[int]:
    """TBDL/DLNG -> NDLV for each message id in ``reasons``, dumping each
    payload and writing one audit event per message with its reason.

    Runs in the caller's transaction; returns the ids actually blacklisted.
    """
    if not reasons:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_QUARANTINE_SQL, {"ids": list(reasons)})
        rows = [dict(zip(_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:  # jsonb arrives as text through Django's connection
            row["headers"] = json.loads(row["headers"])
            row["dead_letter"] = json.loads(row["dead_letter"]) if row["dead_letter"] else None
        paths = [str(_dump(row, reasons[row["id"]])) for row in rows]
        ids = [row["id"] for row in rows]
        if ids:
            cursor.execute(_DUMP_PATH_SQL, {"ids": ids, "paths": paths})
    AuditEvent.objects.bulk_create(
        AuditEvent(
            actor_name=SYSTEM_ACTOR,
            action="message_quarantine",
            queue_name=row["queue"],
            message_id=row["id"],
            reason=reasons[row["id"]],
            details={
                "dump_path": path,
                "crash_count": row["crash_count"],
                "attempts": row["attempts"],
            },
        )
        for row, path in zip(rows, paths, strict=True)
    )
    return ids


def quarantine_reasons(rows: Sequence[tuple[int, int, int, int, int]]) -> dict[int, str]:
    """From (id, crash_count, attempts, crash_threshold, poison_limit) rows,
    the messages that must be blacklisted and why."""
    reasons: dict[int, str] = {}
    for message_id, crashes, attempts, threshold, poison_limit in rows:
        if crashes >= threshold:
            reasons[message_id] = (
                f"its consumer crashed {crashes} times while delivering it "
                f"(crash threshold {threshold})"
            )
        elif attempts >= poison_limit:
            reasons[message_id] = (
                f"delivered {attempts} times without an acknowledgement "
                f"(poison limit {poison_limit})"
            )
    return reasons
