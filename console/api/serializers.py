"""Input parsing and output shapes of the REST API. No business rules here:
the broker services validate and write."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from broker.consumers import MAX_WEBHOOK_TIMEOUT_SECONDS, MIN_WEBHOOK_TIMEOUT_SECONDS
from broker.ha.admin import NODE_NAME_MAX_LENGTH, PairOverview
from broker.models import (
    QUEUE_NAME_MAX_LENGTH,
    AuditEvent,
    BulkJob,
    DivergedExport,
    HaEvent,
    HaEventKind,
    Message,
    MessageState,
    Node,
    Queue,
    ReplayJob,
    ReplaySource,
    RuleTable,
    Subscription,
    Topic,
    queue_name_validator,
)
from broker.rules import LAZARETTO_REASONS
from broker.selectors import (
    AuditFilter,
    LimitState,
    MessageFilter,
    QueueSummary,
    SubscriptionSummary,
    dead_letter_queue_list,
    topic_list,
)
from broker.services.archive import ArchivedMessage
from broker.services.bulk import MAX_SELECTED
from broker.services.dead_letters import ScanResult
from broker.services.publish import MAX_DELAY_SECONDS, MAX_EXPIRY_SECONDS, NewMessage
from broker.services.queues import QUEUE_SETTINGS, SECRET_SETTINGS
from broker.services.replay import MAX_VELOCITY, ReplayFilter, ReplaySpec
from broker.services.rule_tables import rule_table_report
from broker.services.transitions.blacklist import TRIAGE_ACTIONS
from console.models import TOKEN_NAME_MAX_LENGTH, ApiToken


class NameRelatedField(serializers.SlugRelatedField):
    """A related object by its name; a name no object can have (one with a
    NUL, which PostgreSQL text refuses) does not exist rather than fail."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return super().to_internal_value(data)


# Each resource with a depth has two serializers: the model serializer parses
# what a client sends; the summary serializer answers with a summary from
# broker.selectors (the same fields, read through the summary, plus depth and
# limit), so the API and the console read depths one way.


@extend_schema_field(
    {
        "type": "number",
        "format": "double",
        "minimum": MIN_WEBHOOK_TIMEOUT_SECONDS,
        "maximum": MAX_WEBHOOK_TIMEOUT_SECONDS,
    }
)
class WebhookTimeoutField(serializers.FloatField):
    """Seconds, a finite number within the bounds. Booleans, NaN and
    infinity, which ``float()`` would take, are refused here so the error
    names the field."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            min_value=MIN_WEBHOOK_TIMEOUT_SECONDS, max_value=MAX_WEBHOOK_TIMEOUT_SECONDS, **kwargs
        )

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("invalid")
        return value


class QueueSerializer(serializers.ModelSerializer[Queue]):
    """A queue's name and settings."""

    dead_letter_queue = NameRelatedField(
        slug_field="name",
        queryset=dead_letter_queue_list(),
        allow_null=True,
        required=False,
        help_text="Name of the dead-letter queue; defaults to SYSTEM.DEAD.LETTER.QUEUE.",
    )
    webhook_timeout = WebhookTimeoutField(
        required=False,
        help_text=(
            "Seconds a webhook consumer has to accept the connection, and again to "
            f"answer ({MIN_WEBHOOK_TIMEOUT_SECONDS:g} to {MAX_WEBHOOK_TIMEOUT_SECONDS:g}); "
            "default 10."
        ),
    )
    webhook_signed = serializers.BooleanField(
        read_only=True,
        help_text="Whether webhook POSTs are signed: a webhook_secret is set (it is never "
        "returned).",
    )

    class Meta:
        model = Queue
        fields = ["name", *QUEUE_SETTINGS, "webhook_signed", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        # Secrets are written, never read back.
        extra_kwargs = {
            name: {
                "write_only": True,
                "help_text": "Shared secret (16 to 256 characters) that signs each webhook "
                "POST with HMAC-SHA256 (Lazaretto-Signature); write-only; blank: unsigned.",
            }
            for name in SECRET_SETTINGS
        }


class LimitSerializer(serializers.Serializer[LimitState]):
    """Where a queue stands against a max_messages limit."""

    live = serializers.IntegerField(help_text="Waiting + in-flight messages.")
    over_limit = serializers.BooleanField(help_text="Internal moves took it past max_messages.")
    high_water = serializers.BooleanField(help_text="At 80 % of max_messages or more.")


def fields_through(
    model_serializer: type[serializers.ModelSerializer[Any]],
    attribute: str,
    *,
    own: dict[str, serializers.Field[Any, Any, Any, Any]],
    before: str,
) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
    """How a summary serializer shows its model: ``model_serializer``'s
    fields, each reading the summary's ``attribute`` (``queue.name`` for
    ``name``), with the summary's ``own`` fields placed before ``before``."""
    fields: dict[str, serializers.Field[Any, Any, Any, Any]] = {}
    for name, field in model_serializer().get_fields().items():
        if name == before:
            fields.update(own)
        field.source = f"{attribute}.{field.source or name}"
        fields[name] = field
    return fields


class QueueSummarySerializer(serializers.Serializer[QueueSummary]):
    """A queue: its name and settings, its messages by state and its limit."""

    depth = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Messages by state: TBDL, DLNG, DLVD, NDLV, FAIL.",
    )
    limit = LimitSerializer(help_text="Waiting + in-flight messages against max_messages.")

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return fields_through(
            QueueSerializer, "queue", own=super().get_fields(), before="created_at"
        )


