"""A queue's page: depth and limit, its charts and alerts, pause and resume,
purge, publish a test message, its settings and its limits."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.activity import Window, queue_activity
from broker.models import MessageState, Queue
from broker.selectors import queue_alerts, queue_summary
from broker.services.publish import messages_publish
from broker.services.queues import queue_pause, queue_purge, queue_update
from console.access import queue_held, request_access
from console.charts import activity_charts
from console.forms import PublishForm, PurgeForm, QueueLimitsForm, QueueSettingsForm
from console.roles import Role
from console.views.common import (
    HtmxHttpRequest,
    form_saved,
    found,
    page,
    prefilled_form,
    role_required,
    service_errors,
)


@require_GET
@role_required(Role.VIEWER)
def queue_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    return _queue_page(request, _held(request, Role.VIEWER, name))


def _held(request: HttpRequest, role: Role, name: str) -> Queue:
    """The queue, when the caller holds ``role`` on it; else the 404 page
    (a queue they may not see) or the 403 page."""
    return found(queue_held, request=request, role=role, name=name)


def _settings_form(request: HttpRequest, queue: Queue, data: Any = None) -> QueueSettingsForm:
    """The settings form, offering the dead-letter queues the caller sees."""
    form = QueueSettingsForm(data, instance=queue)
    within = request_access(request).queues(Role.VIEWER)
    if within is not None:
        field = form.fields["dead_letter_queue"]
        field.queryset = field.queryset.filter(within)  # type: ignore[attr-defined]
    return form


def _queue_page(
    request: HtmxHttpRequest,
    queue: Queue,
    settings_form: QueueSettingsForm | None = None,
    purge_form: PurgeForm | None = None,
    publish_form: PublishForm | None = None,
) -> HttpResponse:
    access = request_access(request)
    context = {
        **_activity_context(request, queue),
        "summary": queue_summary(queue=queue),
        "alerts": queue_alerts(queue=queue),
        "queue": queue,
        "states": MessageState.values,
        # This queue's, over the page-wide ones of console.roles.role_context.
        "can_operate": access.may(Role.OPERATOR, queue.name),
        "can_admin": access.may(Role.ADMIN, queue.name),
        "settings_form": settings_form or _settings_form(request, queue),
        "purge_form": purge_form or PurgeForm(),
        "publish_form": publish_form or PublishForm(),
    }
    return page(request, "console/queue.html", "queue-panel", context)


@require_GET
@role_required(Role.VIEWER)
def queue_activity_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """The queue page's charts alone, over the window asked for."""
    queue = _held(request, Role.VIEWER, name)
    context = {"queue": queue, **_activity_context(request, queue)}
    return render(request, "console/queue.html#queue-activity", context)


def _activity_context(request: HtmxHttpRequest, queue: Queue) -> dict[str, object]:
    """The charts over ``?window=`` (the last hour by default)."""
    label = request.GET.get("window", Window.HOUR.label)
    window = Window.named(label)
    if window is None:
        choices = " or ".join(each.label for each in Window)
        raise Http404(f"There is no chart window {label!r}: choose {choices}.")
    activity = queue_activity(queue=queue, window=window)
    return {"window": window, "windows": list(Window), "charts": activity_charts(activity, queue)}


@require_POST
@role_required(Role.ADMIN)
def queue_settings(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _held(request, Role.ADMIN, name)
    # The form works on its own copy so the service still sees what changed.
    form = _settings_form(request, _held(request, Role.ADMIN, name), request.POST)
    save = partial(queue_update, queue=queue, actor=request.user)
    if form_saved(request, form, save, f"Settings of {name} saved.") and not request.htmx:
        return redirect("queue", name=name)
    return _queue_page(request, queue, settings_form=form if form.errors else None)


@require_POST
@role_required(Role.OPERATOR)
def queue_pause_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _held(request, Role.OPERATOR, name)
    paused = request.POST.get("paused") == "1"
    with service_errors(request):
        queue_pause(queue=queue, paused=paused, actor=request.user)
        messages.success(request, f"{name} {'paused' if paused else 'resumed'}.")
    return _queue_page(request, queue) if request.htmx else redirect("queue", name=name)


@require_POST
@role_required(Role.OPERATOR)
def queue_purge_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _held(request, Role.OPERATOR, name)
    form = PurgeForm(request.POST)
    if form.is_valid():
        with service_errors(request, form=form):
            deleted = queue_purge(
                queue=queue, confirmation=form.cleaned_data["confirmation"], actor=request.user
            )
            messages.success(request, f"Purged {deleted} waiting message(s) from {name}.")
            return _queue_page(request, queue) if request.htmx else redirect("queue", name=name)
    return _queue_page(request, queue, purge_form=form)


@require_POST
@role_required(Role.OPERATOR)
def queue_publish_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Publish one test message as the signed-in user, application
    "console"; a message the publish service refuses (too large, the queue
    full) writes nothing and shows why beside the form's fields."""
    queue = _held(request, Role.OPERATOR, name)
    form = PublishForm(request.POST)
    if form.is_valid():
        with service_errors(request, form=form, field="payload"):
            [message_id] = messages_publish(
                queue_name=queue.name,
                messages=[form.new_message()],
                put_user=request.user.get_username(),
                put_application="console",
            )
            messages.success(request, f"Published message {message_id} to {name}.")
            return _queue_page(request, queue) if request.htmx else redirect("queue", name=name)
    return _queue_page(request, queue, publish_form=form)


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def queue_limits(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Everyone sees a queue's limits; admins change them."""
    queue = _held(request, Role.ADMIN if request.method == "POST" else Role.VIEWER, name)
    form = prefilled_form(QueueLimitsForm, request, queue)
    save = partial(queue_update, queue=queue, actor=request.user)
    if form_saved(request, form, save, f"Limits of {name} saved.") and not request.htmx:
        return redirect("queue-limits", name=name)
    context = {"summary": queue_summary(queue=queue), "form": form}
    return page(request, "console/queue_limits.html", "limits-form", context)
