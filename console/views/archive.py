"""The archive: a queue's archived messages by publication time, newest
first, and a link that replays what the search shows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlencode

from django.http import HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from broker.models import ReplaySource
from broker.pipeline.selectors import ArchivedMessage
from console.access import request_access
from console.forms import DATETIME_LOCAL, ArchiveSearchForm
from console.payloads import PayloadView, payload_view
from console.roles import Role
from console.views.common import HtmxHttpRequest, page, role_required
from console.views.common import found as held

PAGE_SIZE = 50


@dataclass(frozen=True)
class ArchivedRow:
    message: ArchivedMessage
    payload: PayloadView | None  # None: not retained

    @property
    def reason(self) -> str:
        return str((self.message.dead_letter or {}).get("reason", ""))


def _local(moment: datetime) -> str:
    """A time as the datetime-local inputs show it (the console's zone)."""
    return timezone.localtime(moment).strftime(DATETIME_LOCAL)


def _day_query(queue: str, day: date) -> str:
    """The search for one archive partition: a day of UTC time."""
    start = datetime.combine(day, time(), tzinfo=UTC)
    window = {"since": _local(start), "until": _local(start + timedelta(days=1))}
    return urlencode({"queue": queue, **window})


@require_GET
@role_required(Role.VIEWER)
def archive(request: HtmxHttpRequest) -> HttpResponse:
    # Imported here, not with the URLconf: see broker.pipeline.archive_reads.
    from broker.pipeline.archive_reads import archive_days, archive_search

    form = ArchiveSearchForm(request.GET, within=request_access(request).queues(Role.VIEWER))
    rows: list[ArchivedRow] = []
    next_before: int | None = None
    replay_url = ""
    days: list[tuple[date, str]] = []
    searched = form.is_valid() and bool(form.cleaned_data["queue"])
    if searched:
        data = form.cleaned_data
        held(request_access(request).check, role=Role.VIEWER, queue_name=data["queue"])
        found = archive_search(
            queue=data["queue"],
            since=data["since"],
            until=data["until"],
            before_id=data["before"],
            limit=PAGE_SIZE + 1,
        )
        rows = [
            ArchivedRow(
                message,
                None
                if message.payload is None
                else payload_view(message.payload, message.content_type),
            )
            for message in found[:PAGE_SIZE]
        ]
        if len(found) > PAGE_SIZE:
            next_before = rows[-1].message.id
        days = [(day, _day_query(data["queue"], day)) for day in archive_days(queue=data["queue"])]
        window = {key: _local(data[key]) for key in ("since", "until") if data[key]}
        query = {"source": ReplaySource.ARCHIVE.value, "queues": data["queue"], **window}
        replay_url = f"{reverse('replay-new')}?{urlencode(query)}"
    query = request.GET.copy()
    query.pop("before", None)
    context = {
        "form": form,
        "searched": searched,
        "rows": rows,
        "days": days,
        "next_before": next_before,
        "query": query.urlencode(),
        "replay_url": replay_url,
    }
    return page(request, "console/archive.html", "archive-results", context)
