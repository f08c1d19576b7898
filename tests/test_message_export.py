"""Exporting messages as JSON Lines or CSV: through the API (streamed), the
command, and the service; what each line holds, the audit event, errors and
roles."""

from __future__ import annotations

import base64
import csv
import io
import json
from datetime import datetime

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from broker.models import AuditEvent, Queue
from broker.selectors import MessageFilter
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.transfer import (
    CSV_COLUMNS,
    DOCUMENT_KEYS,
    export_rows,
    message_document,
    messages_export,
)
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE, blacklisted, dead_lettered
from tests.support.transfer import documents, exported, published_samples

pytestmark = pytest.mark.django_db


def test_the_api_streams_a_queues_messages_as_json_lines(operator_api, orders: Queue) -> None:
    ids = published_samples(orders)
    response, text = exported(operator_api, queue="ORDERS.IN")
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"].startswith('attachment; filename="messages-')
    lines = documents(text)
    assert [line["id"] for line in lines] == ids
    assert all(tuple(line) == DOCUMENT_KEYS for line in lines)
    text_line, json_line, binary_line = lines
    assert (text_line["payload"], text_line["payload_encoding"]) == ("hello", "string")
    assert text_line["headers"] == {"source": "web"}
    assert (json_line["content_type"], json_line["priority"]) == ("application/json", 7)
    assert binary_line["payload_encoding"] == "base64"
    assert base64.b64decode(binary_line["payload"]) == bytes(range(256))
    assert (binary_line["queue"], binary_line["state"], binary_line["dead_letter"]) == (
        "ORDERS.IN",
        "TBDL",
        None,
    )
    assert binary_line["created_at"].endswith("Z")
    datetime.fromisoformat(binary_line["updated_at"])


