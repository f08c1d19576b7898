"""Topics and subscriptions: the list, the forms that create them, a
subscription's edit page."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.models import Topic
from broker.selectors import subscription_summaries
from broker.services.topics import (
    subscription_create,
    subscription_delete,
    subscription_get,
    subscription_update,
    topic_create,
)
from console.forms import SubscriptionEditForm, SubscriptionForm, TopicForm
from console.roles import Role
from console.views.common import (
    HtmxHttpRequest,
    form_saved,
    found,
    page,
    prefilled_form,
    role_required,
)


def _topics_page(
    request: HtmxHttpRequest,
    topic_form: TopicForm | None = None,
    subscription_form: SubscriptionForm | None = None,
) -> HttpResponse:
    return page(
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


@require_POST
@role_required(Role.ADMIN)
def topic_new(request: HtmxHttpRequest) -> HttpResponse:
    form = TopicForm(request.POST)
    save = partial(topic_create, actor=request.user)
    if form_saved(request, form, save, "Topic {name} created.") and not request.htmx:
        return redirect("topics")
    return _topics_page(request, topic_form=form if form.errors else None)


def _subscribe(actor: Any, queue: str, **fields: Any) -> object:
    return subscription_create(actor=actor, queue_name=queue, **fields)


@require_POST
@role_required(Role.ADMIN)
def subscription_new(request: HtmxHttpRequest) -> HttpResponse:
    form = SubscriptionForm(request.POST)
    save = partial(_subscribe, request.user)
    if form_saved(request, form, save, "Subscription {name} created.") and not request.htmx:
        return redirect("topics")
    return _topics_page(request, subscription_form=form if form.errors else None)


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def subscription_edit(request: HtmxHttpRequest, name: str) -> HttpResponse:
    subscription = found(subscription_get, name=name)
    form = prefilled_form(SubscriptionEditForm, request, subscription)
    save = partial(subscription_update, subscription=subscription, actor=request.user)
    if form_saved(request, form, save, f"Subscription {name} saved.") and not request.htmx:
        return redirect("subscription-edit", name=name)
    return page(
        request,
        "console/subscription.html",
        "subscription-form",
        {"subscription": subscription, "form": form},
    )


@require_POST
@role_required(Role.ADMIN)
def subscription_remove(request: HttpRequest, name: str) -> HttpResponse:
    subscription_delete(subscription=found(subscription_get, name=name), actor=request.user)
    messages.success(request, f"Subscription {name} deleted; its queue and messages stay.")
    return redirect("topics")
