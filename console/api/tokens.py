"""REST API for a user's own API tokens (an admin sees and revokes
everyone's). Creating answers the key once; it is never shown again."""

from __future__ import annotations

from typing import cast

from django.contrib.auth.models import User
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.schema import ERROR
from console.api.serializers import NewTokenSerializer, TokenSerializer
from console.roles import Role
from console.tokens import token_create, token_get, token_revoke, tokens_of


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
        token, key = token_create(user=signed_in(request), name=serializer.validated_data["name"])
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
