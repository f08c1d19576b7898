"""The audit log: who did what to which message, filtered."""

from __future__ import annotations

from django.http import HttpResponse
from django.views.decorators.http import require_GET

from broker.models import AuditEvent
from broker.selectors import AuditFilter, audit_page
from console.access import audit_within, request_access
from console.forms import AuditFilterForm
from console.roles import Role
from console.views.common import HtmxHttpRequest, page, role_required


@require_GET
@role_required(Role.VIEWER)
def audit_log(request: HtmxHttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    events: list[AuditEvent] = []
    next_before: int | None = None
    if form.is_valid():
        data = form.cleaned_data
        events, next_before = audit_page(
            filters=AuditFilter(
                actor=data["actor"],
                action=data["action"],
                queue=data["queue"],
                message_id=data["message"],
            ),
            before=data["before"],
            within=audit_within(request_access(request)),
        )
    query = request.GET.copy()
    query.pop("before", None)
    context = {
        "form": form,
        "events": events,
        "next_before": next_before,
        "query": query.urlencode(),
    }
    return page(request, "console/audit.html", "audit-table", context)
