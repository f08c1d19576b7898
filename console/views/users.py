"""Users (admins only): every user with their role, a form that makes one,
and per user a role change and a deactivation. The services are those of
``manage.py user`` (console.users); each change is an audit event by the
admin, and no change may leave the instance without an active admin."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods, require_POST

from console.roles import Role
from console.users import (
    NAME_MAX_LENGTH,
    ROLES,
    user_create,
    user_deactivate,
    user_set_role,
    users_list,
)
from console.views.common import HtmxHttpRequest, page, role_required, service_errors

ROLE_CHOICES = [(role, role) for role in ROLES]


class UserForm(forms.Form):
    name = forms.CharField(max_length=NAME_MAX_LENGTH, label="User name")
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial="viewer")
    password = forms.CharField(widget=forms.PasswordInput, strip=False)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLE_CHOICES)


def _page(request: HtmxHttpRequest, form: UserForm) -> HttpResponse:
    return page(
        request,
        "console/users.html",
        "users",
        {"users": users_list(), "form": form, "roles": ROLES},
    )


@require_http_methods(["GET", "POST"])
@role_required(Role.ADMIN)
def users(request: HtmxHttpRequest) -> HttpResponse:
    form = UserForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with service_errors(request, form=form) as outcome:
            user_create(**form.cleaned_data, actor=request.user)
            messages.success(
                request, f"User {form.cleaned_data['name']} created as {form.cleaned_data['role']}."
            )
        if outcome.ok:
            return _page(request, UserForm())
    return _page(request, form)


@require_POST
@role_required(Role.ADMIN)
def user_role_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Choose one of {', '.join(ROLES)}.")
    else:
        with service_errors(request):
            user_set_role(name=name, role=form.cleaned_data["role"], actor=request.user)
            messages.success(request, f"{name} is now {form.cleaned_data['role']}.")
    return _page(request, UserForm()) if request.htmx else redirect("users")


@require_POST
@role_required(Role.ADMIN)
def user_deactivate_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    with service_errors(request):
        user_deactivate(name=name, actor=request.user)
        messages.success(request, f"{name} is deactivated: their sessions and tokens stop.")
    return _page(request, UserForm()) if request.htmx else redirect("users")
