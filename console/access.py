"""Who may do what on which queue: the one place that decides.

A caller's role on a queue is the highest of their installation-wide role
(``console.roles.user_role``: their role group, or superuser) and the roles
their grants (``console.models.Grant``, to them or to a group of theirs)
give on the queues whose names the grant's pattern matches. A pattern is a
queue name, or a glob: ``*`` any run of characters, ``?`` any one.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace
from string import ascii_letters, digits

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q

from broker.models import QUEUE_NAME_MAX_LENGTH
from console.models import QUEUE_PATTERN_MAX_LENGTH, ApiToken, Grant
from console.roles import Role, user_role

NAME_CHARACTERS = frozenset(ascii_letters + digits + "._/%")
WILDCARDS = frozenset("*?")


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a queue pattern that can match a queue; None when it is."""
    if not pattern:
        return "Give a queue name, or a pattern such as ORDERS.*."
    if len(pattern) > QUEUE_PATTERN_MAX_LENGTH:
        return f"At most {QUEUE_PATTERN_MAX_LENGTH} characters."
    strange = sorted(set(pattern) - NAME_CHARACTERS - WILDCARDS)
    if strange:
        shown = " ".join(repr(character) for character in strange)
        return (
            "Use the characters of a queue name (letters, digits, . _ / %) and the "
            f"wildcards * and ?; not {shown}."
        )
    if len(pattern.replace("*", "")) > QUEUE_NAME_MAX_LENGTH:
        return f"It matches no queue: a queue name has at most {QUEUE_NAME_MAX_LENGTH} characters."
    return None


def pattern_matches(pattern: str, queue_name: str) -> bool:
    # Neither [ nor ] is in a pattern (pattern_problem), so fnmatch's
    # character classes never apply.
    return fnmatch.fnmatchcase(queue_name, pattern)


def pattern_regex(pattern: str) -> str:
    """The pattern as an anchored regular expression, in the syntax both
    Python and PostgreSQL read (for a filter on queue names)."""
    parts = {"*": ".*", "?": "."}
    return "^" + "".join(parts.get(c, re.escape(c)) for c in pattern) + "$"


def pattern_covers(outer: str, inner: str) -> bool:
    """Whether every queue name ``inner`` matches, ``outer`` matches too:
    ``outer``'s ``*`` takes any run of ``inner`` (wildcards included), its
    ``?`` one character of a name or ``inner``'s own ``?``."""
    parts = {"*": ".*", "?": "[^*]"}
    return re.fullmatch("".join(parts.get(c, re.escape(c)) for c in outer), inner) is not None


@dataclass(frozen=True)
class Access:
    """What one caller may do on queues: an installation-wide role, the
    (pattern, role) pairs of their grants, and for a narrowed token its
    pattern and role, which nothing exceeds."""

    installation: Role
    grants: tuple[tuple[str, Role], ...] = ()
    only_pattern: str = ""
    at_most: Role = Role.ADMIN

    def role_on(self, queue_name: str) -> Role:
        if self.only_pattern and not pattern_matches(self.only_pattern, queue_name):
            return Role.NONE
        granted = [role for pattern, role in self.grants if pattern_matches(pattern, queue_name)]
        return min(max([self.installation, *granted]), self.at_most)

    def may(self, role: Role, queue_name: str) -> bool:
        return self.role_on(queue_name) >= role

    def holds_on_pattern(self, role: Role, pattern: str) -> bool:
        """Whether the caller holds ``role`` on every queue ``pattern`` matches."""
        if role > self.at_most or (
            self.only_pattern and not pattern_covers(self.only_pattern, pattern)
        ):
            return False
        return self.installation >= role or any(
            granted >= role and pattern_covers(granted_on, pattern)
            for granted_on, granted in self.grants
        )

    def narrowed(self, *, only_pattern: str = "", at_most: Role | None = None) -> Access:
        """This access as a token limited to ``only_pattern`` and ``at_most`` holds it."""
        return replace(
            self,
            only_pattern=only_pattern or self.only_pattern,
            at_most=min(self.at_most, at_most) if at_most is not None else self.at_most,
        )

    def queues(self, role: Role, *, field: str = "name") -> Q | None:
        """A filter (on the queue name ``field``) for the queues this caller
        holds ``role`` on; None: every queue."""
        if role > self.at_most:
            return Q(pk__in=[])
        if self.installation >= role:
            held = None
        else:
            patterns = [pattern for pattern, granted in self.grants if granted >= role]
            held = _any_of(patterns, field)
        if self.only_pattern:
            only = _any_of([self.only_pattern], field)
            return only if held is None else held & only
        return held


def _any_of(patterns: list[str], field: str) -> Q:
    if not patterns:
        return Q(pk__in=[])
    return Q(**{f"{field}__regex": "|".join(f"({pattern_regex(p)})" for p in patterns)})


def access_of(user: AbstractBaseUser | AnonymousUser, token: ApiToken | None = None) -> Access:
    """The user's access, read once per request (cached on the user object,
    which lives for one request); through ``token``, as far as it is narrowed.
    A token holds what its user holds now: a grant taken from the user is
    taken from their tokens at once."""
    if token is not None:
        at_most = Role(token.at_most) if token.at_most is not None else None
        return access_of(user).narrowed(only_pattern=token.only_pattern, at_most=at_most)
    cached = getattr(user, "_lazaretto_access", None)
    if cached is not None:
        return cached
    installation = user_role(user)
    grants: tuple[tuple[str, Role], ...] = ()
    if user.is_authenticated and user.is_active and installation < Role.ADMIN:
        rows = Grant.objects.filter(Q(user_id=user.pk) | Q(group__user=user.pk))
        grants = tuple(
            (pattern, Role(role)) for pattern, role in rows.values_list("pattern", "role")
        )
    access = Access(installation=installation, grants=grants)
    setattr(user, "_lazaretto_access", access)  # noqa: B010
    return access
