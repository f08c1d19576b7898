"""Dead-letter queues' rules tables and the handler's attempts."""

from __future__ import annotations

from dataclasses import dataclass, fields

from django.conf import settings
from django.db import models
from django.db.models import Q

from broker.models.queues import Queue


class RuleTableStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    ACTIVE = "active", "Active"
    RETIRED = "retired", "Retired"


class RuleTable(models.Model):
    """One version of a dead-letter queue's rules table, in IBM MQ runmqdlq
    syntax (parsed by broker.rules). A draft may be edited; once activated a
    version never changes, and at most one version per queue is active."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="rule_tables")
    version = models.PositiveIntegerField()
    text = models.TextField()
    status = models.CharField(
        max_length=8, choices=RuleTableStatus.choices, default=RuleTableStatus.DRAFT
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["queue", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "version"], name="rule_table_version_unique"),
            models.UniqueConstraint(
                fields=["queue"],
                condition=Q(status=RuleTableStatus.ACTIVE),
                name="rule_table_one_active_per_queue",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} v{self.version} ({self.status})"


class DeadLetterAttempt(models.Model):
    """How many times the dead-letter handler has tried one rule of one
    table version on one message; a rule is passed over once this reaches
    its RETRY count. Rows go when the message leaves the dead-letter queue."""

    message_id = models.BigIntegerField()
    rule_table = models.ForeignKey(RuleTable, on_delete=models.CASCADE)
    rule_number = models.PositiveIntegerField()
    attempts = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["message_id", "rule_table", "rule_number"],
                name="dead_letter_attempt_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"message {self.message_id} rule {self.rule_number}: {self.attempts}"


@dataclass(init=False, repr=False, eq=False)
class ScanCounts:
    """What one scan of the dead-letter handler counts
    (``broker.services.dead_letters``), in column order: one attribute each
    in ``ScanResult``, one column each in ``DeadLetterScan`` (added below)
    and one field each in the API's answer."""

    examined: int = 0
    retried: int = 0
    forwarded: int = 0
    discarded: int = 0
    ignored: int = 0
    failed: int = 0
    without_header: int = 0


SCAN_COUNTS = tuple(count.name for count in fields(ScanCounts))


@dataclass
class ScanResult(ScanCounts):
    """A scan's counts as it goes."""

    @property
    def acted(self) -> int:
        """Messages that left the dead-letter queue."""
        return self.retried + self.forwarded + self.discarded


class DeadLetterScan(ScanCounts, models.Model):
    """The dead-letter handler's last scan of a dead-letter queue: when it
    ended, under which table version, and what it did (a column per
    ``ScanCounts`` count). One row per queue, replaced by every
    scan, so an operator sees whether the handler runs even when it finds
    nothing to do."""

    queue = models.OneToOneField(
        Queue, on_delete=models.CASCADE, primary_key=True, related_name="last_scan"
    )
    rule_table_version = models.PositiveIntegerField()
    finished_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.queue_id} scanned at {self.finished_at} (v{self.rule_table_version})"


for _count in SCAN_COUNTS:
    DeadLetterScan.add_to_class(_count, models.PositiveIntegerField())
