"""Roles: viewer (read), operator (triage, publish, replay), admin (settings,
rules, HA). Each role includes the ones before it. A user's role is the
highest of the groups they belong to; a superuser is an admin."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import HttpRequest
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

if TYPE_CHECKING:  # rest_framework.views imports the permission classes itself
    from rest_framework.views import APIView


class Role(IntEnum):
    NONE = 0
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()


GROUP_ROLES = {"viewer": Role.VIEWER, "operator": Role.OPERATOR, "admin": Role.ADMIN}


def user_role(user: AbstractBaseUser | AnonymousUser) -> Role:
    if not user.is_authenticated or not user.is_active:
        return Role.NONE
    if getattr(user, "is_superuser", False):
        return Role.ADMIN
    cached = getattr(user, "_lazaretto_role", None)
    if cached is None:
        names = getattr(user, "groups").values_list("name", flat=True)  # noqa: B009
        cached = max((GROUP_ROLES.get(name, Role.NONE) for name in names), default=Role.NONE)
        # Cached on the user object, which lives for one request.
        setattr(user, "_lazaretto_role", cached)  # noqa: B010
    return Role(cached)


def role_context(request: HttpRequest) -> dict[str, Any]:
    """What every page may show: the user's installation-wide role, whether
    they operate or administer some queue (a queue's or a message's page
    says for that one), and whether they administer the installation."""
    from console.access import request_access  # console.access imports this module

    access = request_access(request)
    return {
        "role": user_role(request.user),
        "can_operate": access.anywhere(Role.OPERATOR),
        "can_admin": access.anywhere(Role.ADMIN),
        "can_admin_installation": access.on_installation >= Role.ADMIN,
    }


class HasRole(BasePermission):
    """Reads need viewer; writes need the view's ``write_role`` (operator by
    default), on some queue at least: the queues each request acts on then
    decide (console.access). Set ``read_role`` or ``write_role`` on a view
    to change that, and ``installation_wide`` on one that acts on no queue
    (the HA pair), or ``installation_wide_writes`` on one whose writes act
    on none (topics): its role must then be held on every queue."""

    message = "Your role does not allow this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        needed = (
            getattr(view, "read_role", Role.VIEWER)
            if request.method in SAFE_METHODS
            else getattr(view, "write_role", Role.OPERATOR)
        )
        from console.access import request_access  # console.access imports this module

        access = request_access(request)
        if getattr(view, "installation_wide", False) or (
            request.method not in SAFE_METHODS and getattr(view, "installation_wide_writes", False)
        ):
            return access.on_installation >= needed
        # A path that names a queue, a message, a job…: the view's check on
        # it decides, so one the caller may not see is not there (404).
        return access.anywhere(Role.VIEWER if getattr(view, "kwargs", None) else needed)
