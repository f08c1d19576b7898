from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection
from drf_spectacular.generators import SchemaGenerator
from jsonschema import Draft202012Validator

from broker.models import Message, MessageState, Queue
from broker.services.publish import MAX_HEADER_NAME_LENGTH, MAX_HEADERS
from broker.services.topics import subscription_create, topic_create
from tests.support.messages import payload_of

if TYPE_CHECKING:
    from rest_framework.response import _MonkeyPatchedResponse as Response

pytestmark = pytest.mark.django_db


def url(queue: str) -> str:
    return f"/api/v1/queues/{queue}/messages/"


def stored() -> int:
    return Message.objects.count()


def refused(response: Response, status: int) -> Any:
    """The error body of a publish answered ``status``; fails the test
    when the publish stored anything."""
    assert response.status_code == status, response.content
    assert stored() == 0
    return response.json()


def test_it_stores_a_batch_of_1000_as_tbdl(operator_api, orders):
    batch = [{"payload": f"order {n}", "headers": {"n": str(n)}} for n in range(1000)]

    response = operator_api.post(url("ORDERS.IN"), {"messages": batch}, format="json")

    assert response.status_code == 201, response.json()
    assert response.json()["count"] == 1000
    assert len(set(response.json()["ids"])) == 1000
    assert Message.objects.filter(queue=orders, state=MessageState.TO_BE_DELIVERED).count() == 1000
    first = Message.objects.get(id=response.json()["ids"][0])
    assert payload_of(first) == b"order 0"
    assert first.headers == {"n": "0"}
    assert first.put_user == "oscar"


def test_it_publishes_a_single_message_object(operator_api, orders):
    response = operator_api.post(
        url("ORDERS.IN"),
        {
            "payload": "aGk=",
            "payload_encoding": "base64",
            "priority": 9,
            "content_type": "text/plain",
        },
        format="json",
    )

    assert response.status_code == 201
    message = Message.objects.get(id=response.json()["ids"][0])
    assert payload_of(message) == b"hi"
    assert message.priority == 9
    assert message.content_type == "text/plain"


def test_it_rejects_a_batch_with_one_oversized_payload_and_stores_nothing(operator_api, orders):
    batch = [{"payload": "small"} for _ in range(10)]
    batch[7] = {"payload": "x" * (1024 * 1024 + 1)}

    response = operator_api.post(url("ORDERS.IN"), {"messages": batch}, format="json")

    body = refused(response, 413)
    assert body["code"] == "payload_too_large"
    assert body["index"] == 7
    assert "Message 7" in body["detail"]


def test_the_payload_limit_follows_the_queues_setting(operator_api, orders):
    Queue.objects.filter(pk=orders.pk).update(max_payload_bytes=4)

    assert (
        operator_api.post(url("ORDERS.IN"), {"payload": "1234"}, format="json").status_code == 201
    )
    response = operator_api.post(url("ORDERS.IN"), {"payload": "12345"}, format="json")
    assert response.status_code == 413
    assert stored() == 1


def test_it_answers_404_for_an_unknown_queue(operator_api, db):
    response = operator_api.post(url("NO.SUCH.QUEUE"), {"payload": "x"}, format="json")

    body = refused(response, 404)
    assert body["code"] == "queue_not_found"
    assert "NO.SUCH.QUEUE" in body["detail"]


def test_it_rejects_malformed_json(operator_api, orders):
    response = operator_api.post(
        url("ORDERS.IN"), data='{"payload": "x",', content_type="application/json"
    )

    body = refused(response, 400)
    assert body["code"] == "malformed_request"
    assert body["detail"]


@pytest.mark.parametrize("headers", [["a", "b"], "a=b", 5, {"n": 1}, {"nested": {"a": "b"}}])
def test_it_rejects_headers_that_are_not_a_flat_object_of_strings(operator_api, orders, headers):
    response = operator_api.post(
        url("ORDERS.IN"), {"payload": "x", "headers": headers}, format="json"
    )

    body = refused(response, 400)
    assert body["code"] == "invalid"
    assert [field.startswith("messages[0].headers") for field in body["field_errors"]] == [True]


