"""Sign-ins refused after too many failures (django-axes counts them per
user name and per address): what the locked-out caller sees, and the audit
event each lockout leaves."""

from __future__ import annotations

import math
from typing import Any

from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from broker.services.audit import audit_record

LOCKED_OUT_STATUS = 429


def lockout_message() -> str:
    minutes = math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60)
    return (
        f"Too many failed sign-ins for this user name or from this address. "
        f"Try again in {minutes} minute{'s' if minutes != 1 else ''}."
    )


def locked_out(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """The login page again (AXES_LOCKOUT_CALLABLE), saying when to try again."""
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    form = AuthenticationForm(request, initial={"username": username})
    response = render(
        request,
        "registration/login.html",
        {
            "form": form,
            "locked_out": lockout_message(),
            "next": request.POST.get("next", ""),
            "local_login": True,  # only a password sign-in is ever locked out
        },
        status=LOCKED_OUT_STATUS,
    )
    response["Retry-After"] = str(int(settings.AXES_COOLOFF_TIME.total_seconds()))
    return response


@receiver(user_locked_out, dispatch_uid="lazaretto-login-locked-out")
def record_lockout(
    sender: object, request: HttpRequest, username: str | None, ip_address: str, **kwargs: Any
) -> None:
    audit_record(
        action="login.locked_out",
        reason="too many failed sign-ins",
        details={"username": (username or "")[:150], "address": ip_address},
    )
