"""REST API for dead-letter queues: their reasons, their waiting messages
(and the replay schedules that gave up on each), and a run of the handler."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import NoActiveRules
from broker.models import SCAN_COUNTS, Message, MessageState, ReplaySchedule
from broker.pipeline.schedules import given_up_by, schedules_reading
from broker.selectors import (
    active_rule_table,
    dead_letter_groups,
    dead_letter_queue_get,
    queue_summary,
)
from broker.services.dead_letters import dead_letter_scan
from console.access import request_access
from console.api.fields import BodySerializer
from console.api.messages import MessageListSerializer, NewestFirst, listed
from console.api.queues import QueueSummarySerializer
from console.api.schema import ERROR
from console.roles import Role


class GroupCountSerializer(BodySerializer[tuple[str, int]]):
    key = serializers.CharField()
    count = serializers.IntegerField()


class DeadLetterQueueSerializer(BodySerializer[dict[str, Any]]):
    queue = QueueSummarySerializer()
    active_rule_table = serializers.IntegerField(
        allow_null=True, help_text="The id of the active rules table version, if any."
    )
    by_reason = GroupCountSerializer(many=True)
    by_original_queue = GroupCountSerializer(many=True)


# What a scan did: an integer per count of ScanResult, in its order.
ScanResultSerializer = type(
    "ScanResultSerializer",
    (serializers.Serializer,),
    {name: serializers.IntegerField() for name in SCAN_COUNTS},
)


class DeadLetterQueueView(APIView):
    @extend_schema(responses={200: DeadLetterQueueSerializer, 404: ERROR})
    def get(self, request: Request, name: str) -> Response:
        request_access(request).check(Role.VIEWER, name)
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
        request_access(request).check(Role.OPERATOR, name)
        queue = dead_letter_queue_get(name=name)
        if active_rule_table(queue=queue) is None:
            raise NoActiveRules(f"{name} has no active rules table.")
        result = dead_letter_scan(queue=queue)
        return Response(ScanResultSerializer(result).data)


class DeadLetterMessageSerializer(MessageListSerializer):
    """A waiting message of a dead-letter queue, with its dead-letter
    header and the replay schedules that no longer take it."""

    generation = serializers.IntegerField(
        read_only=True, help_text="Replays between it and its first publish: 0 for a publish."
    )
    given_up_by = serializers.SerializerMethodField(
        help_text="The replay schedules reading this queue whose filter takes the message and "
        "that give up on it (its generation reached their give_up_after): they replay it no more."
    )

    class Meta(MessageListSerializer.Meta):
        fields = [*MessageListSerializer.Meta.fields, "dead_letter", "generation", "given_up_by"]
        read_only_fields = fields

    def get_given_up_by(self, message: Message) -> list[str]:
        return [schedule.name for schedule in given_up_by(self.context["schedules"], message)]


class DeadLetterMessagesView(ListAPIView[Message]):
    """A dead-letter queue's waiting (TBDL) messages, newest first, in
    keyset pages, as the console's dead-letter page lists them."""

    # The schema's model; get_queryset needs the queue from the URL.
    queryset = Message.objects.none()
    serializer_class = DeadLetterMessageSerializer
    pagination_class = NewestFirst
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[Message]:
        request_access(self.request).check(Role.VIEWER, self.kwargs["name"])
        queue = dead_letter_queue_get(name=self.kwargs["name"])
        return listed(Message.objects.filter(queue=queue, state=MessageState.TO_BE_DELIVERED))

    def get_serializer_context(self) -> dict[str, Any]:
        # The schedules reading the queue, read once for the whole page.
        return {**super().get_serializer_context(), "schedules": self._schedules()}

    def _schedules(self) -> list[ReplaySchedule]:
        if getattr(self, "swagger_fake_view", False):  # the schema's generation
            return []
        return schedules_reading(self.kwargs["name"])

    @extend_schema(responses={200: DeadLetterMessageSerializer(many=True), 404: ERROR})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)
