"""Messages published for a test as a client of the publish service would
publish them."""

from __future__ import annotations

from collections.abc import Iterable

from broker.models import Queue
from broker.services.publish import NewMessage, messages_publish

# The most messages one publish call takes (the API's limit).
BATCH = 1000
PLAIN = NewMessage(payload=b"{}")


def _name(queue: Queue | str) -> str:
    return queue if isinstance(queue, str) else queue.name


def published(queue: Queue | str, count: int = 1, message: NewMessage = PLAIN) -> list[int]:
    """``count`` copies of ``message`` on ``queue``, in batches the API allows."""
    ids: list[int] = []
    while len(ids) < count:
        batch = min(BATCH, count - len(ids))
        ids += messages_publish(queue_name=_name(queue), messages=[message] * batch)
    return ids


def published_each(queue: Queue | str, payloads: Iterable[bytes], **headers: str) -> list[int]:
    """One message for each of ``payloads``, in their order, all with
    ``headers``, in one publish call."""
    messages = [NewMessage(payload=payload, headers=headers) for payload in payloads]
    return messages_publish(queue_name=_name(queue), messages=messages)
