"""Messages walked into a state through the transitions production uses, as
a worker, the sweeper or the delivery engine would put them there."""

from __future__ import annotations

from collections.abc import Sequence

from broker.models import Queue
from broker.services.publish import NewMessage, messages_publish
from broker.services.transitions.blacklist import messages_quarantine
from broker.services.transitions.in_flight import (
    DeadLetterCause,
    messages_ack,
    messages_claim,
    messages_dead_letter,
)

# A lease owner whose lock nobody holds: to the sweeper, a worker that died.
OWNER = "test-host:1:4711"


def claimed(queue: Queue, count: int, *, owner: str = OWNER) -> list[int]:
    """TBDL -> DLNG for the next ``count`` due messages, as a worker claims them."""
    batch = messages_claim(
        queue_id=queue.id, owner=owner, lease_seconds=300, limit=count, suspect=False
    )
    return [message.id for message in batch]


def delivered(queue: Queue, count: int) -> list[int]:
    """Claimed and acknowledged (DLVD)."""
    ids = claimed(queue, count)
    messages_ack(message_ids=ids, owner=OWNER)
    return ids


def published(queue: Queue, count: int, message: NewMessage) -> list[int]:
    """``count`` copies of ``message`` on ``queue``, in batches the API allows."""
    ids: list[int] = []
    while len(ids) < count:
        batch = min(1000, count - len(ids))
        ids += messages_publish(queue_name=queue.name, messages=[message] * batch)
    return ids


def dead_lettered(
    queue: Queue,
    count: int,
    *,
    reason: str = "handler_error",
    error: str = "boom",
    **headers: str,
) -> list[int]:
    """Published to ``queue``, claimed, and dead-lettered with ``reason``:
    TBDL on the queue's dead-letter queue with a dead-letter header."""
    ids = published(queue, count, NewMessage(payload=b"{}", headers=headers))
    assert sorted(claimed(queue, count)) == sorted(ids), f"{queue.name} held other messages"
    messages_dead_letter(causes=dict.fromkeys(ids, DeadLetterCause(reason, error)), owner=OWNER)
    return ids


def blacklisted(ids: Sequence[int], reason: str = "crashed its consumer twice") -> list[int]:
    """Quarantined (NDLV) with a dump file and an audit event."""
    return messages_quarantine(reasons=dict.fromkeys(ids, reason))
