"""Operations endpoints at the site root, for machines rather than people:
/healthz and /readyz for load balancers and orchestrators (no login; they
reveal nothing sensitive) and /metrics for Prometheus (a token or an allowed
network). The decisions are in console.ops, the numbers in broker.metrics."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker.metrics import metrics_registry
from console.ops import metrics_refusal, readiness


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. Touches nothing else."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when the database, its migrations and Redis are all
    fine, else 503 naming each part that is not and why."""
    checks = readiness()
    ready = all(check.ok for check in checks.values())
    return JsonResponse(
        {
            "status": "ready" if ready else "unavailable",
            "checks": {name: check.as_json() for name, check in checks.items()},
        },
        status=200 if ready else 503,
    )


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus's text format: the database's numbers and every process's
    observations (broker.metrics)."""
    refusal = metrics_refusal(request)
    if refusal is not None:
        response = JsonResponse(
            {"code": refusal.code, "detail": refusal.detail}, status=refusal.status
        )
        if refusal.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
