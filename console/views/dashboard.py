"""The dashboard: every queue's depth and limit, the blacklist and dead-letter
tiles, the last hour's deliveries, whether the workers answer, and the last
messages quarantined or purged automatically."""

from __future__ import annotations

from django.http import HttpResponse
from django.views.decorators.http import require_GET

from broker.models import MessageState
from broker.selectors import heartbeats, last_hour, poison_alarms_recent, queue_summaries
from console.charts import rate_chart
from console.roles import Role
from console.views.common import (
    HtmxHttpRequest,
    page,
    role_required,
)

# A Celery queue whose last task is older than this is shown as not answering.
HEALTHY_WITHIN = {"control": 10.0, "deliveries": 30.0}


@require_GET
@role_required(Role.VIEWER)
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    summaries = queue_summaries(by_kind=True)
    beats = heartbeats()
    context = {
        "summaries": summaries,
        "states": MessageState.values,
        "blacklisted": sum(s.depth[MessageState.NOT_DELIVERABLE] for s in summaries),
        "dead_lettered": sum(
            s.depth[MessageState.TO_BE_DELIVERED] for s in summaries if s.queue.is_dead_letter
        ),
        "chart": rate_chart(last_hour()),
        "alarms": poison_alarms_recent(),
        "workers": [
            {"name": name, "age": beats.get(name), "healthy": beats.get(name, 1e9) <= limit}
            for name, limit in HEALTHY_WITHIN.items()
        ],
    }
    return page(request, "console/dashboard.html", "queue-table", context)
