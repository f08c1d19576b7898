"""REST API v1. Each view parses input, calls one broker service or selector,
and renders; errors become JSON through ``console.api.errors``."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import F, Func, IntegerField, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.models import Message, MessageState, Queue
from broker.selectors import message_get, queue_depths
from broker.services.publish import messages_publish
from broker.services.queues import queue_create, queue_delete, queue_get, queue_update
from console.api.serializers import (
    MessageListSerializer,
    MessageSerializer,
    PublishResultSerializer,
    PublishSerializer,
    QueueSerializer,
)
from console.roles import Role

ERROR = OpenApiResponse(description='Error: `{"code", "detail", "field_errors"?}`')


class QueueListView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses=QueueSerializer(many=True))
    def get(self, request: Request) -> Response:
        queues = list(Queue.objects.select_related("dead_letter_queue").order_by("name"))
        depths = queue_depths(queue_ids=[queue.id for queue in queues])
        return Response(QueueSerializer(queues, many=True, context={"depths": depths}).data)

    @extend_schema(request=QueueSerializer, responses={201: QueueSerializer, 400: ERROR})
    def post(self, request: Request) -> Response:
        serializer = QueueSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        queue = queue_create(actor=request.user, **serializer.validated_data)
        return Response(QueueSerializer(queue).data, status=status.HTTP_201_CREATED)


class QueueDetailView(APIView):
    write_role = Role.ADMIN

    def _render(self, queue: Queue) -> Response:
        return Response(
            QueueSerializer(queue, context={"depths": queue_depths(queue_ids=[queue.id])}).data
        )

    @extend_schema(responses={200: QueueSerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        return self._render(queue_get(name=name))

    @extend_schema(request=QueueSerializer, responses={200: QueueSerializer, 400: ERROR})
    def put(self, request: Request, name: str) -> Response:
        return self._update(request, name, partial=False)

    @extend_schema(request=QueueSerializer, responses={200: QueueSerializer, 400: ERROR})
    def patch(self, request: Request, name: str) -> Response:
        return self._update(request, name, partial=True)

    def _update(self, request: Request, name: str, *, partial: bool) -> Response:
        queue = queue_get(name=name)
        serializer = QueueSerializer(queue, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        return self._render(
            queue_update(queue=queue, actor=request.user, **serializer.validated_data)
        )

    @extend_schema(responses={204: None, 404: ERROR, 409: ERROR})
    def delete(self, request: Request, name: str) -> Response:
        queue_delete(queue=queue_get(name=name), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MessageFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=MessageState.choices)
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Message
        fields = ["state", "created_after", "created_before"]


class NewestFirst(CursorPagination):
    """Keyset pagination on the message id (index message_queue_id_idx):
    every page costs the same however deep the reader goes."""

    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000


class QueueMessagesView(ListAPIView[Message]):
    serializer_class = MessageListSerializer
    filterset_class = MessageFilter
    pagination_class = NewestFirst

    def get_queryset(self) -> QuerySet[Message]:
        queue = queue_get(name=self.kwargs["name"])
        return (
            Message.objects.filter(queue=queue)
            .select_related("queue")
            .defer("payload")
            .annotate(
                payload_bytes=Func(
                    F("payload"), function="octet_length", output_field=IntegerField()
                )
            )
        )

    @extend_schema(
        request=PublishSerializer,
        responses={201: PublishResultSerializer, 400: ERROR, 404: ERROR, 409: ERROR, 413: ERROR},
        description=(
            "Publish one message (a message object) or a batch of up to 1000 "
            '(`{"messages": [...]}` or a JSON array), all or nothing.'
        ),
    )
    def post(self, request: Request, name: str) -> Response:
        data: Any = request.data
        if isinstance(data, list):
            data = {"messages": data}
        elif isinstance(data, dict) and "messages" not in data:
            data = {"messages": [data]}
        serializer = PublishSerializer(data=data)
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
        return Response(MessageSerializer(message_get(message_id=message_id)).data)
