"""Alerts: a queue past one of its thresholds, from the moment the control
worker saw it cross to the moment it saw it back (broker.services.alerts)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from broker.models.messages import NotificationState, WebhookNotice
from broker.models.queues import Queue


class AlertCondition(models.TextChoices):
    """What a threshold watches; each is a ``Queue.alert_*`` setting."""

    WAITING = "waiting", "Messages waiting"
    OLDEST_WAITING = "oldest_waiting", "Oldest waiting message"
    DEAD_LETTER_RATE = "dead_letter_rate", "Dead-lettered a minute"
    BLACKLISTED = "blacklisted", "Messages blacklisted"
    STALLED = "stalled", "No acknowledgement"


class AlertEvent(models.TextChoices):
    """What an episode posts to its webhook: that it fired, then that it
    resolved, in that order."""

    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


class QueueAlert(WebhookNotice):
    """One episode of a queue past a threshold. Open while ``ended_at`` is
    null; at most one open per queue and condition. Its webhook posts come
    one at a time: ``notify_event`` names the next one (blank: none), and
    the resolution is posted only after the firing was, or was given up on.
    """

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="alerts")
    condition = models.CharField(max_length=16, choices=AlertCondition.choices)
    threshold = models.PositiveIntegerField()
    # The reading that crossed the threshold, the highest one while the
    # episode lasted, and the one that was back under it.
    value = models.FloatField()
    peak = models.FloatField()
    end_value = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True, blank=True)
    notify_event = models.CharField(max_length=8, choices=AlertEvent.choices, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "condition"],
                condition=Q(ended_at__isnull=True),
                name="alert_one_open_per_condition",
            ),
        ]
        indexes = [
            # Episodes whose next post is due (as alarm_pending_idx).
            models.Index(
                fields=["notify_next_at"],
                name="alert_pending_idx",
                condition=Q(notification=NotificationState.PENDING),
            ),
        ]

    def __str__(self) -> str:
        state = "open" if self.ended_at is None else "resolved"
        return f"{self.queue_id} {self.condition} > {self.threshold} ({state})"


class QueueAlertWatch(models.Model):
    """What the alert check remembers of a queue between two checks, to tell
    how long it has gone without an acknowledgement while messages wait."""

    queue = models.OneToOneField(
        Queue, on_delete=models.CASCADE, primary_key=True, related_name="alert_watch"
    )
    # The queue's all-time delivered count as last read, and when the check
    # first read that count.
    delivered = models.BigIntegerField()
    delivered_seen_at = models.DateTimeField()
    # When the check first saw messages waiting; null: none at the last check.
    waiting_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.queue_id}: {self.delivered} delivered"
