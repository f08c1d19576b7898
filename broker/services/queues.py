"""Creating, changing and deleting queues."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from broker.errors import (
    ConfirmationMismatch,
    InvalidInput,
    QueueInUse,
    QueueNotEmpty,
    QueueNotFound,
)
from broker.models import MessageState, Queue, QueueKind
from broker.selectors import queue_depths
from broker.services.audit import Actor, audit_record
from broker.services.transitions.discards import messages_purge_waiting

# The alert thresholds (broker.services.alerts), in the order the console
# shows them.
ALERT_SETTINGS = (
    "alert_waiting_above",
    "alert_oldest_waiting_seconds",
    "alert_dead_letter_per_minute",
    "alert_blacklisted_above",
    "alert_stalled_seconds",
)
# Settings an operator may change after creation, in the order forms and the
# API show them. The name is fixed: other queues, rules tables and
# applications refer to it.
QUEUE_SETTINGS = (
    "kind",
    "description",
    "consumer",
    "webhook_timeout",
    "webhook_secret",
    "batch_size",
    "lease_seconds",
    "retry_limit",
    "retry_backoff_seconds",
    "crash_threshold",
    "poison_limit",
    "suspect_delay_seconds",
    "poison_action",
    "alarm_webhook_url",
    *ALERT_SETTINGS,
    "max_messages",
    "overflow",
    "discard_to_dead_letter",
    "max_payload_bytes",
    "dead_letter_queue",
    "delivered_retention",
    "archive_retention_days",
    "paused",
)
EDITABLE_FIELDS = frozenset(QUEUE_SETTINGS)
# Settings never shown once set: the API and the console say only whether
# there is one, and audit events name the setting, never its value.
SECRET_SETTINGS = frozenset({"webhook_secret"})
# How many messages a queue takes, and what it does when full: the Limits form.
LIMIT_SETTINGS = frozenset({"max_messages", "overflow", "discard_to_dead_letter"})
# States whose messages still need something to happen to them.
LIVE_STATES = (MessageState.TO_BE_DELIVERED, MessageState.DELIVERING, MessageState.NOT_DELIVERABLE)


def queue_get(*, name: str) -> Queue:
    try:
        return Queue.objects.select_related("dead_letter_queue").get(name=name)
    except Queue.DoesNotExist:
        raise QueueNotFound(f"There is no queue named {name!r}.") from None


def _save_validated(
    queue: Queue, *, exclude_unique: bool = False, update_fields: list[str] | None = None
) -> None:
    if queue.kind == QueueKind.DEAD_LETTER:
        queue.dead_letter_queue = None
    try:
        # The fields' validators refuse what the check constraints would, by
        # field; the constraints back them up in the database. Validating
        # the constraints here too would cost a query each on every save.
        queue.full_clean(validate_unique=not exclude_unique, validate_constraints=False)
    except ValidationError as error:
        raise InvalidInput(
            "The queue settings are not valid.", field_errors=error.message_dict
        ) from None
    if queue.dead_letter_queue is not None and not queue.dead_letter_queue.is_dead_letter:
        raise InvalidInput(
            "The dead-letter queue must be a queue of kind dead_letter.",
            field_errors={
                "dead_letter_queue": [f"{queue.dead_letter_queue.name} is not a dead-letter queue."]
            },
        )
    # Only the fields an operator changed: another operator may be saving
    # other settings of the same queue.
    queue.save(update_fields=update_fields)


def _system_dead_letter_queue() -> Queue | None:
    """The system dead-letter queue, recreated if an operator deleted it."""
    queue, _ = Queue.objects.get_or_create(
        name=settings.LAZARETTO_DEFAULT_DEAD_LETTER_QUEUE,
        defaults={"kind": QueueKind.DEAD_LETTER, "description": "Messages no consumer could take."},
    )
    return queue if queue.is_dead_letter else None


@transaction.atomic
def queue_create(*, name: str, actor: Actor = None, **fields: Any) -> Queue:
    """Create a queue. A standard queue without an explicit dead-letter queue
    dead-letters to the system dead-letter queue."""
    unknown = set(fields) - EDITABLE_FIELDS
    if unknown:
        raise InvalidInput(
            "Unknown queue settings.", field_errors={key: ["Unknown setting."] for key in unknown}
        )
    queue = Queue(name=name, **fields)
    if (
        "dead_letter_queue" not in fields
        and queue.kind == QueueKind.STANDARD
        and name != settings.LAZARETTO_DEFAULT_DEAD_LETTER_QUEUE
    ):
        queue.dead_letter_queue = _system_dead_letter_queue()
    _save_validated(queue)
    audit_record(action="queue_create", actor=actor, queue_name=queue.name)
    return queue


@transaction.atomic
def queue_update(*, queue: Queue, actor: Actor = None, **fields: Any) -> Queue:
    """Change a queue's settings; the name cannot change."""
    if "name" in fields and fields.pop("name") != queue.name:
        raise InvalidInput(
            "A queue cannot be renamed.", field_errors={"name": ["A queue cannot be renamed."]}
        )
    unknown = set(fields) - EDITABLE_FIELDS
    if unknown:
        raise InvalidInput(
            "Unknown queue settings.", field_errors={key: ["Unknown setting."] for key in unknown}
        )
    if fields.get("kind") == QueueKind.DEAD_LETTER and queue.kind != QueueKind.DEAD_LETTER:
        _refuse_if_live(queue, "become a dead-letter queue")
    if queue.kind == QueueKind.DEAD_LETTER and fields.get("kind", queue.kind) != queue.kind:
        _refuse_if_dead_letter_queue_of_others(queue)
    changed = {key: value for key, value in fields.items() if getattr(queue, key) != value}
    for key, value in changed.items():
        setattr(queue, key, value)
    if changed:
        _save_validated(
            queue, exclude_unique=True, update_fields=[*changed, "dead_letter_queue", "updated_at"]
        )
        # The names of the settings changed, never their values (a secret).
        audit_record(
            action="queue_update",
            actor=actor,
            queue_name=queue.name,
            details={"changed": sorted(changed)},
        )
    return queue


