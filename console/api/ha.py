"""REST API for the HA pair: its state, a switchover, the end of a split brain, and the diverged exports."""

from __future__ import annotations

from typing import cast

from django.contrib.auth.models import User
from django.core.validators import RegexValidator
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.ha.admin import (
    NODE_NAME_MAX_LENGTH,
    NODE_NAME_PATTERN,
    PairOverview,
    ha_overview,
    ha_resolve,
    ha_switchover,
    node_addresses,
)
from broker.ha.diverged import diverged_republish
from broker.models import DivergedExport, HaEvent, HaEventKind, Node
from console.api.fields import AcceptedSerializer, BodyModelSerializer, BodySerializer, parsed
from console.api.schema import ERROR, ErrorSerializer
from console.roles import Role


class HaNodeSerializer(BodyModelSerializer[Node]):
    class Meta:
        model = Node
        fields = [
            "name",
            "role",
            "mode",
            "epoch",
            "address",
            "last_heartbeat_at",
            "replication_lag_bytes",
        ]
        read_only_fields = fields


class HaEventSerializer(BodyModelSerializer[HaEvent]):
    # Not "kind": the schema's KindEnum is the queues' kinds.
    event = serializers.ChoiceField(choices=HaEventKind.choices, source="kind", read_only=True)

    class Meta:
        model = HaEvent
        fields = ["id", "created_at", "event", "node", "epoch", "detail"]
        read_only_fields = fields


class DivergedExportSerializer(BodyModelSerializer[DivergedExport]):
    class Meta:
        model = DivergedExport
        fields = [
            "id",
            "created_at",
            "node",
            "path",
            "messages",
            "republished_at",
            "republished_by",
        ]
        read_only_fields = fields


class HaOverviewSerializer(BodySerializer[PairOverview]):
    epoch = serializers.SerializerMethodField()
    primary = serializers.SerializerMethodField()
    maintenance = serializers.BooleanField(
        help_text="Split brain: the store refuses every write until an admin picks the primary."
    )
    synchronising = serializers.BooleanField(
        help_text="A standby is rejoining: configuration changes are refused until it is "
        "synchronised."
    )
    alone = serializers.BooleanField(
        help_text="The primary runs without a synchronous standby: a publish is on one store only."
    )
    nodes = HaNodeSerializer(many=True)
    events = HaEventSerializer(many=True, help_text="Newest first.")
    exports = DivergedExportSerializer(many=True, help_text="Newest first.")

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_epoch(self, overview: PairOverview) -> int | None:
        return overview.pair.epoch if overview.pair else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_primary(self, overview: PairOverview) -> str | None:
        return (overview.pair.primary_name or None) if overview.pair else None


class HaResolveSerializer(BodySerializer[dict[str, str]]):
    primary = serializers.CharField(
        max_length=NODE_NAME_MAX_LENGTH,
        trim_whitespace=False,
        validators=[RegexValidator(NODE_NAME_PATTERN, "Not a node name.")],
        help_text="The node to keep as primary: letters, digits, '.', '_' or '-'.",
    )


class RepublishedSerializer(BodySerializer[dict[str, int]]):
    published = serializers.IntegerField(help_text="Messages published again.")


REFUSED = OpenApiResponse(
    response=ErrorSerializer,
    description="A node refused the command (`ha_command_refused`): an unknown node, no split "
    "brain to resolve, no synchronised standby to hand over to. Or this instance runs no HA "
    "pair (`ha_not_configured`): no broker node has recorded where it answers.",
)


UNREACHABLE = OpenApiResponse(
    response=ErrorSerializer,
    description="No broker node answered (`ha_node_unreachable`), or the pair is in "
    "maintenance (`ha_maintenance`).",
)


def admin_user(request: Request) -> User:
    # HasRole let only an authenticated admin this far.
    return cast(User, request.user)


class HaView(APIView):
    installation_wide = True

    @extend_schema(responses={200: HaOverviewSerializer})
    def get(self, request: Request) -> Response:
        return Response(HaOverviewSerializer(ha_overview()).data)


class HaSwitchoverView(APIView):
    installation_wide = True
    write_role = Role.ADMIN

    @extend_schema(
        request=None,
        responses={202: AcceptedSerializer, 409: REFUSED, 503: UNREACHABLE},
        description="Swap the roles: the primary hands over to its synchronised standby. "
        "Answers 202 once a node took the command; the pair's state shows the change.",
    )
    def post(self, request: Request) -> Response:
        ha_switchover(actor=admin_user(request), addresses=node_addresses())
        return Response({"accepted": True}, status=status.HTTP_202_ACCEPTED)


class HaResolveView(APIView):
    installation_wide = True
    write_role = Role.ADMIN

    @extend_schema(
        request=HaResolveSerializer,
        responses={202: AcceptedSerializer, 400: ERROR, 409: REFUSED, 503: UNREACHABLE},
        description="End a split brain: keep `primary` as the primary. The other node exports "
        "the messages only it had (see `exports`) and rejoins as standby.",
    )
    def post(self, request: Request) -> Response:
        primary = parsed(HaResolveSerializer, request.data).validated_data["primary"]
        ha_resolve(primary=primary, actor=admin_user(request), addresses=node_addresses())
        return Response({"accepted": True}, status=status.HTTP_202_ACCEPTED)


class HaExportRepublishView(APIView):
    installation_wide = True
    write_role = Role.ADMIN

    @extend_schema(
        request=None,
        responses={
            200: RepublishedSerializer,
            400: ERROR,
            404: ERROR,
            409: ERROR,
            413: ERROR,
            503: ERROR,
        },
        description="Publish an export's diverged messages again, each to its queue as a new "
        "message (those delivered on the losing side excepted), all or nothing, once: a "
        "second call is refused (400).",
    )
    def post(self, request: Request, export_id: int) -> Response:
        published = diverged_republish(export_id=export_id, actor=admin_user(request))
        return Response({"published": published})
