"""Messages, the bulk jobs over them, and the alarms about poison messages."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Now

from broker.models.queues import QUEUE_NAME_MAX_LENGTH, PoisonAction, Queue


class MessageState(models.TextChoices):
    TO_BE_DELIVERED = "TBDL", "To be delivered"
    DELIVERING = "DLNG", "Delivering"
    DELIVERED = "DLVD", "Delivered"
    NOT_DELIVERABLE = "NDLV", "Not deliverable (blacklisted)"
    FAILED = "FAIL", "Failed"


class Message(models.Model):
    id = models.BigAutoField(primary_key=True)
    # Indexed together with id below (message_queue_id_idx), not on its own.
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, db_index=False)
    # Null: not retained (a queue whose delivered_retention is "headers"
    # keeps its delivered messages without their payload).
    payload = models.BinaryField(null=True)
    content_type = models.CharField(max_length=100, default="application/octet-stream")
    headers = models.JSONField(default=dict)
    priority = models.PositiveSmallIntegerField(default=4)
    state = models.CharField(
        max_length=4, choices=MessageState.choices, default=MessageState.TO_BE_DELIVERED
    )
    available_at = models.DateTimeField(db_default=Now())
    # When the message arrived in the queue it is on now: its publish, or its
    # last move (dead-lettered, forwarded, retried, released). discard_old
    # discards the earliest arrivals first.
    enqueued_at = models.DateTimeField(db_default=Now())
    attempts = models.IntegerField(db_default=0)
    # Deliveries that ended without an answer: the worker died within the
    # lease (a crash), or the lease ran out (a timeout). Together they are
    # the retransmissions the poison limit counts.
    crash_count = models.IntegerField(db_default=0)
    timeout_count = models.IntegerField(db_default=0)
    suspect = models.BooleanField(db_default=False)
    lease_owner = models.CharField(max_length=200, blank=True, db_default="")
    # When the consumer's time to answer for this delivery ends (claim +
    # the queue's lease_seconds).
    lease_deadline = models.DateTimeField(null=True, blank=True)
    # Past this time the message is not delivered but dead-lettered with
    # reason "expired"; null: it never expires.
    expires_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, db_default="")
    # Set once the message has been dead-lettered: original queue, reason
    # code, time, putting application and user, format, error text.
    dead_letter = models.JSONField(null=True, blank=True)
    # Where the payload was dumped when the message was blacklisted.
    dump_path = models.CharField(max_length=500, blank=True, db_default="")
    put_application = models.CharField(max_length=28, blank=True)
    put_user = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # On a copy a replay job wrote: the job and the message it copied, kept
    # wherever the copy goes (delivered, archived). Plain ids, no foreign
    # keys: a source may be archived or deleted, and a key on the job would
    # be checked again by every acknowledgement that moves a row between
    # partitions. Each job writes a source once: its mark
    # (ReplayJob.written_upto) and, among the live rows, the unique index
    # message_replayed_once_idx of broker_message_live (migration 0020).
    replay_job_id = models.BigIntegerField(null=True, blank=True)
    replay_source_id = models.BigIntegerField(null=True, blank=True)
    # How many replays lie between the message and the one first published:
    # 0 for a publish, its source's + 1 for a replay's copy. A replay
    # schedule takes none that has reached its give-up limit.
    generation = models.SmallIntegerField(db_default=0)
    # When a replay schedule's job wrote a copy of it: no schedule takes it
    # again (a one-off replay job leaves its sources as they are).
    schedule_replayed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=MessageState.values), name="message_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=0, priority__lte=9), name="message_priority_0_9"
            ),
            models.CheckConstraint(
                condition=Q(attempts__gte=0), name="message_attempts_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(crash_count__gte=0), name="message_crash_count_non_negative"
            ),
            models.CheckConstraint(
                condition=~Q(state=MessageState.DELIVERING) | Q(lease_deadline__isnull=False),
                name="message_delivering_has_lease",
            ),
            models.CheckConstraint(
                condition=Q(timeout_count__gte=0), name="message_timeout_count_non_negative"
            ),
            # Only a delivered message may have lost its payload.
            models.CheckConstraint(
                condition=Q(payload__isnull=False) | Q(state=MessageState.DELIVERED),
                name="message_payload_kept_unless_delivered",
            ),
        ]
        indexes = [
            # Browsing a queue newest or oldest first with keyset pagination:
            #   SELECT … FROM broker_message WHERE queue_id = $1 [AND state = $2]
            #   AND id < $cursor ORDER BY id DESC LIMIT n
            models.Index(fields=["queue", "id"], name="message_queue_id_idx"),
            # Claiming the next due messages of a queue:
            #   SELECT id FROM broker_message WHERE queue_id = $1 AND state = 'TBDL'
            #   AND available_at <= now() ORDER BY priority DESC, id
            #   LIMIT $batch FOR UPDATE SKIP LOCKED
            models.Index(
                "queue",
                F("priority").desc(),
                "id",
                name="message_ready_idx",
                condition=Q(state=MessageState.TO_BE_DELIVERED),
            ),
            # Crash suspects waiting to be delivered alone (rare rows):
            #   SELECT id FROM broker_message WHERE queue_id = $1 AND state = 'TBDL'
            #   AND suspect AND available_at <= now() ORDER BY priority DESC, id LIMIT 1
            models.Index(
                "queue",
                F("priority").desc(),
                "id",
                name="message_suspect_idx",
                condition=Q(state=MessageState.TO_BE_DELIVERED, suspect=True),
            ),
            # The sweeper's scan for deliveries whose lease ran out or whose
            # worker died:
            #   SELECT id FROM broker_message WHERE state = 'DLNG'
            #   AND lease_deadline IS NOT NULL AND lease_deadline < now()
            #   FOR UPDATE SKIP LOCKED
            # Only DLNG messages hold a lease. The predicate names the lease,
            # not the state, so that a statement that finds DLNG rows by key
            # (the ack, a retry) cannot read this index instead: it keeps an
            # entry for every message delivered until VACUUM removes it, and
            # the planner, counting the few DLNG rows, thinks it small.
            models.Index(
                fields=["lease_deadline"],
                name="message_in_flight_idx",
                condition=Q(lease_deadline__isnull=False),
            ),
            # Waiting messages whose time is up:
            #   SELECT id FROM broker_message WHERE state = 'TBDL'
            #   AND expires_at < now() FOR UPDATE SKIP LOCKED
            models.Index(
                fields=["expires_at"],
                name="message_expiry_idx",
                condition=Q(state=MessageState.TO_BE_DELIVERED, expires_at__isnull=False),
            ),
            # discard_old's earliest arrivals waiting in a queue:
            #   SELECT id FROM broker_message WHERE queue_id = $1 AND state = 'TBDL'
            #   ORDER BY enqueued_at, id LIMIT $excess FOR UPDATE SKIP LOCKED
            # and each queue's longest-waiting message (triage, /metrics):
            #   SELECT enqueued_at FROM broker_message WHERE queue_id = $1
            #   AND state = 'TBDL' ORDER BY enqueued_at LIMIT 1
            models.Index(
                fields=["queue", "enqueued_at", "id"],
                name="message_waiting_idx",
                condition=Q(state=MessageState.TO_BE_DELIVERED),
            ),
            # Messages with a dead-letter header, by queue and reason, with
            # what triage groups and shows in the index itself:
            #   SELECT queue_id, dead_letter->>'reason', dead_letter->>'original_queue',
            #   count(id), min(enqueued_at) FROM broker_message WHERE queue_id = ANY($1)
            #   AND state = 'TBDL' AND dead_letter IS NOT NULL GROUP BY 1, 2, 3
            #   SELECT … WHERE queue_id = $1 AND dead_letter->>'reason' = $2
            #   ORDER BY id DESC LIMIT n
            # Only dead-lettered messages have entries: a publish, a claim and
            # an ack of any other message write none (dead_letter stays NULL).
            models.Index(
                F("queue"),
                KT("dead_letter__reason"),
                F("id"),
                include=["state", "enqueued_at", "dead_letter"],
                name="message_dead_letter_idx",
                condition=Q(dead_letter__isnull=False),
            ),
            # The blacklist, per queue, in quarantine order:
            #   SELECT … FROM broker_message WHERE state = 'NDLV'
            #   [AND queue_id = $1] ORDER BY id DESC LIMIT n
            models.Index(
                fields=["queue", "id"],
                name="message_blacklist_idx",
                condition=Q(state=MessageState.NOT_DELIVERABLE),
            ),
            # A message's timeline, the copies replay jobs wrote of it:
            #   SELECT … FROM broker_message WHERE replay_source_id = $1 ORDER BY id
            # Only copies have entries: a publish, claim or ack of any other
            # message writes none.
            models.Index(
                fields=["replay_source_id"],
                name="message_replay_source_idx",
                condition=Q(replay_source_id__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"message {self.id} ({self.state})"


class BulkJobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class BulkJob(models.Model):
    """An operator action on many blacklisted messages at once, run in the
    background in chunks (broker.services.bulk) so its progress can be shown."""

    action = models.CharField(max_length=16)
    # The message browser's filters (state NDLV implied), or {"ids": [...]}.
    filters = models.JSONField(default=dict)
    reason = models.TextField(blank=True)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    status = models.CharField(
        max_length=8, choices=BulkJobStatus.choices, default=BulkJobStatus.QUEUED
    )
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # When its start (a Celery task) was last sent; null: not yet, or Redis
    # refused it (broker.services.job_starts).
    start_sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["id"], condition=Q(status="queued"), name="bulk_job_queued_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.action} job {self.id} ({self.status})"

    @property
    def percent(self) -> int:
        return 100 if not self.total else min(100, round(100 * self.done / self.total))


class NotificationState(models.TextChoices):
    NONE = "none", "No webhook"
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Gave up"


class WebhookNotice(models.Model):
    """Something the control worker posts to an alarm webhook, with retries
    (broker.services.alarms): where to, and how the posting stands."""

    webhook_url = models.CharField(max_length=2048, blank=True)
    notification = models.CharField(
        max_length=8, choices=NotificationState.choices, default=NotificationState.NONE
    )
    notify_attempts = models.PositiveIntegerField(default=0)
    notify_next_at = models.DateTimeField(null=True, blank=True)
    notify_error = models.TextField(blank=True)
    notified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class PoisonAlarm(WebhookNotice):
    """A message quarantined or purged automatically, as an alarm: written in
    the same transaction as the move, so no alarm is lost, and posted to the
    alarm webhook (if any) afterwards, with retries (broker.services.alarms).
    Message and queue are stored by value: a purged message has no row."""

    created_at = models.DateTimeField(db_default=Now())
    queue_name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    message_id = models.BigIntegerField()
    action = models.CharField(max_length=16, choices=PoisonAction.choices)
    reason = models.TextField()
    crash_count = models.IntegerField()
    timeout_count = models.IntegerField()
    attempts = models.IntegerField()
    dump_path = models.CharField(max_length=500)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # Alarms whose notification is due:
            #   SELECT … WHERE notification = 'pending' AND notify_next_at <= now()
            models.Index(
                fields=["notify_next_at"],
                name="alarm_pending_idx",
                condition=Q(notification=NotificationState.PENDING),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} of message {self.message_id} on {self.queue_name}"