def _refuse_if_dead_letter_queue_of_others(queue: Queue) -> None:
    """A dead-letter queue that other queues send to keeps its kind: they
    would be left sending to a queue that is no dead-letter queue."""
    users = list(
        Queue.objects.filter(dead_letter_queue=queue)
        .exclude(id=queue.id)
        .order_by("name")
        .values_list("name", flat=True)[:5]
    )
    if users:
        raise QueueInUse(
            f"{queue.name} is the dead-letter queue of {', '.join(users)}; it stays one.",
            field_errors={"kind": ["Other queues dead-letter to this one."]},
        )


def _refuse_if_live(queue: Queue, what: str) -> None:
    depth = queue_depths(queue_ids=[queue.id])[queue.id]
    live = sum(depth[state] for state in LIVE_STATES)
    if live:
        raise QueueNotEmpty(
            f"{queue.name} still holds {live} waiting, in-flight or blacklisted "
            f"message(s); it cannot {what}. Purge or drain it first."
        )


@transaction.atomic
def queue_delete(*, queue: Queue, actor: Actor = None) -> None:
    """Delete a queue and its delivered and failed history. Refused while it
    holds messages that still need handling, while other queues dead-letter
    to it, or while a subscription delivers into it."""
    # Lock the queue row so no publish slips in between the check and the delete.
    queue = Queue.objects.select_for_update().get(pk=queue.pk)
    _refuse_if_live(queue, "be deleted")
    feeding = list(queue.feeding_queues.values_list("name", flat=True)[:5])
    if feeding:
        raise QueueInUse(
            f"{queue.name} is the dead-letter queue of {', '.join(feeding)}; "
            "point them elsewhere first."
        )
    if hasattr(queue, "subscription"):
        raise QueueInUse(f"{queue.name} belongs to subscription {queue.subscription.name}.")
    name = queue.name
    queue.delete()
    audit_record(action="queue_delete", actor=actor, queue_name=name)


@transaction.atomic
def queue_pause(*, queue: Queue, paused: bool, actor: Actor = None) -> Queue:
    """Stop (or restart) delivery from a queue; publishing goes on."""
    Queue.objects.filter(id=queue.id).update(paused=paused)
    queue.paused = paused
    audit_record(
        action="queue_pause" if paused else "queue_resume", actor=actor, queue_name=queue.name
    )
    return queue


@transaction.atomic
def queue_purge(*, queue: Queue, confirmation: str, actor: Actor = None) -> int:
    """Delete every waiting (TBDL) message of a queue; in-flight deliveries
    finish. ``confirmation`` must repeat the queue's name. Returns how many
    were deleted; one audit event records the count."""
    if confirmation != queue.name:
        raise ConfirmationMismatch(
            "Type the queue's name to confirm.",
            field_errors={"confirmation": [f"Type {queue.name} exactly to purge it."]},
        )
    deleted = messages_purge_waiting(queue_id=queue.id)
    audit_record(
        action="queue_purge", actor=actor, queue_name=queue.name, details={"deleted": deleted}
    )
    return deleted
