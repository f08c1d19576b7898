"""Lazaretto's data: queues, topics, subscriptions, messages and the audit log.

Models hold data and constraints only. Every change of a message's state or
queue goes through ``broker.services.transitions``; every other write through
a service function in ``broker.services``.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import (
    MaxValueValidator,
    MinLengthValidator,
    MinValueValidator,
    RegexValidator,
)
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from broker.consumers import (
    MAX_WEBHOOK_TIMEOUT_SECONDS,
    MIN_WEBHOOK_TIMEOUT_SECONDS,
    WEBHOOK_TIMEOUT_SECONDS,
    validate_consumer,
    validate_webhook_url,
)
from broker.topic_grammar import TopicError, filter_levels, is_under, topic_levels

QUEUE_NAME_MAX_LENGTH = 48
# IBM MQ object names: letters, digits, '.', '_', '/', '%'. ASCII only, so
# names survive every system a message may be forwarded to.
QUEUE_NAME_PATTERN = r"\A[A-Za-z0-9._/%]{1,48}\Z"
queue_name_validator = RegexValidator(
    QUEUE_NAME_PATTERN,
    message=(
        "Use 1 to 48 ASCII letters, digits and the characters . _ / %% "
        "(no spaces or other characters)."
    ),
    code="invalid_name",
)


def validate_topic_string(value: str) -> None:
    try:
        topic_levels(value)
    except TopicError as error:
        raise ValidationError(str(error), code="invalid_topic") from None


def validate_topic_filter(value: str) -> None:
    try:
        filter_levels(value)
    except TopicError as error:
        raise ValidationError(str(error), code="invalid_filter") from None


DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
MIN_WEBHOOK_SECRET_LENGTH = 16
MAX_WEBHOOK_SECRET_LENGTH = 256
MAX_SUSPECT_DELAY_SECONDS = 5.0


class MessageState(models.TextChoices):
    TO_BE_DELIVERED = "TBDL", "To be delivered"
    DELIVERING = "DLNG", "Delivering"
    DELIVERED = "DLVD", "Delivered"
    NOT_DELIVERABLE = "NDLV", "Not deliverable (blacklisted)"
    FAILED = "FAIL", "Failed"


class QueueKind(models.TextChoices):
    STANDARD = "standard", "Standard"
    DEAD_LETTER = "dead_letter", "Dead-letter"


class Overflow(models.TextChoices):
    REJECT_NEW = "reject_new", "Reject new messages"
    DISCARD_OLD = "discard_old", "Discard old messages"


class PoisonAction(models.TextChoices):
    QUARANTINE = "quarantine", "Quarantine (NDLV)"
    PURGE = "purge", "Purge"


class Queue(models.Model):
    name = models.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, unique=True, validators=[queue_name_validator]
    )
    kind = models.CharField(max_length=16, choices=QueueKind.choices, default=QueueKind.STANDARD)
    description = models.CharField(max_length=200, blank=True)
    # A registered handler name or an http(s) webhook URL; blank: messages wait.
    consumer = models.CharField(max_length=2048, blank=True, validators=[validate_consumer])
    # A webhook consumer's POST may take this long to connect, and again to
    # send and to be answered; longer is a handler error.
    webhook_timeout = models.FloatField(
        default=WEBHOOK_TIMEOUT_SECONDS,
        validators=[
            MinValueValidator(MIN_WEBHOOK_TIMEOUT_SECONDS),
            MaxValueValidator(MAX_WEBHOOK_TIMEOUT_SECONDS),
        ],
    )
    # Signs every webhook POST (broker.consumers.webhook_signature); blank:
    # unsigned. Write-only: the API and the console never show it.
    webhook_secret = models.CharField(
        max_length=MAX_WEBHOOK_SECRET_LENGTH,
        blank=True,
        validators=[MinLengthValidator(MIN_WEBHOOK_SECRET_LENGTH)],
    )
    batch_size = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1)])
    lease_seconds = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    retry_limit = models.PositiveIntegerField(default=3)
    retry_backoff_seconds = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    crash_threshold = models.PositiveIntegerField(default=2, validators=[MinValueValidator(1)])
    poison_limit = models.PositiveIntegerField(default=5, validators=[MinValueValidator(1)])
    # What happens to a message that reached its crash threshold or poison limit.
    poison_action = models.CharField(
        max_length=16, choices=PoisonAction.choices, default=PoisonAction.QUARANTINE
    )
    # Where poison alarms of this queue are posted; blank: the installation's
    # LAZARETTO_ALARM_WEBHOOK_URL, if any.
    alarm_webhook_url = models.CharField(
        max_length=2048, blank=True, validators=[validate_webhook_url]
    )
    # The back-off before a suspect that already failed alone is delivered
    # again; it doubles with each further failure, up to 5 s
    # (broker.services.transitions.in_flight).
    suspect_delay_seconds = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(MAX_SUSPECT_DELAY_SECONDS)],
    )
    # Waiting + in-flight messages allowed by direct publishing, and what a
    # publish past the limit does (broker.services.limits).
    max_messages = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    overflow = models.CharField(
        max_length=16, choices=Overflow.choices, default=Overflow.REJECT_NEW
    )
    # discard_old moves discarded messages to the dead-letter queue instead of
    # deleting them.
    discard_to_dead_letter = models.BooleanField(default=False)
    max_payload_bytes = models.PositiveIntegerField(
        default=DEFAULT_MAX_PAYLOAD_BYTES, validators=[MinValueValidator(1)]
    )
    dead_letter_queue = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="feeding_queues"
    )
    paused = models.BooleanField(default=False)
    # Delivered and failed messages older than this many days go to the
    # archive; null: LAZARETTO_ARCHIVE_RETENTION_DAYS.
    archive_retention_days = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(name__regex=QUEUE_NAME_PATTERN), name="queue_name_valid"
            ),
            models.CheckConstraint(
                condition=Q(batch_size__gte=1), name="queue_batch_size_positive"
            ),
            models.CheckConstraint(
                condition=Q(max_messages__isnull=True) | Q(max_messages__gte=1),
                name="queue_max_messages_positive",
            ),
            models.CheckConstraint(
                condition=~Q(kind=QueueKind.DEAD_LETTER) | Q(dead_letter_queue__isnull=True),
                name="queue_dead_letter_has_no_dead_letter_queue",
            ),
            models.CheckConstraint(
                condition=Q(suspect_delay_seconds__gte=0)
                & Q(suspect_delay_seconds__lte=MAX_SUSPECT_DELAY_SECONDS),
                name="queue_suspect_delay_0_5",
            ),
            models.CheckConstraint(
                condition=Q(webhook_timeout__gte=MIN_WEBHOOK_TIMEOUT_SECONDS)
                & Q(webhook_timeout__lte=MAX_WEBHOOK_TIMEOUT_SECONDS),
                name="queue_webhook_timeout_bounds",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_dead_letter(self) -> bool:
        return self.kind == QueueKind.DEAD_LETTER

    @property
    def webhook_signed(self) -> bool:
        """Whether webhook POSTs are signed (a secret is set)."""
        return bool(self.webhook_secret)


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


class QueueDepthDelta(models.Model):
    """A change of a queue's message count in one state, written by the
    statement-level triggers on broker_message (migrations 0002 and 0014) in
    the same transaction as the change: one row per queue and state that a
    statement changed. Rows are only ever inserted here, then folded into
    ``QueueDepth`` and deleted by the sweeper (``broker.services.counters``).

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


