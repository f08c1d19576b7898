"""API authentication by a user's named token (console.tokens):
``Authorization: Token <key>`` or ``Authorization: Bearer <key>``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from console.models import ApiToken
from console.tokens import token_authenticate

KEYWORDS = (b"token", b"bearer")


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() not in KEYWORDS:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Send the token as 'Authorization: Token <key>', with no spaces in the key."
            )
        try:
            key = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("This token is not valid.") from None
        token = token_authenticate(key=key)
        if token is None:
            raise exceptions.AuthenticationFailed("This token is not valid or was revoked.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("This token's user is deactivated.")
        # Audit events of this request name the token (broker.services.audit).
        token.user.api_token_name = token.name  # type: ignore[attr-defined]
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Token realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The token scheme in the OpenAPI schema."""

    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>` (or `Bearer <key>`), with a key made on the "
            "console's API tokens page or by `POST /api/v1/tokens/`.",
        }