class TopicSerializer(serializers.ModelSerializer[Topic]):
    class Meta:
        model = Topic
        fields = ["name", "topic_string", "description", "created_at"]
        read_only_fields = ["created_at"]


class SubscriptionSerializer(serializers.ModelSerializer[Subscription]):
    """A subscription of a queue to a topic."""

    topic = NameRelatedField(slug_field="name", queryset=topic_list())
    queue = serializers.CharField(
        source="queue.name",
        max_length=48,
        help_text="The subscription's own queue; created when it does not exist.",
    )

    class Meta:
        model = Subscription
        fields = [
            "name",
            "topic",
            "topic_filter",
            "queue",
            "max_messages",
            "overflow",
            "discard_to_dead_letter",
            "created_at",
        ]
        read_only_fields = ["created_at"]


class SubscriptionSummarySerializer(serializers.Serializer[SubscriptionSummary]):
    """A subscription of a queue to a topic, with its queue's state against
    the subscription's limit."""

    limit = LimitSerializer(
        help_text="The queue's waiting + in-flight messages against this subscription's "
        "max_messages."
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return fields_through(
            SubscriptionSerializer, "subscription", own=super().get_fields(), before="created_at"
        )


class PayloadField(serializers.CharField):
    """A payload string. DRF's surrogate check walks every character in
    Python, which dominated publishing; encoding to UTF-8 once in
    ``MessageInSerializer.validate`` catches the same lone surrogates."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators = [
            validator
            for validator in self.validators
            if not isinstance(validator, ProhibitSurrogateCharactersValidator)
        ]


@extend_schema_field(
    {
        "type": "number",
        "format": "double",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_EXPIRY_SECONDS,
    }
)
class ExpiryField(serializers.FloatField):
    """Seconds until a message expires: a number (or numeric string, as
    DRF's FloatField takes) above 0 and at most 365 days. Booleans, NaN and
    infinity, which ``float()`` would take, are refused here so the error
    names the field."""

    default_error_messages = {"not_positive": "Ensure this value is greater than 0."}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_value=MAX_EXPIRY_SECONDS, **kwargs)

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("invalid")
        if value <= 0:
            self.fail("not_positive")
        return value


class MessageInSerializer(serializers.Serializer[NewMessage]):
    payload = PayloadField(
        allow_blank=True, trim_whitespace=False, help_text="The body, as text or base64."
    )
    payload_encoding = serializers.ChoiceField(
        choices=["string", "base64"],
        default="string",
        help_text="How `payload` is written: `string` (UTF-8 text) or `base64` (any bytes).",
    )
    content_type = serializers.CharField(max_length=100, default="application/octet-stream")
    headers = serializers.JSONField(default=dict, help_text="A flat object of string values.")
    priority = serializers.IntegerField(min_value=0, max_value=9, default=4)
    delay_seconds = serializers.IntegerField(min_value=0, max_value=MAX_DELAY_SECONDS, default=0)
    expires_in_seconds = ExpiryField(
        required=False,
        allow_null=True,
        help_text="Seconds (above 0, at most 31536000: 365 days) the message may wait from "
        "its publish; still waiting then, it is not delivered but moved to its queue's "
        "dead-letter queue with reason `expired`. Absent or null: it never expires.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["payload_encoding"] == "base64":
            try:
                attrs["payload"] = base64.b64decode(attrs["payload"], validate=True)
            except (binascii.Error, ValueError):
                raise serializers.ValidationError({"payload": ["Not valid base64."]}) from None
        else:
            try:
                attrs["payload"] = attrs["payload"].encode()
            except UnicodeEncodeError:
                raise serializers.ValidationError(
                    {"payload": ["Not valid text: it holds a lone surrogate; send base64."]}
                ) from None
        return attrs

    def to_new_message(self, attrs: dict[str, Any]) -> NewMessage:
        return NewMessage(
            payload=attrs["payload"],
            content_type=attrs["content_type"],
            headers=attrs["headers"],
            priority=attrs["priority"],
            delay_seconds=attrs["delay_seconds"],
            expires_in_seconds=attrs.get("expires_in_seconds"),
        )


class PublishSerializer(serializers.Serializer[list[NewMessage]]):
    messages = MessageInSerializer(  # type: ignore[call-arg]  # many=True builds a ListSerializer
        many=True, allow_empty=False, max_length=settings.LAZARETTO_MAX_PUBLISH_BATCH
    )

    def new_messages(self) -> list[NewMessage]:
        child = MessageInSerializer()
        return [child.to_new_message(attrs) for attrs in self.validated_data["messages"]]


class TopicPublishSerializer(PublishSerializer):
    topic_string = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=1024,
        trim_whitespace=False,
        help_text="Where to publish: the topic's string or one below it (default: the topic's).",
    )


class TopicDeliverySerializer(serializers.Serializer[dict[str, Any]]):
    subscription = serializers.CharField()
    queue = serializers.CharField()
    ids = serializers.ListField(child=serializers.IntegerField())


class TopicPublishResultSerializer(serializers.Serializer[dict[str, Any]]):
    count = serializers.IntegerField(help_text="Messages published (before copying).")
    deliveries = TopicDeliverySerializer(many=True)


class PublishResultSerializer(serializers.Serializer[dict[str, Any]]):
    count = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.IntegerField())


def payload_text(payload: bytes) -> tuple[str, str]:
    """The payload as (text, "string") when it is UTF-8, else (base64, "base64")."""
    try:
        return payload.decode(), "string"
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode(), "base64"


class MessageListSerializer(serializers.ModelSerializer[Message]):
    queue = serializers.CharField(source="queue.name", read_only=True)
    payload_bytes = serializers.IntegerField(read_only=True)

    class Meta:
        model = Message
        fields = [
            "id",
            "queue",
            "state",
            "priority",
            "content_type",
            "headers",
            "payload_bytes",
            "attempts",
            "crash_count",
            "timeout_count",
            "suspect",
            "available_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class MessageSerializer(serializers.ModelSerializer[Message]):
    queue = serializers.CharField(source="queue.name", read_only=True)
    payload = serializers.SerializerMethodField()
    payload_encoding = serializers.SerializerMethodField()
    payload_bytes = serializers.SerializerMethodField()

    class Meta:
        model = Message
        fields = [
            "id",
            "queue",
            "state",
            "priority",
            "content_type",
            "headers",
            "payload",
            "payload_encoding",
            "payload_bytes",
            "attempts",
            "crash_count",
            "timeout_count",
            "suspect",
            "available_at",
            "expires_at",
            "lease_owner",
            "lease_deadline",
            "last_error",
            "dead_letter",
            "put_application",
            "put_user",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_payload(self, message: Message) -> str:
        return payload_text(bytes(message.payload))[0]

    def get_payload_encoding(self, message: Message) -> str:
        return payload_text(bytes(message.payload))[1]

    def get_payload_bytes(self, message: Message) -> int:
        return len(message.payload)


class RuleTableSerializer(serializers.ModelSerializer[RuleTable]):
    queue = NameRelatedField(slug_field="name", queryset=dead_letter_queue_list())
    text = serializers.CharField(trim_whitespace=False, help_text="The table in runmqdlq syntax.")
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    validation = serializers.SerializerMethodField(
        help_text='`{"valid", "control", "rules", "errors": [{"line", "column", "message"}], '
        '"warnings": [{"line", "column", "message"}]}`; warnings do not make a table invalid.'
    )
    activate = serializers.BooleanField(
        write_only=True,
        default=False,
        help_text="Activate the new version at once. A table with errors is then refused "
        "(409 `rules_invalid`, with `errors`) and nothing is stored.",
    )

    class Meta:
        model = RuleTable
        fields = [
            "id",
            "queue",
            "version",
            "status",
            "text",
            "validation",
            "created_by",
            "created_at",
            "activated_at",
            "activate",
        ]
        read_only_fields = ["id", "version", "status", "created_at", "activated_at"]

    def get_validation(self, table: RuleTable) -> dict[str, Any]:
        return rule_table_report(text=table.text, queue=table.queue)


class RuleTableQuerySerializer(serializers.Serializer[dict[str, str]]):
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH,
        required=False,
        validators=[queue_name_validator],
        help_text="Only this dead-letter queue's versions.",
    )


class RuleTableTextSerializer(serializers.Serializer[dict[str, str]]):
    text = serializers.CharField(trim_whitespace=False)


class RollbackSerializer(serializers.Serializer[dict[str, Queue]]):
    queue = NameRelatedField(slug_field="name", queryset=dead_letter_queue_list())


# --- replay jobs -------------------------------------------------------------
# A replay job does real work with whatever it is given, so a key the API does
# not know ("dryrun" for "dry_run") is refused rather than ignored.


def unknown_keys(data: Any, known: Iterable[str]) -> dict[str, list[str]]:
    if not isinstance(data, Mapping):
        return {}
    known = set(known)
    return {str(key): ["Unknown field."] for key in data if key not in known}


def as_mapping(detail: Any) -> dict[str, Any]:
    """A serializer's error detail as ``{field: errors}``."""
    if isinstance(detail, dict):
        return dict(detail)
    return {api_settings.NON_FIELD_ERRORS_KEY: detail}


class ReplayFilterSerializer(serializers.Serializer[ReplayFilter]):
    """Which source messages a replay job takes; empty parts take everything."""

    queues = serializers.ListField(
        child=serializers.CharField(),
        default=list,
        help_text="Queue names; for a dead-letter source, the queues the messages were "
        "dead-lettered from.",
    )
    reason = serializers.CharField(
        allow_blank=True, default="", help_text="Dead-letter reason code (`handler_error`, ...)."
    )
    since = serializers.DateTimeField(
        allow_null=True, default=None, help_text="Published at or after (ISO 8601)."
    )
    until = serializers.DateTimeField(
        allow_null=True, default=None, help_text="Published before (ISO 8601)."
    )
    header = serializers.CharField(
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="`name=value`: messages whose header `name` is `value`.",
    )
    payload_text = serializers.CharField(
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="Messages whose payload contains this text.",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        unknown = unknown_keys(data, self.fields)
        try:
            values: dict[str, Any] = super().to_internal_value(data)
        except serializers.ValidationError as error:
            raise serializers.ValidationError({**as_mapping(error.detail), **unknown}) from None
        if unknown:
            raise serializers.ValidationError(unknown)
        return values


FILTER_PARTS = frozenset(field.name for field in dataclasses.fields(ReplayFilter))


class ReplaySpecSerializer(serializers.Serializer[ReplaySpec]):
    """What a replay job does. The shape is checked here; whether the job
    can run (queues exist, rules parse, the range is sane) is the replay
    service's to say, by field."""

    # DRF's metaclass takes declared fields out of the class, so this one
    # does not shadow Field.source at run time; the stubs cannot tell.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=ReplaySource.choices, help_text="Where the messages come from."
    )
    source_queue = serializers.CharField(
        allow_blank=True,
        default="",
        help_text="The dead-letter queue to read, for source `dead_letter` (and only then).",
    )
    filter = ReplayFilterSerializer(required=False)
    target_queue = serializers.CharField(
        allow_blank=True,
        default="",
        help_text="Where every message goes; blank: each back to its original queue.",
    )
    rules_text = serializers.CharField(
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="A rules table in runmqdlq syntax that routes (or skips) each message.",
    )
    velocity = serializers.IntegerField(
        allow_null=True,
        default=None,
        help_text=f"At most this many messages written per second (1 to {MAX_VELOCITY}); "
        "null: no limit.",
    )
    dry_run = serializers.BooleanField(
        default=False, help_text="Count and sample what the job would write; write nothing."
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        """Errors in the filter are named by the filter's part (``until``,
        ``queues``), as the replay service names them."""
        unknown = unknown_keys(data, self.fields)
        try:
            values: dict[str, Any] = super().to_internal_value(data)
        except serializers.ValidationError as error:
            detail = as_mapping(error.detail)
            window = detail.pop("filter", None)
            if isinstance(window, dict):
                for key, messages in window.items():
                    if key == api_settings.NON_FIELD_ERRORS_KEY:
                        detail["filter"] = messages
                    else:
                        detail[key if key in FILTER_PARTS else f"filter.{key}"] = messages
            elif window is not None:
                detail["filter"] = window
            raise serializers.ValidationError({**detail, **unknown}) from None
        if unknown:
            raise serializers.ValidationError(unknown)
        return values

    def spec(self) -> ReplaySpec:
        data = self.validated_data
        window = data.get("filter")
        return ReplaySpec(
            source=data["source"],
            source_queue=data["source_queue"],
            filter=ReplayFilter(**{**window, "queues": tuple(window["queues"])})
            if window
            else ReplayFilter(),
            target_queue=data["target_queue"],
            rules_text=data["rules_text"],
            velocity=data["velocity"],
            dry_run=data["dry_run"],
        )


class ReplayJobSerializer(serializers.ModelSerializer[ReplayJob]):
    """A replay job: what it does, where it stands, what it wrote."""

    filter = serializers.SerializerMethodField()
    percent = serializers.IntegerField(read_only=True, help_text="Progress, 0 to 100.")
    per_target = serializers.DictField(
        child=serializers.IntegerField(), read_only=True, help_text="Messages per target queue."
    )
    per_rule = serializers.DictField(
        child=serializers.IntegerField(),
        read_only=True,
        help_text='Messages per rule of `rules_text` (its number, or "none").',
    )
    sample = serializers.JSONField(
        read_only=True, help_text="For a dry run, a few of the messages it would write."
    )
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = ReplayJob
        fields = [
            "id",
            "status",
            "percent",
            "source",
            "source_queue",
            "filter",
            "target_queue",
            "rules_text",
            "velocity",
            "dry_run",
            "cancel_requested",
            "total",
            "read",
            "matched",
            "written",
            "skipped",
            "failed",
            "per_target",
            "per_rule",
            "sample",
            "spark_app_id",
            "runs",
            "error",
            "created_by",
            "created_at",
            "started_at",
            "heartbeat_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(ReplayFilterSerializer)
    def get_filter(self, job: ReplayJob) -> dict[str, Any]:
        return dict(ReplayFilterSerializer(ReplayFilter.from_stored(job.filters)).data)


class ReplayPreviewSerializer(serializers.Serializer[dict[str, int]]):
    count = serializers.IntegerField(help_text="Messages the filter matches, before any rules.")


# --- triage: messages, dead letters, bulk jobs, audit, tokens -----------------

REASON_CHOICES = sorted(LAZARETTO_REASONS)


class MessageQuerySerializer(serializers.Serializer[MessageFilter]):
    """The message browser's filters as query parameters; blank means any."""

    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, required=False, validators=[queue_name_validator]
    )
    state = serializers.ChoiceField(choices=MessageState.choices, required=False)
    reason = serializers.ChoiceField(
        choices=REASON_CHOICES, required=False, help_text="The dead-letter header's reason."
    )
    since = serializers.DateTimeField(required=False, help_text="Published at or after.")
    until = serializers.DateTimeField(required=False, help_text="Published before.")
    header = serializers.RegexField(
        r"^[^=]+=.*$",
        max_length=200,
        required=False,
        help_text="`name=value`: messages whose headers hold that pair.",
        error_messages={"invalid": "Write it as name=value."},
    )
    text = serializers.CharField(
        max_length=200, required=False, trim_whitespace=False, help_text="Payload contains."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and until <= since:
            raise serializers.ValidationError({"until": ["Must be after since."]})
        return attrs

    def message_filter(self) -> MessageFilter:
        return MessageFilter(**self.validated_data)


class ReasonSerializer(serializers.Serializer[dict[str, str]]):
    reason = serializers.CharField(
        max_length=500, required=False, default="", help_text="Why, for the audit log."
    )


class ForwardSerializer(ReasonSerializer):
    queue = serializers.CharField(max_length=QUEUE_NAME_MAX_LENGTH, help_text="The target queue.")
    keep_header = serializers.BooleanField(
        default=True, help_text="Keep the dead-letter header on the forwarded message."
    )


class ResubmitSerializer(MessageInSerializer):
    # A corrected copy is published at once and never expires.
    delay_seconds = None  # type: ignore[assignment]
    expires_in_seconds = None  # type: ignore[assignment]
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH,
        required=False,
        help_text="Where to publish the copy; default: the original's queue, or for a "
        "dead-lettered message the queue its header names.",
    )


class ResubmitResultSerializer(serializers.Serializer[dict[str, int]]):
    id = serializers.IntegerField(help_text="The new message's id.")


class BulkRequestSerializer(serializers.Serializer[dict[str, Any]]):
    action = serializers.ChoiceField(choices=sorted(TRIAGE_ACTIONS))
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        min_length=1,
        max_length=MAX_SELECTED,
        help_text="Blacklisted messages to act on; or give `filter`.",
    )
    filter = MessageQuerySerializer(
        required=False, help_text="Act on every blacklisted message the filter selects."
    )
    reason = serializers.CharField(max_length=500, required=False, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError(
                {"non_field_errors": ["Give either ids or filter, not both or neither."]}
            )
        return attrs


class BulkJobSerializer(serializers.ModelSerializer[BulkJob]):
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    percent = serializers.IntegerField(read_only=True)

    class Meta:
        model = BulkJob
        fields = [
            "id",
            "action",
            "filters",
            "reason",
            "status",
            "total",
            "done",
            "percent",
            "error",
            "created_by",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields


class ConfirmSerializer(serializers.Serializer[dict[str, str]]):
    confirm = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, help_text="The queue's name, repeated."
    )


class PurgeResultSerializer(serializers.Serializer[dict[str, int]]):
    deleted = serializers.IntegerField()


class GroupCountSerializer(serializers.Serializer[tuple[str, int]]):
    key = serializers.CharField()
    count = serializers.IntegerField()


class DeadLetterQueueSerializer(serializers.Serializer[dict[str, Any]]):
    queue = QueueSummarySerializer()
    active_rule_table = serializers.IntegerField(
        allow_null=True, help_text="The id of the active rules table version, if any."
    )
    by_reason = GroupCountSerializer(many=True)
    by_original_queue = GroupCountSerializer(many=True)


class ScanResultSerializer(serializers.Serializer[ScanResult]):
    examined = serializers.IntegerField()
    retried = serializers.IntegerField()
    forwarded = serializers.IntegerField()
    discarded = serializers.IntegerField()
    ignored = serializers.IntegerField()
    failed = serializers.IntegerField()


class AuditQuerySerializer(serializers.Serializer[AuditFilter]):
    actor = serializers.CharField(max_length=150, required=False)
    action = serializers.CharField(max_length=64, required=False)
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, required=False, validators=[queue_name_validator]
    )
    message_id = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)

    def audit_filter(self) -> AuditFilter:
        return AuditFilter(**self.validated_data)


class AuditEventSerializer(serializers.ModelSerializer[AuditEvent]):
    actor = serializers.CharField(source="actor_name", read_only=True)
    queue = serializers.CharField(source="queue_name", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor", "action", "queue", "message_id", "reason", "details"]
        read_only_fields = fields


class TokenSerializer(serializers.ModelSerializer[ApiToken]):
    user = serializers.CharField(source="user.username", read_only=True)
    name = serializers.CharField(max_length=TOKEN_NAME_MAX_LENGTH)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "user", "prefix", "created_at", "last_used_at"]
        read_only_fields = ["id", "user", "prefix", "created_at", "last_used_at"]


class NewTokenSerializer(TokenSerializer):
    key = serializers.CharField(
        read_only=True,
        help_text="The key, shown this once: send it as `Authorization: Token <key>`.",
    )

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "key"]
        read_only_fields = [*TokenSerializer.Meta.read_only_fields, "key"]


