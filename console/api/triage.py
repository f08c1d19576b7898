"""REST API for triage: the message browser across queues, one message's actions, and bulk jobs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import Cursor
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.models import (
    QUEUE_NAME_MAX_LENGTH,
    BulkJob,
    Message,
    MessageState,
    queue_name_validator,
)
from broker.rules import LAZARETTO_REASONS
from broker.selectors import (
    SEARCH_SPAN,
    MessageFilter,
    SearchedIds,
    filtered_messages,
    search_span,
)
from broker.services.bulk import MAX_SELECTED, bulk_job_submit
from broker.services.transitions.blacklist import (
    TRIAGE_ACTIONS,
    message_fail,
    message_purge,
    message_release,
)
from broker.services.transitions.dead_lettered import (
    message_discard,
    message_forward,
    message_retry,
)
from broker.services.transitions.resubmit import message_resubmit
from console.access import (
    check_bulk,
    job_held,
    message_held,
    messages_within,
    request_access,
)
from console.api.fields import (
    NO_CONTENT,
    BodyModelSerializer,
    BodySerializer,
    QuerySerializer,
    parsed,
)
from console.api.messages import MessageListSerializer, MessageSerializer, NewestFirst, listed
from console.api.queues import MessageInSerializer, payload_shapes
from console.api.schema import ERROR, one_of
from console.roles import Role

REASON_CHOICES = sorted(LAZARETTO_REASONS)


class MessageQuerySerializer(QuerySerializer[MessageFilter]):
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
        r"\A[^=\x00]+=[^\x00]*\Z",
        max_length=200,
        required=False,
        help_text="`name=value`: messages whose headers hold that pair.",
        error_messages={"invalid": "Write it as name=value."},
    )
    text = serializers.CharField(
        max_length=200, required=False, trim_whitespace=False, help_text="Payload contains."
    )

    def message_filter(self) -> MessageFilter:
        return MessageFilter(**self.validated_data)


class ReasonSerializer(BodySerializer[dict[str, str]]):
    reason = serializers.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        default="",
        help_text="Why, for the audit log.",
    )


class ForwardSerializer(ReasonSerializer):
    queue = serializers.CharField(max_length=QUEUE_NAME_MAX_LENGTH, help_text="The target queue.")
    keep_header = serializers.BooleanField(
        default=True, help_text="Keep the dead-letter header on the forwarded message."
    )


@one_of(*payload_shapes("Resubmit"))
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


class ResubmitResultSerializer(BodySerializer[dict[str, int]]):
    id = serializers.IntegerField(help_text="The new message's id.")


@one_of(
    ("BulkByIdsRequest", {"required": ["ids"], "properties": {"filter": None}}),
    ("BulkByFilterRequest", {"required": ["filter"], "properties": {"ids": None}}),
)
class BulkRequestSerializer(BodySerializer[dict[str, Any]]):
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
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError(
                {"non_field_errors": ["Give either ids or filter, not both or neither."]}
            )
        return attrs


class BulkJobSerializer(BodyModelSerializer[BulkJob]):
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, default=None, allow_null=True
    )
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


SEARCHED_SCHEMA = {
    "type": ["object", "null"],
    "required": ["from_id", "to_id"],
    "properties": {
        "from_id": {"type": "integer", "description": "The lowest id this page searched."},
        "to_id": {"type": "integer", "description": "The highest id this page searched."},
    },
    "description": (
        f"For a header or text search, the ids this page read (at most {SEARCH_SPAN:,}, "
        "newest first); `next` searches below them. null for the other filters."
    ),
}


class SearchedNewestFirst(NewestFirst):
    """NewestFirst; a header or payload-text search, which no index serves,
    reads at most SEARCH_SPAN ids below its cursor a page
    (broker.selectors.search_span). The answer's ``searched`` says which ids;
    when they held less than a page, ``next`` searches the ids below them.
    A search's pages go one way: no ``previous``."""

    span: SearchedIds | None = None

    def paginate_queryset(
        self, queryset: QuerySet[Any], request: Request, view: Any = None
    ) -> list[Any] | None:
        cursor = self.decode_cursor(request)
        before = int(cursor.position) if cursor and cursor.position is not None else None
        self.span = search_span(filters=view.message_filter, before=before)
        if self.span is not None:
            queryset = queryset.filter(id__gte=self.span.low, id__lt=self.span.high)
        return super().paginate_queryset(queryset, request, view)

    def get_next_link(self) -> str | None:
        link: str | None = super().get_next_link()
        if link is None and self.span is not None and self.span.low > 1:
            cursor = Cursor(offset=0, reverse=False, position=self.span.low)
            return str(self.encode_cursor(cursor))
        return link

    def get_previous_link(self) -> str | None:
        return None if self.span is not None else super().get_previous_link()

    def get_paginated_response(self, data: Any) -> Response:
        response = super().get_paginated_response(data)
        response.data["searched"] = (
            None if self.span is None else {"from_id": self.span.low, "to_id": self.span.high - 1}
        )
        return response

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        paginated: dict[str, Any] = super().get_paginated_response_schema(schema)
        paginated["properties"]["searched"] = SEARCHED_SCHEMA
        paginated["required"] = [*paginated["required"], "searched"]
        return paginated


