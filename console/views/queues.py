"""A queue's page: depth and limit, pause and resume, purge, its settings and
its limits."""

from __future__ import annotations

from functools import partial

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.errors import BrokerError
from broker.models import MessageState, Queue
from broker.selectors import QueueSummary, queue_depths
from broker.services.queues import queue_get, queue_pause, queue_purge, queue_update
from console.forms import PurgeForm, QueueLimitsForm, QueueSettingsForm, add_service_errors
from console.roles import Role
from console.views.common import (
    HtmxHttpRequest,
    form_saved,
    found,
    page,
    prefilled_form,
    role_required,
)


@require_GET
@role_required(Role.VIEWER)
def queue_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = found(queue_get, name=name)
    return _queue_page(request, queue)


def _queue_page(
    request: HtmxHttpRequest,
    queue: Queue,
    settings_form: QueueSettingsForm | None = None,
    purge_form: PurgeForm | None = None,
) -> HttpResponse:
    summary = QueueSummary(queue=queue, depth=queue_depths(queue_ids=[queue.id])[queue.id])
    context = {
        "summary": summary,
        "queue": queue,
        "states": MessageState.values,
        "settings_form": settings_form
        or QueueSettingsForm(instance=Queue.objects.get(pk=queue.pk)),
        "purge_form": purge_form or PurgeForm(),
    }
    return page(request, "console/queue.html", "queue-panel", context)


@require_POST
@role_required(Role.ADMIN)
def queue_settings(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = found(queue_get, name=name)
    # The form works on its own copy so the service still sees what changed.
    form = QueueSettingsForm(request.POST, instance=Queue.objects.get(pk=queue.pk))
    save = partial(queue_update, queue=queue, actor=request.user)
    if form_saved(request, form, save, f"Settings of {name} saved.") and not request.htmx:
        return redirect("queue", name=name)
    return _queue_page(request, queue, settings_form=form if form.errors else None)


@require_POST
@role_required(Role.OPERATOR)
def queue_pause_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = found(queue_get, name=name)
    paused = request.POST.get("paused") == "1"
    queue_pause(queue=queue, paused=paused, actor=request.user)
    messages.success(request, f"{name} {'paused' if paused else 'resumed'}.")
    return redirect("queue", name=name) if not request.htmx else _queue_page(request, queue)


@require_POST
@role_required(Role.OPERATOR)
def queue_purge_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = found(queue_get, name=name)
    form = PurgeForm(request.POST)
    if form.is_valid():
        try:
            deleted = queue_purge(
                queue=queue, confirmation=form.cleaned_data["confirmation"], actor=request.user
            )
        except BrokerError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Purged {deleted} waiting message(s) from {name}.")
            return redirect("queue", name=name) if not request.htmx else _queue_page(request, queue)
    return _queue_page(request, queue, purge_form=form)


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def queue_limits(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = found(queue_get, name=name)
    form = prefilled_form(QueueLimitsForm, request, queue)
    save = partial(queue_update, queue=queue, actor=request.user)
    if form_saved(request, form, save, f"Limits of {name} saved.") and not request.htmx:
        return redirect("queue-limits", name=name)
    summary = QueueSummary(queue=queue, depth=queue_depths(queue_ids=[queue.id])[queue.id])
    return page(
        request, "console/queue_limits.html", "limits-form", {"summary": summary, "form": form}
    )
