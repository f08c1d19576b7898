"""Dump files: a blacklisted message's payload and metadata, written for the
operator when it is quarantined."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from django.conf import settings


def dump_path_for(*, queue_id: int, message_id: int) -> Path:
    """Named from ids only: nothing a publisher wrote reaches the file system."""
    return Path(settings.DUMP_DIR) / f"queue-{queue_id}" / f"message-{message_id}.json"


def dump_write(*, message: dict[str, Any], reason: str) -> Path:
    """Write ``message`` (its columns, ``queue_id`` and ``id`` among them,
    the payload as bytes) with the reason it was blacklisted; returns the
    file's path. The payload is stored base64-encoded, never interpreted."""
    path = dump_path_for(queue_id=message["queue_id"], message_id=message["id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        **{key: value for key, value in message.items() if key != "payload"},
        "created_at": message["created_at"].isoformat(),
        "reason": reason,
        "payload_base64": base64.b64encode(bytes(message["payload"])).decode(),
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True))
    return path
