"""The HA pair: its epoch, its nodes' last words, its history and the
exports of diverged messages."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class NodeRole(models.TextChoices):
    DISCOVERING = "discovering", "Discovering"
    PRIMARY = "primary", "Primary"
    STANDBY = "standby", "Standby"
    SYNCHRONISING = "synchronising", "Synchronising"
    MAINTENANCE = "maintenance", "Maintenance"
    UNREACHABLE = "unreachable", "Unreachable"


class HaPair(models.Model):
    """The pair's shared state: one row (id 1), replicated with the store.

    ``epoch`` goes up by one each time a node becomes primary; every
    primary-only duty carries the epoch it was issued under and is refused
    by a store whose epoch differs (migration 0010's guard trigger).
    """

    epoch = models.BigIntegerField(default=1)
    primary_name = models.CharField(max_length=64, blank=True)
    changed_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"epoch {self.epoch}, primary {self.primary_name or '-'}"


class Node(models.Model):
    """An HA broker node as the primary last saw it (the primary writes both
    rows: its own and, from the heartbeats, its peer's)."""

    name = models.CharField(max_length=64, unique=True)
    role = models.CharField(max_length=16, choices=NodeRole.choices)
    # The primary's replication mode ("synchronous", "alone") or a node's
    # reason for its role (split brain, rejoining, ...).
    mode = models.CharField(max_length=32, blank=True)
    epoch = models.BigIntegerField(default=0)
    # host:port of the node's heartbeat and command listener.
    address = models.CharField(max_length=255, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Bytes of WAL the standby has still to replay; null for the primary.
    replication_lag_bytes = models.BigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"node {self.name} ({self.role})"


class HaEventKind(models.TextChoices):
    STARTED = "started", "Started as primary"
    FAILOVER = "failover", "Failover"
    SWITCHOVER = "switchover", "Switchover"
    REJOINED = "rejoined", "Rejoined as standby"
    STANDBY_LOST = "standby_lost", "Standby lost"
    STANDBY_SYNCHRONOUS = "standby_synchronous", "Standby synchronous"
    SPLIT_BRAIN = "split_brain", "Split brain"
    RESOLVED = "resolved", "Split brain resolved"


class HaEvent(models.Model):
    """The pair's history: every role change and replication mode change."""

    created_at = models.DateTimeField(db_default=Now(), db_index=True)
    kind = models.CharField(max_length=24, choices=HaEventKind.choices)
    node = models.CharField(max_length=64)
    epoch = models.BigIntegerField()
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.node} epoch {self.epoch}"


class DivergedExport(models.Model):
    """Messages that only the losing side of a split brain had, written to
    a JSON-lines file under DUMP_DIR by the losing node before it rejoined;
    an admin publishes them again (or not)."""

    created_at = models.DateTimeField(db_default=Now())
    node = models.CharField(max_length=64)
    path = models.CharField(max_length=1024)
    messages = models.PositiveIntegerField()
    republished_at = models.DateTimeField(null=True, blank=True)
    republished_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.messages} diverged message(s) of {self.node} in {self.path}"
