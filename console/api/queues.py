"""REST API for queues: their settings, summaries, publishing, pause, resume and purge."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.serializer_helpers import ReturnDict
from rest_framework.views import APIView

from broker.consumers import (
    MAX_WEBHOOK_TIMEOUT_SECONDS,
    MIN_WEBHOOK_TIMEOUT_SECONDS,
    handler_names,
    validate_consumer,
    validate_webhook_url,
)
from broker.errors import QueueNotFound
from broker.models import (
    MAX_WEBHOOK_SECRET_LENGTH,
    MIN_WEBHOOK_SECRET_LENGTH,
    QUEUE_NAME_MAX_LENGTH,
    Queue,
)
from broker.selectors import (
    LimitState,
    QueueSummary,
    dead_letter_queue_list,
    queue_summaries,
    queue_summary,
)
from broker.services.publish import MAX_DELAY_SECONDS, NewMessage
from broker.services.queues import (
    QUEUE_SETTINGS,
    SECRET_SETTINGS,
    queue_create,
    queue_delete,
    queue_pause,
    queue_purge,
    queue_update,
)
from console.access import queue_held, request_access
from console.api.fields import (
    BodyModelSerializer,
    BodySerializer,
    ExpiryField,
    HeadersField,
    NameRelatedField,
    PayloadField,
    WebhookTimeoutField,
    fields_through,
    parsed,
)
from console.api.schema import ERROR, one_of
from console.roles import Role

# A webhook URL as the schema states it: http(s), a host name or an IPv4
# address, an optional port and path. Whether the host may be reached is
# this instance's policy, checked on save and at each connection
# (broker.outbound, LAZARETTO_WEBHOOK_ALLOWED_NETWORKS).
PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
HOST = r"(?:(?:[A-Za-z0-9-]+\.)*[A-Za-z][A-Za-z0-9-]*|[0-9]{1,3}(?:\.[0-9]{1,3}){3})"
WEBHOOK_URL = rf"https?://{HOST}(?::{PORT})?(?:/[!-~]*)?"


class ConsumerPattern(RegexValidator):
    """A queue's consumer: blank, a registered handler's name or a webhook
    URL. The model's own check runs first, for its reasons (the handlers
    known, the address refused); the pattern, which the schema states, then
    refuses what it takes beyond that. The handlers are those registered
    when the pattern is read (start-up has loaded LAZARETTO_CONSUMER_MODULES
    by then)."""

    message = "Name a registered handler or an http(s) webhook URL with a host name."

    def __init__(self) -> None:
        super().__init__(regex="", message=self.message)

    def __call__(self, value: Any) -> None:
        validate_consumer(value)
        super().__call__(value)

    @property
    def regex(self) -> re.Pattern[str]:
        names = "|".join(re.escape(name) for name in handler_names())
        return re.compile(rf"\A(?:{names}|{WEBHOOK_URL})?\Z")

    @regex.setter
    def regex(self, value: object) -> None:
        pass  # computed from the registered handlers


class WebhookPattern(RegexValidator):
    """An alarm webhook: blank or an http(s) URL, the model's check first
    (as ConsumerPattern)."""

    def __init__(self) -> None:
        super().__init__(rf"\A(?:{WEBHOOK_URL})?\Z", "An http(s) URL with a host name.")

    def __call__(self, value: Any) -> None:
        validate_webhook_url(value)
        super().__call__(value)


# A webhook secret is blank (POSTs go unsigned) or 16 to 256 characters,
# taken as typed. A pattern rather than a minimum length, so that the schema
# says a blank is taken too.
SECRET_PATTERN = RegexValidator(
    rf"\A(?:[^\x00]{{{MIN_WEBHOOK_SECRET_LENGTH},{MAX_WEBHOOK_SECRET_LENGTH}}})?\Z",
    f"A secret is {MIN_WEBHOOK_SECRET_LENGTH} to {MAX_WEBHOOK_SECRET_LENGTH} characters; "
    "blank for unsigned POSTs.",
)


class QueueSerializer(BodyModelSerializer[Queue]):
    """A queue's name and settings."""

    dead_letter_queue = NameRelatedField(
        missing=QueueNotFound,
        what="dead-letter queue",
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
            **{
                name: {
                    "write_only": True,
                    "trim_whitespace": False,
                    "min_length": None,
                    "validators": [SECRET_PATTERN],
                    "help_text": "Shared secret (16 to 256 characters) that signs each webhook "
                    "POST with HMAC-SHA256 (Lazaretto-Signature); write-only; blank: unsigned.",
                }
                for name in SECRET_SETTINGS
            },
            "consumer": {"validators": [ConsumerPattern()]},
            "alarm_webhook_url": {"validators": [WebhookPattern()]},
        }


