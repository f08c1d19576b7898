"""REST API for the audit log."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from broker.models import QUEUE_NAME_MAX_LENGTH, AuditEvent, queue_name_validator
from broker.selectors import AuditFilter, audit_events
from console.access import audit_within, request_access
from console.api.fields import BodyModelSerializer, QuerySerializer, parsed
from console.api.messages import NewestFirst
from console.api.schema import ERROR


class AuditQuerySerializer(QuerySerializer[AuditFilter]):
    actor = serializers.CharField(max_length=150, required=False)
    action = serializers.CharField(max_length=64, required=False)
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH, required=False, validators=[queue_name_validator]
    )
    message_id = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)

    def audit_filter(self) -> AuditFilter:
        return AuditFilter(**self.validated_data)


class AuditEventSerializer(BodyModelSerializer[AuditEvent]):
    actor = serializers.CharField(source="actor_name", read_only=True)
    queue = serializers.CharField(source="queue_name", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor", "action", "queue", "message_id", "reason", "details"]
        read_only_fields = fields


class AuditListView(ListAPIView[AuditEvent]):
    """The audit log, newest first, in keyset pages."""

    queryset = AuditEvent.objects.none()
    serializer_class = AuditEventSerializer
    pagination_class = NewestFirst
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[AuditEvent]:
        filters = parsed(AuditQuerySerializer, self.request.query_params).audit_filter()
        return audit_events(filters, within=audit_within(request_access(self.request)))

    @extend_schema(
        parameters=[AuditQuerySerializer], responses={200: AuditEventSerializer, 400: ERROR}
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)
