"""REST API for a dead-letter queue's rules tables: versions, checks, activation and rollback."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.models import QUEUE_NAME_MAX_LENGTH, Queue, RuleTable, queue_name_validator
from broker.selectors import dead_letter_queue_list
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
from console.api.fields import NameRelatedField
from console.api.schema import ERROR
from console.roles import Role


class RuleTableSerializer(serializers.ModelSerializer[RuleTable]):
    queue = NameRelatedField(slug_field="name", queryset=dead_letter_queue_list())
    text = serializers.CharField(trim_whitespace=False, help_text="The table in runmqdlq syntax.")
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)
    validation = serializers.SerializerMethodField(
        help_text='`{"valid", "control", "rules", "errors": [{"line", "column", "message"}], '
        '"warnings": [{"line", "column", "message"}]}`; warnings do not make a table invalid.'
    )
    activate = serializers.BooleanField(
        write_only=True,
        default=False,
        help_text="Activate the new version at once. A table with errors is then refused "
        "(409 `rules_invalid`, with `errors`) and nothing is stored.",
    )

    class Meta:
        model = RuleTable
        fields = [
            "id",
            "queue",
            "version",
            "status",
            "text",
            "validation",
            "created_by",
            "created_at",
            "activated_at",
            "activate",
        ]
        read_only_fields = ["id", "version", "status", "created_at", "activated_at"]

    def get_validation(self, table: RuleTable) -> dict[str, Any]:
        return rule_table_report(text=table.text, queue=table.queue)


class RuleTableQuerySerializer(serializers.Serializer[dict[str, str]]):
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH,
        required=False,
        validators=[queue_name_validator],
        help_text="Only this dead-letter queue's versions.",
    )


class RuleTableTextSerializer(serializers.Serializer[dict[str, str]]):
    text = serializers.CharField(trim_whitespace=False)


class RollbackSerializer(serializers.Serializer[dict[str, Queue]]):
    queue = NameRelatedField(slug_field="name", queryset=dead_letter_queue_list())


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
