"""REST API for a queue's messages: the list (filtered, newest first) and one message."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import django_filters
from django.db.models import F, Func, IntegerField, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import InvalidInput
from broker.models import Message, MessageState
from broker.services.publish import messages_publish
from broker.services.transfer import payload_document
from console.access import message_held, queue_held, request_access
from console.api.fields import BodyModelSerializer
from console.api.queues import (
    PUBLISH_EXAMPLES,
    PublishResultSerializer,
    PublishSerializer,
    as_batch,
)
from console.api.schema import ERROR
from console.roles import Role


class MessageListSerializer(BodyModelSerializer[Message]):
    queue = serializers.CharField(source="queue.name", read_only=True)
    payload_bytes = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="The payload's size; null when not retained."
    )

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


class MessageSerializer(BodyModelSerializer[Message]):
    queue = serializers.CharField(source="queue.name", read_only=True)
    payload = serializers.SerializerMethodField(
        help_text="The payload as text or base64 (payload_encoding); null when not retained."
    )
    payload_encoding = serializers.SerializerMethodField(
        help_text="string or base64; null when the payload was not retained."
    )
    payload_bytes = serializers.SerializerMethodField(
        help_text="The payload's size; null when not retained."
    )
    payload_retained = serializers.SerializerMethodField(
        help_text="False for a delivered message whose queue keeps delivered messages without "
        "their payload (delivered_retention headers)."
    )
    replay_job_id = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="The replay job that wrote this message as a copy; null for any other.",
    )
    replay_source_id = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="The message this copy was replayed from; null for any other.",
    )

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
            "payload_retained",
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
            "replay_job_id",
            "replay_source_id",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_payload(self, message: Message) -> str | None:
        return payload_document(message.payload)[0]

    def get_payload_encoding(self, message: Message) -> str | None:
        return payload_document(message.payload)[1]

    def get_payload_bytes(self, message: Message) -> int | None:
        return None if message.payload is None else len(message.payload)

    def get_payload_retained(self, message: Message) -> bool:
        return message.payload is not None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time, compared in UTC: Python takes offsets up to ±23:59,
    PostgreSQL only to ±15:59."""

    def filter(self, qs: QuerySet[Any], value: Any) -> QuerySet[Any]:
        return super().filter(qs, value.astimezone(UTC) if value else value)


class QueueMessageFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=MessageState.choices)
    created_after = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Message
        fields = ["state", "created_after", "created_before"]


def listed(messages: QuerySet[Message]) -> QuerySet[Message]:
    """``messages`` as a list shows them: with their queue and payload size,
    without the payload itself."""
    return (
        messages.select_related("queue")
        .defer("payload")
        .annotate(
            payload_bytes=Func(F("payload"), function="octet_length", output_field=IntegerField())
        )
    )


class NewestFirst(CursorPagination):
    """Keyset pagination on the message id (index message_queue_id_idx):
    every page costs the same however deep the reader goes."""

    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= self.max_page_size:
            problem = f"A whole number from 1 to {self.max_page_size}."
            raise InvalidInput(
                f"page_size: {problem}", field_errors={self.page_size_query_param: [problem]}
            )
        return int(raw)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(
                    minimum=1, maximum=self.max_page_size, default=self.page_size
                )
        return parameters


class QueueMessagesView(ListAPIView[Message]):
    # The schema's model; get_queryset needs the queue from the URL.
    queryset = Message.objects.none()
    serializer_class = MessageListSerializer
    filterset_class = QueueMessageFilter
    pagination_class = NewestFirst

    def get_queryset(self) -> QuerySet[Message]:
        queue = queue_held(self.request, Role.VIEWER, self.kwargs["name"])
        return listed(Message.objects.filter(queue=queue))

    @extend_schema(
        request=PublishSerializer,
        responses={201: PublishResultSerializer, 400: ERROR, 404: ERROR, 409: ERROR, 413: ERROR},
        examples=PUBLISH_EXAMPLES,
        description=(
            "Publish one message (a message object) or a batch of up to 1000 "
            '(`{"messages": [...]}` or a JSON array), all or nothing.'
        ),
    )
    def post(self, request: Request, name: str) -> Response:
        request_access(request).check(Role.OPERATOR, name)
        serializer = PublishSerializer(data=as_batch(request.data))
        serializer.is_valid(raise_exception=True)
        ids = messages_publish(
            queue_name=name,
            messages=serializer.new_messages(),
            put_user=request.user.get_username(),
            put_application="api",
        )
        return Response({"count": len(ids), "ids": ids}, status=status.HTTP_201_CREATED)


class MessageDetailView(APIView):
    @extend_schema(responses={200: MessageSerializer, 404: ERROR})
    def get(self, request: Request, message_id: int) -> Response:
        return Response(MessageSerializer(message_held(request, Role.VIEWER, message_id)).data)
