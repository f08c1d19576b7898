"""Topics and subscriptions: the list, the forms that create them, a
subscription's edit page."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.selectors import subscription_summaries, topic_list
from broker.services.topics import (
    subscription_create,
    subscription_delete,
    subscription_update,
    topic_create,
)
from console.access import request_access, subscription_held
from console.forms import SubscriptionEditForm, SubscriptionForm, TopicForm
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


def _topics_page(
    request: HtmxHttpRequest,
    topic_form: TopicForm | None = None,
    subscription_form: SubscriptionForm | None = None,
) -> HttpResponse:
    context = {
        "topics": topic_list(),
        "subscriptions": subscription_summaries(
            within=request_access(request).queues(Role.VIEWER, field="queue__name")
        ),
        "topic_form": topic_form or TopicForm(),
        "subscription_form": subscription_form or SubscriptionForm(),
    }
    return page(request, "console/topics.html", "topics", context)


@require_GET
@role_required(Role.VIEWER)
def topics(request: HtmxHttpRequest) -> HttpResponse:
    return _topics_page(request)


@require_POST
@role_required(Role.ADMIN, installation_wide=True)
def topic_new(request: HtmxHttpRequest) -> HttpResponse:
    form = TopicForm(request.POST)
    save = partial(topic_create, actor=request.user)
    if form_saved(request, form, save, "Topic {name} created.") and not request.htmx:
        return redirect("topics")
    return _topics_page(request, topic_form=form if form.errors else None)


def _subscribe(request: HttpRequest, queue: str, **fields: Any) -> object:
    request_access(request).check_create(queue)
    return subscription_create(actor=request.user, queue_name=queue, **fields)


@require_POST
@role_required(Role.ADMIN)
def subscription_new(request: HtmxHttpRequest) -> HttpResponse:
    form = SubscriptionForm(request.POST)
    save = partial(_subscribe, request)
    if form_saved(request, form, save, "Subscription {name} created.") and not request.htmx:
        return redirect("topics")
    return _topics_page(request, subscription_form=form if form.errors else None)


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def subscription_edit(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Everyone sees a subscription's filter and limit; admins change them."""
    subscription = found(subscription_held, request=request, role=Role.VIEWER, name=name)
    if request.method == "POST":
        request_access(request).check(Role.ADMIN, subscription.queue.name)
    form = prefilled_form(SubscriptionEditForm, request, subscription)
    save = partial(subscription_update, subscription=subscription, actor=request.user)
    if form_saved(request, form, save, f"Subscription {name} saved.") and not request.htmx:
        return redirect("subscription-edit", name=name)
    context = {"subscription": subscription, "form": form}
    return page(request, "console/subscription.html", "subscription-form", context)


@require_POST
@role_required(Role.ADMIN)
def subscription_remove(request: HttpRequest, name: str) -> HttpResponse:
    subscription = found(subscription_held, request=request, role=Role.ADMIN, name=name)
    with service_errors(request):
        subscription_delete(subscription=subscription, actor=request.user)
        messages.success(request, f"Subscription {name} deleted; its queue and messages stay.")
        return redirect("topics")
    return redirect("subscription-edit", name=name)
