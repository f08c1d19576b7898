"""Importing JSON Lines into a queue: round trips through the API and the
command (binary payloads included), line-by-line validation with nothing
written on a bad line, the partial flag, the queue's limits, roles and the
audit event."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from drf_spectacular.generators import SchemaGenerator
from jsonschema import Draft202012Validator

from broker.models import AuditEvent, Message, Queue
from broker.services.queues import queue_create
from tests.support.transfer import (
    JSON_LINES,
    contents,
    exported,
    imported,
    published_samples,
    sample_contents,
)

pytestmark = pytest.mark.django_db

GOOD = json.dumps({"payload": "ok"})


@pytest.fixture
def target(db) -> Queue:
    return queue_create(name="ORDERS.COPY", max_payload_bytes=1024)


def test_an_api_export_imported_through_the_api_keeps_every_message(
    operator_api, orders: Queue, target: Queue
) -> None:
    published_samples(orders)
    _, text = exported(operator_api, queue="ORDERS.IN")
    response = imported(operator_api, "ORDERS.COPY", text)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["count"], body["skipped"]) == (3, [])
    assert body["ids"] == list(
        Message.objects.filter(queue=target).order_by("id").values_list("id", flat=True)
    )
    assert contents(target) == sample_contents()
    assert {m.state for m in Message.objects.filter(queue=target)} == {"TBDL"}


def test_a_command_export_imported_by_the_command_keeps_every_message(
    orders: Queue, target: Queue, tmp_path: Path
) -> None:
    published_samples(orders)
    file = tmp_path / "orders.jsonl"
    call_command("messages", "export", "--queue", "ORDERS.IN", "--output", str(file))
    out = io.StringIO()
    call_command("messages", "import", "ORDERS.COPY", str(file), stdout=out)
    assert out.getvalue().strip() == "ORDERS.COPY: imported 3 message(s)"
    assert contents(target) == sample_contents()


def test_an_import_is_audited_with_who_and_how_many(operator, operator_api, target) -> None:
    imported(operator_api, "ORDERS.COPY", f"{GOOD}\n{GOOD}\n")
    event = AuditEvent.objects.get(action="messages_import")
    assert (event.actor, event.queue_name, event.details["messages"]) == (
        operator,
        "ORDERS.COPY",
        2,
    )
    assert Message.objects.filter(queue=target, put_user="oscar").count() == 2


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("not json", "not JSON"),
        ('["a", "list"]', "must be a JSON object"),
        ('{"content_type": "text/plain"}', "payload is missing"),
        (
            '{"payload": "x", "payload_encoding": "hex"}',
            "payload_encoding must be string or base64",
        ),
        ('{"payload": "***", "payload_encoding": "base64"}', "not valid base64"),
        ('{"payload": "x", "headers": {"a": 1}}', "headers must be a JSON object of string values"),
        ('{"payload": "x", "headers": ["a"]}', "headers must be a JSON object of string values"),
        ('{"payload": "x", "priority": 12}', "priority must be from 0 to 9"),
        ('{"payload": "x", "priority": "high"}', "priority must be a whole number"),
        ('{"payload": 5}', "payload must be a string"),
        ('{"payload": "x", "colour": "red"}', "unknown field(s): colour"),
        ('{"payload": "x", "content_type": ""}', "content type must be 1 to 100"),
        ('{"payload": "x", "content_type": "a\\u0000"}', "content type holds a NUL"),
        ('{"payload": "x", "headers": {"\\u0000": "v"}}', "name '\\x00' holds a NUL"),
        ('{"payload": "x", "headers": {"k": "\\u0000"}}', "Header 'k' holds a NUL"),
        ('{"payload": "x", "headers": {"\\udc00": "v"}}', "holds a lone surrogate"),
        (json.dumps({"payload": "x" * 1025}), "queue ORDERS.COPY accepts at most 1,024"),
    ],
)
def test_a_bad_line_refuses_the_whole_file_saying_which_and_why(
    operator_api, target: Queue, line: str, problem: str
) -> None:
    response = imported(operator_api, "ORDERS.COPY", f"{GOOD}\n{line}\n{GOOD}\n")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "import_invalid"
    assert list(body["field_errors"]) == ["lines[2]"]
    assert problem in body["field_errors"]["lines[2]"][0]
    assert "nothing was written" in body["detail"]
    assert not Message.objects.filter(queue=target).exists()
    assert not AuditEvent.objects.filter(action="messages_import").exists()


def test_a_file_that_is_not_json_lines_is_refused_line_by_line(operator_api, target) -> None:
    csv_text = "id,queue,payload_base64\n1,ORDERS.IN,aGVsbG8=\n"
    body = imported(operator_api, "ORDERS.COPY", csv_text).json()
    assert (body["code"], sorted(body["field_errors"])) == (
        "import_invalid",
        ["lines[1]", "lines[2]"],
    )
    assert imported(operator_api, "ORDERS.COPY", "").json()["code"] == "import_invalid"
    assert imported(operator_api, "ORDERS.COPY", b"\xff\xfe\x00\n").status_code == 400
    assert not Message.objects.filter(queue=target).exists()


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        pytest.param("", False, id="empty"),
        pytest.param("\n \r\n\t\n", False, id="blank-lines"),
        pytest.param(f"\n{GOOD}\n\n", True, id="a-message-among-blank-lines"),
    ],
)
@pytest.mark.parametrize("media_type", [JSON_LINES, "text/plain"])
def test_the_schema_states_that_a_body_holds_a_line_that_is_not_blank(
    operator_api, target, media_type, body, valid
) -> None:
    """A body without a message is one the schema refuses, as the API does;
    and the body is required, so a client sends one."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    request_body = schema["paths"]["/api/v1/queues/{name}/messages/import/"]["post"]["requestBody"]
    validator = Draft202012Validator(request_body["content"][media_type]["schema"])

    response = operator_api.generic(
        "POST", "/api/v1/queues/ORDERS.COPY/messages/import/", body, content_type=media_type
    )

    assert request_body["required"] is True
    assert validator.is_valid(body) is valid
    if valid:
        assert (response.status_code, response.json()["count"]) == (201, 1)
    else:
        assert (response.status_code, response.json()["code"]) == (400, "import_invalid")
        assert not Message.objects.filter(queue=target).exists()


