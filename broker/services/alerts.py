"""Alert thresholds: the control worker's check, every second, of each queue
that has any (``alerts_check``).

A queue may watch five readings, each against its own threshold
(``Queue.alert_*``; null: not watched):

- ``waiting``: messages waiting (TBDL), delayed ones included;
- ``oldest_waiting``: seconds since the longest-waiting one arrived;
- ``dead_letter_rate``: messages dead-lettered over the last minute, from
  the queue (a standard queue) or into it (a dead-letter queue: what its
  feeding queues dead-letter);
- ``blacklisted``: messages blacklisted (NDLV);
- ``stalled``: seconds without an acknowledgement while messages wait, on a
  queue whose messages are delivered (standard, not paused, a consumer).

A reading above its threshold opens an episode (``QueueAlert``) unless one is
open; an open one whose reading is back at or under the threshold (or whose
threshold was cleared) ends. Each opening and ending is audited, and posted
to the queue's alarm webhook or the installation's, with retries, by the
same runner as the poison alarms (``broker.services.alarms``): firing first,
then resolved.

Readings come from the counters the sweeper keeps (depths, per-minute and
all-time counts, with the changes not yet folded) and one index probe for the
oldest waiting message: a check of a hundred queues is one statement. The
database's clock times everything, so a check's readings agree with one
another whichever worker runs it. One check at a time (an advisory lock).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, PositiveIntegerField, Q, TextField, Value, When
from django.db.models.functions import Now

from broker.models import (
    AlertCondition,
    AlertEvent,
    NotificationState,
    Queue,
    QueueAlert,
    QueueAlertWatch,
)
from broker.services.audit import AuditEntry, audit_record_many
from broker.services.locks import session_lock

logger = logging.getLogger(__name__)

# Each condition's threshold setting on Queue.
THRESHOLD_SETTINGS: dict[str, str] = {
    AlertCondition.WAITING: "alert_waiting_above",
    AlertCondition.OLDEST_WAITING: "alert_oldest_waiting_seconds",
    AlertCondition.DEAD_LETTER_RATE: "alert_dead_letter_per_minute",
    AlertCondition.BLACKLISTED: "alert_blacklisted_above",
    AlertCondition.STALLED: "alert_stalled_seconds",
}

# The advisory-lock key of the check; negative, as every lock of the control
# worker's duties (delivery leases take positive keys).
CHECK_LOCK_KEY = -0x4C5A_414C_5254  # "LZALRT"

# Each watched queue's readings, on the database's clock. The dead-letter
# rate over the last sixty seconds is this minute's count and the part of
# the last minute's that the window still covers, as if spread evenly over
# it. The oldest waiting message is probed for only on queues with some.
_READINGS_SQL = """
SELECT q.id,
       waiting.n,
       coalesce((SELECT d.count FROM broker_queuedepth_current AS d
                 WHERE d.queue_id = q.id AND d.state = 'NDLV'), 0),
       CASE WHEN waiting.n > 0 THEN greatest(extract(epoch FROM now() - (
           SELECT m.enqueued_at FROM broker_message AS m
           WHERE m.queue_id = q.id AND m.state = 'TBDL'
           ORDER BY m.enqueued_at LIMIT 1)), 0)::float8 END,
       coalesce((
           SELECT sum(CASE WHEN c.minute = date_trunc('minute', now()) THEN c.dead_lettered
                      ELSE c.dead_lettered
                           * (1 - extract(epoch FROM now() - date_trunc('minute', now())) / 60)
                      END)
           FROM broker_queueminute_current AS c
           WHERE c.minute >= date_trunc('minute', now()) - interval '1 minute'
             AND c.queue_id IN (
                 SELECT q.id WHERE q.kind = 'standard'
                 UNION ALL
                 SELECT f.id FROM broker_queue AS f
                 WHERE q.kind = 'dead_letter' AND f.dead_letter_queue_id = q.id)
       ), 0)::float8,
       coalesce((SELECT t.delivered FROM broker_queuetotal_current AS t WHERE t.queue_id = q.id), 0),
       q.kind = 'standard' AND NOT q.paused AND q.consumer <> '',
       now()
