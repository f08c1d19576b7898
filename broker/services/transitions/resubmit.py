"""Edit and resubmit: an operator's corrected copy of a blacklisted or
dead-lettered message, published as a new message. The original stays as it
is; the audit log links the two."""

from __future__ import annotations

from collections.abc import Mapping

from django.db import transaction

from broker.errors import MessageNotFound
from broker.models import Message, QueueKind
from broker.services.audit import Actor, AuditEntry, audit_record_many
from broker.services.publish import NewMessage, messages_publish
from broker.services.transitions.table import Transition, allows, refuse

RESUBMITTED_FROM = "lazaretto-resubmitted-from"


@transaction.atomic
def message_resubmit(
    *,
    message_id: int,
    queue_name: str,
    payload: bytes,
    content_type: str,
    headers: Mapping[str, str],
    priority: int,
    actor: Actor = None,
) -> int:
    """Publish an operator's corrected copy of a blacklisted (NDLV) or
    dead-lettered message as a new message; validation and limits apply as
    for any publish. The copy carries a ``lazaretto-resubmitted-from``
    header; both get an audit event naming the other. Returns the copy's id."""
    original = Message.objects.select_related("queue").filter(id=message_id).first()
    if original is None:
        raise MessageNotFound(f"There is no message {message_id}.")
    on_dead_letter_queue = original.queue.kind == QueueKind.DEAD_LETTER
    if not allows(
        Transition.RESUBMIT, state=original.state, on_dead_letter_queue=on_dead_letter_queue
    ):
        refuse(Transition.RESUBMIT, message_id=message_id)
    user = actor.get_username() if actor is not None and actor.is_authenticated else ""
    [copy_id] = messages_publish(
        queue_name=queue_name,
        messages=[
            NewMessage(
                payload=payload,
                content_type=content_type,
                headers={**headers, RESUBMITTED_FROM: str(message_id)},
                priority=priority,
            )
        ],
        put_user=user,
        put_application="console",
    )
    audit_record_many(
        entries=[
            AuditEntry(
                action="message_resubmit",
                queue_name=queue_name,
                message_id=message_id,
                reason=f"resubmitted as message {copy_id}",
                details={"copy": copy_id},
            ),
            AuditEntry(
                action="message_resubmitted_copy",
                queue_name=queue_name,
                message_id=copy_id,
                reason=f"corrected copy of message {message_id}",
                details={"original": message_id},
            ),
        ],
        actor=actor,
    )
    return copy_id
