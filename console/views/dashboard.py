"""The dashboard: every queue's depth and limit, the blacklist and dead-letter
tiles, the last hour's deliveries, whether the workers answer, the alerts
open now and the last ones ended, the last messages quarantined or purged
automatically, and the admins' form that creates a queue."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from broker.models import MessageState
from broker.selectors import (
    alerts_recent,
    heartbeats,
    last_hour,
    poison_alarms_recent,
    queue_summaries,
)
from broker.services.queues import queue_create
from console.access import Access, request_access
from console.charts import rate_chart
from console.forms import QueueCreateForm
from console.roles import Role
from console.views.common import (
    HtmxHttpRequest,
    form_saved,
    page,
    role_required,
)

# A Celery queue whose last task is older than this is shown as not answering.
HEALTHY_WITHIN = {"control": 10.0, "deliveries": 30.0}


def _dashboard_context(access: Access) -> dict[str, Any]:
    """What the dashboard shows of the queues ``access`` sees."""
    within = access.queues(Role.VIEWER)
    summaries = queue_summaries(by_kind=True, within=within)
    beats = heartbeats()
    everything = within is None
    return {
        "summaries": summaries,
        "states": MessageState.values,
        "blacklisted": sum(s.depth[MessageState.NOT_DELIVERABLE] for s in summaries),
        "dead_lettered": sum(
            s.depth[MessageState.TO_BE_DELIVERED] for s in summaries if s.queue.is_dead_letter
        ),
        "chart": rate_chart(
            last_hour(queue_ids=None if everything else [s.queue.id for s in summaries])
        ),
        "alarms": poison_alarms_recent(within=access.queues(Role.VIEWER, field="queue_name")),
        "alerts": alerts_recent(within=access.queues(Role.VIEWER, field="queue__name")),
        "workers": [
            {"name": name, "age": beats.get(name), "healthy": beats.get(name, 1e9) <= limit}
            for name, limit in HEALTHY_WITHIN.items()
        ],
    }


def _queue_create(request: HttpRequest, name: str, **fields: Any) -> object:
    request_access(request).check_create(name)
    return queue_create(name=name, actor=request.user, **fields)


@require_GET
@role_required(Role.VIEWER)
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    context = {**_dashboard_context(request_access(request)), "queue_form": QueueCreateForm()}
    return page(request, "console/dashboard.html", "queue-table", context)


@require_POST
@role_required(Role.ADMIN)
def queue_new(request: HtmxHttpRequest) -> HttpResponse:
    """Create a queue: then its page (with htmx, a fresh form, the dashboard's
    table showing the queue at its next refresh); a name or consumer the queue
    service refuses writes nothing and shows its error beside the field."""
    form = QueueCreateForm(request.POST)
    save = partial(_queue_create, request)
    if form_saved(request, form, save, "Queue {name} created."):
        if not request.htmx:
            return redirect("queue", name=form.cleaned_data["name"])
        form = QueueCreateForm()
    context: dict[str, Any] = {"queue_form": form}
    if not request.htmx:
        context.update(_dashboard_context(request_access(request)))
    return page(request, "console/dashboard.html", "queue-new", context)
