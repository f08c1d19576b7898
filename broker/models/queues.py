"""Queues, topics and subscriptions: where messages go and what limits them."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import (
    MaxValueValidator,
    MinLengthValidator,
    MinValueValidator,
    RegexValidator,
)
from django.db import models
from django.db.models import Q

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


# An alert threshold's bounds: a count or rate up to a billion, a duration
# from a second to a year.
MAX_ALERT_COUNT = 1_000_000_000
MAX_ALERT_SECONDS = 365 * 24 * 3600
alert_count_validators = [
    MaxValueValidator(MAX_ALERT_COUNT, message="At most a billion (1000000000).")
]
alert_seconds_validators = [
    MinValueValidator(1, message="At least 1 second."),
    MaxValueValidator(MAX_ALERT_SECONDS, message="At most a year (31536000 seconds)."),
]


class QueueKind(models.TextChoices):
    STANDARD = "standard", "Standard"
    DEAD_LETTER = "dead_letter", "Dead-letter"


class Overflow(models.TextChoices):
    REJECT_NEW = "reject_new", "Reject new messages"
    DISCARD_OLD = "discard_old", "Discard old messages"


class PoisonAction(models.TextChoices):
    QUARANTINE = "quarantine", "Quarantine (NDLV)"
    PURGE = "purge", "Purge"


class DeliveredRetention(models.TextChoices):
    """What the acknowledgement keeps of a delivered message (DLVD)."""

    FULL = "full", "The whole message"
    HEADERS = "headers", "All but its payload"
    NONE = "none", "Nothing: the acknowledgement deletes it"


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
    # Alert thresholds (broker.services.alerts): an alert fires when the
    # queue goes past one and resolves when it is back; null: not watched.
    alert_waiting_above = models.PositiveIntegerField(
        null=True, blank=True, validators=alert_count_validators
    )
    alert_oldest_waiting_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=alert_seconds_validators
    )
    alert_dead_letter_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=alert_count_validators
    )
    alert_blacklisted_above = models.PositiveIntegerField(
        null=True, blank=True, validators=alert_count_validators
    )
    alert_stalled_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=alert_seconds_validators
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
    # What the acknowledgement keeps of each message it delivers, read at the
    # acknowledgement (broker.services.transitions.in_flight): changing it
    # applies to the messages acknowledged from then on.
    delivered_retention = models.CharField(
        max_length=8,
        choices=DeliveredRetention.choices,
        default=DeliveredRetention.FULL,
        db_default=DeliveredRetention.FULL,
    )
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
            *(
                models.CheckConstraint(condition=condition, name=f"queue_{field}_bounds")
                for field, condition in (
                    ("alert_waiting_above", Q(alert_waiting_above__lte=MAX_ALERT_COUNT)),
                    (
                        "alert_oldest_waiting_seconds",
                        Q(alert_oldest_waiting_seconds__range=(1, MAX_ALERT_SECONDS)),
                    ),
                    (
                        "alert_dead_letter_per_minute",
                        Q(alert_dead_letter_per_minute__lte=MAX_ALERT_COUNT),
                    ),
                    ("alert_blacklisted_above", Q(alert_blacklisted_above__lte=MAX_ALERT_COUNT)),
                    (
                        "alert_stalled_seconds",
                        Q(alert_stalled_seconds__range=(1, MAX_ALERT_SECONDS)),
                    ),
                )
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
            problem = f"The filter must start with the topic's string {self.topic.topic_string!r}."
            raise ValidationError({"topic_filter": ValidationError(problem, code="outside_topic")})