class ArchiveQuerySerializer(serializers.Serializer[dict[str, Any]]):
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, validators=[queue_name_validator]
    )
    since = serializers.DateTimeField(required=False, help_text="Published at or after.")
    until = serializers.DateTimeField(required=False, help_text="Published before.")
    before_id = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, help_text="The next page: ids below."
    )
    page_size = serializers.IntegerField(min_value=1, max_value=500, default=100)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and until <= since:
            raise serializers.ValidationError({"until": ["Must be after since."]})
        return attrs


class ArchivedMessageSerializer(serializers.Serializer[ArchivedMessage]):
    id = serializers.IntegerField()
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=MessageState.choices)
    payload = serializers.SerializerMethodField()
    payload_encoding = serializers.SerializerMethodField()
    content_type = serializers.CharField()
    headers = serializers.DictField()
    dead_letter = serializers.DictField(allow_null=True)
    put_application = serializers.CharField()
    put_user = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_payload(self, message: ArchivedMessage) -> str:
        return payload_text(message.payload)[0]

    def get_payload_encoding(self, message: ArchivedMessage) -> str:
        return payload_text(message.payload)[1]


class ArchivePageSerializer(serializers.Serializer[dict[str, Any]]):
    results = ArchivedMessageSerializer(many=True)
    next_before_id = serializers.IntegerField(
        allow_null=True, help_text="Pass as `before_id` for the next page; null on the last."
    )


