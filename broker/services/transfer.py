"""Messages moved as files between environments: the message document, the
streamed export (JSON Lines or CSV) of what a ``MessageFilter`` selects,
and the import of a JSON Lines file into a queue through the publish
service.

One message document a line (JSON Lines)::

    {"id": 7, "queue": "ORDERS.IN", "payload": "{\\"order\\": 1}",
     "payload_encoding": "string", "content_type": "application/json",
     "headers": {"source": "web"}, "priority": 4, "dead_letter": null,
     "state": "TBDL", "crash_count": 0, "timeout_count": 0,
     "created_at": "2026-11-26T13:29:48.123456Z", "updated_at": "..."}

``payload`` is the payload's UTF-8 text when it decodes, else its base64
(``payload_encoding`` says which, as the API's message detail does). The CSV
export has the same columns but carries every payload as base64 in
``payload_base64`` (CSV cannot carry binary), and ``headers`` and
``dead_letter`` as JSON text.

An import reads ``payload``, ``payload_encoding``, ``content_type``,
``headers`` and ``priority``; the other keys of an exported document are
allowed and ignored. The HA split-brain files (``broker.ha.diverged``) carry
the payload as ``payload_base64`` with ``put_application`` and
``put_user``; an import reads those too.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii as json_string
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.db.models import F, Func, Q, TextField
from django.db.models.functions import Cast

from broker.errors import BrokerError, InvalidInput, QueueNotFound
from broker.models import Overflow, Queue
from broker.selectors import MessageFilter, filtered_messages
from broker.services.audit import Actor, audit_record
from broker.services.limits import Limit, lock_and_measure, refuse_if_full
from broker.services.publish import NewMessage, _validate, messages_publish

FORMATS = {"jsonl": "application/x-ndjson", "csv": "text/csv"}
EXPORT_CHUNK_ROWS = 5000
# The row as it is read, in this order: one query a chunk, no model objects.
# What needs no Python comes as text from the server: the headers and the
# dead-letter header as their JSON, the times in ISO 8601 UTC
# (EXPORT_ANNOTATIONS). Parsing them into Python objects only to write them
# out again took a third of an export's time.
ROW_FIELDS = (
    "id",
    "queue__name",
    "payload",
    "content_type",
    "headers_json",
    "priority",
    "dead_letter_json",
    "state",
    "crash_count",
    "timeout_count",
    "created_utc",
    "updated_utc",
)
UTC_TEXT = "to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
EXPORT_ANNOTATIONS = {
    "headers_json": Cast("headers", TextField()),
    "dead_letter_json": Cast("dead_letter", TextField()),
    "created_utc": Func(F("created_at"), template=UTC_TEXT, output_field=TextField()),
    "updated_utc": Func(F("updated_at"), template=UTC_TEXT, output_field=TextField()),
}
# The document's keys, in the order of its JSON line.
DOCUMENT_KEYS = (
    "id",
    "queue",
    "payload",
    "payload_encoding",
    "payload_retained",
    "content_type",
    "headers",
    "priority",
    "dead_letter",
    "state",
    "crash_count",
    "timeout_count",
    "created_at",
    "updated_at",
)
CSV_COLUMNS = tuple(
    "payload_base64" if key == "payload" else key
    for key in DOCUMENT_KEYS
    if key != "payload_encoding"
)
PAYLOAD_ENCODINGS = ("string", "base64")
# Keys an import accepts: a document's, and those of the HA split-brain files.
IMPORT_KEYS = frozenset({*DOCUMENT_KEYS, "payload_base64", "put_application", "put_user"})
IMPORT_APPLICATION = "lazaretto-import"
MAX_LISTED_ERRORS = 100


class ImportInvalid(InvalidInput):
    """Lines of an import file that are not valid message documents; with
    them the import wrote nothing."""

    code = "import_invalid"

    def __init__(self, detail: str, *, errors: list[LineError]) -> None:
        super().__init__(
            detail,
            field_errors={
                f"lines[{error.line}]": [f"Line {error.line}: {error.problem}"]
                for error in errors[:MAX_LISTED_ERRORS]
            },
        )
        self.errors = errors


# --- the document -----------------------------------------------------------------


def utc_iso(moment: datetime) -> str:
    """ISO 8601 in UTC, ``Z`` for the offset (as the API writes times)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def payload_document(payload: bytes | None) -> tuple[str | None, str | None]:
    """(text, "string") when the payload is UTF-8, else (base64, "base64");
    (None, None) when it was not retained."""
    if payload is None:
        return None, None
    payload = bytes(payload)
    try:
        return payload.decode(), "string"
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode(), "base64"


