"""What happened on each queue, counted: depths by state, per-minute and
all-time counters (one list, ``COUNTERS``), the dead-letter handler's
actions, and the workers' heartbeats."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

from django.db import models
from django.db.models import Q

from broker.models.messages import MessageState
from broker.models.queues import Queue


class QueueDepth(models.Model):
    """How many messages of a queue were in one state when the sweeper last
    folded the changes in (``QueueDepthDelta``).

    The depth now is this count plus the queue's changes not yet folded: the
    view ``broker_queuedepth_current`` adds them up, and every reader reads
    it (``broker.selectors.queue_depths``). One row per (queue, state), made
    with the queue.
    """

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="depths")
    state = models.CharField(max_length=4, choices=MessageState.choices)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "state"], name="queue_depth_unique"),
            models.CheckConstraint(condition=Q(count__gte=0), name="queue_depth_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} {self.state}: {self.count}"


class QueueDepthMinute(models.Model):
    """A queue's message count in one state at the end of one minute, and
    before its first change in that minute, written by the sweeper's fold
    (``broker.services.counting``) for each (queue, state) whose count the
    fold changed: the queue page's depth chart. A minute without a row saw no
    change, so the count then is the one before the next row (or today's).
    Kept for ``DEPTH_HISTORY`` (the fold deletes older rows)."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=4, choices=MessageState.choices)
    minute = models.DateTimeField()
    count_before = models.BigIntegerField()
    count = models.BigIntegerField()

    class Meta:
        constraints = [
            # The chart: SELECT … WHERE queue_id = $1 AND minute >= $2
            models.UniqueConstraint(
                fields=["queue", "minute", "state"], name="queue_depth_minute_unique"
            ),
        ]
        indexes = [
            # The fold's pruning: DELETE … WHERE minute < now() - DEPTH_HISTORY
            models.Index(fields=["minute"], name="queue_depth_minute_time_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} {self.state} {self.minute:%H:%M}: {self.count}"


class QueueDepthDelta(models.Model):
    """A change of a queue's message count in one state, written by the
    statement-level triggers on broker_message (migrations 0002 and 0014) in
    the same transaction as the change: one row per queue and state that a
    statement changed. Rows are only ever inserted here, then folded into
    ``QueueDepth`` and deleted by the sweeper (``broker.services.counting``).

    Why not update ``QueueDepth`` at once: every claim, ack and publish of a
    queue would update the same few rows. Each update locks its row until
    the transaction commits, so the delivery processes of a queue wait on
    one another, and each leaves a row version behind. While a transaction
    stays open, VACUUM may remove none of those versions, and each update
    has to walk past all of them: three minutes into one, at 9,600 messages
    a second, an update took 0.8-1.0 ms instead of 0.1, and a quarter of the
    time a settle statement was waiting for another one's lock on these
    rows. An insert locks nothing and finds nothing in its way.

    No foreign key and no index: nothing looks a single row up, the fold
    reads them all, and a queue's deletion leaves its rows to the next fold.
    """

    queue = models.ForeignKey(
        Queue, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    state = models.CharField(max_length=4, choices=MessageState.choices)
    n = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.queue_id} {self.state}: {self.n:+d}"


@dataclass(frozen=True)
class Metric:
    """A counter's name and help on /metrics (name empty: not shown there)."""

    name: str
    help: str


class Counts:
    """What each queue counts, in column order: one column each in
    ``QueueMinute``, ``QueueTotal`` and ``QueueCountDelta`` (which inherit
    these attributes and get the columns from ``_with_counters``), with its
    /metrics name and help. A new counter is a line here and a migration that
    adds its columns and recreates the views broker_queueminute_current and
    broker_queuetotal_current (migration 0014)."""

    published: Annotated[
        int, Metric("lazaretto_messages_published", "Messages published to the queue.")
    ]
    delivered: Annotated[
        int, Metric("lazaretto_messages_delivered", "Messages delivered (acked) from the queue.")
    ]
    failed: Annotated[int, Metric("", "Messages that failed (FAIL).")]
    poisoned: Annotated[
        int,
        Metric(
            "lazaretto_messages_poisoned", "Messages set aside as poison (quarantined or purged)."
        ),
    ]
    handler_errors: Annotated[
        int,
        Metric(
            "lazaretto_handler_errors",
            "Deliveries the queue's consumer answered with an error (retried or not).",
        ),
    ]
    crashed: Annotated[
        int,
        Metric(
            "lazaretto_delivery_crashes",
            "Deliveries that ended because the delivering worker died.",
        ),
    ]
    timed_out: Annotated[
        int,
        Metric(
            "lazaretto_delivery_timeouts",
            "Deliveries that ended because their lease ran out unanswered.",
        ),
    ]
    dead_lettered: Annotated[
        int,
        Metric(
            "lazaretto_messages_dead_lettered",
            "Messages moved from the queue to its dead-letter queue, for any reason.",
        ),
    ]
    blacklisted: Annotated[
        int, Metric("lazaretto_messages_blacklisted", "Messages blacklisted (NDLV).")
    ]
    discarded: Annotated[
        int,
        Metric(
            "lazaretto_messages_discarded",
            "Messages deleted unread: discard_old, or DISCARD on a dead-letter queue.",
        ),
    ]


@dataclass(frozen=True)
class Counter:
    column: str
    metric: Metric


COUNTERS = tuple(
    Counter(column, hint.__metadata__[0])
    for column, hint in get_type_hints(Counts, include_extras=True).items()
)
COUNTER_COLUMNS = tuple(counter.column for counter in COUNTERS)


def _with_counters(model: type[models.Model], field: type[models.Field[Any, Any]]) -> None:
    """Add a ``field`` column (0 by default, in the database) per counter."""
    for column in COUNTER_COLUMNS:
        model.add_to_class(column, field(db_default=0))


class QueueMinute(Counts, models.Model):
    """What happened on one queue in one minute (one column per counter of
    ``COUNTERS``), as far as the sweeper has folded it in from
    ``QueueCountDelta``: the dashboard's last-hour chart reads it with the
    changes not folded yet (the view ``broker_queueminute_current``)."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="minutes")
    minute = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "minute"], name="queue_minute_unique"),
        ]
        indexes = [
            # The dashboard's chart: SELECT … WHERE minute >= now() - '1 hour'
            models.Index(fields=["minute"], name="queue_minute_time_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} {self.minute:%H:%M}: {self.delivered}/{self.failed}"


class QueueTotal(Counts, models.Model):
    """Every ``QueueMinute`` counter of a queue added up since the queue was
    created, one row per queue whatever the history: what /metrics reads,
    with the changes not folded yet (the view ``broker_queuetotal_current``).
    The fold that adds a ``QueueCountDelta`` to a minute adds it here in the
    same statement, so the two never disagree."""

    queue = models.OneToOneField(
        Queue, on_delete=models.CASCADE, primary_key=True, related_name="total"
    )

    def __str__(self) -> str:
        return f"{self.queue_id}: {self.published} published, {self.delivered} delivered"


class QueueCountDelta(Counts, models.Model):
    """What one statement did on a queue in one minute (one column per
    counter of ``COUNTERS``), written by ``broker.services.counting`` with the
    change it counts. Inserted only, then folded into ``QueueMinute`` and
    ``QueueTotal`` and deleted by the sweeper, for the reasons
    ``QueueDepthDelta`` gives: the settle of every batch and every publish
    would otherwise update the queue's same two rows."""

    queue = models.ForeignKey(
        Queue, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    minute = models.DateTimeField()

    def __str__(self) -> str:
        return (
            f"{self.queue_id} {self.minute:%H:%M}: "
            f"+{self.published} published, +{self.delivered} delivered"
        )


_with_counters(QueueMinute, models.PositiveIntegerField)
_with_counters(QueueTotal, models.BigIntegerField)
_with_counters(QueueCountDelta, models.IntegerField)


class DeadLetterActionTotal(models.Model):
    """How many times the dead-letter handler acted on a dead-letter queue by
    one rule of one rules-table version, by action (retry, fwd, discard,
    ignore, or failed when the action could not be carried out): one count
    per audit event it wrote (``broker.services.dead_letters``)."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="rule_actions")
    rule_table_version = models.PositiveIntegerField()
    # 0: no rule matched (or every matching one was used up).
    rule = models.PositiveIntegerField()
    action = models.CharField(max_length=16)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "rule_table_version", "rule", "action"],
                name="dead_letter_action_total_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} v{self.rule_table_version} rule {self.rule} {self.action}"


class Heartbeat(models.Model):
    """When a Celery queue last had a worker take a task from it."""

    name = models.CharField(max_length=64, unique=True)
    seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} at {self.seen_at:%H:%M:%S}"
