"""Signing in: the password form (unless LAZARETTO_LOCAL_LOGIN is off), and
single sign-on with OpenID Connect when an issuer is configured
(console.oidc): its two steps are mozilla-django-oidc's views, answered 404
while single sign-on is not configured."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

logger = logging.getLogger(__name__)

SSO_FAILURES = {
    "unreachable": "The identity provider did not answer.",
    "failed": "Single sign-on did not sign you in.",
}


class SignIn(LoginView):
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.LAZARETTO_LOCAL_LOGIN:
            raise PermissionDenied("Sign-in with a password is switched off: use single sign-on.")
        return super().post(request, *args, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        failure = self.request.session.pop("oidc_failure", "")
        if not failure and self.request.GET.get("sso") == "failed":
            failure = "failed"
        context.update(
            local_login=settings.LAZARETTO_LOCAL_LOGIN,
            sso_name=settings.LAZARETTO_OIDC_NAME if settings.LAZARETTO_OIDC_ISSUER else "",
            sso_failure=SSO_FAILURES.get(failure, ""),
        )
        return context


def _configured(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not settings.LAZARETTO_OIDC_ISSUER:
            raise Http404("Single sign-on is not configured.")
        return view(request, *args, **kwargs)

    return guarded


class Callback(OIDCAuthenticationCallbackView):
    """The provider's answer. One that is not the answer to this browser's
    request (another state, or none) signs nobody in and ends on the login
    page, as any refused sign-in does, rather than on an error page."""

    def get(self, request: HttpRequest) -> HttpResponseBase:
        try:
            return super().get(request)
        except SuspiciousOperation as refused:
            logger.warning("single sign-on refused: %s", refused)
            return self.login_failure()


sso_start = _configured(OIDCAuthenticationRequestView.as_view())
sso_callback = _configured(Callback.as_view())
