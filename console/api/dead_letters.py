"""REST API for dead-letter queues: their reasons and a run of the handler."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import NoActiveRules
from broker.models import SCAN_COUNTS
from broker.selectors import (
    active_rule_table,
    dead_letter_groups,
    dead_letter_queue_get,
    queue_summary,
)
from broker.services.dead_letters import dead_letter_scan
from console.api.fields import BodySerializer
from console.api.queues import QueueSummarySerializer
from console.api.schema import ERROR


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
