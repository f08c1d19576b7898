"""What every console view shares: the typed request, the page-or-partial
renderer, role checks, the 404 page, and the helpers that turn broker
errors into something the operator sees."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django_htmx.middleware import HtmxDetails

from broker.errors import BrokerError, QueueNotFound, SubscriptionNotFound
from console.api.errors import not_found_json
from console.forms import add_service_errors
from console.roles import Role, user_role


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


View = Callable[..., HttpResponseBase]
T = TypeVar("T")
F = TypeVar("F", bound=forms.Form)


def role_required(role: Role) -> Callable[[View], View]:
    """Login, then at least ``role``; anything less is 403."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if user_role(request.user) < role:
                raise PermissionDenied("Your role does not allow this.")
            return view(request, *args, **kwargs)

        return login_required(wrapped)

    return decorate


def found(getter: Callable[..., T], **kwargs: Any) -> T:
    """What ``getter`` finds, or a 404 page."""
    try:
        return getter(**kwargs)
    except (QueueNotFound, SubscriptionNotFound) as error:
        raise Http404(error.detail) from None


def page(
    request: HtmxHttpRequest, template: str, region: str, context: dict[str, Any]
) -> HttpResponse:
    """The whole page, or only ``region`` when htmx asks."""
    return render(request, f"{template}#{region}" if request.htmx else template, context)


def prefilled_form(form_class: type[F], request: HttpRequest, instance: object) -> F:
    """A form bound to the POST, or showing ``instance``'s current values."""
    initial = {name: getattr(instance, name) for name in form_class.base_fields}
    return form_class(request.POST or None, initial=initial)


def form_saved(
    request: HttpRequest, form: forms.BaseForm, save: Callable[..., object], done: str
) -> bool:
    """For an admin's POST: save the form's data through the service ``save``
    and say ``done`` (formatted with the data); service errors go beside the
    fields. Anyone else's POST is refused."""
    if request.method != "POST":
        return False
    if user_role(request.user) < Role.ADMIN:
        raise PermissionDenied("Only admins change this.")
    if not form.is_valid():
        return False
    try:
        save(**form.cleaned_data)
    except BrokerError as error:
        add_service_errors(form, error)
        return False
    messages.success(request, done.format(**form.cleaned_data))
    return True


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return not_found_json(request, exception)
    return render(request, "404.html", status=404)
