"""The blacklist: NDLV messages, live; bulk release, fail or purge by
selection or by filter, and the bulk job's progress."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.forms import BoundField
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from broker.models import MessageState
from broker.selectors import MessageFilter
from broker.services.bulk import bulk_job_submit, bulk_preview
from console.access import check_bulk, job_held, request_access
from console.forms import BulkForm, MessageFilterForm
from console.roles import Role
from console.views.common import HtmxHttpRequest, found, page, role_required, service_errors
from console.views.messages import message_table


@require_GET
@role_required(Role.VIEWER)
def blacklist(request: HtmxHttpRequest) -> HttpResponse:
    return message_table(request, "console/blacklist.html", {"state": MessageState.NOT_DELIVERABLE})


def _label(field: BoundField) -> str:
    return f"{field.label} ({field.help_text})" if field.help_text else str(field.label)


@require_POST
@role_required(Role.OPERATOR)
def blacklist_bulk(request: HtmxHttpRequest) -> HttpResponse:
    """Act on the selected rows, or (after a preview and a confirmation) on
    every blacklisted message the filter matches, as a background job."""
    form = BulkForm(request.POST)
    filters = MessageFilterForm(request.POST)
    if not form.is_valid() or not filters.is_valid():
        messages.error(request, "Choose an action and what to apply it to.")
        return redirect("blacklist")
    data = form.cleaned_data
    access = request_access(request)
    if data["scope"] == "filter":
        values = {k: v for k, v in filters.cleaned_data.items() if k not in {"before", "state"}}
        chosen = MessageFilter(**values)
        with service_errors(request) as allowed:
            found(check_bulk, access=access, ids=None, filters=values)
        if not allowed.ok:
            return redirect("blacklist")
        if not data["confirmed"]:
            given = {name: value for name, value in values.items() if value}
            context = {
                "form": form,
                "count": bulk_preview(filters=chosen),
                "filters": request.POST,
                # What the job will apply, stated on the confirmation.
                "applied": [(name, _label(filters[name]), value) for name, value in given.items()],
                "query": urlencode({name: request.POST[name] for name in given}),
            }
            return render(request, "console/bulk_confirm.html", context)
        selection: dict[str, Any] = {"filters": chosen}
    else:
        found(check_bulk, access=access, ids=data["ids"], filters=None)
        selection = {"message_ids": data["ids"]}
    with service_errors(request):
        job = bulk_job_submit(
            action=data["action"], actor=request.user, reason=data["note"], **selection
        )
        return redirect("bulk-job", job_id=job.id)
    return redirect("blacklist")


@require_GET
@role_required(Role.VIEWER)
def bulk_job_page(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job = found(job_held, request=request, job_id=job_id)
    return page(request, "console/bulk_job.html", "job-progress", {"job": job})