class SearchedMessageListSerializer(MessageListSerializer):
    """One message of the list across queues, whose pages say which ids a
    search read (a queue's own list has no search)."""


class MessageListView(ListAPIView[Message]):
    """Every queue's messages, newest first, in keyset pages, narrowed by the
    console browser's filters. A header or text search reads a span of ids
    a page (SearchedNewestFirst)."""

    queryset = Message.objects.none()
    serializer_class = SearchedMessageListSerializer
    pagination_class = SearchedNewestFirst
    filter_backends: list[Any] = []
    message_filter = MessageFilter()

    def get_queryset(self) -> QuerySet[Message]:
        query = parsed(MessageQuerySerializer, self.request.query_params)
        self.message_filter = query.message_filter()
        access = request_access(self.request)
        if self.message_filter.queue:
            access.check(Role.VIEWER, self.message_filter.queue)
        messages = filtered_messages(self.message_filter)
        within = messages_within(access.queues(Role.VIEWER))
        return listed(messages if within is None else messages.filter(within))

    @extend_schema(
        parameters=[MessageQuerySerializer],
        responses={200: SearchedMessageListSerializer, 400: ERROR},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


TRIAGE_ONE: dict[str, Callable[..., Message]] = {
    "release": message_release,
    "fail": message_fail,
    "retry": message_retry,
}


DELETE_ONE: dict[str, Callable[..., None]] = {"purge": message_purge, "discard": message_discard}


class MessageActionView(APIView):
    """release and fail act on a blacklisted (NDLV) message; retry sends a
    dead-lettered message back to the queue its header names; purge deletes a
    blacklisted message and discard a dead-lettered one. A message in any
    other state is refused with 409 `illegal_transition`."""

    operation = ""

    @extend_schema(
        request=ReasonSerializer,
        responses={200: MessageSerializer, 204: NO_CONTENT, 404: ERROR, 409: ERROR},
    )
    def post(self, request: Request, message_id: int) -> Response:
        message_held(request, Role.OPERATOR, message_id)
        reason = parsed(ReasonSerializer, request.data).validated_data["reason"]
        if self.operation in DELETE_ONE:
            DELETE_ONE[self.operation](message_id=message_id, actor=request.user, reason=reason)
            return Response(status=status.HTTP_204_NO_CONTENT)
        message = TRIAGE_ONE[self.operation](
            message_id=message_id, actor=request.user, reason=reason
        )
        return Response(MessageSerializer(message).data)


class MessageForwardView(APIView):
    @extend_schema(
        request=ForwardSerializer, responses={200: MessageSerializer, 404: ERROR, 409: ERROR}
    )
    def post(self, request: Request, message_id: int) -> Response:
        message_held(request, Role.OPERATOR, message_id)
        data = parsed(ForwardSerializer, request.data).validated_data
        request_access(request).check(Role.OPERATOR, data["queue"])
        message = message_forward(
            message_id=message_id,
            queue_name=data["queue"],
            keep_header=data["keep_header"],
            actor=request.user,
            reason=data["reason"],
        )
        return Response(MessageSerializer(message).data)


class MessageResubmitView(APIView):
    """Publish a corrected copy of a blacklisted or dead-lettered message as a
    new message; the original stays as it is."""

    @extend_schema(
        request=ResubmitSerializer,
        responses={201: ResubmitResultSerializer, 400: ERROR, 404: ERROR, 409: ERROR},
    )
    def post(self, request: Request, message_id: int) -> Response:
        original = message_held(request, Role.OPERATOR, message_id)
        data = parsed(ResubmitSerializer, request.data).validated_data
        queue = data.get("queue") or (
            (original.dead_letter or {}).get("original_queue") or original.queue.name
        )
        request_access(request).check(Role.OPERATOR, queue)
        copy_id = message_resubmit(
            message_id=message_id,
            queue_name=queue,
            payload=data["payload"],
            content_type=data["content_type"],
            headers=data["headers"],
            priority=data["priority"],
            actor=request.user,
        )
        return Response({"id": copy_id}, status=status.HTTP_201_CREATED)


class BulkJobCreateView(APIView):
    @extend_schema(
        request=BulkRequestSerializer,
        responses={202: BulkJobSerializer, 400: ERROR},
        description="Release, fail or purge many blacklisted messages in the background: "
        "the ones listed in `ids`, or every one `filter` selects. Answers 202 with the job; "
        "`GET /api/v1/jobs/{id}/` reports its progress.",
    )
    def post(self, request: Request) -> Response:
        data = parsed(BulkRequestSerializer, request.data).validated_data
        query = data.get("filter")
        check_bulk(request_access(request), data.get("ids"), query)
        job = bulk_job_submit(
            action=data["action"],
            actor=request.user,
            message_ids=data.get("ids"),
            filters=None if query is None else MessageFilter(**query),
            reason=data["reason"],
        )
        url = reverse("api-job", kwargs={"job_id": job.id})
        return Response(
            BulkJobSerializer(job).data, status=status.HTTP_202_ACCEPTED, headers={"Location": url}
        )


class JobDetailView(APIView):
    @extend_schema(responses={200: BulkJobSerializer, 404: ERROR})
    def get(self, request: Request, job_id: int) -> Response:
        return Response(BulkJobSerializer(job_held(request, job_id)).data)
