"""Max messages: how many messages a queue may hold waiting and in flight
(TBDL + DLNG), and what a publish past that limit does.

* ``reject_new``: the publish fails as a whole and writes nothing.
* ``discard_old``: the publish lands, then the oldest waiting messages are
  discarded until the queue is back at its limit; each discard is deleted
  with an audit event, or moved to the dead-letter queue with reason
  ``discarded_old``.

Only publishing is limited. Internal moves (dead-letter retry and forward,
release, replay) never drop a message: they may take a queue past its limit.

Exactness under concurrency: a limited publish first locks the rows of its
target queues (``FOR NO KEY UPDATE``, in id order, so two publishers to
overlapping queues cannot deadlock), then reads their depth counters. Every
publisher to a limited queue takes that lock, so the check and the insert of
one publisher cannot interleave with another's; deliveries and acks only
lower the depth. ``NO KEY`` leaves the foreign-key checks of other writers
(which take ``KEY SHARE``) unblocked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection

from broker.errors import MaxMessagesReached
from broker.models import Overflow, Queue
from broker.services.transitions.discards import messages_discard_old


@dataclass(frozen=True)
class Limit:
    """The limit a publish must respect on one queue, and whose it is."""

    queue: Queue
    max_messages: int | None
    overflow: str
    discard_to_dead_letter: bool
    # "queue ORDERS.IN" or "subscription BILLING.ORDERS", for messages.
    owner: str
    subscription: str | None = None

    @classmethod
    def of_queue(cls, queue: Queue) -> Limit:
        return cls(
            queue=queue,
            max_messages=queue.max_messages,
            overflow=queue.overflow,
            discard_to_dead_letter=queue.discard_to_dead_letter,
            owner=f"queue {queue.name}",
        )


def lock_and_measure(queue_ids: Iterable[int]) -> dict[int, int]:
    """Lock the queues' rows (see module docstring) and return each one's
    waiting + in-flight count. Call before writing any message to them."""
    ids = sorted(set(queue_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM broker_queue WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE", [ids]
        )
    return measure(ids)


def measure(queue_ids: Iterable[int]) -> dict[int, int]:
    """Each queue's waiting + in-flight count, from the depth counters."""
    ids = sorted(set(queue_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue_id, sum(count) FROM broker_queuedepth_current"
            " WHERE queue_id = ANY(%s) AND state IN ('TBDL', 'DLNG') GROUP BY queue_id",
            [ids],
        )
        depths = {queue_id: int(total) for queue_id, total in cursor.fetchall()}
    return {queue_id: depths.get(queue_id, 0) for queue_id in ids}


def refuse_if_full(limits: Iterable[Limit], depths: dict[int, int], incoming: int) -> None:
    """Raise for the first ``reject_new`` limit that ``incoming`` more
    messages would pass."""
    for limit in limits:
        if limit.max_messages is None or limit.overflow != Overflow.REJECT_NEW:
            continue
        depth = depths[limit.queue.id]
        if depth + incoming > limit.max_messages:
            raise MaxMessagesReached(
                f"{limit.owner[0].upper()}{limit.owner[1:]} holds {depth} of at most {limit.max_messages} "
                f"messages; {incoming} more would pass the limit (reject_new).",
                owner=limit.owner,
                subscription=limit.subscription,
                queue=limit.queue.name,
                limit=limit.max_messages,
                depth=depth,
            )


def discard_excess(limits: Iterable[Limit]) -> dict[str, list[int]]:
    """After a publish landed, with the queues still locked by
    ``lock_and_measure``: bring each ``discard_old`` queue back to its limit
    by discarding its oldest waiting messages. Returns the discarded ids by
    limit owner."""
    limits = [
        limit
        for limit in limits
        if limit.max_messages is not None and limit.overflow == Overflow.DISCARD_OLD
    ]
    if not limits:
        return {}
    depths = measure(limit.queue.id for limit in limits)
    discarded: dict[str, list[int]] = {}
    for limit in limits:
        assert limit.max_messages is not None
        excess = depths[limit.queue.id] - limit.max_messages
        if excess > 0:
            discarded[limit.owner] = messages_discard_old(
                queue=limit.queue,
                excess=excess,
                to_dead_letter=limit.discard_to_dead_letter,
                reason=(
                    f"discard_old: {limit.owner} was past its limit of "
                    f"{limit.max_messages} messages"
                ),
                subscription=limit.subscription,
            )
    return discarded
