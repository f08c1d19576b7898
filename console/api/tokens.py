"""REST API for a user's own API tokens."""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.fields import BodyModelSerializer
from console.api.schema import ERROR
from console.models import QUEUE_PATTERN_MAX_LENGTH, TOKEN_NAME_MAX_LENGTH, ApiToken
from console.roles import GROUP_ROLES, Role
from console.tokens import (
    PRINTABLE_ONLY,
    READABLE_NAME_PATTERN,
    token_create,
    token_get,
    token_revoke,
    tokens_of,
)


class TokenSerializer(BodyModelSerializer[ApiToken]):
    user = serializers.CharField(source="user.username", read_only=True)
    name = serializers.CharField(
        max_length=TOKEN_NAME_MAX_LENGTH,
        trim_whitespace=False,
        validators=[RegexValidator(READABLE_NAME_PATTERN, PRINTABLE_ONLY)],
    )

    only_pattern = serializers.CharField(
        max_length=QUEUE_PATTERN_MAX_LENGTH,
        required=False,
        allow_blank=True,
        default="",
        help_text="Only the queues this pattern matches (a name, or a glob such as ORDERS.*); "
        "blank: every queue its user holds a role on.",
    )
    at_most = serializers.ChoiceField(
        choices=list(GROUP_ROLES),
        required=False,
        allow_null=True,
        default=None,
        help_text="At most this role, below its user's; null: its user's. A token never holds "
        "more than its user holds at the time of each request.",
    )

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "user",
            "prefix",
            "only_pattern",
            "at_most",
            "created_at",
            "last_used_at",
        ]
        read_only_fields = ["id", "user", "prefix", "created_at", "last_used_at"]

    def to_representation(self, instance: ApiToken) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["at_most"] = None if instance.at_most is None else Role(instance.at_most).label
        return data


class NewTokenSerializer(TokenSerializer):
    key = serializers.CharField(
        read_only=True,
        help_text="The key, shown this once: send it as `Authorization: Token <key>`.",
    )

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "key"]
        read_only_fields = [*TokenSerializer.Meta.read_only_fields, "key"]


def signed_in(request: Request) -> User:
    # HasRole let only an authenticated user this far.
    return cast(User, request.user)


class TokenListView(APIView):
    # Any role may hold tokens: a token acts with its user's role.
    write_role = Role.VIEWER

    @extend_schema(responses=TokenSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(TokenSerializer(tokens_of(user=signed_in(request)), many=True).data)

    @extend_schema(request=TokenSerializer, responses={201: NewTokenSerializer, 400: ERROR})
    def post(self, request: Request) -> Response:
        serializer = TokenSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token, key = token_create(
            user=signed_in(request),
            name=data["name"],
            only_pattern=data["only_pattern"],
            at_most=data["at_most"] or "",
        )
        token.key = key  # type: ignore[attr-defined]
        return Response(NewTokenSerializer(token).data, status=status.HTTP_201_CREATED)


class TokenDetailView(APIView):
    write_role = Role.VIEWER

    @extend_schema(responses={200: TokenSerializer, 404: ERROR})
    def get(self, request: Request, token_id: int) -> Response:
        return Response(TokenSerializer(token_get(token_id=token_id, user=signed_in(request))).data)

    @extend_schema(responses={204: None, 404: ERROR})
    def delete(self, request: Request, token_id: int) -> Response:
        token_revoke(
            token=token_get(token_id=token_id, user=signed_in(request)), actor=signed_in(request)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)
