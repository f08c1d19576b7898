"""The operator console's pages. Views stay thin: a selector for the data, a
form for input, a broker service for every change, and the page's named
partial for htmx swaps. Every form also works as a plain post."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial, wraps
from typing import Any, TypeVar

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.middleware import HtmxDetails

from broker.errors import BrokerError, QueueNotFound, SubscriptionNotFound
from broker.models import MessageState, Queue, Topic
from broker.selectors import (
    QueueSummary,
    heartbeats,
    last_hour,
    queue_depths,
    queue_summaries,
    subscription_summaries,
)
from broker.services.queues import queue_get, queue_pause, queue_purge, queue_update
from broker.services.topics import (
    subscription_create,
    subscription_delete,
    subscription_get,
    subscription_update,
    topic_create,
)
from console.api.errors import not_found_json
from console.charts import rate_chart
from console.forms import (
    PurgeForm,
    QueueLimitsForm,
    QueueSettingsForm,
    SubscriptionEditForm,
    SubscriptionForm,
    TopicForm,
    add_service_errors,
)
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


def _found(getter: Callable[..., T], **kwargs: Any) -> T:
    """What ``getter`` finds, or a 404 page."""
    try:
        return getter(**kwargs)
    except (QueueNotFound, SubscriptionNotFound) as error:
        raise Http404(error.detail) from None


def _page(
    request: HtmxHttpRequest, template: str, region: str, context: dict[str, Any]
) -> HttpResponse:
    """The whole page, or only ``region`` when htmx asks."""
    return render(request, f"{template}#{region}" if request.htmx else template, context)


# A Celery queue whose last task is older than this is shown as not answering.
HEALTHY_WITHIN = {"control": 10.0, "deliveries": 30.0}


@require_GET
@role_required(Role.VIEWER)
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    summaries = queue_summaries(by_kind=True)
    beats = heartbeats()
    context = {
        "summaries": summaries,
        "states": MessageState.values,
        "blacklisted": sum(s.depth[MessageState.NOT_DELIVERABLE] for s in summaries),
        "dead_lettered": sum(
            s.depth[MessageState.TO_BE_DELIVERED] for s in summaries if s.queue.is_dead_letter
        ),
        "chart": rate_chart(last_hour()),
        "workers": [
            {"name": name, "age": beats.get(name), "healthy": beats.get(name, 1e9) <= limit}
            for name, limit in HEALTHY_WITHIN.items()
        ],
    }
    return _page(request, "console/dashboard.html", "queue-table", context)


def _topics_page(
    request: HtmxHttpRequest,
    topic_form: TopicForm | None = None,
    subscription_form: SubscriptionForm | None = None,
) -> HttpResponse:
    return _page(
        request,
        "console/topics.html",
        "topics",
        {
            "topics": Topic.objects.order_by("name"),
            "subscriptions": subscription_summaries(),
            "topic_form": topic_form or TopicForm(),
            "subscription_form": subscription_form or SubscriptionForm(),
        },
    )


@require_GET
@role_required(Role.VIEWER)
def topics(request: HtmxHttpRequest) -> HttpResponse:
    return _topics_page(request)


def _settings_form(form_class: type[F], request: HttpRequest, instance: object) -> F:
    """A form bound to the POST, or showing ``instance``'s current values."""
    initial = {name: getattr(instance, name) for name in form_class.base_fields}
    return form_class(request.POST or None, initial=initial)


def _saved(
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


@require_POST
@role_required(Role.ADMIN)
def topic_new(request: HtmxHttpRequest) -> HttpResponse:
    form = TopicForm(request.POST)
    save = partial(topic_create, actor=request.user)
    if _saved(request, form, save, "Topic {name} created.") and not request.htmx:
        return redirect("topics")
    return _topics_page(request, topic_form=form if form.errors else None)


def _subscribe(actor: Any, queue: str, **fields: Any) -> object:
    return subscription_create(actor=actor, queue_name=queue, **fields)


@require_POST
@role_required(Role.ADMIN)
def subscription_new(request: HtmxHttpRequest) -> HttpResponse:
    form = SubscriptionForm(request.POST)
    save = partial(_subscribe, request.user)
    if _saved(request, form, save, "Subscription {name} created.") and not request.htmx:
        return redirect("topics")
    return _topics_page(request, subscription_form=form if form.errors else None)


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def subscription_edit(request: HtmxHttpRequest, name: str) -> HttpResponse:
    subscription = _found(subscription_get, name=name)
    form = _settings_form(SubscriptionEditForm, request, subscription)
    save = partial(subscription_update, subscription=subscription, actor=request.user)
    if _saved(request, form, save, f"Subscription {name} saved.") and not request.htmx:
        return redirect("subscription-edit", name=name)
    return _page(
        request,
        "console/subscription.html",
        "subscription-form",
        {"subscription": subscription, "form": form},
    )


@require_POST
@role_required(Role.ADMIN)
def subscription_remove(request: HttpRequest, name: str) -> HttpResponse:
    subscription_delete(subscription=_found(subscription_get, name=name), actor=request.user)
    messages.success(request, f"Subscription {name} deleted; its queue and messages stay.")
    return redirect("topics")


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def queue_limits(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _found(queue_get, name=name)
    form = _settings_form(QueueLimitsForm, request, queue)
    save = partial(queue_update, queue=queue, actor=request.user)
    if _saved(request, form, save, f"Limits of {name} saved.") and not request.htmx:
        return redirect("queue-limits", name=name)
    summary = QueueSummary(queue=queue, depth=queue_depths(queue_ids=[queue.id])[queue.id])
    return _page(
        request, "console/queue_limits.html", "limits-form", {"summary": summary, "form": form}
    )


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return not_found_json(request, exception)
    return render(request, "404.html", status=404)


@require_GET
@role_required(Role.VIEWER)
def queue_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _found(queue_get, name=name)
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
    return _page(request, "console/queue.html", "queue-panel", context)


@require_POST
@role_required(Role.ADMIN)
def queue_settings(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _found(queue_get, name=name)
    # The form works on its own copy so the service still sees what changed.
    form = QueueSettingsForm(request.POST, instance=Queue.objects.get(pk=queue.pk))
    save = partial(queue_update, queue=queue, actor=request.user)
    if _saved(request, form, save, f"Settings of {name} saved.") and not request.htmx:
        return redirect("queue", name=name)
    return _queue_page(request, queue, settings_form=form if form.errors else None)


@require_POST
@role_required(Role.OPERATOR)
def queue_pause_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _found(queue_get, name=name)
    paused = request.POST.get("paused") == "1"
    queue_pause(queue=queue, paused=paused, actor=request.user)
    messages.success(request, f"{name} {'paused' if paused else 'resumed'}.")
    return redirect("queue", name=name) if not request.htmx else _queue_page(request, queue)


@require_POST
@role_required(Role.OPERATOR)
def queue_purge_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _found(queue_get, name=name)
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
