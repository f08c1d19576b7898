"""Single sign-on with OpenID Connect, beside local passwords
(mozilla-django-oidc runs the authorization code flow with its state,
nonce and PKCE; this backend decides what an ID token must hold and who the
user is).

An ID token is taken only when its signature verifies with a key of the
provider's JWKS, in the algorithm configured, and it was issued by the
configured issuer, for this client, and has not expired: the library itself
checks neither issuer nor audience. The user is the one whose name the
username claim gives, made at their first sign-in with no role; at every
sign-in their groups become those the groups claim names among Lazaretto's
groups (teams, or the roles viewer, operator and admin), so a user the
provider took out of a group has lost its grants at their next sign-in.

A provider that does not answer ends the sign-in on the login page, which
says so; local sign-in stays as it was (unless switched off).
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from broker.services.audit import audit_record

logger = logging.getLogger(__name__)

# Seconds of clock difference with the provider allowed on exp, iat and nbf.
LEEWAY_SECONDS = 60


class ProviderUnreachable(Exception):
    """The identity provider did not answer the token, key or user request."""


class OidcBackend(OIDCAuthenticationBackend):
    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        """The code flow's user, or None; an ID token that does not verify, or
        a provider that does not answer, is logged and is no user (the
        callback then shows the login page)."""
        try:
            return super().authenticate(request, **kwargs)
        except requests.RequestException as error:
            logger.warning("single sign-on: the identity provider did not answer: %s", error)
            if request is not None:
                request.session["oidc_failure"] = "unreachable"
        except SuspiciousOperation as refused:
            logger.warning("single sign-on refused: %s", refused)
        return None

    def get_payload_data(self, token: str, key: Any) -> dict[str, Any]:
        """The ID token's claims, once its signature, algorithm, issuer,
        audience and lifetime are verified; else SuspiciousOperation."""
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[settings.OIDC_RP_SIGN_ALGO],
                audience=settings.OIDC_RP_CLIENT_ID,
                issuer=settings.LAZARETTO_OIDC_ISSUER,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as error:
            raise SuspiciousOperation(f"ID token refused: {error}") from None
        return claims

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(_username(claims))

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        return User.objects.filter(username=_username(claims))

    def create_user(self, claims: dict[str, Any]) -> User:
        with transaction.atomic():
            user = User.objects.create_user(
                username=_username(claims), email=str(claims.get("email", ""))
            )
            audit_record(
                action="user.create", actor=None, details={"user": user.username, "via": "sso"}
            )
            _join_claimed_groups(user, claims)
        return user

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        with transaction.atomic():
            _join_claimed_groups(user, claims)
        return user


def _username(claims: dict[str, Any]) -> str:
    value = claims.get(settings.LAZARETTO_OIDC_USERNAME_CLAIM) or claims.get("sub") or ""
    return str(value)[:150]


def _join_claimed_groups(user: User, claims: dict[str, Any]) -> None:
    """Make the user's groups those the groups claim names among
    Lazaretto's; audited when they change."""
    claimed = claims.get(settings.LAZARETTO_OIDC_GROUPS_CLAIM) or []
    if not isinstance(claimed, list):
        claimed = [claimed]
    wanted = set(Group.objects.filter(name__in=[str(name) for name in claimed]))
    held = set(user.groups.all())
    if wanted == held:
        return
    user.groups.set(wanted)
    audit_record(
        action="user.groups",
        actor=None,
        details={
            "user": user.username,
            "via": "sso",
            "from": sorted(group.name for group in held),
            "to": sorted(group.name for group in wanted),
        },
    )
