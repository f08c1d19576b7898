"""The audit log: one event per operator action and per automatic
quarantine or discard."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AnonymousUser, User

from broker.models import AuditEvent

SYSTEM_ACTOR = "system"

# Who performs a service call: a user, or None when the system acts on its own.
Actor = User | AnonymousUser | None


@dataclass(frozen=True)
class AuditEntry:
    """One event to record: what happened to which queue or message, and why."""

    action: str
    queue_name: str = ""
    message_id: int | None = None
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def audit_record_many(*, entries: Iterable[AuditEntry], actor: Actor = None) -> list[AuditEvent]:
    """Write the events of one action in one statement, all by ``actor``
    (None: the system acted). A user who signed the request with an API token
    carries the token's name as ``api_token_name``; the events record it in
    ``details["via_token"]``."""
    user = actor if isinstance(actor, User) else None
    name = user.get_username() if user is not None else SYSTEM_ACTOR
    token = getattr(user, "api_token_name", None)
    via = {"via_token": token} if token else {}
    return AuditEvent.objects.bulk_create(
        AuditEvent(
            actor=user,
            actor_name=name,
            action=entry.action,
            queue_name=entry.queue_name,
            message_id=entry.message_id,
            reason=entry.reason,
            details={**entry.details, **via},
        )
        for entry in entries
    )


def audit_record(
    *,
    action: str,
    actor: Actor = None,
    queue_name: str = "",
    message_id: int | None = None,
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write one audit event; ``actor`` None means the system acted."""
    entry = AuditEntry(
        action=action,
        queue_name=queue_name,
        message_id=message_id,
        reason=reason,
        details=details or {},
    )
    [event] = audit_record_many(entries=[entry], actor=actor)
    return event
