"""What happened on a queue over the last hour or day, slot by slot: its
depth by state (``QueueDepthMinute``) and its rates (``QueueMinute``), as the
queue page charts them. Read-only, like ``broker.selectors``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from broker.models import MessageState, Queue, QueueDepthMinute
from broker.selectors import queue_depths


class Window(enum.Enum):
    """A chart's span and the minutes each of its slots adds up."""

    HOUR = ("hour", 60, 1)
    DAY = ("day", 24 * 60, 15)

    def __init__(self, label: str, minutes: int, slot_minutes: int) -> None:
        self.label = label
        self.minutes = minutes
        self.slot_minutes = slot_minutes

    @classmethod
    def named(cls, label: str) -> Window | None:
        """The window called ``label``, if any."""
        return next((window for window in cls if window.label == label), None)


# The counters a queue's rate chart shows (``broker.models.Counts``), each
# with the word the chart calls it by.
RATES = {
    "published": "published",
    "delivered": "acked",
    "dead_lettered": "dead-lettered",
    "poisoned": "quarantined",
}


@dataclass(frozen=True)
class QueueActivity:
    window: Window
    # Each slot's first minute, oldest first; the last slot holds this minute.
    slots: list[datetime]
    # Counter name -> messages per minute in each slot (RATES).
    rates: dict[str, list[float]]
    # Counter name -> messages in the whole window.
    totals: dict[str, int]
    # State -> the count at the end of each slot (the last: now).
    depths: dict[str, list[int]]


def queue_activity(*, queue: Queue, window: Window) -> QueueActivity:
    """``queue``'s rates and depths over ``window``: three small queries
    whatever the backlog (the queue's per-minute rows, on the unique indexes
    queue_minute_unique and queue_depth_minute_unique, and its depths now)."""
    size = window.slot_minutes
    now = timezone.now().replace(second=0, microsecond=0)
    # Slots start on multiples of their size (quarter hours for the day).
    current = now - timedelta(minutes=(now.hour * 60 + now.minute) % size)
    first = current - timedelta(minutes=window.minutes - size)
    slots = [first + timedelta(minutes=n * size) for n in range(window.minutes // size)]
    counts = _minute_counts(queue_id=queue.id, since=first)
    per_slot: list[dict[str, int]] = [dict.fromkeys(RATES, 0) for _ in slots]
    for minute, values in counts.items():
        slot = per_slot[_slot_of(minute, first, size)]
        for name in RATES:
            slot[name] += values[name]
    rates = {name: [slot[name] / size for slot in per_slot] for name in RATES}
    return QueueActivity(
        window=window,
        slots=slots,
        rates=rates,
        totals={name: sum(slot[name] for slot in per_slot) for name in RATES},
        depths=_depths(queue=queue, slots=slots),
    )


def _slot_of(minute: datetime, first: datetime, size: int) -> int:
    return int((minute - first).total_seconds() // 60) // size


def _minute_counts(*, queue_id: int, since: datetime) -> dict[datetime, dict[str, int]]:
    columns = ", ".join(RATES)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT minute, {columns} FROM broker_queueminute_current"  # noqa: S608
            " WHERE queue_id = %s AND minute >= %s",
            [queue_id, since],
        )
        return {
            minute: dict(zip(RATES, values, strict=True)) for minute, *values in cursor.fetchall()
        }


def _depths(*, queue: Queue, slots: list[datetime]) -> dict[str, list[int]]:
    """Each state's count at the end of each slot, walking back from today's:
    the count at the end of a slot is the one its earliest change started
    from, or, if it changed nothing, the one the slot after it began with."""
    today = queue_depths(queue_ids=[queue.id])[queue.id]
    changes = (
        QueueDepthMinute.objects.filter(queue=queue, minute__gte=slots[0])
        .order_by("-minute")
        .values_list("state", "minute", "count_before")
    )
    by_state: dict[str, list[tuple[datetime, int]]] = {state: [] for state in MessageState.values}
    for state, minute, count_before in changes:
        by_state[state].append((minute, count_before))
    depths = {}
    for state, newest_first in by_state.items():
        values, count, seen = [], today[state], 0
        for start in reversed(slots):
            values.append(count)
            while seen < len(newest_first) and newest_first[seen][0] >= start:
                count = newest_first[seen][1]
                seen += 1
        depths[state] = values[::-1]
    return depths