# --- the HA pair --------------------------------------------------------------


class HaNodeSerializer(serializers.ModelSerializer[Node]):
    class Meta:
        model = Node
        fields = [
            "name",
            "role",
            "mode",
            "epoch",
            "address",
            "last_heartbeat_at",
            "replication_lag_bytes",
        ]
        read_only_fields = fields


class HaEventSerializer(serializers.ModelSerializer[HaEvent]):
    # Not "kind": the schema's KindEnum is the queues' kinds.
    event = serializers.ChoiceField(choices=HaEventKind.choices, source="kind", read_only=True)

    class Meta:
        model = HaEvent
        fields = ["id", "created_at", "event", "node", "epoch", "detail"]
        read_only_fields = fields


class DivergedExportSerializer(serializers.ModelSerializer[DivergedExport]):
    class Meta:
        model = DivergedExport
        fields = [
            "id",
            "created_at",
            "node",
            "path",
            "messages",
            "republished_at",
            "republished_by",
        ]
        read_only_fields = fields


class HaOverviewSerializer(serializers.Serializer[PairOverview]):
    epoch = serializers.SerializerMethodField()
    primary = serializers.SerializerMethodField()
    maintenance = serializers.BooleanField(
        help_text="Split brain: the store refuses every write until an admin picks the primary."
    )
    synchronising = serializers.BooleanField(
        help_text="A standby is rejoining: configuration changes are refused until it is "
        "synchronised."
    )
    alone = serializers.BooleanField(
        help_text="The primary runs without a synchronous standby: a publish is on one store only."
    )
    nodes = HaNodeSerializer(many=True)
    events = HaEventSerializer(many=True, help_text="Newest first.")
    exports = DivergedExportSerializer(many=True, help_text="Newest first.")

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_epoch(self, overview: PairOverview) -> int | None:
        return overview.pair.epoch if overview.pair else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_primary(self, overview: PairOverview) -> str | None:
        return (overview.pair.primary_name or None) if overview.pair else None


class HaResolveSerializer(serializers.Serializer[dict[str, str]]):
    primary = serializers.CharField(
        max_length=NODE_NAME_MAX_LENGTH, help_text="The node to keep as primary."
    )


class AcceptedSerializer(serializers.Serializer[dict[str, bool]]):
    accepted = serializers.BooleanField(help_text="The node took the command; it runs now.")


class RepublishedSerializer(serializers.Serializer[dict[str, int]]):
    published = serializers.IntegerField(help_text="Messages published again.")
