"""Grants: a role on the queues a pattern matches, given to a user or a
group (console.models.Grant; what they allow is console.access's to say).
Every change is an audit event."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction

from broker.errors import AlreadyExists, InvalidInput, NotFound
from broker.services.audit import Actor, audit_record
from console.access import access_of, pattern_problem
from console.models import Grant
from console.roles import GROUP_ROLES, Role


class GrantNotFound(NotFound):
    code = "grant_not_found"


@dataclass(frozen=True)
class Grantee:
    """Whom a grant is for: a user or a group, by name."""

    user: str = ""
    group: str = ""

    @property
    def described(self) -> dict[str, str]:
        return {"user": self.user} if self.user else {"group": self.group}


def _checked(
    pattern: str, role: str, to: Grantee, actor: Actor
) -> tuple[Role, User | None, Group | None]:
    errors: dict[str, list[str]] = {}
    problem = pattern_problem(pattern)
    if problem:
        errors["pattern"] = [problem]
    if role not in GROUP_ROLES:
        errors["role"] = [f"Choose one of {', '.join(GROUP_ROLES)}."]
    elif (
        not problem
        and isinstance(actor, User)
        and not access_of(actor).holds_on_pattern(GROUP_ROLES[role], pattern)
    ):
        errors["role"] = [f"You do not hold {role} on every queue {pattern} matches."]
    user = group = None
    if bool(to.user) == bool(to.group):
        errors["user"] = ["Name a user or a group (one of them)."]
    elif to.user:
        user = User.objects.filter(username=to.user).first()
        if user is None:
            errors["user"] = [f"There is no user {to.user!r}."]
    else:
        group = Group.objects.filter(name=to.group).exclude(name__in=GROUP_ROLES).first()
        if group is None:
            errors["group"] = [f"There is no group {to.group!r}."]
    if errors:
        raise InvalidInput("The grant is not valid.", field_errors=errors)
    return GROUP_ROLES[role], user, group


def grant_add(*, pattern: str, role: str, to: Grantee, actor: Actor) -> Grant:
    """Give ``to`` the role on the queues ``pattern`` matches. A second
    grant on the same pattern to the same user or group is refused: change
    it by removing it first."""
    level, user, group = _checked(pattern, role, to, actor)
    try:
        with transaction.atomic():
            grant = Grant.objects.create(user=user, group=group, role=level, pattern=pattern)
            audit_record(
                action="grant.add",
                actor=actor,
                details={"pattern": pattern, "role": role, **to.described},
            )
    except IntegrityError:
        raise AlreadyExists(
            f"{'User' if user else 'Group'} {to.user or to.group!r} already has a grant on "
            f"{pattern!r}; remove it to change it.",
            field_errors={"pattern": ["A grant on this pattern exists already."]},
        ) from None
    return grant


def grant_remove(*, grant_id: int, actor: Actor) -> None:
    with transaction.atomic():
        grant = Grant.objects.select_related("user", "group").filter(id=grant_id).first()
        if grant is None:
            raise GrantNotFound(f"There is no grant {grant_id}.")
        grant.delete()
        audit_record(
            action="grant.remove",
            actor=actor,
            details={
                "pattern": grant.pattern,
                "role": Role(grant.role).label,
                **grantee_of(grant).described,
            },
        )


def grantee_of(grant: Grant) -> Grantee:
    if grant.user is not None:
        return Grantee(user=grant.user.get_username())
    return Grantee(group=grant.group.name if grant.group else "")


def grants_list(*, to: Grantee | None = None) -> list[Grant]:
    """Every grant (or those of one user or group), by pattern."""
    grants = Grant.objects.select_related("user", "group")
    if to is not None and to.user:
        grants = grants.filter(user__username=to.user)
    elif to is not None and to.group:
        grants = grants.filter(group__name=to.group)
    return list(grants)


# --- groups ------------------------------------------------------------------------------


class GroupNotFound(NotFound):
    code = "group_not_found"


GROUP_NAME_MAX_LENGTH = 150


def _team(name: str) -> Group:
    group = Group.objects.filter(name=name).exclude(name__in=GROUP_ROLES).first()
    if group is None:
        raise GroupNotFound(f"There is no group {name!r}.")
    return group


def group_create(*, name: str, actor: Actor) -> Group:
    """A group of users (a team), to give grants to. The role groups
    (viewer, operator, admin) are the installation-wide roles, not teams."""
    name = name.strip()
    problem = ""
    if not name:
        problem = "Give the group a name, such as the team's."
    elif len(name) > GROUP_NAME_MAX_LENGTH:
        problem = f"At most {GROUP_NAME_MAX_LENGTH} characters."
    elif name in GROUP_ROLES:
        problem = f"{name} is a role: give the group a name of its own."
    if problem:
        raise InvalidInput(problem, field_errors={"name": [problem]})
    try:
        with transaction.atomic():
            group = Group.objects.create(name=name)
            audit_record(action="group.create", actor=actor, details={"group": name})
    except IntegrityError:
        problem = f"A group named {name!r} exists already."
        raise AlreadyExists(problem, field_errors={"name": [problem]}) from None
    return group


@transaction.atomic
def group_delete(*, name: str, actor: Actor) -> None:
    """A group goes with its grants; its members stay, without them."""
    _team(name).delete()
    audit_record(action="group.delete", actor=actor, details={"group": name})


@transaction.atomic
def group_add_member(*, name: str, user: str, actor: Actor) -> None:
    member = User.objects.filter(username=user).first()
    if member is None:
        problem = f"There is no user {user!r}."
        raise InvalidInput(problem, field_errors={"user": [problem]})
    _team(name).user_set.add(member)
    audit_record(action="group.add", actor=actor, details={"group": name, "user": user})


@transaction.atomic
def group_remove_member(*, name: str, user: str, actor: Actor) -> None:
    _team(name).user_set.remove(*User.objects.filter(username=user))
    audit_record(action="group.remove", actor=actor, details={"group": name, "user": user})


def groups_list() -> list[Group]:
    """The teams, by name, with their members and grants."""
    return list(
        Group.objects.exclude(name__in=GROUP_ROLES)
        .prefetch_related("user_set", "queue_grants")
        .order_by("name")
    )
