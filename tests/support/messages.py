"""Messages walked into a state through the transitions production uses, as
a worker, the sweeper or the delivery engine would put them there; and what
a test reads or waits for of their states."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from broker.models import Message, MessageState, Queue
from broker.selectors import queue_counts
from broker.services.publish import NewMessage
from broker.services.transitions.blacklist import messages_quarantine
from broker.services.transitions.in_flight import (
    DeadLetterCause,
    messages_ack,
    messages_claim,
    messages_dead_letter,
)
from rig.processes import wait_until
from tests.support.publishing import published

S = MessageState
SYSTEM_DEAD_LETTER_QUEUE = "SYSTEM.DEAD.LETTER.QUEUE"

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
    messages_ack(queue_id=queue.id, message_ids=ids, owner=OWNER)
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


def quarantined(ids: Sequence[int], reason: str = "crashed twice") -> list[int]:
    """These messages quarantined (NDLV) with a dump file and an audit
    event; their ids in order (the statement returns them in any)."""
    return sorted(messages_quarantine(reasons=dict.fromkeys(ids, reason)))


def blacklisted(
    queue: Queue | str, count: int = 1, payload: bytes = b"x", reason: str = "crashed twice"
) -> list[int]:
    """``count`` new messages of ``payload`` on ``queue``, quarantined (NDLV)."""
    return quarantined(published(queue, count, NewMessage(payload=payload)), reason)


def states(queue: Queue) -> Counter[str]:
    """How many of the queue's messages stand in each state."""
    return Counter(Message.objects.filter(queue=queue).values_list("state", flat=True))


def settled(queue: Queue, count: int) -> bool:
    """Whether ``count`` of the queue's messages are delivered or blacklisted."""
    done = states(queue)
    return done[S.DELIVERED] + done[S.NOT_DELIVERABLE] == count


def on_the_dead_letter_queue(message_id: int, *, what: str, timeout: float = 30) -> Message:
    """The message, once the workers have moved it to the system dead-letter
    queue; fails the test after ``timeout`` seconds, naming ``what``."""
    return wait_until(
        lambda: Message.objects.filter(id=message_id, queue__name=SYSTEM_DEAD_LETTER_QUEUE).first(),
        timeout=timeout,
        what=what,
    )


def totals(queue_name: str) -> dict[str, int]:
    """A queue's all-time counters, as /metrics shows them."""
    [counts] = [counts for counts in queue_counts() if counts.name == queue_name]
    return counts.totals


def payload_of(message: Message) -> bytes:
    """The message's payload, which it must have (only a delivered message
    of a queue with delivered_retention "headers" has none)."""
    assert message.payload is not None, f"message {message.id} kept no payload"
    return bytes(message.payload)
