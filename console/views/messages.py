"""Messages: the browser, a message's page and downloads, the operator's
actions on one message (release, fail, purge), and edit-and-resubmit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from broker.errors import MessageNotFound
from broker.models import Message
from broker.pipeline.selectors import replayed_from, replays_of
from broker.selectors import (
    SEARCH_SPAN,
    MessageFilter,
    message_get,
    message_timeline,
    messages_page,
)
from broker.services.dumps import dump_path_for
from broker.services.transitions.blacklist import message_fail, message_purge, message_release
from broker.services.transitions.resubmit import message_resubmit
from console.access import message_held, messages_within, request_access
from console.forms import MessageFilterForm, ResubmitForm
from console.payloads import payload_view
from console.roles import Role
from console.views.common import (
    HtmxHttpRequest,
    back,
    flashed,
    found,
    page,
    role_required,
    service_errors,
)


def message_table(request: HtmxHttpRequest, template: str, fixed: dict[str, str]) -> HttpResponse:
    """The message list of ``template`` under the GET filters (``fixed``
    overrides them: the blacklist is always state NDLV)."""
    form = MessageFilterForm({**request.GET.dict(), **fixed})
    found_page = None
    if form.is_valid():
        data = {key: value for key, value in form.cleaned_data.items() if key != "before"}
        access = request_access(request)
        if data.get("queue"):
            found(access.check, role=Role.VIEWER, queue_name=data["queue"])
        found_page = messages_page(
            filters=MessageFilter(**data),
            before=form.cleaned_data["before"],
            within=messages_within(access.queues(Role.VIEWER)),
        )
    query = request.GET.copy()
    query.pop("before", None)
    context = {
        "form": form,
        "page": found_page,
        "search_span": SEARCH_SPAN,
        "query": query.urlencode(),
        # The filter as submitted, for forms that act on what it matches.
        "filter_values": [
            (name, request.GET[name])
            for name in form.fields
            if name not in {"before", *fixed} and request.GET.get(name)
        ],
    }
    return page(request, template, "message-table", context)


@require_GET
@role_required(Role.VIEWER)
def message_list(request: HtmxHttpRequest) -> HttpResponse:
    return message_table(request, "console/messages.html", {})


@require_GET
@role_required(Role.VIEWER)
def message_detail(request: HttpRequest, message_id: int) -> HttpResponse:
    message = _held(request, Role.VIEWER, message_id)
    access = request_access(request)
    return render(
        request,
        "console/message.html",
        {
            "message": message,
            # This message's queue's, over the page-wide ones.
            "can_operate": access.may(Role.OPERATOR, message.queue.name),
            "can_admin": access.may(Role.ADMIN, message.queue.name),
            "payload": None
            if message.payload is None
            else payload_view(bytes(message.payload), message.content_type),
            "timeline": message_timeline(message_id=message.id),
            "replayed_from": replayed_from(message_id=message.id),
            "replays": replays_of(message_id=message.id),
        },
    )


@require_GET
@role_required(Role.VIEWER)
def message_payload(request: HttpRequest, message_id: int) -> HttpResponse:
    """The whole payload as a download; never rendered by the browser."""
    message = _held(request, Role.VIEWER, message_id)
    if message.payload is None:
        raise Http404(f"The payload of message {message.id} was not retained.")
    response = HttpResponse(bytes(message.payload), content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="message-{message.id}.bin"'
    return response


@require_GET
@role_required(Role.VIEWER)
def message_dump(request: HttpRequest, message_id: int) -> FileResponse:
    """The dump written when the message was blacklisted. The path comes
    from the ids, never from stored or submitted text."""
    message = _held(request, Role.VIEWER, message_id)
    path = dump_path_for(queue_id=message.queue_id, message_id=message.id)
    if not message.dump_path or not path.is_file():
        raise Http404("No dump file for this message.")
    return FileResponse(path.open("rb"), as_attachment=True, filename=path.name)


def _held(request: HttpRequest, role: Role, message_id: int) -> Message:
    """The message, when the caller holds ``role`` on its queue; else the
    404 page (a queue they may not see) or the 403 page."""
    return found(message_held, request=request, role=role, message_id=message_id)


def _row_message(message_id: int) -> Message | None:
    """The message as its row shows it after an action; None once purged."""
    try:
        return message_get(message_id=message_id)
    except MessageNotFound:
        return None


def _act(
    request: HtmxHttpRequest, message_id: int, action: Callable[..., Any], done: str
) -> HttpResponse:
    """Run an operator action on one message. Its outcome (``done``, or the
    broker's refusal) is a flash message: shown in the message's row when
    htmx asked, else on the page the form came from."""
    _held(request, Role.OPERATOR, message_id)
    reason = request.POST.get("reason", "")[:500]
    with service_errors(request):
        action(message_id=message_id, actor=request.user, reason=reason)
        messages.success(request, done.format(id=message_id))
    if request.htmx:
        context = {
            "message": _row_message(message_id),
            "message_id": message_id,
            "outcomes": flashed(request),
        }
        return render(request, "console/_message_row.html", context)
    return redirect(back(request, default="blacklist"))


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


@require_http_methods(["GET", "POST"])
@role_required(Role.OPERATOR)
def message_resubmit_view(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    """Correct a blacklisted or dead-lettered message and publish the result
    as a new message; the original stays."""
    original = _held(request, Role.OPERATOR, message_id)
    try:
        text = None if original.payload is None else bytes(original.payload).decode()
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
        with service_errors(request, form=form):
            request_access(request).check(Role.OPERATOR, data["queue"])
            copy_id = message_resubmit(
                message_id=original.id,
                queue_name=data["queue"],
                payload=data["payload"].encode(),
                content_type=data["content_type"],
                headers=data["headers"],
                priority=data["priority"],
                actor=request.user,
            )
            messages.success(request, f"Published the corrected copy as message {copy_id}.")
            return redirect("message", message_id=copy_id)
    return render(
        request,
        "console/resubmit.html",
        {"original": original, "form": form, "binary": text is None},
    )
