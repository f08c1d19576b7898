"""Structured logs: with LOG_FORMAT=json every line a real Celery worker logs
is one JSON object, and each delivery's lines name the message, its queue and
the worker; the default stays one human-readable line per event."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess

import pytest

from broker.models import Message, MessageState
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from rig.processes import wait_until
from tests.support.processes import manage, refused_at_start_up

S = MessageState
WORKER = re.compile(rf"{re.escape(socket.gethostname())}:(\d+)")


def json_lines(text: str) -> list[dict]:
    """Every line of a worker's output, each of which must be a JSON object."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.slow
def test_a_json_worker_logs_each_delivery_with_its_message_queue_and_worker(start_workers):
    logged = queue_create(name="LOGGED.Q", consumer="log")
    unreadable = queue_create(name="UNREADABLE.Q", consumer="json")
    crashing = queue_create(name="CRASHING.Q", consumer="demo", batch_size=1, crash_threshold=1)
    workers = start_workers(LOG_FORMAT="json")

    [delivered] = messages_publish(queue_name=logged.name, messages=[NewMessage(payload=b"hi")])
    [dead] = messages_publish(queue_name=unreadable.name, messages=[NewMessage(payload=b"{")])
    [crashed] = messages_publish(queue_name=crashing.name, messages=[NewMessage(payload=b"CRASH")])
    wait_until(
        lambda: Message.objects.get(id=delivered).state == S.DELIVERED, timeout=30, what="ack"
    )
    wait_until(
        lambda: Message.objects.get(id=crashed).state == S.NOT_DELIVERABLE,
        timeout=30,
        what="the crash noticed",
    )
    wait_until(lambda: Message.objects.get(id=dead).queue_id != unreadable.id, timeout=30)

    deliveries = json_lines(workers.log("deliveries"))
    control = json_lines(workers.log("control"))
    for line in deliveries + control:
        assert {"timestamp", "level", "logger", "event", "worker"} <= line.keys(), line
        assert WORKER.fullmatch(line["worker"]), line
    # The consumer's own line (the "log" handler), bound to its delivery.
    [consumed] = [line for line in deliveries if line.get("message_id") == delivered]
    assert consumed["queue"] == logged.name
    assert consumed["logger"] == "broker.consumers"
    assert f"message {delivered} on {logged.name}" in consumed["event"]
    # The delivery's outcome.
    [failed] = [line for line in deliveries if line.get("message_id") == dead]
    assert failed["queue"] == unreadable.name
    assert failed["event"].endswith("dead-lettered (format_error)")
    # The crash, noticed by the sweeper, names the worker that died with it.
    about_it = [line for line in control if line.get("message_id") == crashed]
    assert [line["level"] for line in about_it] == ["info", "warning"]
    crash, alarm = about_it
    assert crash["queue"] == crashing.name
    assert crash["crashed"] is True
    assert crash["worker"] != control[0]["worker"]
    assert f"worker {crash['worker']} died delivering it" in crash["event"]
    # Then it is set aside as poison.
    assert (alarm["level"], alarm["queue"]) == ("warning", crashing.name)
    assert "quarantined" in alarm["event"]
    # Celery's own lines are JSON too.
    assert any(line["event"].endswith("ready.") for line in deliveries)


def log_a_line(**env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import logging\n"
        "log = logging.getLogger('broker.example')\n"
        "log.warning('hello %s', 'world', extra={'queue': 'ORDERS.IN', 'message_id': 7})\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    log.exception('it broke')\n"
    )
    return manage("shell", "-c", code, environ={**os.environ, "DEBUG": "1", **env})


@pytest.mark.slow
def test_json_lines_carry_the_extra_fields_and_the_traceback():
    result = log_a_line(LOG_FORMAT="json")

    assert result.returncode == 0, result.stderr
    hello, broke = (json.loads(line) for line in result.stderr.splitlines()[:2])
    assert hello["event"] == "hello world"
    assert (hello["level"], hello["logger"]) == ("warning", "broker.example")
    assert (hello["queue"], hello["message_id"]) == ("ORDERS.IN", 7)
    assert WORKER.fullmatch(hello["worker"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", hello["timestamp"])
    assert broke["event"] == "it broke"
    assert "ZeroDivisionError: division by zero" in broke["exception"]


@pytest.mark.slow
def test_text_is_the_default_one_readable_line_with_the_fields_after_the_message():
    result = log_a_line()

    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert re.fullmatch(
        r"\S+Z WARNING broker\.example hello world queue=ORDERS\.IN message_id=7 worker=\S+:\d+",
        first,
    ), first
    assert "ZeroDivisionError: division by zero" in result.stderr


@pytest.mark.slow
def test_a_bad_log_format_stops_start_up_naming_the_variable():
    error = refused_at_start_up("check", LOG_FORMAT="xml")

    assert "LOG_FORMAT: 'xml' is not valid; expected one of text, json." in error