def message_document(row: tuple[Any, ...]) -> dict[str, Any]:
    """One message, read as ``ROW_FIELDS``, as its export document."""
    (message_id, queue, payload, content_type, headers, priority, dead_letter, state) = row[:8]
    crash_count, timeout_count, created_at, updated_at = row[8:]
    text, encoding = payload_document(payload)
    return {
        "id": message_id,
        "queue": queue,
        "payload": text,
        "payload_encoding": encoding,
        "payload_retained": payload is not None,
        "content_type": content_type,
        "headers": json.loads(headers),
        "priority": priority,
        "dead_letter": None if dead_letter is None else json.loads(dead_letter),
        "state": state,
        "crash_count": crash_count,
        "timeout_count": timeout_count,
        "created_at": created_at,
        "updated_at": updated_at,
    }


def message_line(row: tuple[Any, ...]) -> str:
    """``message_document(row)`` as one line of JSON Lines, written from the
    row's parts: the headers and times are spliced in as the server wrote
    them, and only the strings are encoded."""
    (message_id, queue, payload, content_type, headers, priority, dead_letter, state) = row[:8]
    crash_count, timeout_count, created_at, updated_at = row[8:]
    if payload is None:
        payload_part = '"payload": null, "payload_encoding": null, "payload_retained": false'
    else:
        text, encoding = payload_document(payload)
        payload_part = (
            f'"payload": {json_string(cast(str, text))}, "payload_encoding": "{encoding}", '
            '"payload_retained": true'
        )
    return (
        f'{{"id": {message_id}, "queue": {json_string(queue)}, {payload_part}, '
        f'"content_type": {json_string(content_type)}, '
        f'"headers": {headers}, "priority": {priority}, '
        f'"dead_letter": {"null" if dead_letter is None else dead_letter}, '
        f'"state": "{state}", "crash_count": {crash_count}, "timeout_count": {timeout_count}, '
        f'"created_at": "{created_at}", "updated_at": "{updated_at}"}}\n'
    )


def _csv_row(row: tuple[Any, ...]) -> list[Any]:
    document = message_document(row)
    payload = row[ROW_FIELDS.index("payload")]
    document["payload_base64"] = "" if payload is None else base64.b64encode(payload).decode()
    document["headers"] = json.dumps(document["headers"], sort_keys=True)
    document["dead_letter"] = (
        ""
        if document["dead_letter"] is None
        else json.dumps(document["dead_letter"], sort_keys=True)
    )
    return [document[column] for column in CSV_COLUMNS]


# --- export -----------------------------------------------------------------------


def export_rows(
    filters: MessageFilter, *, chunk_rows: int = EXPORT_CHUNK_ROWS, within: Q | None = None
) -> Iterator[list[tuple[Any, ...]]]:
    """The messages ``filters`` select (of those ``within`` selects), oldest
    id first, a chunk at a time.

    Keyset by id: each chunk is its own short query (``id > last``), so an
    export of millions holds neither a transaction open (which would stop
    VACUUM) nor more than one chunk in memory."""
    selected = filtered_messages(filters)
    rows = (
        (selected if within is None else selected.filter(within))
        .annotate(**EXPORT_ANNOTATIONS)
        .order_by("id")
        .values_list(*ROW_FIELDS)
    )
    last = 0
    while True:
        chunk = list(rows.filter(id__gt=last)[:chunk_rows])
        if not chunk:
            return
        yield chunk
        last = chunk[-1][0]


def _jsonl_chunks(
    chunks: Iterable[list[tuple[Any, ...]]], count: Callable[[int], None]
) -> Iterator[str]:
    for chunk in chunks:
        count(len(chunk))
        yield "".join(map(message_line, chunk))


def _csv_chunks(
    chunks: Iterable[list[tuple[Any, ...]]], count: Callable[[int], None]
) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    for chunk in chunks:
        buffer.seek(0)
        buffer.truncate()
        count(len(chunk))
        writer.writerows(_csv_row(row) for row in chunk)
        yield buffer.getvalue()


