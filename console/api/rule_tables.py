"""REST API for a dead-letter queue's rules tables: versions, checks, activation and rollback."""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.errors import QueueNotFound
from broker.models import QUEUE_NAME_MAX_LENGTH, Queue, RuleTable, queue_name_validator
from broker.selectors import dead_letter_queue_list
from broker.services.rule_tables import (
    MAX_TEXT,
    rule_table_activate,
    rule_table_create,
    rule_table_create_and_activate,
    rule_table_dry_run,
    rule_table_report,
    rule_table_rollback,
    rule_table_update,
)
from console.access import check_targets, request_access, rule_table_held
from console.api.fields import (
    NOT_BLANK,
    BodyModelSerializer,
    BodySerializer,
    NameRelatedField,
    QuerySerializer,
)
from console.api.schema import ERROR
from console.roles import Role


class ProblemSerializer(serializers.Serializer[dict[str, Any]]):
    line = serializers.IntegerField()
    column = serializers.IntegerField()
    message = serializers.CharField()


class ParsedRuleSerializer(serializers.Serializer[dict[str, Any]]):
    line = serializers.IntegerField()
    keywords = serializers.DictField(child=serializers.CharField(), help_text="As written.")


class ValidationReportSerializer(serializers.Serializer[dict[str, Any]]):
    valid = serializers.BooleanField()
    control = serializers.DictField(
        child=serializers.CharField(), help_text="The control line's keywords (INPUTQ, ...)."
    )
    rules = ParsedRuleSerializer(many=True)
    # A field (the serializer's metaclass takes it), not Serializer.errors.
    errors = ProblemSerializer(many=True)  # type: ignore[assignment]
    warnings = ProblemSerializer(many=True, help_text="They do not make a table invalid.")


class RuleHitsSerializer(serializers.Serializer[dict[str, Any]]):
    rule = serializers.IntegerField(help_text="Its number, from 1, in the table's order.")
    line = serializers.IntegerField()
    action = serializers.CharField()
    hits = serializers.IntegerField(help_text="Waiting messages it would take first.")
    samples = serializers.ListField(child=serializers.IntegerField(), help_text="Message ids.")


class DryRunSerializer(serializers.Serializer[dict[str, Any]]):
    examined = serializers.IntegerField()
    without_header = serializers.IntegerField()
    ignored = serializers.IntegerField()
    rules = RuleHitsSerializer(many=True)


def table_text(**kwargs: Any) -> serializers.CharField:
    """A rules table's text: as written, more than whitespace, at most MAX_TEXT."""
    return serializers.CharField(
        trim_whitespace=False,
        max_length=MAX_TEXT,
        validators=[RegexValidator(NOT_BLANK, "Enter a table.")],
        **kwargs,
    )


class RuleTableSerializer(BodyModelSerializer[RuleTable]):
    queue = NameRelatedField(
        missing=QueueNotFound, what="dead-letter queue", queryset=dead_letter_queue_list()
    )
    text = table_text(help_text="The table in runmqdlq syntax.")
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, default=None, allow_null=True
    )
    validation = serializers.SerializerMethodField()
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

    @extend_schema_field(ValidationReportSerializer)
    def get_validation(self, table: RuleTable) -> dict[str, Any]:
        return rule_table_report(text=table.text, queue=table.queue)


class RuleTableQuerySerializer(QuerySerializer[dict[str, str]]):
    queue = serializers.CharField(
        max_length=QUEUE_NAME_MAX_LENGTH,
        required=False,
        validators=[queue_name_validator],
        help_text="Only this dead-letter queue's versions.",
    )


class RuleTableTextSerializer(BodySerializer[dict[str, str]]):
    text = table_text()


class RollbackSerializer(BodySerializer[dict[str, Queue]]):
    queue = NameRelatedField(
        missing=QueueNotFound, what="dead-letter queue", queryset=dead_letter_queue_list()
    )


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
        access = request_access(self.request)
        if queue:
            access.check(Role.VIEWER, queue)
        within = access.queues(Role.VIEWER, field="queue__name")
        tables = tables if within is None else tables.filter(within)
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
        access = request_access(request)
        access.check(Role.ADMIN, data["queue"].name)
        check_targets(access, Role.OPERATOR, data["text"])
        create = rule_table_create_and_activate if data.pop("activate") else rule_table_create
        table = create(queue=data["queue"], text=data["text"], actor=request.user)
        return Response(RuleTableSerializer(table).data, status=status.HTTP_201_CREATED)


class RuleTableDetailView(APIView):
    write_role = Role.ADMIN

    @extend_schema(responses={200: RuleTableSerializer, 404: ERROR})
    def get(self, request: Request, table_id: int) -> Response:
        return Response(RuleTableSerializer(rule_table_held(request, Role.VIEWER, table_id)).data)

    @extend_schema(
        request=RuleTableTextSerializer, responses={200: RuleTableSerializer, 409: ERROR}
    )
    def patch(self, request: Request, table_id: int) -> Response:
        serializer = RuleTableTextSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        table = rule_table_held(request, Role.ADMIN, table_id)
        if "text" in serializer.validated_data:  # an empty patch changes nothing
            check_targets(request_access(request), Role.OPERATOR, serializer.validated_data["text"])
            table = rule_table_update(
                table=table, text=serializer.validated_data["text"], actor=request.user
            )
        return Response(RuleTableSerializer(table).data)


class RuleTableValidateView(APIView):
    write_role = Role.VIEWER  # it reads

    @extend_schema(request=None, responses={200: ValidationReportSerializer, 404: ERROR})
    def post(self, request: Request, table_id: int) -> Response:
        table = rule_table_held(request, Role.VIEWER, table_id)
        return Response(rule_table_report(text=table.text, queue=table.queue))


class RuleTableDryRunView(APIView):
    write_role = Role.VIEWER  # it reads

    @extend_schema(
        request=None,
        responses={200: DryRunSerializer, 404: ERROR, 409: ERROR},
        description="Per rule, how many of the queue's waiting messages it would take first, "
        "with sample ids; nothing changes. A table with errors: 409 `rules_invalid`.",
    )
    def post(self, request: Request, table_id: int) -> Response:
        return Response(rule_table_dry_run(table=rule_table_held(request, Role.VIEWER, table_id)))


class RuleTableActivateView(APIView):
    write_role = Role.ADMIN

    @extend_schema(request=None, responses={200: RuleTableSerializer, 404: ERROR, 409: ERROR})
    def post(self, request: Request, table_id: int) -> Response:
        table = rule_table_held(request, Role.ADMIN, table_id)
        check_targets(request_access(request), Role.OPERATOR, table.text)
        table = rule_table_activate(table=table, actor=request.user)
        return Response(RuleTableSerializer(table).data)


class RuleTableRollbackView(APIView):
    write_role = Role.ADMIN

    @extend_schema(request=RollbackSerializer, responses={200: RuleTableSerializer, 409: ERROR})
    def post(self, request: Request) -> Response:
        serializer = RollbackSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        request_access(request).check(Role.ADMIN, serializer.validated_data["queue"].name)
        table = rule_table_rollback(queue=serializer.validated_data["queue"], actor=request.user)
        return Response(RuleTableSerializer(table).data)
