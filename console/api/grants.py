"""REST API for grants and groups (admins of the installation): the same
services as the Users and Groups pages and ``manage.py grant`` and
``group`` (console.grants); every change an audit event."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.fields import BodySerializer, parsed
from console.api.schema import ERROR
from console.grants import (
    GROUP_NAME_MAX_LENGTH,
    Grantee,
    grant_add,
    grant_remove,
    grantee_of,
    grants_list,
    group_add_member,
    group_create,
    group_delete,
    group_remove_member,
    groups_list,
)
from console.models import QUEUE_PATTERN_MAX_LENGTH, Grant
from console.roles import GROUP_ROLES, Role
from console.users import NAME_MAX_LENGTH


class GrantSerializer(BodySerializer[Grant]):
    id = serializers.IntegerField(read_only=True)
    pattern = serializers.CharField(
        max_length=QUEUE_PATTERN_MAX_LENGTH,
        trim_whitespace=False,
        help_text="A queue name, or a glob with * and ?, e.g. ORDERS.*",
    )
    role = serializers.ChoiceField(choices=list(GROUP_ROLES))
    user = serializers.CharField(
        max_length=NAME_MAX_LENGTH,
        required=False,
        allow_blank=True,
        default="",
        help_text="A user's name…",
    )
    group = serializers.CharField(
        max_length=GROUP_NAME_MAX_LENGTH,
        required=False,
        allow_blank=True,
        default="",
        help_text="…or a group's.",
    )
    created_at = serializers.DateTimeField(read_only=True)

    def to_representation(self, grant: Grant) -> dict[str, Any]:
        whom = grantee_of(grant)
        return {
            "id": grant.id,
            "pattern": grant.pattern,
            "role": Role(grant.role).label,
            "user": whom.user,
            "group": whom.group,
            "created_at": serializers.DateTimeField().to_representation(grant.created_at),
        }


class GroupSerializer(BodySerializer[Group]):
    name = serializers.CharField(max_length=GROUP_NAME_MAX_LENGTH)
    members = serializers.ListField(child=serializers.CharField(), read_only=True)
    grants = GrantSerializer(many=True, read_only=True)

    def to_representation(self, group: Group) -> dict[str, Any]:
        return {
            "name": group.name,
            "members": sorted(user.get_username() for user in group.user_set.all()),
            "grants": [GrantSerializer(grant).data for grant in group.queue_grants.all()],
        }


class MemberSerializer(BodySerializer[dict[str, str]]):
    user = serializers.CharField(max_length=NAME_MAX_LENGTH)


class AdminOnly(APIView):
    read_role = Role.ADMIN
    write_role = Role.ADMIN
    installation_wide = True


class GrantListView(AdminOnly):
    @extend_schema(responses=GrantSerializer(many=True))
    def get(self, request: Request) -> Response:
        # many=True builds a ListSerializer, which takes the list.
        return Response(GrantSerializer(grants_list(), many=True).data)  # type: ignore[arg-type]

    @extend_schema(
        request=GrantSerializer, responses={201: GrantSerializer, 400: ERROR, 409: ERROR}
    )
    def post(self, request: Request) -> Response:
        data = parsed(GrantSerializer, request.data).validated_data
        grant = grant_add(
            pattern=data["pattern"],
            role=data["role"],
            to=Grantee(user=data["user"], group=data["group"]),
            actor=request.user,
        )
        return Response(GrantSerializer(grant).data, status=status.HTTP_201_CREATED)


class GrantDetailView(AdminOnly):
    @extend_schema(responses={204: None, 404: ERROR})
    def delete(self, request: Request, grant_id: int) -> Response:
        grant_remove(grant_id=grant_id, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class GroupListView(AdminOnly):
    @extend_schema(responses=GroupSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(GroupSerializer(groups_list(), many=True).data)  # type: ignore[arg-type]

    @extend_schema(
        request=GroupSerializer, responses={201: GroupSerializer, 400: ERROR, 409: ERROR}
    )
    def post(self, request: Request) -> Response:
        name = parsed(GroupSerializer, request.data).validated_data["name"]
        group = group_create(name=name, actor=request.user)
        return Response(GroupSerializer(group).data, status=status.HTTP_201_CREATED)


class GroupDetailView(AdminOnly):
    @extend_schema(responses={204: None, 404: ERROR})
    def delete(self, request: Request, name: str) -> Response:
        group_delete(name=name, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class GroupMembersView(AdminOnly):
    @extend_schema(request=MemberSerializer, responses={204: None, 400: ERROR, 404: ERROR})
    def post(self, request: Request, name: str) -> Response:
        user = parsed(MemberSerializer, request.data).validated_data["user"]
        group_add_member(name=name, user=user, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class GroupMemberView(AdminOnly):
    @extend_schema(responses={204: None, 404: ERROR})
    def delete(self, request: Request, name: str, user: str) -> Response:
        group_remove_member(name=name, user=user, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
