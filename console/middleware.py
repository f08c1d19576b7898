"""The console's own middleware: a deadline on the store for every request,
a write the store's HA guard refused wherever it was not caught, the API's
query strings held to the schema, and each user's time zone.

A write the store's HA guard refused, wherever it was not caught:
Console views show a refusal beside their form (``service_errors``) and the
API answers it with its error body (``console.api.errors``); any other view
whose write the guard refuses (split brain: every write; a standby
synchronising: configuration changes) answers 503 with a page that says
why, or the JSON error body under /api/, rather than a 500. So does a
request that needed Redis while it cannot be reached (``redis_unavailable``)."""

from __future__ import annotations

from collections.abc import Callable
from zoneinfo import ZoneInfo

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone

from broker.errors import BrokerError, StoreUnavailable
from broker.ha.guard import refusal
from broker.store.deadline import limit
from console.api.errors import DATABASE_ERRORS, REDIS_ERRORS, RedisUnavailable, error_body
from console.time_zones import time_zone_of

REFUSED = 503


class StoreDeadlineMiddleware:
    """A request waits on the store for LAZARETTO_STORE_TIMEOUT_SECONDS at
    most, all its statements together: past that it fails with
    ``store_unavailable`` (a frozen or cut-off server) instead of holding
    the web process's thread."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with limit(total=settings.LAZARETTO_STORE_TIMEOUT_SECONDS, what="a web request"):
            return self.get_response(request)


class RefusalMiddleware:
    """A write the HA guard refused, or Redis unreachable, wherever it was
    not caught: 503 with the error's code, never 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        error: BrokerError | None
        if isinstance(exception, REDIS_ERRORS):
            error = RedisUnavailable()
        elif isinstance(exception, DATABASE_ERRORS):
            error = refusal(exception)
        else:
            return None
        if error is None:
            return None
        if request.path.startswith("/api/"):
            response: HttpResponse = JsonResponse(
                error_body(error.code, error.detail), status=REFUSED
            )
        elif isinstance(error, StoreUnavailable | RedisUnavailable):
            # Without the request: its context (the user, the pair's banner)
            # would ask the store again.
            response = HttpResponse(render_to_string("503.html", {"error": error}), status=REFUSED)
        else:
            response = render(request, "503.html", {"error": error}, status=REFUSED)
        if error.retry_after is not None:
            response["Retry-After"] = str(error.retry_after)
        return response


class EmptyQueryParameterMiddleware:
    """Under /api/, a query parameter given with no value (``?queue=``) is
    refused with 400 ``invalid`` naming it, not taken as left out: the
    schema says every query parameter is a non-empty string, a number, a
    time or one of a list, and a client generated from it leaves out what
    it does not mean."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/v1/"):
            empty = sorted({name for name, value in request.GET.items() if value == ""})
            if empty:
                problem = "May not be empty: leave the parameter out instead."
                detail = f"Empty query parameter(s): {', '.join(empty)}. {problem}"
                errors = {name: [problem] for name in empty}
                return JsonResponse(error_body("invalid", detail, errors), status=400)
        return self.get_response(request)


class TimeZoneMiddleware:
    """Times are shown in the signed-in user's zone (``console.time_zones``),
    else in the site's; the zone stays active for this request only."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            zone = time_zone_of(user=request.user)
        except DATABASE_ERRORS:
            # The store cannot answer now: the view's own query meets the
            # same refusal and answers it (the 503 page, the API's body).
            zone = str(settings.TIME_ZONE)
        timezone.activate(ZoneInfo(zone))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
