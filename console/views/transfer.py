"""Messages as files in the console: the export of what a message list's
filter shows (the message browser, the blacklist, a dead-letter queue), and
a JSON Lines upload into a queue (broker.services.transfer)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from broker.selectors import MessageFilter
from broker.services.transfer import messages_export, messages_import
from console.access import messages_within, queue_held, request_access
from console.api.transfer import export_download
from console.forms import ImportForm, MessageFilterForm
from console.roles import Role
from console.views.common import HtmxHttpRequest, found, role_required, service_errors

FORMAT_LABELS = [("jsonl", "JSON Lines"), ("csv", "CSV (payloads in base64)")]


@require_GET
@role_required(Role.OPERATOR)
def messages_export_view(request: HtmxHttpRequest) -> HttpResponseBase:
    """A download of every message the filter selects, streamed; a refused
    filter (an unknown queue) is shown again, its error beside the field."""
    form = MessageFilterForm(request.GET)
    export_format = request.GET.get("format", "jsonl")
    if form.is_valid():
        values = {name: value for name, value in form.cleaned_data.items() if name != "before"}
        access = request_access(request)
        with service_errors(request, form=form, field="queue"):
            if values.get("queue"):
                access.check(Role.OPERATOR, values["queue"])
            chunks = messages_export(
                filters=MessageFilter(**values),
                export_format=export_format,
                actor=request.user,
                via="console",
                within=messages_within(access.queues(Role.OPERATOR)),
            )
            return export_download(chunks, export_format)
    context = {"form": form, "formats": FORMAT_LABELS, "chosen": export_format}
    return render(request, "console/export.html", context, status=400)


@require_POST
@role_required(Role.OPERATOR)
def queue_import_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Publish an uploaded JSON Lines file's messages to the queue. Back to
    the queue's page when every line went in; else this form again, each bad
    line's number and why beside the file field (with ``partial``, the good
    lines were written and the bad ones are listed)."""
    queue = found(queue_held, request=request, role=Role.OPERATOR, name=name)
    form = ImportForm(request.POST, request.FILES)
    skipped = []
    if form.is_valid():
        with service_errors(request, form=form, field="file"):
            result = messages_import(
                queue_name=queue.name,
                lines=form.cleaned_data["file"],
                actor=request.user,
                via="console",
                partial=form.cleaned_data["partial"],
            )
            messages.success(request, f"Imported {len(result.ids)} message(s) into {queue.name}.")
            if not result.errors:
                return redirect("queue", name=queue.name)
            skipped = result.errors
    context = {"queue": queue, "form": form, "skipped": skipped}
    return render(request, "console/queue_import.html", context, status=200 if skipped else 400)