def _check_export(filters: MessageFilter, export_format: str) -> None:
    if export_format not in FORMATS:
        problem = f"The format must be one of {', '.join(FORMATS)}, not {export_format!r}."
        raise InvalidInput(problem, field_errors={"format": [problem]})
    if filters.queue and not Queue.objects.filter(name=filters.queue).exists():
        problem = f"There is no queue named {filters.queue!r}."
        raise QueueNotFound(problem, field_errors={"queue": [problem]})


def filter_description(filters: MessageFilter) -> dict[str, str]:
    """The filter's given values, as text, for the audit log."""
    given = {name: getattr(filters, name) for name in filters.__dataclass_fields__}
    return {
        name: utc_iso(value) if isinstance(value, datetime) else str(value)
        for name, value in given.items()
        if value
    }


def messages_export(
    *,
    filters: MessageFilter,
    export_format: str,
    actor: Actor,
    via: str,
    chunk_rows: int = EXPORT_CHUNK_ROWS,
    within: Q | None = None,
) -> Iterator[str]:
    """The messages ``filters`` select (of those ``within``, a filter on
    messages, selects) as JSON Lines or CSV text, a chunk of
    rows at a time, to be written as it comes (constant memory however many
    match). Checks the format and the queue at once (InvalidInput,
    QueueNotFound); reads nothing until iterated. Once the last chunk is
    out, or the reader stops early, writes one ``messages_export`` audit
    event: who, which filter, which format, how many, and whether the export
    was read to its end."""
    _check_export(filters, export_format)
    chunks = export_rows(filters, chunk_rows=chunk_rows, within=within)
    return _audited(filters, export_format, actor, via, chunks)


def _audited(
    filters: MessageFilter,
    export_format: str,
    actor: Actor,
    via: str,
    chunks: Iterator[list[tuple[Any, ...]]],
) -> Iterator[str]:
    exported = [0]
    complete = False

    def count(rows: int) -> None:
        exported[0] += rows

    writer = _jsonl_chunks if export_format == "jsonl" else _csv_chunks
    try:
        yield from writer(chunks, count)
        complete = True
    finally:
        audit_record(
            action="messages_export",
            actor=actor,
            queue_name=filters.queue,
            reason=f"exported {exported[0]} message(s) as {export_format}"
            + ("" if complete else " (stopped early)"),
            details={
                "filter": filter_description(filters),
                "format": export_format,
                "messages": exported[0],
                "complete": complete,
                "via": via,
            },
        )


# --- import -----------------------------------------------------------------------


@dataclass(frozen=True)
class LineError:
    """Why line ``line`` (from 1) of an import file is not a message."""

    line: int
    problem: str


@dataclass(frozen=True)
class ImportResult:
    ids: list[int]
    errors: list[LineError]


class _Refused(Exception):
    pass


def _text(document: Mapping[str, Any], key: str, default: str) -> str:
    value = document.get(key, default)
    if not isinstance(value, str):
        raise _Refused(f"{key} must be a string, not {type(value).__name__}.")
    return value


def _payload(document: Mapping[str, Any]) -> bytes:
    retained = document.get("payload_retained", True)
    if not isinstance(retained, bool):
        raise _Refused(f"payload_retained must be true or false, not {retained!r}.")
    if not retained or None in (document.get("payload", ""), document.get("payload_base64", "")):
        raise _Refused(
            "the payload was not retained (its queue keeps delivered messages without "
            "their payload): there is nothing to import."
        )
    if "payload" not in document and "payload_base64" in document:
        encoded, encoding = document["payload_base64"], "base64"
    else:
        if "payload" not in document:
            raise _Refused("payload is missing.")
        encoded = document["payload"]
        encoding = _text(document, "payload_encoding", "string")
    if not isinstance(encoded, str):
        raise _Refused(f"payload must be a string, not {type(encoded).__name__}.")
    if encoding == "string":
        try:
            return encoded.encode()
        except UnicodeEncodeError:
            raise _Refused("payload holds a lone surrogate, which is not UTF-8.") from None
    if encoding != "base64":
        raise _Refused(f"payload_encoding must be string or base64, not {encoding!r}.")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _Refused("payload is not valid base64.") from None


