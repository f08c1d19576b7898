"""The messages only the losing side of a split brain had.

Before a node's store is rewound onto the survivor's, every message row on
it that the survivor does not have (same id and same creation time) is
written to a JSON-lines file under ``DUMP_DIR/ha/``, and the file is
recorded on the survivor's store (DivergedExport) for an admin, who can
publish its messages again (:func:`diverged_republish`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from broker.errors import InvalidInput, NotFound
from broker.ha.postgres import Server
from broker.models import DivergedExport, MessageState
from broker.services.audit import audit_record
from broker.services.publish import NewMessage, messages_publish

CHUNK_IDS = 50_000
EXPORT_SQL = (
    "SELECT m.id, q.name, m.payload, m.content_type, m.headers, m.priority, m.state,"
    " m.created_at, m.put_application, m.put_user"
    " FROM broker_message m JOIN broker_queue q ON q.id = m.queue_id"
    " WHERE m.id = ANY(%s) ORDER BY m.id"
)


def _ids(server: Server, low: int, high: int) -> set[tuple[int, datetime]]:
    rows = server.execute(
        "SELECT id, created_at FROM broker_message WHERE id > %s AND id <= %s", [low, high]
    )
    return {(int(row[0]), row[1]) for row in rows}


def _diverged_ids(local: Server, survivor: Server) -> Iterator[list[int]]:
    """Ids of local messages the survivor lacks, a chunk of the id range at a time."""
    [(low, high)] = local.execute(
        "SELECT coalesce(min(id), 1) - 1, coalesce(max(id), 0) FROM broker_message"
    )
    low, high = int(low), int(high)
    while low < high:
        top = min(low + CHUNK_IDS, high)
        mine = _ids(local, low, top)
        theirs = _ids(survivor, low, top)
        missing = sorted(message_id for message_id, created in mine - theirs)
        if missing:
            yield missing
        low = top


def diverged_export(*, local: Server, survivor: Server, node: str) -> tuple[Path, int] | None:
    """Write the local store's messages the survivor lacks to a file under
    DUMP_DIR/ha/ and record it on the survivor's store. Returns the file and
    its count, or None when nothing diverged."""
    directory = Path(settings.DUMP_DIR) / "ha"
    directory.mkdir(parents=True, exist_ok=True)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%S")
    path = directory / f"diverged-{stamp}-{_file_safe(node)}.jsonl"
    count = 0
    with path.open("w") as out:
        for ids in _diverged_ids(local, survivor):
            rows = local.execute(EXPORT_SQL, [ids])
            for row in rows:
                out.write(json.dumps(_document(row), sort_keys=True) + "\n")
                count += 1
    if not count:
        path.unlink()
        return None
    survivor.execute(
        "INSERT INTO broker_divergedexport (node, path, messages, republished_by) "
        "VALUES (%s, %s, %s, '')",
        [node, str(path), count],
    )
    return path, count


def _document(row: tuple[Any, ...]) -> dict[str, Any]:
    (message_id, queue, payload, content_type, headers, priority, state, created, app, user) = row
    return {
        "id": message_id,
        "queue": queue,
        # None: a delivered message its queue kept without its payload.
        "payload_base64": None if payload is None else base64.b64encode(bytes(payload)).decode(),
        "content_type": content_type,
        "headers": headers,
        "priority": priority,
        "state": state,
        "created_at": created.isoformat(),
        "put_application": app,
        "put_user": user,
    }


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def diverged_get(export_id: int) -> DivergedExport:
    export = DivergedExport.objects.filter(id=export_id).first()
    if export is None:
        raise NotFound(f"There is no diverged-messages export {export_id}.")
    return export


def diverged_read(export: DivergedExport) -> list[dict[str, Any]]:
    path = Path(export.path)
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise InvalidInput(f"The export file {path} cannot be read: {error.strerror}.") from None
    return [json.loads(line) for line in lines if line.strip()]


def diverged_republish(*, export_id: int, actor: User) -> int:
    """Publish an export's messages again, each to its queue as a new
    message (those delivered on the losing side excepted), once, all or
    nothing. Returns how many were published."""
    with transaction.atomic():
        export = DivergedExport.objects.select_for_update().filter(id=export_id).first()
        if export is None:
            raise NotFound(f"There is no diverged-messages export {export_id}.")
        if export.republished_at is not None:
            raise InvalidInput(
                f"The messages of export {export_id} were published again at "
                f"{export.republished_at:%Y-%m-%d %H:%M:%S} by {export.republished_by}."
            )
        published = 0
        by_queue: dict[str, list[NewMessage]] = {}
        for document in diverged_read(export):
            if document["state"] == MessageState.DELIVERED:
                continue  # its consumer has had it
            by_queue.setdefault(document["queue"], []).append(
                NewMessage(
                    payload=base64.b64decode(document["payload_base64"]),
                    content_type=document["content_type"],
                    headers=document.get("headers") or {},
                    priority=int(document["priority"]),
                )
            )
        batch = settings.LAZARETTO_MAX_PUBLISH_BATCH
        for queue, messages in by_queue.items():
            for start in range(0, len(messages), batch):
                published += len(
                    messages_publish(
                        queue_name=queue,
                        messages=messages[start : start + batch],
                        put_user=actor.get_username(),
                        put_application="lazaretto-ha",
                    )
                )
        export.republished_at = timezone.now()
        export.republished_by = actor.get_username()
        export.save(update_fields=["republished_at", "republished_by"])
        audit_record(
            action="ha.republish",
            actor=actor,
            reason=f"published again the {published} diverged message(s) of {export.node}",
            details={"export": export.id, "path": export.path},
        )
    return published
