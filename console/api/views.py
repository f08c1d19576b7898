"""REST API v1. Each view parses input, calls one broker service or selector,
and renders; errors become JSON through ``console.api.errors``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC
from typing import Any

import django_filters
from django.db.models import F, Func, IntegerField, QuerySet
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.serializer_helpers import ReturnDict
from rest_framework.views import APIView

from broker.errors import InvalidInput
from broker.models import (
    Message,
    MessageState,
    Queue,
    ReplayJob,
    ReplayJobStatus,
    RuleTable,
    Subscription,
)
from broker.selectors import (
    message_get,
    queue_summaries,
    queue_summary,
    subscription_summaries,
    subscription_summary,
    topic_list,
)
from broker.services.publish import messages_publish, topic_publish
from broker.services.queues import queue_create, queue_delete, queue_get, queue_update
from broker.services.replay import (
    replay_job_cancel,
    replay_job_get,
    replay_job_run_again,
    replay_job_submit,
    replay_preview,
)
from broker.services.rule_tables import (
    rule_table_activate,
    rule_table_create,
    rule_table_create_and_activate,
    rule_table_dry_run,
    rule_table_get,
    rule_table_report,
    rule_table_rollback,
    rule_table_update,
)
from broker.services.topics import (
    subscription_create,
    subscription_delete,
    subscription_get,
    subscription_update,
    topic_create,
    topic_delete,
    topic_get,
)
from console.api.schema import ERROR
from console.api.serializers import (
    MessageListSerializer,
    MessageSerializer,
    PublishResultSerializer,
    PublishSerializer,
    QueueSerializer,
    QueueSummarySerializer,
    ReplayJobSerializer,
    ReplayPreviewSerializer,
    ReplaySpecSerializer,
    RollbackSerializer,
    RuleTableQuerySerializer,
    RuleTableSerializer,
    RuleTableTextSerializer,
    SubscriptionSerializer,
    SubscriptionSummarySerializer,
    TopicPublishResultSerializer,
    TopicPublishSerializer,
    TopicSerializer,
)
from console.roles import Role

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
        topic_string = data.get("topic_string", "")
        message = {key: value for key, value in data.items() if key != "topic_string"}
        return {"messages": [message], "topic_string": topic_string}
    return data


def queue_json(queue: Queue) -> ReturnDict[str, Any]:
    return QueueSummarySerializer(queue_summary(queue=queue)).data


class QueueListView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses=QueueSummarySerializer(many=True))
    def get(self, request: Request) -> Response:
        summaries = queue_summaries()
        # many=True builds a ListSerializer, which takes the list.
        return Response(QueueSummarySerializer(summaries, many=True).data)  # type: ignore[arg-type]

    @extend_schema(request=QueueSerializer, responses={201: QueueSummarySerializer, 400: ERROR})
    def post(self, request: Request) -> Response:
        serializer = QueueSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        queue = queue_create(actor=request.user, **serializer.validated_data)
        return Response(queue_json(queue), status=status.HTTP_201_CREATED)


class QueueDetailView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses={200: QueueSummarySerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        return Response(queue_json(queue_get(name=name)))

    @extend_schema(request=QueueSerializer, responses={200: QueueSummarySerializer, 400: ERROR})
    def put(self, request: Request, name: str) -> Response:
        return self._update(request, name, partial=False)

    @extend_schema(request=QueueSerializer, responses={200: QueueSummarySerializer, 400: ERROR})
    def patch(self, request: Request, name: str) -> Response:
        return self._update(request, name, partial=True)

    def _update(self, request: Request, name: str, *, partial: bool) -> Response:
        queue = queue_get(name=name)
        serializer = QueueSerializer(queue, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        return Response(
            queue_json(queue_update(queue=queue, actor=request.user, **serializer.validated_data))
        )

    @extend_schema(responses={204: None, 404: ERROR, 409: ERROR})
    def delete(self, request: Request, name: str) -> Response:
        queue_delete(queue=queue_get(name=name), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time, compared in UTC: Python takes offsets up to ±23:59,
    PostgreSQL only to ±15:59."""

    def filter(self, qs: QuerySet[Any], value: Any) -> QuerySet[Any]:
        return super().filter(qs, value.astimezone(UTC) if value else value)


class MessageFilter(django_filters.FilterSet):
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
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            problem = f"A whole number from 1 to {self.max_page_size}."
            raise InvalidInput(
                f"page_size: {problem}", field_errors={self.page_size_query_param: [problem]}
            )
        return int(raw)


class QueueMessagesView(ListAPIView[Message]):
    # The schema's model; get_queryset needs the queue from the URL.
    queryset = Message.objects.none()
    serializer_class = MessageListSerializer
    filterset_class = MessageFilter
    pagination_class = NewestFirst

    def get_queryset(self) -> QuerySet[Message]:
        return listed(Message.objects.filter(queue=queue_get(name=self.kwargs["name"])))

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
        return Response(MessageSerializer(message_get(message_id=message_id)).data)


