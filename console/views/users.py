"""Users, groups and grants (admins of the installation only): every user
with their installation-wide role (or none), a form that makes one, per user
a role change and a deactivation; every grant (a role on the queues a
pattern matches, to a user or a group) with a form that adds one; the groups
with their members. The services are those of ``manage.py user``,
``grant`` and ``group`` (console.users, console.grants); each change is an
audit event by the admin, and no change may leave the instance without an
active admin."""

from __future__ import annotations

from functools import partial

from django import forms
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods, require_POST

from console.grants import (
    GROUP_NAME_MAX_LENGTH,
    Grantee,
    grant_add,
    grant_remove,
    grants_list,
    group_add_member,
    group_create,
    group_delete,
    group_remove_member,
    groups_list,
)
from console.models import QUEUE_PATTERN_MAX_LENGTH
from console.roles import GROUP_ROLES, Role
from console.users import (
    NAME_MAX_LENGTH,
    ROLES,
    user_create,
    user_deactivate,
    user_set_role,
    users_list,
)
from console.views.common import (
    HtmxHttpRequest,
    form_saved,
    page,
    role_required,
    service_errors,
)

ROLE_CHOICES = [(role, role) for role in ROLES]


class UserForm(forms.Form):
    name = forms.CharField(max_length=NAME_MAX_LENGTH, label="User name")
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial="viewer")
    password = forms.CharField(widget=forms.PasswordInput, strip=False)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLE_CHOICES)


class GrantForm(forms.Form):
    pattern = forms.CharField(
        max_length=QUEUE_PATTERN_MAX_LENGTH,
        help_text="A queue name, or a pattern with * and ?, e.g. ORDERS.*",
    )
    role = forms.ChoiceField(choices=[(role, role) for role in GROUP_ROLES], initial="viewer")
    user = forms.CharField(max_length=NAME_MAX_LENGTH, required=False, help_text="A user…")
    group = forms.CharField(max_length=NAME_MAX_LENGTH, required=False, help_text="…or a group")


class GroupForm(forms.Form):
    name = forms.CharField(max_length=GROUP_NAME_MAX_LENGTH, label="Group name")


class MemberForm(forms.Form):
    user = forms.CharField(max_length=NAME_MAX_LENGTH)


def _page(
    request: HtmxHttpRequest, form: UserForm, grant_form: GrantForm | None = None
) -> HttpResponse:
    context = {
        "users": users_list(),
        "form": form,
        "roles": ROLES,
        "grants": grants_list(),
        "grant_form": grant_form or GrantForm(),
    }
    return page(request, "console/users.html", "users", context)


@require_http_methods(["GET", "POST"])
@role_required(Role.ADMIN, installation_wide=True)
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
@role_required(Role.ADMIN, installation_wide=True)
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
@role_required(Role.ADMIN, installation_wide=True)
def user_deactivate_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    with service_errors(request):
        user_deactivate(name=name, actor=request.user)
        messages.success(request, f"{name} is deactivated: their sessions and tokens stop.")
    return _page(request, UserForm()) if request.htmx else redirect("users")


@require_POST
@role_required(Role.ADMIN, installation_wide=True)
def grant_new(request: HtmxHttpRequest) -> HttpResponse:
    form = GrantForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        with service_errors(request, form=form) as outcome:
            grant_add(
                pattern=data["pattern"],
                role=data["role"],
                to=Grantee(user=data["user"], group=data["group"]),
                actor=request.user,
            )
            whom = data["user"] or data["group"]
            messages.success(request, f"{whom} holds {data['role']} on {data['pattern']}.")
        if outcome.ok:
            form = GrantForm()
    if not request.htmx and not form.errors:
        return redirect("users")
    return _page(request, UserForm(), form)


@require_POST
@role_required(Role.ADMIN, installation_wide=True)
def grant_remove_view(request: HtmxHttpRequest, grant_id: int) -> HttpResponse:
    with service_errors(request):
        grant_remove(grant_id=grant_id, actor=request.user)
        messages.success(request, f"Grant {grant_id} removed.")
    return _page(request, UserForm()) if request.htmx else redirect("users")


def _groups_page(request: HtmxHttpRequest, form: GroupForm | None = None) -> HttpResponse:
    context = {"groups": groups_list(), "form": form or GroupForm(), "member_form": MemberForm()}
    return page(request, "console/groups.html", "groups", context)


@require_http_methods(["GET", "POST"])
@role_required(Role.ADMIN, installation_wide=True)
def groups(request: HtmxHttpRequest) -> HttpResponse:
    form = GroupForm(request.POST or None)
    save = partial(group_create, actor=request.user)
    if form_saved(request, form, save, "Group {name} created."):
        form = GroupForm()
    return _groups_page(request, form)


@require_POST
@role_required(Role.ADMIN, installation_wide=True)
def group_member_view(request: HtmxHttpRequest, name: str, verb: str) -> HttpResponse:
    """Add a member (``verb`` add) or take one out (remove)."""
    form = MemberForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Name a user.")
    else:
        user = form.cleaned_data["user"]
        with service_errors(request):
            if verb == "add":
                group_add_member(name=name, user=user, actor=request.user)
                messages.success(request, f"{user} is a member of {name}.")
            else:
                group_remove_member(name=name, user=user, actor=request.user)
                messages.success(request, f"{user} is no longer a member of {name}.")
    return _groups_page(request) if request.htmx else redirect("groups")


@require_POST
@role_required(Role.ADMIN, installation_wide=True)
def group_delete_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    with service_errors(request):
        group_delete(name=name, actor=request.user)
        messages.success(request, f"Group {name} deleted, with its grants; its members stay.")
    return _groups_page(request) if request.htmx else redirect("groups")
