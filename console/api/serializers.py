"""Input parsing and output shapes of the REST API. No business rules here:
the broker services validate and write."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from django.conf import settings
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from broker.models import (
    Message,
    MessageState,
    Queue,
    QueueKind,
    RuleTable,
    Subscription,
    Topic,
)
from broker.selectors import LimitState, live_count
from broker.services.publish import MAX_DELAY_SECONDS, NewMessage
from broker.services.queues import QUEUE_SETTINGS
from broker.services.rule_tables import rule_table_report


class QueueSerializer(serializers.ModelSerializer[Queue]):
    dead_letter_queue = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Queue.objects.filter(kind=QueueKind.DEAD_LETTER),
        allow_null=True,
        required=False,
        help_text="Name of the dead-letter queue; defaults to SYSTEM.DEAD.LETTER.QUEUE.",
    )
    depth = serializers.SerializerMethodField(
        help_text="Messages by state: TBDL, DLNG, DLVD, NDLV, FAIL."
    )
    limit = serializers.SerializerMethodField(
        help_text="Waiting + in-flight messages against max_messages: "
        "`live`, `over_limit`, `high_water` (80 % or more)."
    )

    class Meta:
        model = Queue
        fields = [
            "name",
            *QUEUE_SETTINGS,
            "depth",
            "limit",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]

    def get_depth(self, queue: Queue) -> dict[str, int]:
        depths: dict[int, dict[str, int]] = self.context.get("depths", {})
        return depths.get(queue.id, dict.fromkeys(MessageState.values, 0))

    def get_limit(self, queue: Queue) -> dict[str, Any]:
        return limit_json(
            LimitState(live=live_count(self.get_depth(queue)), max_messages=queue.max_messages)
        )


def limit_json(state: LimitState) -> dict[str, Any]:
    return {"live": state.live, "over_limit": state.over_limit, "high_water": state.high_water}


class TopicSerializer(serializers.ModelSerializer[Topic]):
    class Meta:
        model = Topic
        fields = ["name", "topic_string", "description", "created_at"]
        read_only_fields = ["created_at"]


class SubscriptionSerializer(serializers.ModelSerializer[Subscription]):
    topic = serializers.SlugRelatedField(slug_field="name", queryset=Topic.objects.all())
    queue = serializers.CharField(
        source="queue.name",
        max_length=48,
        help_text="The subscription's own queue; created when it does not exist.",
    )
    limit = serializers.SerializerMethodField(
        help_text="The queue's waiting + in-flight messages against this subscription's "
        "max_messages: `live`, `over_limit`, `high_water`."
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
            "limit",
            "created_at",
        ]
        read_only_fields = ["created_at"]

    def get_limit(self, subscription: Subscription) -> dict[str, Any]:
        depths: dict[int, dict[str, int]] = self.context.get("depths", {})
        depth = depths.get(subscription.queue_id, dict.fromkeys(MessageState.values, 0))
        return limit_json(
            LimitState(live=live_count(depth), max_messages=subscription.max_messages)
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
            "suspect",
            "available_at",
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
    queue = serializers.SlugRelatedField(
        slug_field="name", queryset=Queue.objects.filter(kind=QueueKind.DEAD_LETTER)
    )
    text = serializers.CharField(trim_whitespace=False, help_text="The table in runmqdlq syntax.")
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    validation = serializers.SerializerMethodField(
        help_text='`{"valid", "control", "rules", "errors": [{"line", "column", "message"}]}`'
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
        ]
        read_only_fields = ["id", "version", "status", "created_at", "activated_at"]

    def get_validation(self, table: RuleTable) -> dict[str, Any]:
        return rule_table_report(text=table.text, queue=table.queue)


class RuleTableTextSerializer(serializers.Serializer[dict[str, str]]):
    text = serializers.CharField(trim_whitespace=False)


class RollbackSerializer(serializers.Serializer[dict[str, Queue]]):
    queue = serializers.SlugRelatedField(
        slug_field="name", queryset=Queue.objects.filter(kind=QueueKind.DEAD_LETTER)
    )
