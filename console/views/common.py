"""What every console view shares: the typed request, the page-or-partial
renderer, one role check, one not-found path, and one way to show a broker
error to the operator."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.messages.storage.base import Message
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views import defaults
from django_htmx.middleware import HtmxDetails

from broker.errors import BrokerError, NotFound
from broker.ha.guard import refusal
from console.access import request_access
from console.api.errors import DATABASE_ERRORS, error_body, not_found_json
from console.roles import Role


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


View = Callable[..., HttpResponseBase]
T = TypeVar("T")
F = TypeVar("F", bound=forms.Form)


# --- roles --------------------------------------------------------------------


def require_role(request: HttpRequest, role: Role) -> None:
    """Refuse (403) a user who holds ``role`` on no queue. The one role
    check of a page: the ``role_required`` decorator calls it, and so does a
    view whose POST needs more than its GET; the queues the page acts on
    then decide (console.access)."""
    if not request_access(request).anywhere(role):
        raise PermissionDenied(f"This needs the {role.label} role.")


def require_everywhere(request: HttpRequest, role: Role) -> None:
    """Refuse (403) a user who does not hold ``role`` on every queue: for
    what belongs to the whole installation (users, the HA pair, topics)."""
    if request_access(request).on_installation < role:
        raise PermissionDenied(f"This needs the {role.label} role on the whole installation.")


def role_required(role: Role, *, installation_wide: bool = False) -> Callable[[View], View]:
    """Login, then ``require_role(role)`` (``require_everywhere`` for a page
    of the whole installation)."""
    check = require_everywhere if installation_wide else require_role

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            # A path that names a queue, a message, a job…: the view's check
            # on it decides, so one the caller may not see is not there (404).
            check(request, Role.VIEWER if kwargs and not installation_wide else role)
            return view(request, *args, **kwargs)

        return login_required(wrapped)

    return decorate


# --- not found ----------------------------------------------------------------


def found(getter: Callable[..., T], /, **kwargs: Any) -> T:
    """``getter(**kwargs)``, a selector or service getter, or the 404 page
    when what it looks for does not exist (any ``broker.errors.NotFound``)."""
    try:
        return getter(**kwargs)
    except NotFound as error:
        raise Http404(error.detail) from None


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler404: JSON under /api/, else the 404 page with what was missing."""
    if request.path.startswith("/api/"):
        return not_found_json(request, exception)
    # Http404(detail) from found(); a URL that resolves nowhere carries a dict.
    detail = exception.args[0] if exception is not None and exception.args else ""
    context = {"detail": detail if isinstance(detail, str) else ""}
    return render(request, "404.html", context, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: the error body under /api/, else Django's plain 500 page."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            error_body("server_error", "The server failed to answer; the error is logged."),
            status=500,
        )
    return defaults.server_error(request)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400 (e.g. a request for a host not in ALLOWED_HOSTS)."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("bad_request", "The request is not valid."), status=400)
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler403 for pages outside DRF (DRF answers its own 403s)."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("permission_denied", "You may not do this."), status=403)
    return defaults.permission_denied(request, exception)


# --- broker errors --------------------------------------------------------------


@dataclass
class Outcome:
    """How the service calls inside ``service_errors`` went."""

    ok: bool = True
    error: BrokerError | None = None


@contextmanager
def service_errors(
    request: HttpRequest, *, form: forms.BaseForm | None = None, field: str | None = None
) -> Iterator[Outcome]:
    """The one way a view shows a ``BrokerError`` raised by the service calls
    in its ``with`` block: the block stops there, ``outcome.ok`` turns False,
    and the error goes beside the fields of ``form`` it names (errors naming
    no field of the form go beside ``field``, else above the form), or,
    without a form, to the flash area. A write the store's HA guard refused
    (split brain, a standby synchronising) is shown the same way, as the
    broker error it stands for. Anything else propagates.

        with service_errors(request, form=form):
            queue_purge(queue=queue, confirmation=..., actor=request.user)
            messages.success(request, "Purged.")
            return redirect("queue", name=queue.name)
        return render(...)  # the form, with the error beside its field
    """
    outcome = Outcome()
    try:
        yield outcome
    except (BrokerError, *DATABASE_ERRORS) as raised:
        error = raised if isinstance(raised, BrokerError) else refusal(raised)
        if error is None:
            raise
        outcome.ok, outcome.error = False, error
        if form is None:
            messages.error(request, error.detail)
        else:
            _add_to_form(form, error, fallback=field)


def _add_to_form(form: forms.BaseForm, error: BrokerError, *, fallback: str | None) -> None:
    """``error`` beside the fields it names, the rest beside ``fallback`` (or
    above the form)."""
    default = fallback if fallback in form.fields else None
    if not error.field_errors:
        form.add_error(default, error.detail)
    for name, problems in error.field_errors.items():
        target = name if name in form.fields else default
        for problem in problems:
            form.add_error(target, problem)


def flashed(request: HttpRequest) -> list[Message]:
    """The flash messages waiting for this request, consumed: for an answer
    that shows them in place (a table row swapped in by htmx) rather than on
    the next page."""
    return list(messages.get_messages(request))


# --- rendering and forms --------------------------------------------------------


def page(
    request: HtmxHttpRequest, template: str, region: str, context: dict[str, Any]
) -> HttpResponse:
    """The whole page, or only ``region`` when htmx asks."""
    return render(request, f"{template}#{region}" if request.htmx else template, context)


def back(request: HttpRequest, default: str) -> str:
    """Where a plain post goes back to: its ``next`` field when that stays on
    this site, else ``default`` (a URL name or path)."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return default


def prefilled_form(form_class: type[F], request: HttpRequest, instance: object) -> F:
    """A form bound to the POST, or showing ``instance``'s current values."""
    initial = {name: getattr(instance, name) for name in form_class.base_fields}
    return form_class(request.POST or None, initial=initial)


def form_saved(
    request: HttpRequest, form: forms.BaseForm, save: Callable[..., object], done: str
) -> bool:
    """For an admin's POST: save the form's data through the service ``save``
    and say ``done`` (formatted with the data); service errors go beside the
    fields. A GET saves nothing; anyone else's POST is refused."""
    if request.method != "POST":
        return False
    require_role(request, Role.ADMIN)
    if not form.is_valid():
        return False
    with service_errors(request, form=form) as outcome:
        save(**form.cleaned_data)
        messages.success(request, done.format(**form.cleaned_data))
    return outcome.ok
