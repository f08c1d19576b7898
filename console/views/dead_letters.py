"""Dead-letter queues: their waiting messages by reason, retry, forward or
discard one, apply the rules now; the rules table editor, its versions,
activation and rollback."""

from __future__ import annotations

import difflib
from typing import Any

from django.contrib import messages as flash
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.errors import BrokerError, QueueNotFound
from broker.models import Queue, QueueKind, RuleTable, RuleTableStatus
from broker.selectors import MessageFilter, dead_letter_groups, messages_page
from broker.services.dead_letters import dead_letter_scan
from broker.services.queues import queue_get
from broker.services.rule_tables import (
    rule_table_activate,
    rule_table_create,
    rule_table_dry_run,
    rule_table_report,
    rule_table_rollback,
)
from broker.services.transitions.dead_lettered import (
    message_discard,
    message_forward,
    message_retry,
)
from console.forms import RulesForm
from console.roles import Role, user_role
from console.views.common import (
    HtmxHttpRequest,
    role_required,
)


def _dead_letter_queue(name: str) -> Queue:
    try:
        queue = queue_get(name=name)
    except QueueNotFound as error:
        raise Http404(error.detail) from None
    if queue.kind != QueueKind.DEAD_LETTER:
        raise Http404(f"{name} is not a dead-letter queue.")
    return queue


@require_GET
@role_required(Role.VIEWER)
def dead_letter_queues(request: HttpRequest) -> HttpResponse:
    queues = Queue.objects.filter(kind=QueueKind.DEAD_LETTER).order_by("name")
    return render(request, "console/dead_letter_queues.html", {"queues": queues})


def _queue_page(request: HtmxHttpRequest, queue: Queue, **extra: Any) -> HttpResponse:
    before = request.GET.get("before", "")
    page = messages_page(
        filters=MessageFilter(queue=queue.name, state="TBDL"),
        before=int(before) if before.isdigit() else None,
    )
    context = {
        "queue": queue,
        "groups": dead_letter_groups(queue=queue),
        "page": page,
        "active": queue.rule_tables.filter(status=RuleTableStatus.ACTIVE).first(),
        "targets": Queue.objects.exclude(id=queue.id)
        .order_by("name")
        .values_list("name", flat=True),
        **extra,
    }
    return render(request, "console/dead_letter_queue.html", context)


@require_GET
@role_required(Role.VIEWER)
def dead_letter_queue(request: HtmxHttpRequest, name: str) -> HttpResponse:
    return _queue_page(request, _dead_letter_queue(name))


@require_POST
@role_required(Role.OPERATOR)
def dead_letter_act(
    request: HtmxHttpRequest, name: str, message_id: int, verb: str
) -> HttpResponse:
    """Retry, forward or discard one message; the outcome shows in its row."""
    queue = _dead_letter_queue(name)
    if verb not in {"retry", "forward", "discard"}:
        raise Http404(f"No action {verb!r}.")
    reason = request.POST.get("reason", "")[:500]
    try:
        if verb == "retry":
            message_retry(message_id=message_id, actor=request.user, reason=reason)
            outcome = f"Message {message_id} is back on its original queue."
        elif verb == "forward":
            target = request.POST.get("queue", "")
            message_forward(
                message_id=message_id, queue_name=target, actor=request.user, reason=reason
            )
            outcome = f"Message {message_id} forwarded to {target}."
        else:
            message_discard(message_id=message_id, actor=request.user, reason=reason)
            outcome = f"Message {message_id} discarded."
        ok = True
    except BrokerError as error:
        outcome, ok = error.detail, False
    if request.htmx:
        return render(
            request,
            "console/_outcome_row.html",
            {"message_id": message_id, "outcome": outcome, "ok": ok},
        )
    (flash.success if ok else flash.error)(request, outcome)
    return redirect("dead-letter-queue", name=queue.name)


