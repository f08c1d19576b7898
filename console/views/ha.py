"""The HA pair: its epoch and primary, both nodes, what the store refuses
now, the pair's history and the exports of diverged messages. Admins switch
the roles over, pick the survivor of a split brain and publish diverged
messages again."""

from __future__ import annotations

from typing import cast

from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from broker.ha.admin import ha_overview, ha_resolve, ha_switchover, node_addresses
from broker.ha.diverged import diverged_get, diverged_republish
from console.forms import ResolveForm
from console.roles import Role
from console.views.common import HtmxHttpRequest, found, page, role_required, service_errors


def _ha_page(request: HtmxHttpRequest, resolve_form: ResolveForm | None = None) -> HttpResponse:
    context = {"overview": ha_overview(), "resolve_form": resolve_form or ResolveForm()}
    return page(request, "console/ha.html", "ha-status", context)


def _done(request: HtmxHttpRequest) -> HttpResponse:
    return _ha_page(request) if request.htmx else redirect("ha")


@require_GET
@role_required(Role.VIEWER, installation_wide=True)
def ha(request: HtmxHttpRequest) -> HttpResponse:
    return _ha_page(request)


@require_POST
@role_required(Role.ADMIN, installation_wide=True)
def ha_switchover_view(request: HtmxHttpRequest) -> HttpResponse:
    with service_errors(request):
        ha_switchover(actor=cast(User, request.user), addresses=node_addresses())
        messages.success(
            request, "Switchover requested: the primary hands over to its synchronised standby."
        )
    return _done(request)


@require_POST
@role_required(Role.ADMIN, installation_wide=True)
def ha_resolve_view(request: HtmxHttpRequest) -> HttpResponse:
    form = ResolveForm(request.POST)
    if form.is_valid():
        primary = form.cleaned_data["primary"]
        with service_errors(request, form=form, field="primary") as outcome:
            ha_resolve(primary=primary, actor=cast(User, request.user), addresses=node_addresses())
            messages.success(
                request,
                f"{primary} is kept as primary; the other node exports what only it had "
                "and rejoins as standby.",
            )
        if outcome.ok:
            return _done(request)
    return _ha_page(request, resolve_form=form)


@require_POST
@role_required(Role.ADMIN, installation_wide=True)
def ha_republish_view(request: HtmxHttpRequest, export_id: int) -> HttpResponse:
    export = found(diverged_get, export_id=export_id)
    with service_errors(request):
        published = diverged_republish(export_id=export.id, actor=cast(User, request.user))
        messages.success(
            request, f"{published} diverged message(s) of {export.node} published again."
        )
    return _done(request)
