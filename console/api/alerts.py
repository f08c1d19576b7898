"""REST API for the alert episodes (broker.services.alerts)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from broker.models import QUEUE_NAME_MAX_LENGTH, AlertCondition, QueueAlert, queue_name_validator
from broker.selectors import AlertFilter, alert_episodes
from console.access import request_access
from console.api.fields import BodyModelSerializer, QuerySerializer, parsed
from console.api.messages import NewestFirst
from console.api.schema import ERROR
from console.roles import Role


class AlertQuerySerializer(QuerySerializer[AlertFilter]):
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, required=False, validators=[queue_name_validator]
    )
    condition = serializers.ChoiceField(choices=AlertCondition.choices, required=False)
    open = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="true: the episodes open now; false: the ended ones; absent: both.",
    )

    def alert_filter(self) -> AlertFilter:
        return AlertFilter(**self.validated_data)


class AlertSerializer(BodyModelSerializer[QueueAlert]):
    queue = serializers.CharField(source="queue.name", read_only=True)

    class Meta:
        model = QueueAlert
        fields = [
            "id",
            "queue",
            "condition",
            "threshold",
            "value",
            "peak",
            "end_value",
            "started_at",
            "ended_at",
            "notification",
            "notify_attempts",
            "notify_error",
            "notified_at",
        ]
        read_only_fields = fields


class AlertListView(ListAPIView[QueueAlert]):
    """Alert episodes, newest first, in keyset pages."""

    queryset = QueueAlert.objects.none()
    serializer_class = AlertSerializer
    pagination_class = NewestFirst
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[QueueAlert]:
        filters = parsed(AlertQuerySerializer, self.request.query_params).alert_filter()
        within = request_access(self.request).queues(Role.VIEWER, field="queue__name")
        return alert_episodes(filters, within=within)

    @extend_schema(parameters=[AlertQuerySerializer], responses={200: AlertSerializer, 400: ERROR})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)
