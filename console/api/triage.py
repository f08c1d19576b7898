"""REST API for triage: the message browser and its actions, bulk jobs,
dead-letter queues, queue pause/resume/purge and the audit log. As in
``console.api.views``, each view parses input, calls one broker service or
selector, and renders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import NoActiveRules
from broker.models import AuditEvent, Message
from broker.selectors import (
    MessageFilter,
    active_rule_table,
    audit_events,
    bulk_job_get,
    dead_letter_groups,
    dead_letter_queue_get,
    filtered_messages,
    message_get,
    queue_summary,
)
from broker.services.archive import archive_search
from broker.services.bulk import bulk_job_submit
from broker.services.dead_letters import dead_letter_scan
from broker.services.queues import queue_get, queue_pause, queue_purge
from broker.services.transitions.blacklist import message_fail, message_purge, message_release
from broker.services.transitions.dead_lettered import (
    message_discard,
    message_forward,
    message_retry,
)
from broker.services.transitions.resubmit import message_resubmit
from console.api.schema import ERROR
from console.api.serializers import (
    ArchivePageSerializer,
    ArchiveQuerySerializer,
    AuditEventSerializer,
    AuditQuerySerializer,
    BulkJobSerializer,
    BulkRequestSerializer,
    ConfirmSerializer,
    DeadLetterQueueSerializer,
    ForwardSerializer,
    MessageListSerializer,
    MessageQuerySerializer,
    MessageSerializer,
    PurgeResultSerializer,
    QueueSummarySerializer,
    ReasonSerializer,
    ResubmitResultSerializer,
    ResubmitSerializer,
    ScanResultSerializer,
)
from console.api.views import NewestFirst, listed, queue_json

NO_CONTENT = OpenApiResponse(description="Done; nothing to return.")


def parsed(serializer_class: type[serializers.Serializer[Any]], data: Any) -> Any:
    """``serializer_class`` validated over ``data`` (400 with field errors)."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer


# --- messages -----------------------------------------------------------------


class MessageListView(ListAPIView[Message]):
    """Every queue's messages, newest first, in keyset pages, narrowed by the
    console browser's filters."""

    queryset = Message.objects.none()
    serializer_class = MessageListSerializer
    pagination_class = NewestFirst
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[Message]:
        query = parsed(MessageQuerySerializer, self.request.query_params)
        return listed(filtered_messages(query.message_filter()))

    @extend_schema(
        parameters=[MessageQuerySerializer], responses={200: MessageListSerializer, 400: ERROR}
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
        data = parsed(ForwardSerializer, request.data).validated_data
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
        data = parsed(ResubmitSerializer, request.data).validated_data
        original = message_get(message_id=message_id)
        queue = data.get("queue") or (
            (original.dead_letter or {}).get("original_queue") or original.queue.name
        )
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


# --- bulk jobs ----------------------------------------------------------------


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
        return Response(BulkJobSerializer(bulk_job_get(job_id=job_id)).data)


# --- queues -------------------------------------------------------------------


class QueuePauseView(APIView):
    """pause stops delivery from the queue (publishing goes on); resume
    restarts it."""

    paused = True

    @extend_schema(request=None, responses={200: QueueSummarySerializer, 404: ERROR})
    def post(self, request: Request, name: str) -> Response:
        queue = queue_pause(queue=queue_get(name=name), paused=self.paused, actor=request.user)
        return Response(queue_json(queue))


class QueuePurgeView(APIView):
    @extend_schema(
        request=ConfirmSerializer,
        responses={200: PurgeResultSerializer, 400: ERROR, 404: ERROR},
        description="Delete every waiting (TBDL) message of the queue. `confirm` must repeat "
        "the queue's name exactly, or nothing is deleted (400).",
    )
    def post(self, request: Request, name: str) -> Response:
        queue = queue_get(name=name)
        confirm = parsed(ConfirmSerializer, request.data).validated_data["confirm"]
        deleted = queue_purge(queue=queue, confirmation=confirm, actor=request.user)
        return Response({"deleted": deleted})


# --- dead-letter queues -------------------------------------------------------


class DeadLetterQueueView(APIView):
    @extend_schema(responses={200: DeadLetterQueueSerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        queue = dead_letter_queue_get(name=name)
        groups = dead_letter_groups(queue=queue)
        table = active_rule_table(queue=queue)
        return Response(
            DeadLetterQueueSerializer(
                {
                    "queue": queue_summary(queue=queue),
                    "active_rule_table": table.id if table else None,
                    "by_reason": [{"key": k, "count": n} for k, n in groups.by_reason],
                    "by_original_queue": [
                        {"key": k, "count": n} for k, n in groups.by_original_queue
                    ],
                }
            ).data
        )


class DeadLetterApplyView(APIView):
    @extend_schema(
        request=None,
        responses={200: ScanResultSerializer, 404: ERROR, 409: ERROR},
        description="Run one scan of the dead-letter queue under its active rules table now, "
        "as the handler would; 409 `no_active_rules` when it has none.",
    )
    def post(self, request: Request, name: str) -> Response:
        queue = dead_letter_queue_get(name=name)
        if active_rule_table(queue=queue) is None:
            raise NoActiveRules(f"{name} has no active rules table.")
        result = dead_letter_scan(queue=queue)
        return Response(ScanResultSerializer(result).data)


# --- audit --------------------------------------------------------------------


class AuditListView(ListAPIView[AuditEvent]):
    """The audit log, newest first, in keyset pages."""

    queryset = AuditEvent.objects.none()
    serializer_class = AuditEventSerializer
    pagination_class = NewestFirst
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[AuditEvent]:
        return audit_events(parsed(AuditQuerySerializer, self.request.query_params).audit_filter())

    @extend_schema(
        parameters=[AuditQuerySerializer], responses={200: AuditEventSerializer, 400: ERROR}
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


# --- the archive -------------------------------------------------------------------


class ArchiveSearchView(APIView):
    @extend_schema(
        parameters=[ArchiveQuerySerializer],
        responses={200: ArchivePageSerializer, 400: ERROR},
        description="A queue's archived messages published in [since, until), newest first, "
        "read from the Parquet archive (no database rows).",
    )
    def get(self, request: Request) -> Response:
        query = parsed(ArchiveQuerySerializer, request.query_params).validated_data
        size = query.pop("page_size")
        found = archive_search(**query, limit=size + 1)
        return Response(
            ArchivePageSerializer(
                {
                    "results": found[:size],
                    "next_before_id": found[size - 1].id if len(found) > size else None,
                }
            ).data
        )
