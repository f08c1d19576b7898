"""Dead-letter queues: where triage starts (every queue's depth, waiting
messages by reason and origin, rules and last scan); the replay schedules
reading a queue and the messages they gave up on; retry, forward or
discard one; apply the active rules now; and the rules table editor with
its versions, activation and rollback."""

from __future__ import annotations

import difflib
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.models import Queue, RuleTable
from broker.pipeline.schedules import given_up_by, schedules_reading
from broker.selectors import (
    NO_HEADER,
    MessageFilter,
    active_rule_table,
    dead_letter_groups,
    dead_letter_queue_get,
    dead_letter_triage,
    messages_page,
    queue_names,
    rule_table_version,
    rule_table_version_before,
    rule_table_versions,
)
from broker.services.dead_letters import dead_letter_scan
from broker.services.rule_tables import (
    rule_table_activate,
    rule_table_create,
    rule_table_create_and_activate,
    rule_table_dry_run,
    rule_table_report,
    rule_table_rollback,
)
from broker.services.transitions.dead_lettered import (
    message_discard,
    message_forward,
    message_retry,
)
from console.access import check_targets, message_held, request_access
from console.forms import RulesForm
from console.roles import Role
from console.views.common import (
    HtmxHttpRequest,
    flashed,
    found,
    page,
    role_required,
    service_errors,
)


@require_GET
@role_required(Role.VIEWER)
def dead_letter_queues(request: HttpRequest) -> HttpResponse:
    """Where triage starts: each dead-letter queue's depth, oldest waiting
    message, counts by reason and origin, rules table and last scan."""
    within = request_access(request).queues(Role.VIEWER)
    context = {"triage": dead_letter_triage(within=within), "no_header": NO_HEADER}
    return render(request, "console/dead_letter_queues.html", context)


@require_GET
@role_required(Role.VIEWER)
def dead_letter_queue(request: HtmxHttpRequest, name: str) -> HttpResponse:
    queue = _held(request, Role.VIEWER, name)
    access = request_access(request)
    before = request.GET.get("before", "")
    waiting = messages_page(
        filters=MessageFilter(queue=queue.name, state="TBDL"),
        before=int(before) if before.isdigit() else None,
    )
    schedules = schedules_reading(queue.name)
    context = {
        "queue": queue,
        "groups": dead_letter_groups(queue=queue),
        "page": waiting,
        # Each message with the schedules that gave up on it.
        "rows": [(message, given_up_by(schedules, message)) for message in waiting.messages],
        "schedules": schedules,
        "active": active_rule_table(queue=queue),
        "targets": queue_names(exclude=queue, within=access.queues(Role.OPERATOR)),
        # This queue's, over the page-wide ones.
        "can_operate": access.may(Role.OPERATOR, queue.name),
        "can_admin": access.may(Role.ADMIN, queue.name),
    }
    return render(request, "console/dead_letter_queue.html", context)


@require_POST
@role_required(Role.OPERATOR)
def dead_letter_act(
    request: HtmxHttpRequest, name: str, message_id: int, verb: str
) -> HttpResponse:
    """Retry, forward or discard one message. Its outcome is a flash
    message: shown in the message's row when htmx asked, else on the queue's
    page."""
    queue = _held(request, Role.OPERATOR, name)
    if verb not in {"retry", "forward", "discard"}:
        raise Http404(f"No action {verb!r}.")
    reason = request.POST.get("reason", "")[:500]
    message = found(message_held, request=request, role=Role.OPERATOR, message_id=message_id)
    if message.queue_id != queue.id:
        raise Http404(f"There is no message {message_id} on {queue.name}.")
    with service_errors(request):
        if verb == "retry":
            original = (message.dead_letter or {}).get("original_queue", "")
            if original:
                request_access(request).check(Role.OPERATOR, original)
            message_retry(message_id=message_id, actor=request.user, reason=reason)
            done = f"Message {message_id} is back on its original queue."
        elif verb == "forward":
            target = request.POST.get("queue", "")
            request_access(request).check(Role.OPERATOR, target)
            message_forward(
                message_id=message_id, queue_name=target, actor=request.user, reason=reason
            )
            done = f"Message {message_id} forwarded to {target}."
        else:
            message_discard(message_id=message_id, actor=request.user, reason=reason)
            done = f"Message {message_id} discarded."
        messages.success(request, done)
    if request.htmx:
        context = {"message_id": message_id, "outcomes": flashed(request)}
        return render(request, "console/_outcome_row.html", context)
    return redirect("dead-letter-queue", name=queue.name)