class Topic(models.Model):
    """A named root of a topic tree; publications use topic strings below it."""

    name = models.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, unique=True, validators=[queue_name_validator]
    )
    # The root of the topic tree: publications name this or a string below it.
    topic_string = models.CharField(
        max_length=1024, unique=True, validators=[validate_topic_string]
    )
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Subscription(models.Model):
    """Delivers copies of a topic's publications matching ``topic_filter``
    into its own queue, within its own max-messages limit."""

    name = models.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, unique=True, validators=[queue_name_validator]
    )
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="subscriptions")
    topic_filter = models.CharField(max_length=1024, validators=[validate_topic_filter])
    queue = models.OneToOneField(Queue, on_delete=models.PROTECT, related_name="subscription")
    max_messages = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    overflow = models.CharField(
        max_length=16, choices=Overflow.choices, default=Overflow.REJECT_NEW
    )
    discard_to_dead_letter = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_messages__isnull=True) | Q(max_messages__gte=1),
                name="subscription_max_messages_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.topic_id is None or not self.topic_filter:
            return
        try:
            levels = filter_levels(self.topic_filter)
        except TopicError:
            return  # the field validator reports it
        root = topic_levels(self.topic.topic_string)
        if not is_under(levels, root):
            raise ValidationError(
                {
                    "topic_filter": (
                        f"The filter must start with the topic's string "
                        f"{self.topic.topic_string!r}."
                    )
                }
            )