@pytest.mark.parametrize("priority", [12, -1, "high", 4.5])
def test_it_rejects_a_priority_outside_0_to_9(operator_api, orders, priority):
    response = operator_api.post(
        url("ORDERS.IN"), {"payload": "x", "priority": priority}, format="json"
    )

    body = refused(response, 400)
    assert "messages[0].priority" in body["field_errors"]


def test_a_bad_item_anywhere_rejects_the_whole_batch(operator_api, orders):
    batch = [{"payload": "ok"}] * 5 + [{"payload": "x", "priority": 12}]

    response = operator_api.post(url("ORDERS.IN"), {"messages": batch}, format="json")

    body = refused(response, 400)
    assert "messages[5].priority" in body["field_errors"]


def test_it_refuses_publishing_straight_to_a_dead_letter_queue(operator_api, db):
    response = operator_api.post(url("SYSTEM.DEAD.LETTER.QUEUE"), {"payload": "x"}, format="json")

    body = refused(response, 409)
    assert body["code"] == "queue_is_dead_letter"


def test_it_refuses_a_batch_over_1000(operator_api, orders):
    response = operator_api.post(
        url("ORDERS.IN"), {"messages": [{"payload": "x"}] * 1001}, format="json"
    )

    body = refused(response, 400)
    assert "messages" in body["field_errors"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": []}, "messages"),
        ({"payload": "%%%", "payload_encoding": "base64"}, "messages[0].payload"),
        ({"payload": "x", "payload_encoding": "rot13"}, "messages[0].payload_encoding"),
        ({"headers": {}}, "messages[0].payload"),
        ({"payload": "x", "delay_seconds": -5}, "messages[0].delay_seconds"),
        ({"payload": "x", "content_type": "t" * 101}, "messages[0].content_type"),
        ({"payload": "\ud800"}, "messages[0].payload"),
        ({"payload": "x", "headers": {"\u0000": "v"}}, "messages[0].headers"),
        ({"payload": "x", "headers": {"a\u0000b": ""}}, "messages[0].headers"),
        ({"payload": "x", "headers": {"\udc00": "v"}}, "messages[0].headers"),
        ({"payload": "x", "headers": {"k": "\udc00"}}, "messages[0].headers.k"),
        ({"payload": "x", "content_type": "a\u0000"}, "messages[0].content_type"),
    ],
)
def test_it_names_the_field_of_other_bad_input(operator_api, orders, body, field):
    raw = json.dumps(body)  # escapes a lone surrogate as \ud800, as a client would send it
    response = operator_api.post(url("ORDERS.IN"), raw, content_type="application/json")

    body = refused(response, 400)
    assert field in body["field_errors"]


def test_it_answers_401_without_credentials(anonymous_api, orders):
    response = anonymous_api.post(url("ORDERS.IN"), {"payload": "x"}, format="json")

    body = refused(response, 401)
    assert body["code"] == "not_authenticated"


def test_a_viewer_cannot_publish(viewer_api, orders):
    response = viewer_api.post(url("ORDERS.IN"), {"payload": "x"}, format="json")

    body = refused(response, 403)
    assert body["code"] == "permission_denied"


def test_a_publish_keeps_binary_payloads_intact(operator_api, admin_api, orders):
    raw = bytes(range(256))
    response = operator_api.post(
        url("ORDERS.IN"),
        {"payload": base64.b64encode(raw).decode(), "payload_encoding": "base64"},
        format="json",
    )

    detail = admin_api.get(f"/api/v1/messages/{response.json()['ids'][0]}/").json()
    assert detail["payload_encoding"] == "base64"
    assert base64.b64decode(detail["payload"]) == raw
    assert detail["payload_bytes"] == 256