@require_POST
@role_required(Role.OPERATOR)
def dead_letter_apply_rules(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Run one scan of the queue under its active rules table now."""
    queue = _held(request, Role.OPERATOR, name)
    if active_rule_table(queue=queue) is None:
        messages.error(request, f"{name} has no active rules table.")
        return redirect("dead-letter-queue", name=name)
    with service_errors(request):
        result = dead_letter_scan(queue=queue)
        messages.success(
            request,
            f"Examined {result.examined}: retried {result.retried}, forwarded {result.forwarded}, "
            f"discarded {result.discarded}, ignored {result.ignored}, failed {result.failed}.",
        )
    return redirect("dead-letter-queue", name=name)


def _held(request: HttpRequest, role: Role, name: str) -> Queue:
    """The dead-letter queue, when the caller holds ``role`` on it; else the
    404 page (a queue they may not see, or not a dead-letter queue) or the
    403 page."""
    found(request_access(request).check, role=role, queue_name=name)
    return found(dead_letter_queue_get, name=name)


def _numbered(text: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's lines, each with the errors and the warnings (notes: they
    do not make the table invalid) found on it."""

    def by_line(findings: list[dict[str, Any]]) -> dict[int, list[str]]:
        lines: dict[int, list[str]] = {}
        for finding in findings:
            lines.setdefault(finding["line"], []).append(
                f"column {finding['column']}: {finding['message']}"
            )
        return lines

    errors = by_line(report["errors"])
    notes = by_line(report.get("warnings", []))
    return [
        {
            "number": number,
            "text": line,
            "errors": errors.get(number, []),
            "notes": notes.get(number, []),
        }
        for number, line in enumerate(text.splitlines() or [""], start=1)
    ]


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def rules_editor(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Edit a new draft: check it (errors and notes at their lines), dry-run
    it against the queue (anyone); save it, or save and activate it (admins);
    see the history and roll back."""
    queue = _held(request, Role.VIEWER, name)
    versions = rule_table_versions(queue=queue)
    active = active_rule_table(queue=queue)
    # The editor starts from the active version, else the newest draft.
    start = active or (versions[0] if versions else None)
    form = RulesForm(request.POST or None, initial={"text": start.text if start else ""})
    context: dict[str, Any] = {"queue": queue, "versions": versions, "active": active, "form": form}
    if request.method == "POST" and form.is_valid():
        text = form.cleaned_data["text"]
        report = rule_table_report(text=text, queue=queue)
        context.update(report=report, lines=_numbered(text, report))
        intent = request.POST.get("intent", "check")
        if intent in {"save", "activate"}:
            access = request_access(request)
            access.check(Role.ADMIN, queue.name)
            with service_errors(request, form=form, field="text"):
                check_targets(access, Role.OPERATOR, text)
                return _save(request, queue, text, activate=intent == "activate")
        elif intent == "dry-run" and report["valid"]:
            with service_errors(request, form=form, field="text"):
                draft = RuleTable(queue=queue, text=text, version=0)
                context["dry_run"] = rule_table_dry_run(table=draft)
    return page(request, "console/rules.html", "rules-result", context)


def _save(request: HtmxHttpRequest, queue: Queue, text: str, *, activate: bool) -> HttpResponse:
    """A new version of ``text``: a draft, or the active version at once.
    Either stores nothing when the broker refuses it."""
    if activate:
        table = rule_table_create_and_activate(queue=queue, text=text, actor=request.user)
        messages.success(
            request, f"Version {table.version} is active; the handler uses it from its next scan."
        )
    else:
        table = rule_table_create(queue=queue, text=text, actor=request.user)
        messages.success(request, f"Saved as draft version {table.version}.")
    return redirect("rules-editor", name=queue.name)


@require_POST
@role_required(Role.ADMIN)
def rules_activate(request: HttpRequest, name: str, version: int) -> HttpResponse:
    queue = _held(request, Role.ADMIN, name)
    table = found(rule_table_version, queue=queue, version=version)
    check_targets(request_access(request), Role.OPERATOR, table.text)
    with service_errors(request):
        rule_table_activate(table=table, actor=request.user)
        messages.success(request, f"Version {version} is active.")
    return redirect("rules-editor", name=name)


@require_POST
@role_required(Role.ADMIN)
def rules_rollback(request: HttpRequest, name: str) -> HttpResponse:
    queue = _held(request, Role.ADMIN, name)
    with service_errors(request):
        table = rule_table_rollback(queue=queue, actor=request.user)
        messages.success(request, f"Rolled back: version {table.version} is active again.")
    return redirect("rules-editor", name=name)


@require_GET
@role_required(Role.VIEWER)
def rules_version(request: HttpRequest, name: str, version: int) -> HttpResponse:
    """One version's text, with its differences from the version before."""
    queue = _held(request, Role.VIEWER, name)
    table = found(rule_table_version, queue=queue, version=version)
    previous = rule_table_version_before(table=table)
    diff = difflib.unified_diff(
        (previous.text if previous else "").splitlines(),
        table.text.splitlines(),
        fromfile=f"version {previous.version}" if previous else "(nothing)",
        tofile=f"version {version}",
        lineterm="",
    )
    context = {"queue": queue, "table": table, "previous": previous, "diff": list(diff)}
    return render(request, "console/rules_version.html", context)