class Message(models.Model):
    id = models.BigAutoField(primary_key=True)
    # Indexed together with id below (message_queue_id_idx), not on its own.
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, db_index=False)
    payload = models.BinaryField()
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
                models.F("priority").desc(),
                "id",
                name="message_ready_idx",
                condition=Q(state=MessageState.TO_BE_DELIVERED),
            ),
            # Crash suspects waiting to be delivered alone (rare rows):
            #   SELECT id FROM broker_message WHERE queue_id = $1 AND state = 'TBDL'
            #   AND suspect AND available_at <= now() ORDER BY priority DESC, id LIMIT 1
            models.Index(
                "queue",
                models.F("priority").desc(),
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
            models.Index(
                fields=["queue", "enqueued_at", "id"],
                name="message_waiting_idx",
                condition=Q(state=MessageState.TO_BE_DELIVERED),
            ),
            # The blacklist, per queue, in quarantine order:
            #   SELECT … FROM broker_message WHERE state = 'NDLV'
            #   [AND queue_id = $1] ORDER BY id DESC LIMIT n
            models.Index(
                fields=["queue", "id"],
                name="message_blacklist_idx",
                condition=Q(state=MessageState.NOT_DELIVERABLE),
            ),
        ]

    def __str__(self) -> str:
        return f"message {self.id} ({self.state})"


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
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.action} job {self.id} ({self.status})"

    @property
    def percent(self) -> int:
        return 100 if not self.total else min(100, round(100 * self.done / self.total))


