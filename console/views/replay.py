"""Replay jobs: the recent ones, a new one (previewed, then submitted), and
one job's live progress, with cancel and run again."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.models import ReplayJob, ReplaySource
from broker.pipeline.replay import replay_job_cancel, replay_job_run_again, replay_job_submit
from broker.pipeline.selection import ReplaySpec
from broker.pipeline.selectors import replay_jobs_recent, replay_preview
from console.access import (
    check_replay,
    held_replay,
    replay_job_held,
    replays_within,
    request_access,
)
from console.forms import ReplayForm
from console.roles import Role
from console.views.common import HtmxHttpRequest, found, page, role_required, service_errors

# per_rule's key for the messages no rule of the table matched.
NO_RULE = {"0"}
# The dry-run sample's columns shown first (stored as JSON, in no order).
SAMPLE_COLUMNS = ("message", "target", "rule")


@require_GET
@role_required(Role.VIEWER)
def replay_jobs(request: HtmxHttpRequest) -> HttpResponse:
    jobs = replay_jobs_recent(
        limit=50, within=replays_within(request_access(request), request.user.pk)
    )
    context = {"jobs": jobs, "live": any(not job.finished for job in jobs)}
    return page(request, "console/replay_jobs.html", "replay-table", context)


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def replay_new(request: HtmxHttpRequest) -> HttpResponse:
    """The job form (prefilled from the query string); a valid POST queues
    the job, one the replay service refuses writes nothing and shows its
    errors beside the fields."""
    if request.method != "POST":
        form = ReplayForm.prefilled(request.GET, within=request_access(request).queues(Role.VIEWER))
        return page(request, "console/replay_new.html", "replay-form", {"form": form})
    form = ReplayForm(request.POST, within=request_access(request).queues(Role.VIEWER))
    if form.is_valid():
        with service_errors(request, form=form):
            spec = held_replay(request_access(request), form.spec())
            job = replay_job_submit(spec=spec, actor=request.user)
            kind = "Dry run" if job.dry_run else "Replay job"
            messages.success(request, f"{kind} {job.id} queued.")
            return redirect("replay-job", job_id=job.id)
    return page(request, "console/replay_new.html", "replay-form", {"form": form})


@require_POST
@role_required(Role.OPERATOR)
def replay_preview_view(request: HtmxHttpRequest) -> HttpResponse:
    """How many messages the form's filter matches now, or its errors."""
    form = ReplayForm(request.POST, within=request_access(request).queues(Role.VIEWER))
    context: dict[str, Any] = {"form": form}
    if form.is_valid():
        with service_errors(request, form=form):
            context["count"] = replay_preview(held_replay(request_access(request), form.spec()))
    return page(request, "console/replay_new.html", "replay-form", context)


def _per_rule(job: ReplayJob) -> list[tuple[str, int]]:
    """The messages each rule routed, in rule order, no match last."""

    def order(key: str) -> tuple[int, int, str]:
        if key in NO_RULE:
            return (2, 0, key)
        return (0, int(key), "") if key.isdigit() else (1, 0, key)

    return [
        ("no rule matched" if key in NO_RULE else f"rule {key}", job.per_rule[key])
        for key in sorted(job.per_rule, key=order)
    ]


def _sample(job: ReplayJob) -> tuple[list[str], list[list[tuple[Any, str]]]]:
    """The dry run's sample as a table: its columns (the message, its target
    and rule first) and its cells of (value, link): a source message still
    in the hot table links to its page."""
    columns = [name for name in SAMPLE_COLUMNS if any(name in row for row in job.sample)]
    for row in job.sample:
        columns += [name for name in row if name not in columns]

    def cell(name: str, value: Any) -> tuple[Any, str]:
        linked = name == "message" and isinstance(value, int) and value > 0
        if linked and job.source != ReplaySource.ARCHIVE:
            return value, reverse("message", kwargs={"message_id": value})
        return value, ""

    return columns, [[cell(name, row.get(name)) for name in columns] for row in job.sample]


def filter_rows(filters: dict[str, Any]) -> list[tuple[str, str]]:
    """A stored filter (a job's or a schedule's) as (label, value) rows."""
    return [
        (name.replace("_", " "), ", ".join(value) if isinstance(value, list) else str(value))
        for name, value in filters.items()
    ]


@require_GET
@role_required(Role.VIEWER)
def replay_job_page(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job = found(replay_job_held, request=request, job_id=job_id)
    columns, rows = _sample(job)
    context = {
        "job": job,
        "per_target": sorted(job.per_target.items()),
        "per_rule": _per_rule(job),
        "sample_columns": columns,
        "sample_rows": rows,
        "filters": filter_rows(job.filters),
    }
    return page(request, "console/replay_job.html", "replay-progress", context)


def _check(request: HttpRequest, job_id: int) -> None:
    """Let the caller act on the job: operator on every queue it reads and writes."""
    job = found(replay_job_held, request=request, job_id=job_id)
    check_replay(request_access(request), ReplaySpec.of(job))


@require_POST
@role_required(Role.OPERATOR)
def replay_job_cancel_view(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    _check(request, job_id)
    with service_errors(request):
        job = replay_job_cancel(job_id=job_id, actor=request.user)
        if job.finished:
            messages.success(request, f"Replay job {job_id} cancelled.")
        else:
            messages.success(
                request,
                f"Cancel requested: replay job {job_id} stops at its next report; what it "
                "wrote stays written.",
            )
    return redirect("replay-job", job_id=job_id)


@require_POST
@role_required(Role.OPERATOR)
def replay_job_run_view(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    _check(request, job_id)
    with service_errors(request):
        replay_job_run_again(job_id=job_id, actor=request.user)
        messages.success(
            request,
            f"Replay job {job_id} queued again; it writes only what its earlier runs did not.",
        )
    return redirect("replay-job", job_id=job_id)
