"""The audit log: who did what to which message or queue, and why."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from broker.models.queues import QUEUE_NAME_MAX_LENGTH


class AuditEvent(models.Model):
    """Who did what to which message, when and why.

    Message and queue are stored by value, not by foreign key: the event
    must outlive a purged message or a deleted queue.
    """

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # "system" for automatic actions (sweeper, overflow), else the username.
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    queue_name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True)
    message_id = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # A message's audit timeline:
            #   SELECT … FROM broker_auditevent WHERE message_id = $1 ORDER BY id
            models.Index(
                fields=["message_id", "id"],
                name="audit_message_idx",
                condition=Q(message_id__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.actor_name} {self.action} {self.message_id or self.queue_name}"
