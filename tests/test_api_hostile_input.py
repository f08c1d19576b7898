"""Hostile input in every filter and body: SQL-injection strings, NUL
bytes, invalid UTF-8, huge and negative integers, a 10 MB body, JSON nested
10,000 deep. Each is answered below 500 (a 4xx with the error body when the
value cannot be what the field holds), and nothing changes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.models import AuditEvent, Message, Queue, ReplayJob, ReplaySchedule
from console.models import ApiToken

pytestmark = pytest.mark.django_db

HOSTILE = [
    "' OR 1=1 --",
    "'; DROP TABLE broker_message; --",
    "\x00",
    "nul\x00inside",
    "%FF%FE%00",
    "9" * 40,
    "-1",
    "-99999999999999999999",
    "1e309",
    "NaN",
]
# Sent as they are in the query string: bytes that are not UTF-8.
RAW = ["%FF%FE", "%ED%A0%80", "%C0%AF"]

# Every list endpoint and the query parameters it reads.
FILTERS = {
    "/api/v1/messages/": [
        "queue",
        "state",
        "reason",
        "since",
        "until",
        "header",
        "text",
        "page_size",
        "cursor",
    ],
    "/api/v1/queues/ORDERS.IN/messages/": [
        "state",
        "created_after",
        "created_before",
        "page_size",
        "cursor",
    ],
    "/api/v1/audit/": ["actor", "action", "queue", "message_id", "page_size", "cursor"],
    "/api/v1/alerts/": ["queue", "condition", "open", "page_size", "cursor"],
    "/api/v1/replay-jobs/": ["status", "page_size", "cursor"],
    "/api/v1/dead-letter-queues/SYSTEM.DEAD.LETTER.QUEUE/messages/": ["page_size", "cursor"],
    "/api/v1/rule-tables/": ["queue"],
    "/api/v1/archive/": ["queue", "since", "until", "before_id", "page_size"],
}
# Operations that take a JSON body, with a valid-looking one to corrupt.
BODIES: dict[str, dict[str, Any]] = {
    "/api/v1/queues/": {"name": "X.Q"},
    "/api/v1/queues/ORDERS.IN/messages/": {"payload": "x"},
    "/api/v1/messages/bulk/": {"action": "fail", "ids": [1]},
    "/api/v1/replay-jobs/": {"source": "dead_letter"},
    "/api/v1/replay-jobs/preview/": {"source": "dead_letter"},
    "/api/v1/replay-schedules/": {"name": "x", "source": "blacklist", "every_seconds": 60},
    "/api/v1/tokens/": {"name": "x"},
    "/api/v1/topics/": {"name": "T"},
    "/api/v1/rule-tables/": {"queue": "SYSTEM.DEAD.LETTER.QUEUE", "text": "ACTION(DISCARD)"},
}


def snapshot() -> tuple[int, ...]:
    return (
        Message.objects.count(),
        Queue.objects.count(),
        ReplayJob.objects.count(),
        ReplaySchedule.objects.count(),
        ApiToken.objects.count(),
        AuditEvent.objects.count(),
    )


def assert_refused_or_harmless(answer) -> None:
    assert answer.status_code < 500, answer.content[:300]
    assert answer["Content-Type"] == "application/json"
    if answer.status_code >= 400:
        body = answer.json()
        assert set(body) >= {"code", "detail"}


@pytest.fixture
def seeded(orders, publish):
    publish(orders, 3)
    return snapshot()


@pytest.mark.parametrize("path", list(FILTERS))
def test_hostile_values_in_every_filter(admin_api, seeded, path):
    for name in FILTERS[path]:
        for value in HOSTILE:
            assert_refused_or_harmless(admin_api.get(path, {name: value}))
        for raw in RAW:
            assert_refused_or_harmless(admin_api.get(f"{path}?{name}={raw}"))
    assert snapshot() == seeded


@pytest.mark.parametrize("path", list(BODIES))
def test_hostile_bodies_on_every_write(admin_api, seeded, path):
    sample = BODIES[path]
    refused = [
        b"\xff\xfe not utf-8 \x80",
        ("[" * 10_000 + "]" * 10_000).encode(),
        b'{"unterminated": ',
        b"NaN",
        b'{"a": NaN}',
    ]
    for body in refused:
        answer = admin_api.generic("POST", path, body, content_type="application/json")
        assert_refused_or_harmless(answer)
        assert answer.status_code >= 400, (path, body[:60])
    assert snapshot() == seeded
    # Legal for some fields (a payload may hold any bytes), never a 500.
    odd: list[object] = ["\x00", "a\x00b", "' OR 1=1 --", 10**40, -(10**40)]
    for value in odd:
        body = json.dumps(dict.fromkeys(sample, value)).encode()
        answer = admin_api.generic("POST", path, body, content_type="application/json")
        assert_refused_or_harmless(answer)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/api/v1/queues/ORDERS.IN/messages/",
            {"payload": "x", "priority": 10**40},
            "messages[0].priority",
        ),
        (
            "/api/v1/queues/ORDERS.IN/messages/",
            {"payload": "x", "priority": -1},
            "messages[0].priority",
        ),
        (
            "/api/v1/queues/ORDERS.IN/messages/",
            {"payload": "x", "delay_seconds": -(10**40)},
            "messages[0].delay_seconds",
        ),
        ("/api/v1/queues/", {"name": "BIG.Q", "max_messages": 10**40}, "max_messages"),
        ("/api/v1/queues/", {"name": "BIG.Q", "max_messages": -5}, "max_messages"),
        ("/api/v1/messages/bulk/", {"action": "fail", "ids": [10**40]}, "ids[0]"),
        ("/api/v1/replay-jobs/", {"source": "blacklist", "velocity": 10**40}, "velocity"),
        ("/api/v1/replay-jobs/", {"source": "blacklist", "velocity": -1}, "velocity"),
        (
            "/api/v1/replay-schedules/",
            {"name": "x", "source": "blacklist", "every_seconds": 10**40},
            "every_seconds",
        ),
        (
            "/api/v1/replay-schedules/",
            {"name": "x", "source": "blacklist", "every_seconds": 60, "give_up_after": -(10**40)},
            "give_up_after",
        ),
    ],
)
def test_huge_and_negative_integers_are_field_errors(admin_api, seeded, path, body, field):
    answer = admin_api.post(path, body, format="json")

    assert answer.status_code == 400
    assert field in answer.json()["field_errors"]
    assert snapshot() == seeded


def test_a_10_mb_body_is_refused_with_the_error_body(admin_api, seeded, settings):
    body = json.dumps({"payload": "x" * (10 * 1024 * 1024)}).encode()

    answer = admin_api.generic(
        "POST", "/api/v1/queues/ORDERS.IN/messages/", body, content_type="application/json"
    )

    assert answer.status_code == 413
    assert answer.json()["code"] in {"payload_too_large", "request_too_large"}
    assert snapshot() == seeded


def test_json_nested_10000_deep_is_malformed(admin_api, seeded):
    body = ('{"a":' * 10_000 + "1" + "}" * 10_000).encode()

    answer = admin_api.generic(
        "POST", "/api/v1/queues/ORDERS.IN/messages/", body, content_type="application/json"
    )

    assert (answer.status_code, answer.json()["code"]) == (400, "malformed_request")
    assert snapshot() == seeded


def test_hostile_path_values_are_404_not_500(admin_api, seeded):
    for path in (
        "/api/v1/queues/%27%20OR%201%3D1%20--/",
        "/api/v1/queues/%00/",
        "/api/v1/queues/%FF%FE/",
        "/api/v1/messages/99999999999999999999999/",
        "/api/v1/jobs/99999999999999999999999/",
        "/api/v1/replay-jobs/99999999999999999999999/",
        "/api/v1/replay-schedules/99999999999999999999999/",
        "/api/v1/replay-schedules/99999999999999999999999/jobs/",
        "/api/v1/tokens/99999999999999999999999/",
    ):
        answer = admin_api.get(path)
        assert answer.status_code == 404, path
        assert answer.json()["code"].endswith("not_found")
    assert snapshot() == seeded


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/api/v1/messages/", "since"),
        ("/api/v1/messages/", "until"),
        ("/api/v1/queues/ORDERS.IN/messages/", "created_after"),
        ("/api/v1/queues/ORDERS.IN/messages/", "created_before"),
        ("/api/v1/archive/?queue=ORDERS.IN", "since"),
    ],
)
def test_a_time_offset_postgresql_does_not_take_is_compared_in_utc(admin_api, seeded, path, name):
    """Python takes offsets up to ±23:59, PostgreSQL only to ±15:59."""
    joiner = "&" if "?" in path else "?"

    answer = admin_api.get(f"{path}{joiner}{name}=2000-01-01T00:00:00-23:00")

    assert answer.status_code == 200


def test_the_console_browser_takes_such_an_offset_too(admin, seeded):
    from django.test import Client

    client = Client()
    client.force_login(admin)

    answer = client.get("/messages/", {"since": "2000-01-01T00:00:00-23:00"})

    assert answer.status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/queues/", {"name": "X.Q", "colour": "red"}, "colour"),
        ("/api/v1/messages/bulk/", {"action": "fail", "ids": [1], "colour": "red"}, "colour"),
        (
            "/api/v1/messages/bulk/",
            {"action": "fail", "filter": {"state": "NDLV", "colour": "red"}},
            "filter.colour",
        ),
        (
            "/api/v1/replay-jobs/",
            {"source": "dead_letter", "filter": {"reason": "expired", "colour": "red"}},
            "filter.colour",
        ),
    ],
)
def test_a_key_the_schema_does_not_list_is_a_field_error_nested_too(
    admin_api, seeded, path, body, field
):
    answer = admin_api.post(path, body, format="json")

    assert answer.status_code == 400, answer.content[:300]
    assert answer.json()["field_errors"][field] == ["Unknown field."]
    assert snapshot() == seeded
