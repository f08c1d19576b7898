"""The operator console's pages. Views stay thin: a selector for the data, a
template for the page, and the page's named partial for htmx swaps."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from django_htmx.middleware import HtmxDetails

from broker.models import MessageState
from broker.selectors import queue_summaries
from console.api.errors import not_found_json


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


@require_GET
@login_required
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    template = "console/dashboard.html#queue-table" if request.htmx else "console/dashboard.html"
    return render(
        request,
        template,
        {"summaries": queue_summaries(), "states": MessageState.values},
    )


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return not_found_json(request, exception)
    return render(request, "404.html", status=404)
