"""The audit log: one event per operator action and per automatic
quarantine or discard."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User

from broker.models import AuditEvent

SYSTEM_ACTOR = "system"

# Who performs a service call: a user, or None when the system acts on its own.
Actor = User | AnonymousUser | None


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
    user = actor if isinstance(actor, User) else None
    return AuditEvent.objects.create(
        actor=user,
        actor_name=user.get_username() if user is not None else SYSTEM_ACTOR,
        action=action,
        queue_name=queue_name,
        message_id=message_id,
        reason=reason,
        details=details or {},
    )