def test_the_csv_export_carries_every_payload_as_base64(operator_api, orders: Queue) -> None:
    published_samples(orders)
    response, text = exported(operator_api, queue="ORDERS.IN", format="csv")
    assert response["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(text)))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert "payload_encoding" not in CSV_COLUMNS
    assert [base64.b64decode(row["payload_base64"]) for row in rows] == [
        b"hello",
        b'{"order": 1}',
        bytes(range(256)),
    ]
    assert json.loads(rows[2]["headers"]) == {"kind": "binary", "n": "1"}
    assert rows[0]["dead_letter"] == ""


def test_the_blacklist_and_a_dead_letter_queue_export_what_their_pages_show(
    operator_api, orders: Queue
) -> None:
    published_samples(orders)
    poison = blacklisted(orders, 2)
    dead = dead_lettered(queue_create(name="PAY.IN"), 3, reason="handler_error")
    blacklist = documents(exported(operator_api, state="NDLV")[1])
    assert [line["id"] for line in blacklist] == sorted(poison)  # oldest first
    _, text = exported(
        operator_api, queue=SYSTEM_DEAD_LETTER_QUEUE, state="TBDL", reason="handler_error"
    )
    letters = documents(text)
    assert [line["id"] for line in letters] == sorted(dead)
    assert letters[0]["dead_letter"]["original_queue"] == "PAY.IN"
    assert letters[0]["dead_letter"]["reason"] == "handler_error"


def test_a_json_line_is_the_document_written_from_the_servers_text(orders: Queue) -> None:
    messages_publish(
        queue_name="ORDERS.IN",
        messages=[NewMessage(payload='grüß \\ "q"'.encode(), headers={"city": "Zürich", "b": "1"})],
    )
    dead_lettered(queue_create(name="PAY.IN"), 1, reason="handler_error")
    rows = [row for chunk in export_rows(MessageFilter()) for row in chunk]
    text = "".join(
        messages_export(filters=MessageFilter(), export_format="jsonl", actor=None, via="test")
    )
    lines = documents(text)
    assert lines == [message_document(row) for row in rows]
    assert lines[0]["headers"] == {"city": "Zürich", "b": "1"}
    assert lines[0]["payload"] == 'grüß \\ "q"'
    assert lines[1]["dead_letter"]["reason"] == "handler_error"
    assert all(line["created_at"].endswith("Z") for line in lines)
    assert all(datetime.fromisoformat(line["created_at"]) for line in lines)


def test_a_search_exports_by_header_and_payload_text(operator_api, orders: Queue) -> None:
    ids = published_samples(orders)
    assert [line["id"] for line in documents(exported(operator_api, header="kind=binary")[1])] == [
        ids[2]
    ]
    assert [line["id"] for line in documents(exported(operator_api, text="order")[1])] == [ids[1]]


def test_an_export_reads_nothing_until_iterated_then_a_chunk_a_query(orders: Queue) -> None:
    published_samples(orders)
    published_samples(orders)
    filters = MessageFilter(queue="ORDERS.IN")
    with CaptureQueriesContext(connection) as checked:
        chunks = messages_export(filters=filters, export_format="jsonl", actor=None, via="test")
    assert len(checked) == 1  # the queue exists; no message read yet
    with CaptureQueriesContext(connection) as read:
        first = next(chunks)
    assert len(read) == 1
    assert len(first.splitlines()) == 6
    small = messages_export(
        filters=filters, export_format="jsonl", actor=None, via="t", chunk_rows=2
    )
    assert [len(chunk.splitlines()) for chunk in small] == [2, 2, 2]


def test_an_export_is_audited_with_its_filter_format_and_count(
    operator, operator_api, orders: Queue
) -> None:
    published_samples(orders)
    exported(operator_api, queue="ORDERS.IN", format="csv", header="source=web")
    event = AuditEvent.objects.get(action="messages_export")
    assert (event.actor, event.queue_name) == (operator, "ORDERS.IN")
    assert event.details["filter"] == {"queue": "ORDERS.IN", "header": "source=web"}
    assert (event.details["format"], event.details["messages"]) == ("csv", 1)
    assert event.details["complete"] is True


def test_an_unknown_queue_or_format_is_refused_with_a_stable_code(operator_api, orders) -> None:
    response = operator_api.get("/api/v1/messages/export/", {"queue": "NO.SUCH.Q"})
    assert response.status_code == 404
    assert response.json()["code"] == "queue_not_found"
    assert "NO.SUCH.Q" in response.json()["detail"]
    response = operator_api.get("/api/v1/messages/export/", {"format": "xml"})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert "format" in response.json()["field_errors"]
    assert not AuditEvent.objects.filter(action="messages_export").exists()


def test_errors_are_json_whatever_the_client_accepts(operator_api) -> None:
    response = operator_api.get(
        "/api/v1/messages/export/", {"queue": "NO.SUCH.Q"}, HTTP_ACCEPT="text/csv"
    )
    assert (response.status_code, response["Content-Type"]) == (404, "application/json")


def test_a_viewer_may_not_export_and_nobody_anonymously(viewer_api, anonymous_api) -> None:
    assert viewer_api.get("/api/v1/messages/export/").status_code == 403
    assert anonymous_api.get("/api/v1/messages/export/").status_code == 401


def test_the_command_exports_to_stdout_or_a_file(orders: Queue, tmp_path) -> None:
    ids = published_samples(orders)
    out = io.StringIO()
    call_command("messages", "export", "--queue", "ORDERS.IN", stdout=out)
    assert [line["id"] for line in documents(out.getvalue())] == ids
    target = tmp_path / "orders.csv"
    call_command("messages", "export", "--queue", "ORDERS.IN", "--output", str(target))
    rows = list(csv.DictReader(target.open()))
    assert base64.b64decode(rows[2]["payload_base64"]) == bytes(range(256))
    event = AuditEvent.objects.filter(action="messages_export").latest("id")
    assert (event.actor_name, event.details["format"]) == ("system", "csv")
    assert event.details["via"] == "manage.py messages"


def test_the_command_refuses_an_unknown_queue(db) -> None:
    with pytest.raises(CommandError, match="no queue named 'NO.SUCH.Q'"):
        call_command("messages", "export", "--queue", "NO.SUCH.Q", stdout=io.StringIO())
