"""Replay schedules: the list with each one's timing, next firing and last
job; the form (new and edit), which shows the next five firings as the
timing is typed; one schedule's page with its firings and jobs; pause,
resume, run now and delete."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from broker.models import ReplayJob, ReplaySchedule
from broker.pipeline.schedules import (
    ScheduleSpec,
    Timing,
    latest_job,
    next_firing,
    next_firings,
    schedule_create,
    schedule_delete,
    schedule_pause,
    schedule_resume,
    schedule_run_now,
    schedule_update,
    schedules_all,
    spec_of,
    timing_of,
    timing_problems,
)
from console.access import (
    check_replay,
    held_replay,
    replays_within,
    request_access,
    schedule_held,
    schedule_replay,
)
from console.forms import ScheduleForm, TimingForm
from console.roles import Role
from console.time_zones import time_zone_names
from console.views.common import HtmxHttpRequest, back, found, page, role_required, service_errors
from console.views.replay import filter_rows

# The firings the form previews, and the firings and jobs a schedule's page lists.
FIRINGS_PREVIEWED = 5
LISTED = 50
# The list's htmx region: a row's action answers with it, outcome included.
TABLE = "schedule-table"


@dataclass(frozen=True)
class ScheduleRow:
    schedule: ReplaySchedule
    timing: Timing
    next_firing: datetime | None
    job: ReplayJob | None


def _row(schedule: ReplaySchedule) -> ScheduleRow:
    return ScheduleRow(schedule, timing_of(schedule), next_firing(schedule), latest_job(schedule))


def _table(request: HttpRequest) -> dict[str, Any]:
    within = replays_within(request_access(request), request.user.pk)
    rows = [_row(schedule) for schedule in schedules_all(within=within)]
    return {"rows": rows, "live": any(row.job and not row.job.finished for row in rows)}


@require_GET
@role_required(Role.VIEWER)
def schedules(request: HtmxHttpRequest) -> HttpResponse:
    return page(request, "console/schedules.html", TABLE, _table(request))


# --- the form ----------------------------------------------------------------------


def firings_preview(timing_form: TimingForm) -> dict[str, Any]:
    """The next firings of the timing typed (times in UTC, shown in the
    user's zone), or what is wrong with it."""
    if not timing_form.is_valid():
        return {"firings": [], "problems": _flat(timing_form.errors)}
    timing = timing_form.timing()
    problems = timing_problems(timing)
    if problems:
        return {"firings": [], "problems": _flat(problems)}
    after = timezone.now()
    return {"firings": next_firings(timing, after=after, count=FIRINGS_PREVIEWED), "problems": []}


def _flat(errors: Any) -> list[str]:
    return [str(problem) for problems in errors.values() for problem in problems]


def _form_page(
    request: HtmxHttpRequest, form: ScheduleForm, schedule: ReplaySchedule | None
) -> HttpResponse:
    # The timing the form shows (typed, or its initial values), previewed.
    shown = {name: form[name].value() for name in TimingForm.base_fields}
    context = {
        "form": form,
        "schedule": schedule,
        "time_zones": time_zone_names(),
        **firings_preview(TimingForm(shown)),
    }
    return page(request, "console/schedule_form.html", "schedule-form", context)


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def schedule_new(request: HtmxHttpRequest) -> HttpResponse:
    """The schedule form (prefilled from the query string, its time zone
    the user's); a valid POST saves the schedule, one the service refuses
    saves nothing and shows its errors beside the fields."""
    if request.method != "POST":
        form = ScheduleForm.prefilled(
            request.GET, within=request_access(request).queues(Role.VIEWER)
        )
        form.initial.setdefault("time_zone", timezone.get_current_timezone_name())
        return _form_page(request, form, None)
    form = ScheduleForm(request.POST, within=request_access(request).queues(Role.VIEWER))
    if form.is_valid():
        with service_errors(request, form=form):
            spec = _held(request, form.schedule_spec())
            schedule = schedule_create(spec=spec, actor=request.user)
            messages.success(request, f"Replay schedule {schedule.name} saved.")
            return redirect("schedule", schedule_id=schedule.id)
    return _form_page(request, form, None)


def _held(request: HttpRequest, spec: ScheduleSpec) -> ScheduleSpec:
    """The schedule as the caller may save it (``held_replay``)."""
    return replace(spec, replay=held_replay(request_access(request), spec.replay))


def _live(request: HttpRequest, schedule_id: int) -> ReplaySchedule:
    """A schedule not deleted that the caller may change: operator on every
    queue it reads and writes."""
    schedule = found(schedule_held, request=request, schedule_id=schedule_id)
    check_replay(request_access(request), schedule_replay(schedule))
    if schedule.deleted_at is not None:
        raise Http404(f"Replay schedule {schedule.name!r} was deleted.")
    return schedule


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def schedule_edit(request: HtmxHttpRequest, schedule_id: int) -> HttpResponse:
    """The form showing the schedule; a valid POST replaces what it does
    and when (its past firings and jobs stay as they were)."""
    schedule = _live(request, schedule_id)
    if request.method != "POST":
        return _form_page(
            request,
            ScheduleForm.of(spec_of(schedule), within=request_access(request).queues(Role.VIEWER)),
            schedule,
        )
    form = ScheduleForm(request.POST, within=request_access(request).queues(Role.VIEWER))
    if form.is_valid():
        with service_errors(request, form=form):
            spec = _held(request, form.schedule_spec())
            schedule_update(schedule_id=schedule.id, spec=spec, actor=request.user)
            messages.success(request, f"Replay schedule {form.cleaned_data['name']} saved.")
            return redirect("schedule", schedule_id=schedule.id)
    return _form_page(request, form, schedule)


@require_GET
@role_required(Role.VIEWER)
def schedule_firings(request: HtmxHttpRequest) -> HttpResponse:
    """The next five firings of the timing in the query string (``cron``,
    ``time_zone``, ``every_seconds``): the form's preview, swapped in by
    htmx as the timing is typed."""
    context = firings_preview(TimingForm(request.GET))
    return page(request, "console/schedule_firings.html", "schedule-firings", context)


# --- one schedule ------------------------------------------------------------------


@require_GET
@role_required(Role.VIEWER)
def schedule_page(request: HtmxHttpRequest, schedule_id: int) -> HttpResponse:
    schedule = found(schedule_held, request=request, schedule_id=schedule_id)
    context = {
        "schedule": schedule,
        "row": _row(schedule),
        "filters": filter_rows(schedule.filters),
        "firings": schedule.firings.select_related("job")[:LISTED],
        "jobs": schedule.jobs.select_related("created_by").order_by("-id")[:LISTED],
    }
    return render(request, "console/schedule.html", context)


# --- actions -----------------------------------------------------------------------


def _answer(request: HtmxHttpRequest, default: str) -> HttpResponse:
    """The schedules table, the outcome in it, when one of its rows posted
    through htmx; else back where the post came from (``next``)."""
    if request.htmx and request.htmx.target == TABLE:
        return render(request, f"console/schedules.html#{TABLE}", _table(request))
    target = back(request, default)
    if request.htmx:
        return HttpResponseClientRedirect(target)
    return redirect(target)


def _schedule_url(schedule: ReplaySchedule) -> str:
    return reverse("schedule", kwargs={"schedule_id": schedule.id})


def _act(
    request: HtmxHttpRequest,
    schedule_id: int,
    act: Callable[..., Any],
    said: Callable[[ReplaySchedule, Any], str],
    *,
    back: str = "",
) -> HttpResponse:
    """Do ``act`` to the schedule, say ``said`` of it (a refusal is a message,
    not an error page), and answer with the list or ``back`` (the
    schedule's page by default)."""
    schedule = found(schedule_held, request=request, schedule_id=schedule_id)
    check_replay(request_access(request), schedule_replay(schedule))
    with service_errors(request):
        outcome = act(schedule_id=schedule.id, actor=request.user)
        messages.success(request, said(schedule, outcome))
    return _answer(request, back or _schedule_url(schedule))


@require_POST
@role_required(Role.OPERATOR)
def schedule_pause_view(request: HtmxHttpRequest, schedule_id: int) -> HttpResponse:
    return _act(
        request,
        schedule_id,
        schedule_pause,
        lambda schedule, _: f"{schedule.name} is paused: it fires no more until resumed.",
    )


@require_POST
@role_required(Role.OPERATOR)
def schedule_resume_view(request: HtmxHttpRequest, schedule_id: int) -> HttpResponse:
    return _act(
        request, schedule_id, schedule_resume, lambda schedule, _: f"{schedule.name} is resumed."
    )


@require_POST
@role_required(Role.OPERATOR)
def schedule_run_view(request: HtmxHttpRequest, schedule_id: int) -> HttpResponse:
    """Fire the schedule now; refused while it is paused or its last job still runs."""
    return _act(
        request,
        schedule_id,
        schedule_run_now,
        lambda schedule, firing: f"{schedule.name}: replay job {firing.job_id} queued.",
    )


@require_POST
@role_required(Role.OPERATOR)
def schedule_delete_view(request: HtmxHttpRequest, schedule_id: int) -> HttpResponse:
    return _act(
        request,
        schedule_id,
        schedule_delete,
        lambda schedule, _: f"{schedule.name} is deleted; its jobs stay.",
        back=reverse("schedules"),
    )
