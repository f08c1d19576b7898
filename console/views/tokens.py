"""API tokens: each user's list, the form that makes one (its key shown
once, on the answer to that form), and revoke."""

from __future__ import annotations

from typing import cast

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import redirect
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_http_methods, require_POST

from console.models import QUEUE_PATTERN_MAX_LENGTH, TOKEN_NAME_MAX_LENGTH
from console.roles import GROUP_ROLES, Role
from console.tokens import token_create, token_get, token_revoke, tokens_of
from console.views.common import HtmxHttpRequest, found, page, role_required, service_errors


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=TOKEN_NAME_MAX_LENGTH, help_text="What will use it, e.g. billing-exporter."
    )
    only_pattern = forms.CharField(
        max_length=QUEUE_PATTERN_MAX_LENGTH,
        required=False,
        label="Only the queues",
        help_text="A queue name or a pattern such as ORDERS.*; blank: all of yours.",
    )
    at_most = forms.ChoiceField(
        choices=[("", "your role"), *((role, role) for role in GROUP_ROLES)],
        required=False,
        label="At most",
        help_text="A role no higher than yours there.",
    )


def _page(request: HtmxHttpRequest, form: TokenForm, key: str = "") -> HttpResponse:
    user = cast(User, request.user)
    context = {"tokens": tokens_of(user=user), "form": form, "new_key": key}
    response = page(request, "console/tokens.html", "tokens", context)
    if key:
        patch_cache_control(response, no_store=True)
    return response


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def tokens(request: HtmxHttpRequest) -> HttpResponse:
    """Any signed-in user manages their own tokens; a token acts with its
    user's role. An admin sees and revokes everyone's."""
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with service_errors(request, form=form) as outcome:
            token, key = token_create(user=cast(User, request.user), **form.cleaned_data)
            messages.success(
                request, f"Token {token.name} created. Copy its key now: it is not shown again."
            )
        if outcome.ok:
            return _page(request, TokenForm(), key)
    return _page(request, form)


@require_POST
@role_required(Role.VIEWER)
def token_revoke_view(request: HtmxHttpRequest, token_id: int) -> HttpResponse:
    token = found(token_get, token_id=token_id, user=cast(User, request.user))
    token_revoke(token=token, actor=request.user)
    messages.success(request, f"Token {token.name} revoked.")
    if request.htmx:
        return _page(request, TokenForm())
    return redirect("tokens")
