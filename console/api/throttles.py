"""Per-client request rate for the API: each token (or, for a console
session, each user) has its own budget, counted in the shared cache so every
web process sees the same figure. Over budget: 429 with ``Retry-After``.

While the cache (Redis) cannot be reached, requests are let through
uncounted (docs/operations.md): the rate is a fairness limit, not a lock,
and refusing every request because a counter cannot be read would turn a
Redis outage into an API outage."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from console.models import ApiToken

logger = logging.getLogger(__name__)


class ClientRateThrottle(SimpleRateThrottle):
    scope = "api"

    def get_rate(self) -> str | None:
        # Read per request (not at import, as DRF's default does) so a
        # deployment's LAZARETTO_API_RATE and tests' overrides both apply.
        return str(settings.LAZARETTO_API_RATE)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if isinstance(request.auth, ApiToken):
            ident = f"token-{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            ident = f"addr-{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request: Request, view: Any) -> bool:
        try:
            return super().allow_request(request, view)
        except RedisError as error:
            logger.warning("the API's rate is not counted: the cache is unreachable (%s)", error)
            return True