class QueueSettingsSerializer(QueueSerializer):
    """A queue's settings as an update takes them: all but its name, which
    never changes."""

    class Meta(QueueSerializer.Meta):
        read_only_fields = [*QueueSerializer.Meta.read_only_fields, "name"]


class LimitSerializer(BodySerializer[LimitState]):
    """Where a queue stands against a max_messages limit."""

    live = serializers.IntegerField(help_text="Waiting + in-flight messages.")
    over_limit = serializers.BooleanField(help_text="Internal moves took it past max_messages.")
    high_water = serializers.BooleanField(help_text="At 80 % of max_messages or more.")


class QueueSummarySerializer(BodySerializer[QueueSummary]):
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


# Text, or base64 (the alphabet, padded, as base64.b64decode(validate=True)
# takes it) when payload_encoding says so.
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
PAYLOAD_SHAPES = (
    {"properties": {"payload_encoding": {"enum": ["string"]}}},
    {
        "required": ["payload_encoding"],
        "properties": {"payload_encoding": {"enum": ["base64"]}, "payload": {"pattern": BASE64}},
    },
)


def payload_shapes(name: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    """A message body's two shapes: ``Text<name>Request`` and ``Base64<name>Request``."""
    text, binary = PAYLOAD_SHAPES
    return (f"Text{name}Request", text), (f"Base64{name}Request", binary)


@one_of(*payload_shapes("MessageIn"))
class MessageInSerializer(BodySerializer[NewMessage]):
    payload = PayloadField(
        allow_blank=True, trim_whitespace=False, help_text="The body, as text or base64."
    )
    payload_encoding = serializers.ChoiceField(
        choices=["string", "base64"],
        default="string",
        help_text="How `payload` is written: `string` (UTF-8 text) or `base64` (any bytes).",
    )
    content_type = serializers.CharField(max_length=100, default="application/octet-stream")
    headers = HeadersField(default=dict, help_text="A flat object of string values.")
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


class PublishSerializer(BodySerializer[list[NewMessage]]):
    messages = serializers.ListField(
        child=MessageInSerializer(), min_length=1, max_length=settings.LAZARETTO_MAX_PUBLISH_BATCH
    )

    def new_messages(self) -> list[NewMessage]:
        child = MessageInSerializer()
        return [child.to_new_message(attrs) for attrs in self.validated_data["messages"]]


class PublishResultSerializer(BodySerializer[dict[str, Any]]):
    count = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.IntegerField())


class ConfirmSerializer(BodySerializer[dict[str, str]]):
    confirm = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, help_text="The queue's name, repeated."
    )


class PurgeResultSerializer(BodySerializer[dict[str, int]]):
    deleted = serializers.IntegerField()


PUBLISH_EXAMPLES = [
    OpenApiExample(
        "One message",
        value={"payload": '{"order": 1017}', "content_type": "application/json"},
        request_only=True,
    ),
    OpenApiExample(
        "A batch, with headers, priority and expiry",
        value={
            "messages": [
                {"payload": "first", "headers": {"tenant": "acme"}, "priority": 7},
                {"payload": "AAEC", "payload_encoding": "base64", "expires_in_seconds": 3600},
            ]
        },
        request_only=True,
    ),
    OpenApiExample("Stored", value={"count": 2, "ids": [5012, 5013]}, response_only=True),
]