@require_POST
@role_required(Role.OPERATOR)
def dead_letter_apply_rules(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Run one scan of the queue under its active rules table now."""
    queue = _dead_letter_queue(name)
    if not queue.rule_tables.filter(status=RuleTableStatus.ACTIVE).exists():
        flash.error(request, f"{name} has no active rules table.")
    else:
        result = dead_letter_scan(queue=queue)
        flash.success(
            request,
            f"Examined {result.examined}: retried {result.retried}, forwarded {result.forwarded}, "
            f"discarded {result.discarded}, ignored {result.ignored}, failed {result.failed}.",
        )
    return redirect("dead-letter-queue", name=name)


def _numbered(text: str, errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table's lines, each with the errors found on it."""
    by_line: dict[int, list[str]] = {}
    for error in errors:
        by_line.setdefault(error["line"], []).append(
            f"column {error['column']}: {error['message']}"
        )
    return [
        {"number": number, "text": line, "errors": by_line.get(number, [])}
        for number, line in enumerate(text.splitlines() or [""], start=1)
    ]


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def rules_editor(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Edit a new draft: check it (errors at their lines), dry-run it against
    the queue, save it, activate it; see the history and roll back."""
    queue = _dead_letter_queue(name)
    versions = list(queue.rule_tables.order_by("-version"))
    active = next((table for table in versions if table.status == RuleTableStatus.ACTIVE), None)
    # The editor starts from the active version, else the newest draft.
    start = active or (versions[0] if versions else None)
    form = RulesForm(request.POST or None, initial={"text": start.text if start else ""})
    context: dict[str, Any] = {"queue": queue, "versions": versions, "active": active, "form": form}
    if request.method == "POST" and form.is_valid():
        text = form.cleaned_data["text"]
        report = rule_table_report(text=text, queue=queue)
        context.update(report=report, lines=_numbered(text, report["errors"]))
        intent = request.POST.get("intent", "check")
        if intent in {"save", "activate"}:
            if user_role(request.user) < Role.ADMIN:
                raise PermissionDenied("Only admins change rules tables.")
            return _save(
                request, queue, text, activate=intent == "activate", report=report, context=context
            )
        if intent == "dry-run" and report["valid"]:
            context["dry_run"] = rule_table_dry_run(
                table=RuleTable(queue=queue, text=text, version=0)
            )
    return render(
        request,
        "console/rules.html#rules-result" if request.htmx else "console/rules.html",
        context,
    )


def _save(
    request: HtmxHttpRequest,
    queue: Queue,
    text: str,
    *,
    activate: bool,
    report: dict[str, Any],
    context: dict[str, Any],
) -> HttpResponse:
    if activate and not report["valid"]:
        context["problem"] = "A table with errors cannot be activated; it was not saved."
        return render(request, "console/rules.html", context)
    table = rule_table_create(queue=queue, text=text, actor=request.user)
    if activate:
        rule_table_activate(table=table, actor=request.user)
        flash.success(
            request, f"Version {table.version} is active; the handler uses it from its next scan."
        )
    else:
        flash.success(request, f"Saved as draft version {table.version}.")
    return redirect("rules-editor", name=queue.name)


@require_POST
@role_required(Role.ADMIN)
def rules_activate(request: HttpRequest, name: str, version: int) -> HttpResponse:
    queue = _dead_letter_queue(name)
    table = queue.rule_tables.filter(version=version).first()
    if table is None:
        raise Http404(f"{name} has no version {version}.")
    try:
        rule_table_activate(table=table, actor=request.user)
        flash.success(request, f"Version {version} is active.")
    except BrokerError as error:
        flash.error(request, error.detail)
    return redirect("rules-editor", name=name)


@require_POST
@role_required(Role.ADMIN)
def rules_rollback(request: HttpRequest, name: str) -> HttpResponse:
    try:
        table = rule_table_rollback(queue=_dead_letter_queue(name), actor=request.user)
        flash.success(request, f"Rolled back: version {table.version} is active again.")
    except BrokerError as error:
        flash.error(request, error.detail)
    return redirect("rules-editor", name=name)


@require_GET
@role_required(Role.VIEWER)
def rules_version(request: HttpRequest, name: str, version: int) -> HttpResponse:
    """One version's text, with its differences from the version before."""
    queue = _dead_letter_queue(name)
    table = queue.rule_tables.filter(version=version).first()
    if table is None:
        raise Http404(f"{name} has no version {version}.")
    previous = queue.rule_tables.filter(version__lt=version).order_by("-version").first()
    diff = difflib.unified_diff(
        (previous.text if previous else "").splitlines(),
        table.text.splitlines(),
        fromfile=f"version {previous.version}" if previous else "(nothing)",
        tofile=f"version {version}",
        lineterm="",
    )
    return render(
        request,
        "console/rules_version.html",
        {"queue": queue, "table": table, "previous": previous, "diff": list(diff)},
    )