class TopicListView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses=TopicSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(TopicSerializer(topic_list(), many=True).data)

    @extend_schema(request=TopicSerializer, responses={201: TopicSerializer, 400: ERROR})
    def post(self, request: Request) -> Response:
        serializer = TopicSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        topic = topic_create(actor=request.user, **serializer.validated_data)
        return Response(TopicSerializer(topic).data, status=status.HTTP_201_CREATED)


class TopicDetailView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses={200: TopicSerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        return Response(TopicSerializer(topic_get(name=name)).data)

    @extend_schema(responses={204: None, 404: ERROR, 409: ERROR})
    def delete(self, request: Request, name: str) -> Response:
        topic_delete(topic=topic_get(name=name), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TopicPublishView(APIView):
    @extend_schema(
        request=TopicPublishSerializer,
        responses={201: TopicPublishResultSerializer, 400: ERROR, 404: ERROR, 409: ERROR},
        examples=[
            OpenApiExample(
                "On a topic string below the topic",
                value={"topic_string": "orders/eu/paid", "payload": '{"order": 1017}'},
                request_only=True,
            )
        ],
        description=(
            "Publish on the topic (or on `topic_string` below it): one copy per matching "
            "subscription, all or nothing. A full reject_new subscription refuses the whole "
            "publish with 409 `max_messages_reached`."
        ),
    )
    def post(self, request: Request, name: str) -> Response:
        serializer = TopicPublishSerializer(data=as_batch(request.data))
        serializer.is_valid(raise_exception=True)
        deliveries = topic_publish(
            topic_name=name,
            topic_string=serializer.validated_data.get("topic_string", ""),
            messages=serializer.new_messages(),
            put_user=request.user.get_username(),
            put_application="api",
        )
        return Response(
            {
                "count": len(serializer.validated_data["messages"]),
                "deliveries": [asdict(d) for d in deliveries],
            },
            status=status.HTTP_201_CREATED,
        )


def subscription_json(subscription: Subscription) -> ReturnDict[str, Any]:
    return SubscriptionSummarySerializer(subscription_summary(subscription=subscription)).data


class SubscriptionListView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses=SubscriptionSummarySerializer(many=True))
    def get(self, request: Request) -> Response:
        summaries = subscription_summaries()
        # many=True builds a ListSerializer, which takes the list.
        return Response(SubscriptionSummarySerializer(summaries, many=True).data)  # type: ignore[arg-type]

    @extend_schema(
        request=SubscriptionSerializer, responses={201: SubscriptionSummarySerializer, 400: ERROR}
    )
    def post(self, request: Request) -> Response:
        serializer = SubscriptionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        subscription = subscription_create(
            actor=request.user, queue_name=data.pop("queue")["name"], **data
        )
        return Response(subscription_json(subscription), status=status.HTTP_201_CREATED)


class SubscriptionDetailView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses={200: SubscriptionSummarySerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        return Response(subscription_json(subscription_get(name=name)))