def as_batch(data: Any) -> Any:
    """A publish body is one message object, a JSON array of them, or
    ``{"messages": [...]}`` (with the topic string beside it for a topic)."""
    if isinstance(data, list):
        return {"messages": data}
    if isinstance(data, dict) and "messages" not in data:
        message = {key: value for key, value in data.items() if key != "topic_string"}
        batch: dict[str, Any] = {"messages": [message]}
        if "topic_string" in data:
            batch["topic_string"] = data["topic_string"]
        return batch
    return data


def queue_json(queue: Queue) -> ReturnDict[str, Any]:
    return QueueSummarySerializer(queue_summary(queue=queue)).data


class QueueListView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses=QueueSummarySerializer(many=True))
    def get(self, request: Request) -> Response:
        summaries = queue_summaries(within=request_access(request).queues(Role.VIEWER))
        # many=True builds a ListSerializer, which takes the list.
        return Response(QueueSummarySerializer(summaries, many=True).data)  # type: ignore[arg-type]

    @extend_schema(request=QueueSerializer, responses={201: QueueSummarySerializer, 400: ERROR})
    def post(self, request: Request) -> Response:
        serializer = QueueSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        access = request_access(request)
        access.check_create(serializer.validated_data["name"])
        if dead_letter_queue := serializer.validated_data.get("dead_letter_queue"):
            access.check(Role.VIEWER, dead_letter_queue.name)
        queue = queue_create(actor=request.user, **serializer.validated_data)
        return Response(queue_json(queue), status=status.HTTP_201_CREATED)


class QueueDetailView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses={200: QueueSummarySerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        return Response(queue_json(queue_held(request, Role.VIEWER, name)))

    @extend_schema(
        request=QueueSettingsSerializer, responses={200: QueueSummarySerializer, 400: ERROR}
    )
    def put(self, request: Request, name: str) -> Response:
        return self._update(request, name, partial=False)

    @extend_schema(
        request=QueueSettingsSerializer, responses={200: QueueSummarySerializer, 400: ERROR}
    )
    def patch(self, request: Request, name: str) -> Response:
        return self._update(request, name, partial=True)

    def _update(self, request: Request, name: str, *, partial: bool) -> Response:
        queue = queue_held(request, Role.ADMIN, name)
        serializer = QueueSettingsSerializer(queue, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        if dead_letter_queue := serializer.validated_data.get("dead_letter_queue"):
            request_access(request).check(Role.VIEWER, dead_letter_queue.name)
        return Response(
            queue_json(queue_update(queue=queue, actor=request.user, **serializer.validated_data))
        )

    @extend_schema(responses={204: None, 404: ERROR, 409: ERROR})
    def delete(self, request: Request, name: str) -> Response:
        queue_delete(queue=queue_held(request, Role.ADMIN, name), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class QueuePauseView(APIView):
    """pause stops delivery from the queue (publishing goes on); resume
    restarts it."""

    paused = True

    @extend_schema(request=None, responses={200: QueueSummarySerializer, 404: ERROR})
    def post(self, request: Request, name: str) -> Response:
        queue = queue_held(request, Role.OPERATOR, name)
        queue = queue_pause(queue=queue, paused=self.paused, actor=request.user)
        return Response(queue_json(queue))


class QueuePurgeView(APIView):
    @extend_schema(
        request=ConfirmSerializer,
        responses={200: PurgeResultSerializer, 400: ERROR, 404: ERROR, 409: ERROR},
        description="Delete every waiting (TBDL) message of the queue. `confirm` must repeat "
        "the queue's name exactly, or nothing is deleted (409 `confirmation_mismatch`).",
    )
    def post(self, request: Request, name: str) -> Response:
        queue = queue_held(request, Role.OPERATOR, name)
        confirm = parsed(ConfirmSerializer, request.data).validated_data["confirm"]
        deleted = queue_purge(queue=queue, confirmation=confirm, actor=request.user)
        return Response({"deleted": deleted})