FROM broker_queue AS q
CROSS JOIN LATERAL (
    SELECT coalesce((SELECT d.count FROM broker_queuedepth_current AS d
                     WHERE d.queue_id = q.id AND d.state = 'TBDL'), 0) AS n
) AS waiting
WHERE q.id = ANY(%s)
"""


@dataclass(frozen=True)
class Readings:
    """One queue's readings at one check."""

    queue_id: int
    waiting: int
    blacklisted: int
    oldest_waiting: float | None
    dead_letter_rate: float
    delivered: int
    deliverable: bool
    at: datetime


@dataclass
class CheckResult:
    """What one check did: episodes opened and ended (ids); ``notify``:
    whether any of them has a post to make; ``busy`` when another check held
    the lock and this one did nothing."""

    fired: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    notify: bool = False
    busy: bool = False


# What each condition's reading says, and its unit.
_READING_TEXTS: dict[str, tuple[str, str]] = {
    AlertCondition.WAITING: ("{:,.0f} messages waiting", ""),
    AlertCondition.OLDEST_WAITING: ("the oldest waiting message arrived {:,.0f} s ago", " s"),
    AlertCondition.DEAD_LETTER_RATE: ("{:,.0f} messages dead-lettered in the last minute", ""),
    AlertCondition.BLACKLISTED: ("{:,.0f} messages blacklisted (NDLV)", ""),
    AlertCondition.STALLED: ("no acknowledgement for {:,.0f} s while messages wait", " s"),
}


def alert_summary(
    *, queue_name: str, condition: str, value: float | None, threshold: int, resolved: bool = False
) -> str:
    """One line on a reading against its threshold, for people; ``value``
    None: nothing to measure (nothing waits)."""
    text, unit = _READING_TEXTS[condition]
    reading = text.format(value) if value is not None else "nothing waiting"
    if resolved:
        label = AlertCondition(condition).label.lower()
        return f"Queue {queue_name}: {label} back within {threshold:,}{unit} ({reading})."
    return f"Queue {queue_name}: {reading}, more than {threshold:,}{unit}."


def alerts_check() -> CheckResult:
    """Read every queue with a threshold or an open episode, open the
    episodes of readings past their threshold and end those back under it.
    Each opening and ending is committed with its audit event."""
    with session_lock(CHECK_LOCK_KEY) as alone:
        if not alone:
            return CheckResult(busy=True)
        queues = {
            queue.id: queue
            for queue in Queue.objects.filter(
                _any_threshold() | Q(alerts__ended_at__isnull=True)
            ).distinct()
        }
        if not queues:
            return CheckResult()
        readings = _read(queues)
        stalled = _stalled_seconds(
            [readings[queue.id] for queue in queues.values() if queue.alert_stalled_seconds]
        )
        open_episodes = {
            (episode.queue_id, episode.condition): episode
            for episode in QueueAlert.objects.filter(queue__in=queues, ended_at__isnull=True)
        }
        result = CheckResult()
        with transaction.atomic():
            for queue in queues.values():
                values = _values(readings[queue.id], stalled.get(queue.id))
                for condition, setting in THRESHOLD_SETTINGS.items():
                    _judge(
                        queue,
                        condition,
                        getattr(queue, setting),
                        values[condition],
                        open_episodes.get((queue.id, condition)),
                        result,
                    )
    return result


def _any_threshold() -> Q:
    condition = Q()
    for setting in THRESHOLD_SETTINGS.values():
        condition |= Q(**{f"{setting}__isnull": False})
    return condition


def _read(queues: dict[int, Queue]) -> dict[int, Readings]:
    with connection.cursor() as cursor:
        cursor.execute(_READINGS_SQL, [list(queues)])
        return {row[0]: Readings(*row) for row in cursor.fetchall()}


def _stalled_seconds(readings: Iterable[Readings]) -> dict[int, float]:
    """For each queue read: how long it has waited for an acknowledgement
    (since the later of its last acknowledgement and the moment messages
    began to wait), as far as the checks have seen; remembered in
    ``QueueAlertWatch``. Queues with nothing waiting, or whose messages are
    not delivered (paused, no consumer), are left out."""
    readings = list(readings)
    watches = QueueAlertWatch.objects.in_bulk([reading.queue_id for reading in readings])
    stalled: dict[int, float] = {}
    updated = []
    for reading in readings:
        watch = watches.get(reading.queue_id)
        if watch is None:
            watch = QueueAlertWatch(
                queue_id=reading.queue_id, delivered=reading.delivered, delivered_seen_at=reading.at
            )
        elif watch.delivered != reading.delivered:
            watch.delivered, watch.delivered_seen_at = reading.delivered, reading.at
        if reading.waiting and reading.deliverable:
            watch.waiting_since = watch.waiting_since or reading.at
            since = max(watch.delivered_seen_at, watch.waiting_since)
            stalled[reading.queue_id] = (reading.at - since).total_seconds()
        else:
            watch.waiting_since = None
        updated.append(watch)
    QueueAlertWatch.objects.bulk_create(
        updated,
        update_conflicts=True,
        unique_fields=["queue"],
        update_fields=["delivered", "delivered_seen_at", "waiting_since"],
    )
    return stalled


