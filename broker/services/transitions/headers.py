"""The dead-letter header: why a message left its queue for a dead-letter
queue, in the fields IBM MQ's MQDLH carries. Built here only."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

MAX_ERROR_LENGTH = 2000


def dead_letter_header(
    *,
    reason: str,
    original_queue: str,
    put_application: str,
    put_user: str,
    content_type: str,
    error: str = "",
) -> dict[str, Any]:
    """The header a dead-lettered message carries: its reason code name
    (``handler_error``, ``format_error``, ``discarded_old``, …), the queue it
    came from, when, who put it, its format, and the error text."""
    return {
        "reason": reason,
        "original_queue": original_queue,
        "time": timezone.now().isoformat(),
        "put_application": put_application,
        "put_user": put_user,
        "format": content_type,
        "error": error[:MAX_ERROR_LENGTH],
    }
