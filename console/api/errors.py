"""Every API error is JSON: ``{"code", "detail", "field_errors"?}``.

``code`` is stable and meant for programs; ``detail`` is for people.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    JsonResponse,
)
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from broker import errors as broker_errors
from broker.ha.guard import refusal

# What a write the store's HA guard refused raises: Django's wrapper of the
# driver's error, or the driver's own from a COPY (publish writes with COPY,
# which Django does not wrap). ``refusal`` reads the SQLSTATE of either.
DATABASE_ERRORS = (DatabaseError, psycopg.Error)

# Redis, the wake-ups' broker and the cache, could not be reached: what
# Django's cache and Celery's sending raise. Where Redis is only a helper
# (the API's rate count, a wake-up) the caller carries on without it
# (docs/operations.md); anything else that needed it answers 503
# ``redis_unavailable``, never 500.
REDIS_ERRORS = (RedisError, KombuOperationalError)


class RedisUnavailable(broker_errors.BrokerError):
    code = "redis_unavailable"
    retry_after = 2

    def __init__(self) -> None:
        super().__init__(
            "Redis (the workers' wake-ups and the shared cache) cannot be reached just now; "
            "retry shortly. What was stored before stays stored."
        )


# An error's status is that of the nearest class in its MRO listed here; any
# NotFound, listed or not, is 404; anything else unlisted is 400.
BROKER_STATUS: dict[type[broker_errors.BrokerError], int] = {
    broker_errors.InvalidInput: status.HTTP_400_BAD_REQUEST,
    broker_errors.Conflict: status.HTTP_409_CONFLICT,
    broker_errors.NamesNothing: status.HTTP_404_NOT_FOUND,
    broker_errors.BatchTooLarge: status.HTTP_400_BAD_REQUEST,
    broker_errors.NotFound: status.HTTP_404_NOT_FOUND,
    broker_errors.QueueNotFound: status.HTTP_404_NOT_FOUND,
    broker_errors.MessageNotFound: status.HTTP_404_NOT_FOUND,
    broker_errors.TopicNotFound: status.HTTP_404_NOT_FOUND,
    broker_errors.SubscriptionNotFound: status.HTTP_404_NOT_FOUND,
    broker_errors.RuleTableNotFound: status.HTTP_404_NOT_FOUND,
    broker_errors.BulkJobNotFound: status.HTTP_404_NOT_FOUND,
    broker_errors.MaxMessagesReached: status.HTTP_409_CONFLICT,
    broker_errors.NotADraft: status.HTTP_409_CONFLICT,
    broker_errors.NothingToRollBack: status.HTTP_409_CONFLICT,
    broker_errors.RulesInvalid: status.HTTP_409_CONFLICT,
    broker_errors.PayloadTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    broker_errors.QueueIsDeadLetter: status.HTTP_409_CONFLICT,
    broker_errors.QueueNotEmpty: status.HTTP_409_CONFLICT,
    broker_errors.QueueInUse: status.HTTP_409_CONFLICT,
    broker_errors.IllegalTransition: status.HTTP_409_CONFLICT,
    broker_errors.ReplayJobBusy: status.HTTP_409_CONFLICT,
    broker_errors.NoActiveRules: status.HTTP_409_CONFLICT,
    broker_errors.HaMaintenance: status.HTTP_503_SERVICE_UNAVAILABLE,
    broker_errors.HaSynchronising: status.HTTP_409_CONFLICT,
    broker_errors.StaleEpoch: status.HTTP_409_CONFLICT,
    broker_errors.HaNodeUnreachable: status.HTTP_503_SERVICE_UNAVAILABLE,
    broker_errors.HaCommandRefused: status.HTTP_409_CONFLICT,
    broker_errors.HaNotConfigured: status.HTTP_409_CONFLICT,
    broker_errors.StoreUnavailable: status.HTTP_503_SERVICE_UNAVAILABLE,
    RedisUnavailable: status.HTTP_503_SERVICE_UNAVAILABLE,
}

DRF_CODES: dict[type[exceptions.APIException], str] = {
    exceptions.ParseError: "malformed_request",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}


def broker_status(error: broker_errors.BrokerError) -> int:
    """The HTTP status for ``error``: its class's, else its nearest base's."""
    for cls in type(error).__mro__:
        if cls in BROKER_STATUS:
            return BROKER_STATUS[cls]
    return status.HTTP_400_BAD_REQUEST


def error_body(code: str, detail: str, field_errors: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "detail": detail}
    if field_errors:
        body["field_errors"] = field_errors
    body.update(extra)
    return body


def _flatten(errors: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error structure as ``{"messages[2].priority": [...]}``."""
    flat: dict[str, list[str]] = {}
    if isinstance(errors, dict):
        for key, value in errors.items():
            if key == "non_field_errors" and prefix:
                # A list-level error ("too many items") belongs to the list itself.
                flat.update(_flatten(value, prefix))
            elif isinstance(key, int):  # a ListField's item
                flat.update(_flatten(value, f"{prefix}[{key}]"))
            else:
                flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(errors, list) and errors and all(isinstance(e, str) for e in errors):
        flat[prefix or "non_field_errors"] = [str(e) for e in errors]
    elif isinstance(errors, list):
        for index, value in enumerate(errors):
            if value:
                flat.update(_flatten(value, f"{prefix}[{index}]"))
    else:
        flat[prefix or "non_field_errors"] = [str(errors)]
    return flat


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DATABASE_ERRORS):
        # A write the store's HA guard refused (split brain, a standby
        # synchronising) is the broker error it stands for; any other
        # database error stays a 500.
        exc = refusal(exc) or exc
    if isinstance(exc, REDIS_ERRORS):
        exc = RedisUnavailable()
    if isinstance(exc, broker_errors.BrokerError):
        extra: dict[str, Any] = {}
        if isinstance(exc, broker_errors.PayloadTooLarge):
            extra = {"index": exc.index, "size": exc.size, "limit": exc.limit}
        elif isinstance(exc, broker_errors.RulesInvalid):
            extra = {"errors": exc.errors}
        elif isinstance(exc, broker_errors.MaxMessagesReached):
            extra = {
                "subscription": exc.subscription,
                "queue": exc.queue,
                "limit": exc.limit,
                "depth": exc.depth,
            }
        refused = Response(
            error_body(exc.code, exc.detail, exc.field_errors, **extra), status=broker_status(exc)
        )
        if exc.retry_after is not None:
            refused["Retry-After"] = str(exc.retry_after)
        return refused
    if isinstance(exc, RequestDataTooBig):
        return Response(
            error_body("request_too_large", "The request body is larger than this server accepts."),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, DjangoPermissionDenied):
        # Raised by console.access with what the caller lacks: DRF's own
        # conversion would drop the words.
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        field_errors = _flatten(exc.detail)
        summary = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in field_errors.items())
        codes = {code for codes in _flatten(exc.get_codes()).values() for code in codes}
        if codes == {"unique"}:
            # Well formed, but the name is taken: a conflict with what exists.
            response.status_code = status.HTTP_409_CONFLICT
            response.data = error_body("already_exists", summary, field_errors)
        else:
            detail = f"The request is not valid. {summary}"
            response.data = error_body("invalid", detail, field_errors)
    elif isinstance(exc, exceptions.APIException):
        code = DRF_CODES.get(type(exc), exc.default_code)
        response.data = error_body(code, str(exc.detail))
    return response


def not_found_json(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(
        error_body("not_found", f"Nothing is at {request.path}."), status=status.HTTP_404_NOT_FOUND
    )


@csrf_exempt  # it changes nothing: a POST there is a 404, not a CSRF refusal
def unknown_path(request: HttpRequest) -> HttpResponse:
    """Every path under /api/ that names nothing (the last URL pattern): the
    JSON 404 whatever DEBUG says (Django's debug 404 page is HTML), or, as
    APPEND_SLASH does, a redirect to the same path with its slash when that
    names something."""
    if settings.APPEND_SLASH and not request.path.endswith("/"):
        try:
            match = resolve(request.path_info + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not unknown_path:
            return HttpResponsePermanentRedirect(request.get_full_path(force_append_slash=True))
    return not_found_json(request)