def _values(reading: Readings, stalled: float | None) -> dict[str, float | None]:
    """Each condition's reading; None: nothing to measure (no message
    waiting, or a queue whose messages are not delivered)."""
    return {
        AlertCondition.WAITING: reading.waiting,
        AlertCondition.OLDEST_WAITING: reading.oldest_waiting,
        AlertCondition.DEAD_LETTER_RATE: reading.dead_letter_rate,
        AlertCondition.BLACKLISTED: reading.blacklisted,
        AlertCondition.STALLED: stalled,
    }


def _judge(
    queue: Queue,
    condition: str,
    threshold: int | None,
    value: float | None,
    episode: QueueAlert | None,
    result: CheckResult,
) -> None:
    if threshold is None or value is None or value <= threshold:
        if episode is not None:
            _resolve(queue, episode, value, result)
    elif episode is None:
        _fire(queue, condition, threshold, value, result)
    elif value > episode.peak:
        QueueAlert.objects.filter(id=episode.id).update(peak=value)


def _fire(queue: Queue, condition: str, threshold: int, value: float, result: CheckResult) -> None:
    url = queue.alarm_webhook_url or settings.LAZARETTO_ALARM_WEBHOOK_URL
    episode = QueueAlert.objects.create(
        queue=queue,
        condition=condition,
        threshold=threshold,
        value=value,
        peak=value,
        webhook_url=url,
        notification=NotificationState.PENDING if url else NotificationState.NONE,
        notify_event=AlertEvent.FIRING if url else "",
        notify_next_at=Now() if url else None,
    )
    summary = alert_summary(
        queue_name=queue.name, condition=condition, value=value, threshold=threshold
    )
    _audit("alert_fired", queue, episode, summary, value)
    logger.warning("alert %s fired: %s", episode.id, summary)
    result.fired.append(episode.id)
    result.notify = result.notify or bool(url)


# The ending of an episode whose firing was already posted (or given up on)
# queues the resolution's post; one whose firing is still being tried leaves
# it to that post's outcome (broker.services.alarms), so the two go in order.
_FIRING_DONE = Q(notification__in=[NotificationState.SENT, NotificationState.FAILED])


def _resolve(queue: Queue, episode: QueueAlert, value: float | None, result: CheckResult) -> None:
    QueueAlert.objects.filter(id=episode.id, ended_at__isnull=True).update(
        ended_at=Now(),
        end_value=value,
        notify_event=Case(
            When(_FIRING_DONE, then=Value(AlertEvent.RESOLVED)), default=F("notify_event")
        ),
        notification=Case(
            When(_FIRING_DONE, then=Value(NotificationState.PENDING)), default=F("notification")
        ),
        notify_attempts=Case(
            When(_FIRING_DONE, then=Value(0)),
            default=F("notify_attempts"),
            output_field=PositiveIntegerField(),
        ),
        notify_error=Case(
            When(_FIRING_DONE, then=Value("")), default=F("notify_error"), output_field=TextField()
        ),
        notify_next_at=Case(When(_FIRING_DONE, then=Now()), default=F("notify_next_at")),
    )
    summary = alert_summary(
        queue_name=queue.name,
        condition=episode.condition,
        value=value,
        threshold=episode.threshold,
        resolved=True,
    )
    _audit("alert_resolved", queue, episode, summary, value)
    logger.info("alert %s resolved: %s", episode.id, summary)
    result.resolved.append(episode.id)
    result.notify = result.notify or bool(episode.webhook_url)


def _audit(
    action: str, queue: Queue, episode: QueueAlert, summary: str, value: float | None
) -> None:
    audit_record_many(
        entries=[
            AuditEntry(
                action=action,
                queue_name=queue.name,
                reason=summary,
                details={
                    "alert_id": episode.id,
                    "condition": episode.condition,
                    "threshold": episode.threshold,
                    "value": value,
                },
            )
        ]
    )
