"""REST API for the HA pair: its state for every role; switchover, the
resolution of a split brain and the republishing of diverged messages for
admins. As elsewhere, each view parses input, calls one broker service or
selector, and renders."""

from __future__ import annotations

from typing import cast

from django.contrib.auth.models import User
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.ha.admin import ha_overview, ha_resolve, ha_switchover, node_addresses
from broker.ha.diverged import diverged_republish
from console.api.schema import ERROR, ErrorSerializer
from console.api.serializers import (
    AcceptedSerializer,
    HaOverviewSerializer,
    HaResolveSerializer,
    RepublishedSerializer,
)
from console.api.triage import parsed
from console.roles import Role

REFUSED = OpenApiResponse(
    response=ErrorSerializer,
    description="A node refused the command (`ha_command_refused`): an unknown node, no split "
    "brain to resolve, no synchronised standby to hand over to.",
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
    @extend_schema(responses={200: HaOverviewSerializer})
    def get(self, request: Request) -> Response:
        return Response(HaOverviewSerializer(ha_overview()).data)


class HaSwitchoverView(APIView):
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
