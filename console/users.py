"""Users and their roles: what the ``user`` command and the console's Users
page do. A user has one installation-wide role (the group of that name), or
none (then only their grants give them any); each change is an audit event,
and no change may leave the instance without an active admin.
A deactivated user's sessions and API tokens stop working at once (both
check ``is_active`` on every request)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import Group, User
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from broker.errors import BrokerError, InvalidInput, NotFound
from broker.services.audit import Actor, audit_record
from console.roles import GROUP_ROLES, Role, user_role

# An installation-wide role, or none: a user who acts only where grants
# give them a role (console.access).
ROLES = (Role.NONE.label, *GROUP_ROLES)
NAME_MAX_LENGTH = 150


class UserNotFound(NotFound):
    code = "user_not_found"


class LastAdmin(BrokerError):
    """The change would leave no active admin to manage the instance."""

    code = "last_admin"


@dataclass(frozen=True)
class UserRow:
    name: str
    role: str
    active: bool
    last_login: datetime | None


def users_list() -> list[UserRow]:
    return [
        UserRow(
            name=user.get_username(),
            role=_role_of(user),
            active=user.is_active,
            last_login=user.last_login,
        )
        for user in User.objects.order_by("username").prefetch_related("groups")
    ]


def _role_of(user: User) -> str:
    """The role a user holds, active or not."""
    if user.is_superuser:
        return Role.ADMIN.label
    names = {group.name for group in user.groups.all()}
    return max(
        (GROUP_ROLES[name] for name in names if name in GROUP_ROLES), default=Role.NONE
    ).label


def _checked_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidInput(
            f"There is no role {role!r}: one of {', '.join(ROLES)}.",
            field_errors={"role": [f"Choose one of {', '.join(ROLES)}."]},
        )
    return role


def _checked_name(name: str) -> str:
    problems: list[str] = []
    if not name:
        problems.append("Give a user name.")
    elif len(name) > NAME_MAX_LENGTH:
        problems.append(f"At most {NAME_MAX_LENGTH} characters.")
    else:
        try:
            UnicodeUsernameValidator()(name)
        except ValidationError as error:
            problems.extend(error.messages)
    if not problems and User.objects.filter(username__iexact=name).exists():
        problems.append(f"A user named {name!r} already exists.")
    if problems:
        raise InvalidInput(f"user name: {' '.join(problems)}", field_errors={"name": problems})
    return name


def _checked_password(password: str, user: User) -> str:
    if not password:
        raise InvalidInput("password: give a password.", field_errors={"password": ["Required."]})
    try:
        validate_password(password, user)
    except ValidationError as error:
        raise InvalidInput(
            f"password: {' '.join(error.messages)}", field_errors={"password": error.messages}
        ) from None
    return password


def user_get(*, name: str) -> User:
    user = User.objects.filter(username=name).first()
    if user is None:
        raise UserNotFound(f"There is no user {name!r}.")
    return user


def _set_group(user: User, role: str) -> None:
    user.groups.remove(*Group.objects.filter(name__in=GROUP_ROLES))
    if role in GROUP_ROLES:
        user.groups.add(Group.objects.get_or_create(name=role)[0])


def user_create(*, name: str, role: str, password: str, actor: Actor) -> User:
    """A new active user with ``role``, signing in with ``password``."""
    role = _checked_role(role)
    name = _checked_name(name)
    _checked_password(password, User(username=name))
    with transaction.atomic():
        user = User.objects.create_user(username=name, password=password)
        _set_group(user, role)
        audit_record(action="user.create", actor=actor, details={"user": name, "role": role})
    return user


def _another_active_admin(user: User) -> bool:
    """Whether an active user besides ``user`` is an admin (a superuser, or
    in the admin group: console.roles), in one query."""
    admins = Q(is_superuser=True) | Q(groups__name=Role.ADMIN.label)
    return User.objects.filter(admins, is_active=True).exclude(id=user.id).exists()


def _keep_an_admin(user: User, change: str) -> None:
    if user.is_active and user_role(user) >= Role.ADMIN and not _another_active_admin(user):
        raise LastAdmin(
            f"{user.get_username()} is the only active admin: {change} would leave nobody "
            "to manage users and settings. Give another user the admin role first."
        )


def user_set_role(*, name: str, role: str, actor: Actor) -> User:
    role = _checked_role(role)
    with transaction.atomic():
        user = User.objects.select_for_update().filter(username=name).first()
        if user is None:
            raise UserNotFound(f"There is no user {name!r}.")
        if role != Role.ADMIN.label:
            _keep_an_admin(user, f"making them {role}")
        before = _role_of(user)
        _set_group(user, role)
        if user.is_superuser and role != Role.ADMIN.label:
            user.is_superuser = False
            user.save(update_fields=["is_superuser"])
        audit_record(
            action="user.role", actor=actor, details={"user": name, "from": before, "to": role}
        )
    return user


def user_deactivate(*, name: str, actor: Actor) -> User:
    """The user can no longer sign in; their sessions and API tokens stop."""
    with transaction.atomic():
        user = User.objects.select_for_update().filter(username=name).first()
        if user is None:
            raise UserNotFound(f"There is no user {name!r}.")
        _keep_an_admin(user, "deactivating them")
        if user.is_active:
            user.is_active = False
            user.save(update_fields=["is_active"])
            audit_record(action="user.deactivate", actor=actor, details={"user": name})
    return user
