"""Creating, revoking and checking API tokens. Every create and revoke is
an audit event; the key is returned once and never stored."""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from broker.errors import AlreadyExists, InvalidInput, NotFound
from broker.services.audit import Actor, audit_record
from console.access import access_of, pattern_problem
from console.models import TOKEN_NAME_MAX_LENGTH, ApiToken
from console.roles import GROUP_ROLES, Role, user_role

KEY_PREFIX = "lzt_"
# A token's name: something to read, so no control, zero-width or
# direction-changing character, and more than whitespace. The API's schema
# states the same pattern.
READABLE_NAME_PATTERN = (
    r"\A(?=[\s\S]*\S)"
    r"[^\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]*\Z"
)
PRINTABLE_ONLY = "Use printable characters only."
LAST_USED_EVERY = timedelta(minutes=1)


class TokenNotFound(NotFound):
    code = "token_not_found"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tokens_of(*, user: User) -> QuerySet[ApiToken]:
    """The user's live tokens, newest first; an admin sees everyone's."""
    tokens = ApiToken.objects.filter(revoked_at__isnull=True).select_related("user")
    return tokens if user_role(user) >= Role.ADMIN else tokens.filter(user=user)


def _narrowing_problems(user: User, only_pattern: str, at_most: str) -> dict[str, list[str]]:
    """What is wrong with narrowing a token of ``user`` to ``only_pattern``
    and ``at_most`` (a role's name): a token never holds more than its user."""
    if only_pattern and (problem := pattern_problem(only_pattern)):
        return {"only_pattern": [problem]}
    if at_most and at_most not in GROUP_ROLES:
        return {"at_most": [f"Choose one of {', '.join(GROUP_ROLES)}."]}
    role = GROUP_ROLES[at_most] if at_most else Role.VIEWER
    pattern = only_pattern or "*"
    if not access_of(user).holds_on_pattern(role, pattern):
        field = "at_most" if at_most else "only_pattern"
        return {field: [f"You do not hold {role.label} on every queue {pattern} matches."]}
    return {}


@transaction.atomic
def token_create(
    *, user: User, name: str, only_pattern: str = "", at_most: str = ""
) -> tuple[ApiToken, str]:
    """A new token named ``name`` for ``user``, narrowed to the queues
    ``only_pattern`` matches and to the role ``at_most`` when given (never
    more than the user holds there); returns it and its key, which is shown
    to the user once and cannot be recovered."""
    name = name.strip()
    problem = ""
    if not name:
        problem = "Give the token a name, such as the program that will use it."
    elif len(name) > TOKEN_NAME_MAX_LENGTH:
        problem = f"At most {TOKEN_NAME_MAX_LENGTH} characters."
    elif not re.fullmatch(READABLE_NAME_PATTERN, name):
        problem = PRINTABLE_ONLY
    errors = {"name": [problem]} if problem else {}
    if only_pattern or at_most:
        errors.update(_narrowing_problems(user, only_pattern, at_most))
    if errors:
        raise InvalidInput(problem or "The token's narrowing is not valid.", field_errors=errors)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=user,
                name=name,
                prefix=key[: len(KEY_PREFIX) + 6],
                digest=_digest(key),
                only_pattern=only_pattern,
                at_most=GROUP_ROLES[at_most] if at_most else None,
            )
    except IntegrityError:
        problem = f"You already have a token named {name!r}."
        raise AlreadyExists(problem, field_errors={"name": [problem]}) from None
    audit_record(
        action="token_create",
        actor=user,
        details={"token": name, "prefix": token.prefix, "user": user.get_username()},
    )
    return token, key


def token_get(*, token_id: int, user: User) -> ApiToken:
    """A live token ``user`` may see: their own, or anyone's for an admin."""
    token = tokens_of(user=user).filter(id=token_id).first()
    if token is None:
        raise TokenNotFound(f"There is no token {token_id}.")
    return token


@transaction.atomic
def token_revoke(*, token: ApiToken, actor: Actor) -> ApiToken:
    """Revoke at once: the next request with its key is refused."""
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(
        action="token_revoke",
        actor=actor,
        details={"token": token.name, "prefix": token.prefix, "user": token.user.get_username()},
    )
    return token


def token_authenticate(*, key: str) -> ApiToken | None:
    """The live token with this key, its last use noted; None for an unknown
    or revoked key. The caller checks that the user is active."""
    token = (
        ApiToken.objects.select_related("user")
        .filter(digest=_digest(key), revoked_at__isnull=True)
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_EVERY:
        ApiToken.objects.filter(id=token.id).update(last_used_at=now)
        token.last_used_at = now
    return token