def test_the_depth_counters_match_the_rows_after_publishing(operator_api, orders):
    operator_api.post(url("ORDERS.IN"), [{"payload": "a"}] * 7, format="json")

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count FROM broker_queuedepth_current WHERE queue_id = %s AND state = 'TBDL'",
            [orders.id],
        )
        assert cursor.fetchone() == (7,)
    assert (
        json.loads(json.dumps(operator_api.get("/api/v1/queues/ORDERS.IN/").json()))["depth"][
            "TBDL"
        ]
        == 7
    )


# Headers the schema and the API take, and headers both refuse: a name
# blank, too long or holding a NUL (which PostgreSQL cannot store), too many.
LONGEST_NAME = "n" * MAX_HEADER_NAME_LENGTH
HEADERS = [
    pytest.param({LONGEST_NAME: "v"}, True, id="longest-name"),
    pytest.param({f"h{n}": "v" for n in range(MAX_HEADERS)}, True, id="most-headers"),
    pytest.param({"": "v"}, False, id="blank-name"),
    pytest.param({f"{LONGEST_NAME}n": "v"}, False, id="name-too-long"),
    pytest.param({"\u0000": "v"}, False, id="nul-name"),
    pytest.param({"a\u0000b": "v"}, False, id="nul-inside-name"),
    pytest.param({"k": "a\u0000"}, False, id="nul-value"),
    pytest.param({f"h{n}": "v" for n in range(MAX_HEADERS + 1)}, False, id="too-many"),
]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


@pytest.fixture
def topic(db):
    topic = topic_create(name="ORDERS", topic_string="orders")
    subscription_create(
        name="BILLING", topic=topic, queue_name="BILLING.Q", topic_filter="orders/#"
    )
    return topic


@pytest.mark.parametrize(("headers", "valid"), HEADERS)
@pytest.mark.parametrize(
    ("operation", "path"),
    [
        ("/api/v1/queues/{name}/messages/", "/api/v1/queues/ORDERS.IN/messages/"),
        ("/api/v1/topics/{name}/messages/", "/api/v1/topics/ORDERS/messages/"),
    ],
)
def test_the_schema_states_which_headers_a_publish_takes(
    operator_api, schema, orders, topic, operation, path, headers, valid
):
    """OpenAPI 3.1 constrains an object's keys (propertyNames): what the
    schema calls a valid publish, the API stores, and what it refuses, the
    API refuses, naming the headers."""
    body_schema = schema["paths"][operation]["post"]["requestBody"]["content"]["application/json"]
    validator = Draft202012Validator({**body_schema["schema"], "components": schema["components"]})
    body = {"messages": [{"payload": "x", "headers": headers}]}

    response = operator_api.post(path, body, format="json")

    assert validator.is_valid(body) is valid
    if valid:
        assert response.status_code == 201, response.json()
    else:
        assert response.status_code == 400, response.json()
        assert response.json()["code"] == "invalid"
        assert [
            field.startswith("messages[0].headers") for field in response.json()["field_errors"]
        ] == [True]
        assert stored() == 0


def test_a_topic_publish_no_subscription_takes_is_still_checked(operator_api, db):
    """Nothing is written, but what the schema refuses the API refuses too."""
    topic_create(name="QUIET", topic_string="quiet")

    response = operator_api.post(
        "/api/v1/topics/QUIET/messages/",
        {"payload": "x", "headers": {"\u0000": "v"}},
        format="json",
    )

    assert response.status_code == 400, response.json()
    assert list(response.json()["field_errors"]) == ["messages[0].headers"]


def test_a_whole_number_written_with_a_zero_fraction_is_that_number(operator_api, orders):
    """JSON Schema 2020-12 (OpenAPI 3.1's) counts 8.0 an integer, as a
    client's JSON library may write it; 8.5 is none."""
    whole = operator_api.post(
        url("ORDERS.IN"), {"payload": "x", "priority": 8.0, "delay_seconds": 0.0}, format="json"
    )
    half = operator_api.post(url("ORDERS.IN"), {"payload": "y", "priority": 8.5}, format="json")

    assert whole.status_code == 201, whole.json()
    assert Message.objects.get().priority == 8
    assert half.status_code == 400
    assert list(half.json()["field_errors"]) == ["messages[0].priority"]