def message_from_document(document: Any) -> NewMessage:
    """The message a document describes (its payload, content type, headers
    and priority), or _Refused saying why it describes none. The queue's own
    limits are checked by the publish service's validation."""
    if not isinstance(document, dict):
        raise _Refused(f"a line must be a JSON object, not {type(document).__name__}.")
    unknown = sorted(str(key) for key in document if key not in IMPORT_KEYS)
    if unknown:
        raise _Refused(f"unknown field(s): {', '.join(unknown)}.")
    headers = document.get("headers")
    headers = {} if headers is None else headers
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise _Refused("headers must be a JSON object of string values.")
    priority = document.get("priority", 4)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise _Refused("priority must be a whole number from 0 to 9.")
    return NewMessage(
        payload=_payload(document),
        content_type=_text(document, "content_type", "application/octet-stream"),
        headers=headers,
        priority=priority,
    )


def _parse_line(text: str | bytes, line: int, queue: Queue) -> NewMessage:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise _Refused(f"not JSON ({error}).") from None
    message = message_from_document(document)
    try:
        _validate(message, line, [queue])
    except BrokerError as error:
        # "Message 3: the payload is ..." -> "the payload is ..."
        raise _Refused(error.detail.split(": ", 1)[-1]) from None
    return message


def read_documents(
    lines: Iterable[str | bytes], queue: Queue
) -> tuple[list[NewMessage], list[LineError]]:
    """Every line of an import file checked: the messages of the good lines,
    and each bad line's number and why. Blank lines are skipped."""
    good: list[NewMessage] = []
    bad: list[LineError] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            good.append(_parse_line(text, number, queue))
        except _Refused as refused:
            bad.append(LineError(number, str(refused)))
    return good, bad


def _refuse_invalid(good: list[NewMessage], bad: list[LineError], partial: bool) -> None:
    if not good and not bad:
        raise ImportInvalid(
            "The file holds no message.", errors=[LineError(1, "The file is empty.")]
        )
    if bad and (not partial or not good):
        first = bad[0]
        raise ImportInvalid(
            f"{len(bad)} line(s) of {len(good) + len(bad)} are not valid message documents "
            f"(line {first.line}: {first.problem}); nothing was written.",
            errors=bad,
        )


def messages_import(
    *,
    queue_name: str,
    lines: Iterable[str | bytes],
    actor: Actor,
    via: str,
    partial: bool = False,
) -> ImportResult:
    """Publish the messages of a JSON Lines file to a queue as new TBDL
    messages, all in one transaction, through the publish service (its
    validation, payload limit, dead-letter refusal and max-messages rules).

    Every line is checked first. A bad line refuses the whole import
    (ImportInvalid, listing each bad line and why) unless ``partial``: then
    the good lines are published and the bad ones returned. A ``reject_new``
    queue that the whole import would take past its max messages refuses it
    whole (MaxMessagesReached), as a publish is refused. Writes one
    ``messages_import`` audit event."""
    queue = Queue.objects.filter(name=queue_name).first()
    if queue is None:
        raise QueueNotFound(f"There is no queue named {queue_name!r}.")
    good, bad = read_documents(lines, queue)
    _refuse_invalid(good, bad, partial)
    user = getattr(actor, "username", "") or ""
    batch = settings.LAZARETTO_MAX_PUBLISH_BATCH
    ids: list[int] = []
    with transaction.atomic():
        if queue.max_messages is not None and queue.overflow == Overflow.REJECT_NEW:
            limit = Limit.of_queue(queue)
            refuse_if_full([limit], lock_and_measure([queue.id]), len(good))
        for start in range(0, len(good), batch):
            ids += messages_publish(
                queue_name=queue.name,
                messages=good[start : start + batch],
                put_user=user,
                put_application=IMPORT_APPLICATION,
            )
        audit_record(
            action="messages_import",
            actor=actor,
            queue_name=queue.name,
            reason=f"imported {len(ids)} message(s)"
            + (f", skipped {len(bad)} bad line(s)" if bad else ""),
            details={
                "messages": len(ids),
                "bad_lines": [error.line for error in bad[:MAX_LISTED_ERRORS]],
                "partial": partial,
                "via": via,
            },
        )
    return ImportResult(ids=ids, errors=bad)