class QueueMinute(models.Model):
    """What happened on one queue in one minute, as far as the sweeper has
    folded it in from ``QueueCountDelta``: the dashboard's last-hour chart
    reads it with the changes not folded yet (the view
    ``broker_queueminute_current``)."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="minutes")
    minute = models.DateTimeField()
    delivered = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    # Messages quarantined or purged as poison (also counted in failed).
    poisoned = models.PositiveIntegerField(db_default=0)
    # Messages published to the queue (directly or through a topic).
    published = models.PositiveIntegerField(db_default=0)
    # Deliveries the consumer answered with an error (retried or not).
    handler_errors = models.PositiveIntegerField(db_default=0)
    # Deliveries that ended without an answer: the worker died within the
    # lease (crashed), or the lease ran out (timed_out).
    crashed = models.PositiveIntegerField(db_default=0)
    timed_out = models.PositiveIntegerField(db_default=0)
    # Messages moved from the queue to its dead-letter queue, for any reason.
    dead_lettered = models.PositiveIntegerField(db_default=0)
    # Messages blacklisted (NDLV).
    blacklisted = models.PositiveIntegerField(db_default=0)
    # Messages deleted unread: discard_old, or a DISCARD on a dead-letter queue.
    discarded = models.PositiveIntegerField(db_default=0)

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


class QueueTotal(models.Model):
    """Every ``QueueMinute`` counter of a queue added up since the queue was
    created, one row per queue whatever the history: what /metrics reads,
    with the changes not folded yet (the view ``broker_queuetotal_current``).
    The fold that adds a ``QueueCountDelta`` to a minute adds it here in the
    same statement, so the two never disagree."""

    queue = models.OneToOneField(
        Queue, on_delete=models.CASCADE, primary_key=True, related_name="total"
    )
    published = models.BigIntegerField(db_default=0)
    delivered = models.BigIntegerField(db_default=0)
    failed = models.BigIntegerField(db_default=0)
    poisoned = models.BigIntegerField(db_default=0)
    handler_errors = models.BigIntegerField(db_default=0)
    crashed = models.BigIntegerField(db_default=0)
    timed_out = models.BigIntegerField(db_default=0)
    dead_lettered = models.BigIntegerField(db_default=0)
    blacklisted = models.BigIntegerField(db_default=0)
    discarded = models.BigIntegerField(db_default=0)

    def __str__(self) -> str:
        return f"{self.queue_id}: {self.published} published, {self.delivered} delivered"


class QueueCountDelta(models.Model):
    """What one statement did on a queue in one minute (see ``QueueMinute``
    for each counter), written by ``broker.services.stats`` with the change
    it counts. Inserted only, then folded into ``QueueMinute`` and
    ``QueueTotal`` and deleted by the sweeper, for the reasons
    ``QueueDepthDelta`` gives: the settle of every batch and every publish
    would otherwise update the queue's same two rows."""

    queue = models.ForeignKey(
        Queue, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    minute = models.DateTimeField()
    published = models.IntegerField(db_default=0)
    delivered = models.IntegerField(db_default=0)
    failed = models.IntegerField(db_default=0)
    poisoned = models.IntegerField(db_default=0)
    handler_errors = models.IntegerField(db_default=0)
    crashed = models.IntegerField(db_default=0)
    timed_out = models.IntegerField(db_default=0)
    dead_lettered = models.IntegerField(db_default=0)
    blacklisted = models.IntegerField(db_default=0)
    discarded = models.IntegerField(db_default=0)

    def __str__(self) -> str:
        return f"{self.queue_id} {self.minute:%H:%M}: +{self.published} published, +{self.delivered} delivered"


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


class NotificationState(models.TextChoices):
    NONE = "none", "No webhook"
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Gave up"


class PoisonAlarm(models.Model):
    """A message quarantined or purged automatically, as an alarm: written in
    the same transaction as the move, so no alarm is lost, and posted to the
    alarm webhook (if any) afterwards, with retries (broker.services.notify).
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
    webhook_url = models.CharField(max_length=2048, blank=True)
    notification = models.CharField(
        max_length=8, choices=NotificationState.choices, default=NotificationState.NONE
    )
    notify_attempts = models.PositiveIntegerField(default=0)
    notify_next_at = models.DateTimeField(null=True, blank=True)
    notify_error = models.TextField(blank=True)
    notified_at = models.DateTimeField(null=True, blank=True)

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


class ReplaySource(models.TextChoices):
    DEAD_LETTER = "dead_letter", "A dead-letter queue"
    BLACKLIST = "blacklist", "The blacklist (NDLV)"
    FAILED = "failed", "Failed messages (FAIL)"
    DELIVERED = "delivered", "Delivered messages (DLVD)"
    ARCHIVE = "archive", "The archive"


class ReplayJobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class ReplayJob(models.Model):
    """Dead (or delivered, or archived) messages put back on queues in bulk
    by a Spark job (workers.spark.replay). Each run writes every message at
    most once (ReplayedMessage), so a failed or cancelled job may be run
    again."""

    source = models.CharField(max_length=16, choices=ReplaySource.choices)
    # The dead-letter queue read, for source dead_letter.
    source_queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True)
    # queues, reason, since, until (ISO 8601), header ("name=value"),
    # payload_text: broker.services.replay.ReplayFilter.
    filters = models.JSONField(default=dict, blank=True)
    # Blank: each message goes back to its original queue.
    target_queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True)
    rules_text = models.TextField(blank=True)
    # At most this many messages written per second; null: as fast as it goes.
    velocity = models.PositiveIntegerField(null=True, blank=True)
    dry_run = models.BooleanField(default=False)
    status = models.CharField(
        max_length=10, choices=ReplayJobStatus.choices, default=ReplayJobStatus.QUEUED
    )
    cancel_requested = models.BooleanField(default=False)
    # Source rows in the job's queues, states and time range when it started.
    total = models.BigIntegerField(default=0)
    read = models.BigIntegerField(default=0)
    matched = models.BigIntegerField(default=0)
    written = models.BigIntegerField(default=0)
    skipped = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    # {queue name: messages}, {rule number: messages} with "0" for no rule
    # matched (jobs with a rules table only), and for a dry run a few of the
    # messages it would write.
    per_target = models.JSONField(default=dict, blank=True)
    per_rule = models.JSONField(default=dict, blank=True)
    sample = models.JSONField(default=list, blank=True)
    spark_app_id = models.CharField(max_length=100, blank=True)
    driver_pid = models.IntegerField(null=True, blank=True)
    runs = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # The driver's last sign of life: a running job silent for long had its
    # driver killed and may be run again.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(velocity__isnull=True) | Q(velocity__gte=1),
                name="replay_job_velocity_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"replay job {self.id} ({self.status})"

    @property
    def settled(self) -> int:
        """Source rows the job is through with: filtered out, written,
        skipped or failed."""
        return self.read - self.matched + self.written + self.skipped + self.failed

    @property
    def percent(self) -> int:
        if self.status == ReplayJobStatus.DONE or not self.total:
            return 100 if self.status == ReplayJobStatus.DONE else 0
        return min(100, round(100 * self.settled / self.total))

    @property
    def finished(self) -> bool:
        return self.status in {
            ReplayJobStatus.DONE,
            ReplayJobStatus.FAILED,
            ReplayJobStatus.CANCELLED,
        }


class ReplayedMessage(models.Model):
    """A message a replay job wrote, by its source message: the job's
    idempotency record (one per job and source, whatever became of the new
    message since) and the mark on the source for its timeline."""

    job = models.ForeignKey(ReplayJob, on_delete=models.CASCADE, related_name="replayed")
    source_message_id = models.BigIntegerField()
    message_id = models.BigIntegerField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "source_message_id"], name="replayed_once_per_job"
            ),
        ]
        indexes = [
            # A source message's timeline: SELECT … WHERE source_message_id = $1
            models.Index(fields=["source_message_id"], name="replayed_source_idx"),
            # A replayed message's origin: SELECT … WHERE message_id = $1
            models.Index(fields=["message_id"], name="replayed_message_idx"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.source_message_id} -> {self.message_id}"


class ArchiveChunkStatus(models.TextChoices):
    WRITTEN = "written", "Written and verified"
    DELETED = "deleted", "Deleted from PostgreSQL"


class ArchiveChunk(models.Model):
    """One step of the archive: a set of messages written to Parquet and
    verified (WRITTEN), then deleted from PostgreSQL (DELETED). A run that
    finds a WRITTEN chunk finishes it before anything else, so a crash
    between write and delete neither loses nor duplicates a message."""

    name = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=8, choices=ArchiveChunkStatus.choices)
    rows = models.PositiveIntegerField()
    first_id = models.BigIntegerField()
    last_id = models.BigIntegerField()
    # Parquet files relative to ARCHIVE_DIR.
    files = models.JSONField(default=list)
    spark_app_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"archive chunk {self.name} ({self.status}, {self.rows} rows)"


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