    @extend_schema(
        request=SubscriptionSerializer, responses={200: SubscriptionSummarySerializer, 400: ERROR}
    )
    def patch(self, request: Request, name: str) -> Response:
        subscription = subscription_get(name=name)
        serializer = SubscriptionSerializer(subscription, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        fixed = {
            "name": subscription.name,
            "topic": subscription.topic,
            "queue": {"name": subscription.queue.name},
        }
        moved = [
            key for key, value in fixed.items() if key in changes and changes.pop(key) != value
        ]
        if moved:
            raise InvalidInput(
                "A subscription keeps its name, topic and queue.",
                field_errors={key: ["Cannot be changed."] for key in moved},
            )
        return Response(
            subscription_json(
                subscription_update(subscription=subscription, actor=request.user, **changes)
            )
        )

    @extend_schema(responses={204: None, 404: ERROR})
    def delete(self, request: Request, name: str) -> Response:
        subscription_delete(subscription=subscription_get(name=name), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RuleTableListView(ListAPIView[RuleTable]):
    """Versions of dead-letter rules tables, newest first; `?queue=NAME`."""

    write_role = Role.ADMIN
    serializer_class = RuleTableSerializer

    def get_queryset(self) -> QuerySet[RuleTable]:
        tables = RuleTable.objects.select_related("queue", "created_by").order_by(
            "queue", "-version"
        )
        query = RuleTableQuerySerializer(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        queue = query.validated_data.get("queue")
        return tables.filter(queue__name=queue) if queue else tables

    @extend_schema(parameters=[RuleTableQuerySerializer])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=RuleTableSerializer,
        responses={201: RuleTableSerializer, 400: ERROR, 409: ERROR},
        description=(
            "A new draft version of a dead-letter queue's rules table; with "
            '`"activate": true`, the new version is active at once, or nothing is stored.'
        ),
    )
    def post(self, request: Request) -> Response:
        serializer = RuleTableSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        create = rule_table_create_and_activate if data.pop("activate") else rule_table_create
        table = create(queue=data["queue"], text=data["text"], actor=request.user)
        return Response(RuleTableSerializer(table).data, status=status.HTTP_201_CREATED)


class RuleTableDetailView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses={200: RuleTableSerializer, 404: ERROR})
    def get(self, request: Request, table_id: int) -> Response:
        return Response(RuleTableSerializer(rule_table_get(table_id=table_id)).data)

    @extend_schema(
        request=RuleTableTextSerializer, responses={200: RuleTableSerializer, 409: ERROR}
    )
    def patch(self, request: Request, table_id: int) -> Response:
        serializer = RuleTableTextSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        table = rule_table_update(
            table=rule_table_get(table_id=table_id),
            text=serializer.validated_data["text"],
            actor=request.user,
        )
        return Response(RuleTableSerializer(table).data)


class RuleTableActionView(APIView):
    """validate and dry-run read (viewer); activate changes (admin)."""

    operation = ""

    def get_permissions(self) -> Sequence[Any]:
        self.write_role = Role.ADMIN if self.operation == "activate" else Role.VIEWER
        return super().get_permissions()

    @extend_schema(request=None, responses={200: RuleTableSerializer, 404: ERROR, 409: ERROR})
    def post(self, request: Request, table_id: int) -> Response:
        table = rule_table_get(table_id=table_id)
        if self.operation == "validate":
            return Response(rule_table_report(text=table.text, queue=table.queue))
        if self.operation == "dry-run":
            return Response(rule_table_dry_run(table=table))
        table = rule_table_activate(table=table, actor=request.user)
        return Response(RuleTableSerializer(table).data)


class RuleTableRollbackView(APIView):
    write_role = Role.ADMIN

    @extend_schema(request=RollbackSerializer, responses={200: RuleTableSerializer, 409: ERROR})
    def post(self, request: Request) -> Response:
        serializer = RollbackSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        table = rule_table_rollback(queue=serializer.validated_data["queue"], actor=request.user)
        return Response(RuleTableSerializer(table).data)


class ReplayJobFilter(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=ReplayJobStatus.choices)

    class Meta:
        model = ReplayJob
        fields = ["status"]


REPLAY_SPEC_ERRORS = (
    "Field errors name the field: `source`, `source_queue`, `target_queue`, `rules_text` "
    '("line N, column C: ..."), `velocity`, `dry_run`, and the filter\'s parts by their own '
    "names (`queues`, `reason`, `since`, `until`, `header`, `payload_text`). Unknown keys are "
    "refused."
)


class ReplayJobListView(ListAPIView[ReplayJob]):
    """Replay jobs, newest first, in keyset pages; `?status=` (repeatable)."""

    queryset = ReplayJob.objects.select_related("created_by")
    serializer_class = ReplayJobSerializer
    filterset_class = ReplayJobFilter
    pagination_class = NewestFirst

    @extend_schema(
        request=ReplaySpecSerializer,
        responses={201: ReplayJobSerializer, 400: ERROR, 403: ERROR},
        description="Submit a replay job (operator). It is checked whole: anything wrong is "
        "400 with an error per field and nothing is stored. A worker runs it on Spark. "
        + REPLAY_SPEC_ERRORS,
    )
    def post(self, request: Request) -> Response:
        serializer = ReplaySpecSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        job = replay_job_submit(spec=serializer.spec(), actor=request.user)
        return Response(ReplayJobSerializer(job).data, status=status.HTTP_201_CREATED)


class ReplayPreviewView(APIView):
    @extend_schema(
        request=ReplaySpecSerializer,
        responses={200: ReplayPreviewSerializer, 400: ERROR, 403: ERROR},
        description="How many messages a replay job would read (its filter, before any "
        "rules), checked as a submission is; nothing is stored. " + REPLAY_SPEC_ERRORS,
    )
    def post(self, request: Request) -> Response:
        serializer = ReplaySpecSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response({"count": replay_preview(serializer.spec())})


class ReplayJobDetailView(APIView):
    @extend_schema(responses={200: ReplayJobSerializer, 404: ERROR})
    def get(self, request: Request, job_id: int) -> Response:
        return Response(ReplayJobSerializer(replay_job_get(job_id=job_id)).data)


class ReplayJobActionView(APIView):
    """cancel: stop a queued or running job. run: queue a finished, failed or
    cancelled job again; it writes only what earlier runs did not."""

    operation = ""

    @extend_schema(request=None, responses={200: ReplayJobSerializer, 404: ERROR, 409: ERROR})
    def post(self, request: Request, job_id: int) -> Response:
        act = replay_job_cancel if self.operation == "cancel" else replay_job_run_again
        return Response(ReplayJobSerializer(act(job_id=job_id, actor=request.user)).data)