def test_partial_writes_the_good_lines_and_lists_the_bad(operator_api, target) -> None:
    text = f"{GOOD}\nnot json\n\n{json.dumps({'payload': 'AAE=', 'payload_encoding': 'base64'})}\n"
    response = imported(operator_api, "ORDERS.COPY", text, partial="true")
    assert response.status_code == 201
    body = response.json()
    assert body["count"] == 2
    assert [(s["line"], s["detail"][:8]) for s in body["skipped"]] == [(2, "not JSON")]
    assert [payload for payload, *_ in contents(target)] == [b"ok", b"\x00\x01"]
    event = AuditEvent.objects.get(action="messages_import")
    assert (event.details["bad_lines"], event.details["partial"]) == ([2], True)


def test_the_command_lists_bad_lines_and_writes_nothing_without_partial(target, tmp_path) -> None:
    file = tmp_path / "bad.jsonl"
    file.write_text(f"{GOOD}\n{{\n{GOOD}\n")
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 line"):
        call_command("messages", "import", "ORDERS.COPY", str(file), stderr=err)
    assert f"{file}:2: not JSON" in err.getvalue()
    assert not Message.objects.filter(queue=target).exists()
    out = io.StringIO()
    call_command(
        "messages", "import", "ORDERS.COPY", str(file), "--partial", stdout=out, stderr=err
    )
    assert "imported 2 message(s), skipped 1 bad line(s)" in out.getvalue()
    assert Message.objects.filter(queue=target).count() == 2


def test_an_import_that_would_pass_a_reject_new_limit_is_refused_whole(operator_api, db) -> None:
    full = queue_create(name="SMALL.Q", max_messages=3, overflow="reject_new")
    response = imported(operator_api, "SMALL.Q", "\n".join([GOOD] * 4))
    assert response.status_code == 409
    assert (response.json()["code"], response.json()["limit"]) == ("max_messages_reached", 3)
    assert not Message.objects.filter(queue=full).exists()
    assert imported(operator_api, "SMALL.Q", "\n".join([GOOD] * 3)).status_code == 201


def test_a_large_import_is_written_in_publish_batches_all_or_nothing(
    operator_api, target, settings
) -> None:
    settings.LAZARETTO_MAX_PUBLISH_BATCH = 2
    assert imported(operator_api, "ORDERS.COPY", "\n".join([GOOD] * 5)).json()["count"] == 5
    full = queue_create(name="SMALL.Q", max_messages=4, overflow="reject_new")
    assert imported(operator_api, "SMALL.Q", "\n".join([GOOD] * 5)).status_code == 409
    assert not Message.objects.filter(queue=full).exists()


def test_an_unknown_or_dead_letter_queue_is_refused(operator_api, db) -> None:
    response = imported(operator_api, "NO.SUCH.Q", GOOD)
    assert (response.status_code, response.json()["code"]) == (404, "queue_not_found")
    response = imported(operator_api, "SYSTEM.DEAD.LETTER.QUEUE", GOOD)
    assert (response.status_code, response.json()["code"]) == (409, "queue_is_dead_letter")
    with pytest.raises(CommandError, match="no queue named 'NO.SUCH.Q'"):
        call_command("messages", "import", "NO.SUCH.Q", "/dev/null")


def test_an_upload_over_the_size_limit_is_refused(operator_api, target, settings) -> None:
    settings.LAZARETTO_MAX_IMPORT_BYTES = 100
    response = imported(operator_api, "ORDERS.COPY", "\n".join([GOOD] * 10))
    assert (response.status_code, response.json()["code"]) == (413, "request_too_large")
    assert not Message.objects.filter(queue=target).exists()


def test_only_json_lines_bodies_are_taken(operator_api, target) -> None:
    response = operator_api.post(
        "/api/v1/queues/ORDERS.COPY/messages/import/", {"payload": "x"}, format="json"
    )
    assert (response.status_code, response.json()["code"]) == (415, "unsupported_media_type")


def test_a_viewer_may_not_import(viewer_api, target) -> None:
    assert imported(viewer_api, "ORDERS.COPY", GOOD).status_code == 403
    assert not Message.objects.filter(queue=target).exists()


def test_a_split_brain_export_file_imports_too(target, tmp_path) -> None:
    """broker.ha.diverged writes the payload as payload_base64, with the
    application and user that put it."""
    document = {
        "id": 9,
        "queue": "ORDERS.IN",
        "payload_base64": base64.b64encode(b"\x00diverged").decode(),
        "content_type": "application/octet-stream",
        "headers": {"a": "b"},
        "priority": 3,
        "state": "TBDL",
        "created_at": "2026-01-01T00:00:00+00:00",
        "put_application": "web",
        "put_user": "u",
    }
    file = tmp_path / "diverged-B.jsonl"
    file.write_text(json.dumps(document) + "\n")
    call_command("messages", "import", "ORDERS.COPY", str(file), stdout=io.StringIO())
    assert contents(target) == [(b"\x00diverged", "application/octet-stream", {"a": "b"}, 3)]
