"""Console pages to find and act on messages: the message browser, a
message's detail, the blacklist, and the audit log."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages as flash
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.errors import BrokerError, MessageNotFound
from broker.models import QUEUE_NAME_MAX_LENGTH, AuditEvent, BulkJob, Message, MessageState
from broker.selectors import (
    AuditFilter,
    MessageFilter,
    audit_page,
    message_get,
    message_timeline,
    messages_page,
)
from broker.services.bulk import bulk_job_submit, bulk_preview
from broker.services.dumps import dump_path_for
from broker.services.transitions.blacklist import (
    TRIAGE_ACTIONS,
    message_fail,
    message_purge,
    message_release,
)
from broker.services.transitions.resubmit import message_resubmit
from console.forms import ResubmitForm, add_service_errors
from console.payloads import payload_view
from console.roles import Role
from console.views import HtmxHttpRequest, role_required

STATE_CHOICES = [("", "any state"), *MessageState.choices]


class MessageFilterForm(forms.Form):
    queue = forms.CharField(max_length=QUEUE_NAME_MAX_LENGTH, required=False)
    state = forms.ChoiceField(choices=STATE_CHOICES, required=False)
    reason = forms.CharField(max_length=64, required=False, help_text="dead-letter reason")
    since = forms.DateTimeField(required=False, help_text="published at or after")
    until = forms.DateTimeField(required=False, help_text="published before")
    header = forms.CharField(max_length=200, required=False, help_text="name=value")
    text = forms.CharField(
        max_length=200, required=False, strip=False, help_text="payload contains"
    )
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def clean_header(self) -> str:
        header: str = self.cleaned_data["header"]
        if header and "=" not in header:
            raise forms.ValidationError("Write it as name=value.")
        return header


class AuditFilterForm(forms.Form):
    actor = forms.CharField(max_length=150, required=False)
    action = forms.CharField(max_length=64, required=False)
    queue = forms.CharField(max_length=QUEUE_NAME_MAX_LENGTH, required=False)
    message = forms.IntegerField(required=False, min_value=1, label="Message id")
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


def _message_or_404(message_id: int) -> Message:
    try:
        return message_get(message_id=message_id)
    except MessageNotFound as error:
        raise Http404(error.detail) from None


def _browse(request: HtmxHttpRequest, template: str, fixed: dict[str, str]) -> HttpResponse:
    """The message list of ``template`` under the GET filters (``fixed``
    overrides them: the blacklist is always state NDLV)."""
    form = MessageFilterForm({**request.GET.dict(), **fixed})
    page = None
    if form.is_valid():
        data = {key: value for key, value in form.cleaned_data.items() if key != "before"}
        page = messages_page(filters=MessageFilter(**data), before=form.cleaned_data["before"])
    query = request.GET.copy()
    query.pop("before", None)
    context = {"form": form, "page": page, "query": query.urlencode()}
    return render(request, f"{template}#message-table" if request.htmx else template, context)


@require_GET
@role_required(Role.VIEWER)
def message_list(request: HtmxHttpRequest) -> HttpResponse:
    return _browse(request, "console/messages.html", {})


@require_GET
@role_required(Role.VIEWER)
def blacklist(request: HtmxHttpRequest) -> HttpResponse:
    return _browse(request, "console/blacklist.html", {"state": MessageState.NOT_DELIVERABLE})


@require_GET
@role_required(Role.VIEWER)
def message_detail(request: HttpRequest, message_id: int) -> HttpResponse:
    message = _message_or_404(message_id)
    return render(
        request,
        "console/message.html",
        {
            "message": message,
            "payload": payload_view(bytes(message.payload), message.content_type),
            "timeline": message_timeline(message_id=message.id),
        },
    )


@require_GET
@role_required(Role.VIEWER)
def message_payload(request: HttpRequest, message_id: int) -> HttpResponse:
    """The whole payload as a download; never rendered by the browser."""
    message = _message_or_404(message_id)
    response = HttpResponse(bytes(message.payload), content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="message-{message.id}.bin"'
    return response


@require_GET
@role_required(Role.VIEWER)
def message_dump(request: HttpRequest, message_id: int) -> FileResponse:
    """The dump written when the message was blacklisted. The path comes
    from the ids, never from stored or submitted text."""
    message = _message_or_404(message_id)
    path = dump_path_for(queue_id=message.queue_id, message_id=message.id)
    if not message.dump_path or not path.is_file():
        raise Http404("No dump file for this message.")
    return FileResponse(path.open("rb"), as_attachment=True, filename=path.name)


def _act(
    request: HtmxHttpRequest, message_id: int, action: Callable[..., Any], done: str
) -> HttpResponse:
    """Run an operator action; show the result in the message's row (htmx)
    or back on the page the form came from."""
    reason = request.POST.get("reason", "")[:500]
    try:
        action(message_id=message_id, actor=request.user, reason=reason)
    except BrokerError as error:
        outcome, ok = error.detail, False
    else:
        outcome, ok = done.format(id=message_id), True
    if request.htmx:
        message = Message.objects.select_related("queue").filter(id=message_id).first()
        return render(
            request,
            "console/_message_row.html",
            {"message": message, "message_id": message_id, "outcome": outcome, "ok": ok},
        )
    (flash.success if ok else flash.error)(request, outcome)
    back = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()})
    return redirect(back if back and safe else "blacklist")


@require_POST
@role_required(Role.OPERATOR)
def message_release_view(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    return _act(
        request, message_id, message_release, "Message {id} released: waiting for delivery."
    )


@require_POST
@role_required(Role.OPERATOR)
def message_fail_view(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    return _act(request, message_id, message_fail, "Message {id} failed for good.")


@require_POST
@role_required(Role.OPERATOR)
def message_purge_view(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    return _act(request, message_id, message_purge, "Message {id} purged.")


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
        )
    query = request.GET.copy()
    query.pop("before", None)
    context = {
        "form": form,
        "events": events,
        "next_before": next_before,
        "query": query.urlencode(),
    }
    template = "console/audit.html"
    return render(request, f"{template}#audit-table" if request.htmx else template, context)


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def message_resubmit_view(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """Correct a blacklisted or dead-lettered message and publish the result
    as a new message; the original stays."""
    original = _message_or_404(message_id)
    try:
        text = bytes(original.payload).decode()
    except UnicodeDecodeError:
        text = None
    target = (original.dead_letter or {}).get("original_queue") or original.queue.name
    form = ResubmitForm(
        request.POST or None,
        initial={
            "queue": target,
            "content_type": original.content_type,
            "priority": original.priority,
            "headers": original.headers,
            "payload": text,
        },
    )
    if request.method == "POST" and text is not None and form.is_valid():
        data = form.cleaned_data
        try:
            copy_id = message_resubmit(
                message_id=original.id,
                queue_name=data["queue"],
                payload=data["payload"].encode(),
                content_type=data["content_type"],
                headers=data["headers"],
                priority=data["priority"],
                actor=request.user,
            )
        except BrokerError as error:
            add_service_errors(form, error)
        else:
            flash.success(request, f"Published the corrected copy as message {copy_id}.")
            return redirect("message", message_id=copy_id)
    return render(
        request,
        "console/resubmit.html",
        {"original": original, "form": form, "binary": text is None},
    )


class MessageIdsField(forms.Field):
    """Selected message ids (any; the service keeps only blacklisted ones)."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[int]:
        values = value or []
        if not all(str(item).isdigit() for item in values):
            raise forms.ValidationError("Message ids are whole numbers.")
        return [int(item) for item in values]


class BulkForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a.capitalize()) for a in TRIAGE_ACTIONS])
    note = forms.CharField(max_length=500, required=False, label="Reason")
    scope = forms.ChoiceField(choices=[("selected", "selected"), ("filter", "filter")])
    ids = MessageIdsField(required=False)
    confirmed = forms.BooleanField(required=False)


@require_POST
@role_required(Role.OPERATOR)
def blacklist_bulk(request: HtmxHttpRequest) -> HttpResponse:
    """Act on the selected rows, or (after a preview and a confirmation) on
    every blacklisted message the filter matches, as a background job."""
    form = BulkForm(request.POST)
    filters = MessageFilterForm(request.POST)
    if not form.is_valid() or not filters.is_valid():
        flash.error(request, "Choose an action and what to apply it to.")
        return redirect("blacklist")
    data = form.cleaned_data
    if data["scope"] == "filter":
        chosen = MessageFilter(
            **{k: v for k, v in filters.cleaned_data.items() if k not in {"before", "state"}}
        )
        if not data["confirmed"]:
            return render(
                request,
                "console/bulk_confirm.html",
                {"form": form, "count": bulk_preview(filters=chosen), "filters": request.POST},
            )
        selection: dict[str, Any] = {"filters": chosen}
    else:
        selection = {"message_ids": data["ids"]}
    try:
        job = bulk_job_submit(
            action=data["action"], actor=request.user, reason=data["note"], **selection
        )
    except BrokerError as error:
        flash.error(request, error.detail)
        return redirect("blacklist")
    return redirect("bulk-job", job_id=job.id)


@require_GET
@role_required(Role.VIEWER)
def bulk_job_page(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job = BulkJob.objects.filter(id=job_id).first()
    if job is None:
        raise Http404(f"There is no job {job_id}.")
    template = "console/bulk_job.html"
    return render(request, f"{template}#job-progress" if request.htmx else template, {"job": job})
