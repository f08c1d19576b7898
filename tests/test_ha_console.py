"""The HA pair as users meet it: the console's HA page and banner, the HA
API, and a write the store's HA guard refuses, which is an error with a
stable code, never a 500.

The guard is the real trigger of migration 0010: a test sets
``lazaretto.ha_mode`` for its own transaction (``SET LOCAL``), as a node sets
it for its whole server. Commands go to a real node listener
(``broker.ha.wire.Listener``) or to a port nothing listens on."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from html import unescape
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.errors import HaCommandRefused
from broker.ha.admin import ha_secret
from broker.ha.wire import Listener
from broker.models import (
    AuditEvent,
    DivergedExport,
    HaEvent,
    HaPair,
    Message,
    Node,
    Queue,
    Topic,
)
from broker.services.publish import NewMessage, messages_publish
from console.middleware import RefusalMiddleware
from rig.processes import free_port
from tests.support.console import logged_in, publish_refused
from tests.support.messages import payload_of

pytestmark = pytest.mark.django_db


def ha_mode(mode: str) -> None:
    """What a node sets on its server, for this test's transaction only."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lazaretto.ha_mode = '{mode}'")


def closed_address() -> str:
    return f"127.0.0.1:{free_port()}"


def pair(*, a: str = "primary", b: str = "standby", a_mode: str = "synchronous", **extra) -> None:
    """Nodes A and B as the primary records them; epoch 7, A primary."""
    HaPair.objects.filter(id=1).update(epoch=7, primary_name="A")
    now = timezone.now()
    Node.objects.create(
        name="A",
        role=a,
        mode=a_mode,
        epoch=7,
        address=extra.get("a_address", closed_address()),
        last_heartbeat_at=now - timedelta(seconds=4),
    )
    Node.objects.create(
        name="B",
        role=b,
        mode="",
        epoch=7,
        address=extra.get("b_address", closed_address()),
        last_heartbeat_at=now - timedelta(minutes=3),
        replication_lag_bytes=4096,
    )


@pytest.fixture
def node() -> Iterator[Callable[..., list[tuple[str, dict[str, Any]]]]]:
    """A broker node's command listener that accepts every command (or
    refuses it with ``refuse``) and records what it was sent."""
    listeners: list[Listener] = []

    def start(address: str, refuse: str = "") -> list[tuple[str, dict[str, Any]]]:
        received: list[tuple[str, dict[str, Any]]] = []

        def handle(op: str, body: dict[str, Any]) -> dict[str, Any]:
            received.append((op, body))
            if refuse:
                raise HaCommandRefused(refuse)
            return {"ok": True}

        listener = Listener(address, secret=ha_secret(), handler=handle)
        listener.start()
        listeners.append(listener)
        return received

    yield start
    for listener in listeners:
        listener.stop()


def diverged_file(tmp_path: Path, queue: str) -> Path:
    """A losing node's export: two messages to publish again and one its
    consumer already had (DLVD), which is skipped."""
    documents: list[tuple[bytes, str, dict[str, str], int]] = [
        (b'{"order": 1}', "TBDL", {"k": "v"}, 5),
        (b"\x00\xffbinary", "NDLV", {}, 0),
        (b"delivered", "DLVD", {}, 0),
    ]
    path = tmp_path / "diverged-B.jsonl"
    with path.open("w") as out:
        for number, (payload, state, headers, priority) in enumerate(documents, start=101):
            line = {
                "id": number,
                "queue": queue,
                "payload_base64": base64.b64encode(payload).decode(),
                "content_type": "application/octet-stream",
                "headers": headers,
                "priority": priority,
                "state": state,
                "created_at": timezone.now().isoformat(),
                "put_application": "orders-app",
                "put_user": "svc",
            }
            out.write(json.dumps(line) + "\n")
    return path


def page_text(response) -> str:
    return unescape(response.content.decode())


# --- the page -----------------------------------------------------------------


def test_a_viewer_sees_the_epoch_the_nodes_the_history_and_the_exports(viewer):
    pair()
    HaEvent.objects.create(kind="started", node="A", epoch=6, detail="first start")
    HaEvent.objects.create(kind="switchover", node="A", epoch=7, detail="B handed over")
    DivergedExport.objects.create(node="B", path="/var/dumps/ha/diverged-x-B.jsonl", messages=12)

    response = logged_in(viewer).get("/ha/")
    html = response.content.decode()

    assert response.status_code == 200
    assert re.search(r"data-epoch>7<", html)
    assert re.search(r"data-primary>A<", html)
    assert 'data-node="A"' in html
    assert 'data-node="B"' in html
    assert 'data-role="standby"' in html
    assert "4 s ago" in html
    assert "3 min ago" in html
    assert re.search(r"data-lag>4096<", html)
    # Newest first.
    assert html.index('data-event="switchover"') < html.index('data-event="started"')
    assert "B handed over" in html
    assert "/var/dumps/ha/diverged-x-B.jsonl" in html
    # A viewer reads; the actions are an admin's.
    assert "Switch over" not in html
    assert "Publish again" not in html
    assert 'aria-current="page">HA<' in html


def test_the_page_says_when_no_node_has_recorded_itself(viewer):
    html = logged_in(viewer).get("/ha/").content.decode()

    assert "No broker node has recorded itself yet" in html
    assert "data-ha-banner" not in html


def test_the_status_region_alone_answers_htmx_and_polls_every_3_seconds(viewer):
    pair()

    full = logged_in(viewer).get("/ha/").content.decode()
    region = logged_in(viewer).get("/ha/", headers={"HX-Request": "true"}).content.decode()

    assert 'hx-trigger="every 3s' in full
    assert region.lstrip().startswith('<div id="ha-status"')
    assert "<html" not in region
    assert 'data-node="A"' in region


def test_node_text_is_escaped(viewer):
    pair()
    HaEvent.objects.create(kind="split_brain", node="B", epoch=7, detail="<script>x()</script>")

    html = logged_in(viewer).get("/ha/").content.decode()

    assert "<script>x()</script>" not in html
    assert "&lt;script&gt;x()&lt;/script&gt;" in html


@pytest.mark.parametrize(
    ("roles", "banner", "text"),
    [
        (
            {"a": "maintenance", "b": "maintenance"},
            "maintenance",
            "writes are refused until an admin picks the primary",
        ),
        (
            {"b": "synchronising"},
            "synchronising",
            "configuration changes are refused until it is synchronised",
        ),
        ({"a_mode": "alone", "b": "unreachable"}, "alone", "a publish is on one store only"),
    ],
)
def test_the_page_shows_what_the_pair_refuses(viewer, roles, banner, text):
    pair(**roles)

    response = logged_in(viewer).get("/ha/")

    assert f'data-ha-banner="{banner}"' in response.content.decode()
    assert text in page_text(response)


def test_every_page_shows_a_split_brain_and_a_synchronising_standby(viewer):
    client = logged_in(viewer)
    calm = client.get("/").content.decode()
    pair(a="maintenance", b="maintenance")
    split = client.get("/audit/")
    Node.objects.filter(name="B").update(role="synchronising")
    Node.objects.filter(name="A").update(role="primary")
    synchronising = client.get("/messages/")

    assert "data-ha-banner" not in calm
    assert 'data-ha-banner="maintenance"' in split.content.decode()
    assert "writes are refused until an admin picks the primary" in page_text(split)
    assert 'data-ha-banner="synchronising"' in synchronising.content.decode()
    assert 'data-ha-banner="alone"' not in synchronising.content.decode()


def test_the_dashboard_says_when_the_primary_runs_without_its_standby(viewer):
    client = logged_in(viewer)
    pair(a_mode="alone", b="unreachable")
    alone = client.get("/").content.decode()
    Node.objects.filter(name="B").delete()
    Node.objects.filter(name="A").update(mode="standalone")
    standalone = client.get("/").content.decode()

    assert 'data-ha-banner="alone"' in alone
    assert "data-ha-banner" not in standalone


def test_the_banner_costs_one_query_and_none_in_an_htmx_answer(viewer):
    client = logged_in(viewer)
    client.get("/")  # sessions, groups: cached from here on

    with CaptureQueriesContext(connection) as page:
        client.get("/")
    with CaptureQueriesContext(connection) as partial:
        client.get("/", headers={"HX-Request": "true"})

    def on_nodes(queries):
        return [q for q in queries if "broker_node" in q["sql"]]

    assert len(on_nodes(page.captured_queries)) == 1
    assert on_nodes(partial.captured_queries) == []


# --- admin actions in the console --------------------------------------------


def test_an_admin_sees_switchover_and_in_maintenance_the_resolve_form(admin):
    pair()
    DivergedExport.objects.create(node="B", path="/var/dumps/ha/x.jsonl", messages=1)
    client = logged_in(admin)
    calm = client.get("/ha/").content.decode()
    Node.objects.update(role="maintenance")
    split = client.get("/ha/").content.decode()

    assert "Switch over" in calm
    assert "Publish again" in calm
    assert 'id="resolve-form"' not in calm
    assert 'id="resolve-form"' in split
    assert '<option value="A">A</option>' in split
    assert '<option value="B">B</option>' in split


@pytest.mark.parametrize("who", ["viewer", "operator"])
@pytest.mark.parametrize("path", ["/ha/switchover/", "/ha/resolve/", "/ha/exports/{x}/republish/"])
def test_only_an_admin_may_post_an_ha_action(request, who, path):
    pair()
    export = DivergedExport.objects.create(node="B", path="/var/dumps/ha/x.jsonl", messages=1)
    client = logged_in(request.getfixturevalue(who))

    response = client.post(path.format(x=export.id), {"primary": "A"})

    assert response.status_code == 403
    assert not AuditEvent.objects.filter(action__startswith="ha.").exists()


def test_a_switchover_reaches_the_primary_node(admin, node):
    address = closed_address()
    received = node(address)
    pair(a_address=address)

    response = logged_in(admin).post("/ha/switchover/", follow=True)

    assert [op for op, _ in received] == ["switchover"]
    assert "Switchover requested" in page_text(response)
    assert AuditEvent.objects.filter(action="ha.switchover", actor=admin).exists()


def test_a_switchover_no_node_answers_is_an_error_in_the_page(admin):
    pair()

    response = logged_in(admin).post("/ha/switchover/", follow=True)

    assert response.status_code == 200
    assert 'class="error"' in response.content.decode()
    assert "did not answer" in page_text(response)
    assert not AuditEvent.objects.filter(action="ha.switchover").exists()


def test_resolve_keeps_the_chosen_node(admin, node):
    address = closed_address()
    received = node(address)
    pair(a="maintenance", b="maintenance", a_address=address)

    response = logged_in(admin).post("/ha/resolve/", {"primary": "B"}, follow=True)

    assert [(op, body["primary"]) for op, body in received] == [("resolve", "B")]
    assert "B is kept as primary" in page_text(response)


def test_a_resolve_the_node_refuses_shows_its_reason_beside_the_form(admin, node):
    address = closed_address()
    node(address, refuse="The pair is not in a split brain.")
    pair(a_address=address)

    response = logged_in(admin).post(
        "/ha/resolve/", {"primary": "A"}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 200
    error = re.search(r'id="id_primary-error">([^<]*)<', response.content.decode())
    assert error
    assert unescape(error.group(1)) == "The pair is not in a split brain."


def test_resolve_without_a_chosen_node_is_refused_by_the_form(admin):
    pair(a="maintenance", b="maintenance")

    response = logged_in(admin).post("/ha/resolve/", {"primary": ""})

    assert response.status_code == 200
    assert re.search(r'id="id_primary-error">This field is required', response.content.decode())


def test_resolve_to_a_node_the_pair_does_not_have_is_refused_by_the_form(admin):
    pair(a="maintenance", b="maintenance")

    response = logged_in(admin).post("/ha/resolve/", {"primary": "C"})

    assert response.status_code == 200
    assert re.search(r'id="id_primary-error">Select a valid choice', response.content.decode())


def test_an_admin_publishes_diverged_messages_again_from_the_page(admin, orders, tmp_path):
    export = DivergedExport.objects.create(
        node="B", path=str(diverged_file(tmp_path, "ORDERS.IN")), messages=3
    )
    client = logged_in(admin)

    first = client.post(f"/ha/exports/{export.id}/republish/", follow=True)
    second = client.post(f"/ha/exports/{export.id}/republish/", follow=True)

    assert "2 diverged message(s) of B published again." in page_text(first)
    assert "were published again at" in page_text(second)
    assert Message.objects.filter(queue=orders).count() == 2
    assert f'data-export="{export.id}"' in first.content.decode()
    assert "Publish again" not in first.content.decode()


def test_an_unknown_export_is_404(admin):
    assert logged_in(admin).post("/ha/exports/999999/republish/").status_code == 404


# --- the API ------------------------------------------------------------------


def test_the_api_shows_the_pair_to_any_role(viewer_api):
    pair(b="synchronising")
    HaEvent.objects.create(kind="started", node="A", epoch=7, detail="")
    DivergedExport.objects.create(node="B", path="/var/dumps/ha/d.jsonl", messages=4)

    response = viewer_api.get("/api/v1/ha/")
    body = response.json()

    assert response.status_code == 200
    assert {key: body[key] for key in ("epoch", "primary", "maintenance", "synchronising")} == {
        "epoch": 7,
        "primary": "A",
        "maintenance": False,
        "synchronising": True,
    }
    assert body["alone"] is False
    assert [n["name"] for n in body["nodes"]] == ["A", "B"]
    identity = {"name", "role", "mode", "epoch", "address"}
    assert set(body["nodes"][1]) == identity | {"last_heartbeat_at", "replication_lag_bytes"}
    assert body["nodes"][1]["replication_lag_bytes"] == 4096
    assert [(e["event"], e["node"], e["epoch"]) for e in body["events"]] == [("started", "A", 7)]
    assert body["exports"][0]["messages"] == 4
    assert body["exports"][0]["republished_at"] is None


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("/api/v1/ha/switchover/", {}),
        ("/api/v1/ha/resolve/", {"primary": "A"}),
        ("/api/v1/ha/exports/1/republish/", {}),
    ],
)
def test_api_actions_are_an_admins(operator_api, viewer_api, path, data):
    for client in (viewer_api, operator_api):
        response = client.post(path, data, format="json")
        assert (response.status_code, response.json()["code"]) == (403, "permission_denied")


def test_api_resolve_to_an_unknown_node_is_409_from_the_broker(admin_api):
    pair(a="maintenance", b="maintenance")

    response = admin_api.post("/api/v1/ha/resolve/", {"primary": "C"}, format="json")

    assert response.status_code == 409
    assert response.json()["code"] == "ha_command_refused"
    assert "the pair is A and B" in response.json()["detail"]


@pytest.mark.parametrize("name", ["bad name!", "", "x" * 65])
def test_api_resolve_to_a_malformed_name_is_400(admin_api, name):
    pair(a="maintenance", b="maintenance")

    response = admin_api.post("/api/v1/ha/resolve/", {"primary": name}, format="json")

    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert "primary" in response.json()["field_errors"]


@pytest.mark.parametrize(
    ("path", "data"),
    [("/api/v1/ha/switchover/", {}), ("/api/v1/ha/resolve/", {"primary": "A"})],
)
def test_api_commands_no_node_answers_are_503(admin_api, path, data):
    pair(a="maintenance", b="maintenance")

    response = admin_api.post(path, data, format="json")

    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "ha_node_unreachable"


@pytest.mark.parametrize(
    ("path", "data"),
    [("/api/v1/ha/switchover/", {}), ("/api/v1/ha/resolve/", {"primary": "A"})],
)
def test_api_commands_where_no_pair_runs_are_409_ha_not_configured(admin_api, path, data):
    """No node has recorded itself: a state of configuration, not an outage."""
    response = admin_api.post(path, data, format="json")

    assert (response.status_code, response.json()["code"]) == (409, "ha_not_configured")
    assert "runs no HA pair" in response.json()["detail"]


def test_api_switchover_and_resolve_answer_202_once_a_node_took_them(admin_api, node):
    address = closed_address()
    received = node(address)
    pair(a="maintenance", b="maintenance", a_address=address)

    switchover = admin_api.post("/api/v1/ha/switchover/")
    resolve = admin_api.post("/api/v1/ha/resolve/", {"primary": "A"}, format="json")

    assert (switchover.status_code, switchover.json()) == (202, {"accepted": True})
    assert (resolve.status_code, resolve.json()) == (202, {"accepted": True})
    assert [op for op, _ in received] == ["switchover", "resolve"]


def test_api_a_command_the_node_refuses_is_409(admin_api, node):
    address = closed_address()
    node(address, refuse="There is no synchronised standby to hand over to.")
    pair(a_address=address)

    response = admin_api.post("/api/v1/ha/switchover/")

    assert response.status_code == 409
    assert response.json() == {
        "code": "ha_command_refused",
        "detail": "There is no synchronised standby to hand over to.",
    }


def test_api_republishes_an_export_once(admin_api, orders, tmp_path):
    export = DivergedExport.objects.create(
        node="B", path=str(diverged_file(tmp_path, "ORDERS.IN")), messages=3
    )

    first = admin_api.post(f"/api/v1/ha/exports/{export.id}/republish/")
    second = admin_api.post(f"/api/v1/ha/exports/{export.id}/republish/")

    assert (first.status_code, first.json()) == (200, {"published": 2})
    copies = Message.objects.filter(queue=orders).order_by("id")
    assert [(payload_of(m), m.state, m.priority) for m in copies] == [
        (b'{"order": 1}', "TBDL", 5),
        (b"\x00\xffbinary", "TBDL", 0),
    ]
    assert copies[0].headers == {"k": "v"}
    assert {m.put_application for m in copies} == {"lazaretto-ha"}
    assert (second.status_code, second.json()["code"]) == (400, "invalid")
    assert Message.objects.filter(queue=orders).count() == 2
    export.refresh_from_db()
    assert export.republished_by == "alice"


def test_api_an_export_whose_file_is_gone_is_400_and_an_unknown_one_404(admin_api, tmp_path):
    export = DivergedExport.objects.create(node="B", path=str(tmp_path / "gone"), messages=1)

    gone = admin_api.post(f"/api/v1/ha/exports/{export.id}/republish/")
    unknown = admin_api.post("/api/v1/ha/exports/999999/republish/")

    assert (gone.status_code, gone.json()["code"]) == (400, "invalid")
    assert "cannot be read" in gone.json()["detail"]
    assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")


# --- writes the store refuses -------------------------------------------------


def test_in_maintenance_a_publish_is_503_ha_maintenance(operator_api, orders):
    ha_mode("maintenance")

    body = publish_refused(operator_api, orders)

    assert body["code"] == "ha_maintenance"
    assert "until an admin picks the primary" in body["detail"]


def test_in_maintenance_reads_still_answer(viewer_api, orders, publish):
    publish(orders, 2)
    ha_mode("maintenance")

    response = viewer_api.get("/api/v1/queues/ORDERS.IN/messages/")

    assert response.status_code == 200
    assert len(response.json()["results"]) == 2


def test_while_synchronising_a_queue_is_not_created_but_publishing_goes_on(
    admin_api, operator_api, orders
):
    ha_mode("synchronising")

    created = admin_api.post("/api/v1/queues/", {"name": "NEW.Q"}, format="json")
    published = operator_api.post(
        "/api/v1/queues/ORDERS.IN/messages/", {"payload": "hello"}, format="json"
    )

    assert created.status_code == 409
    assert created.json()["code"] == "ha_synchronising"
    assert not Queue.objects.filter(name="NEW.Q").exists()
    assert published.status_code == 201
    assert Message.objects.filter(queue=orders).count() == 1


def test_while_synchronising_a_console_form_shows_the_refusal_beside_it(admin, orders):
    ha_mode("synchronising")

    response = logged_in(admin).post(
        "/queues/ORDERS.IN/limits/", {"max_messages": "10", "overflow": "reject_new"}
    )
    html = response.content.decode()

    assert response.status_code == 200
    assert re.search(r'<p class="error" role="alert">HA node synchronisation is in progress', html)
    orders.refresh_from_db()
    assert orders.max_messages is None


def test_while_synchronising_a_new_topic_is_refused_beside_its_form(admin):
    ha_mode("synchronising")

    response = logged_in(admin).post(
        "/topics/new/", {"name": "PAY", "topic_string": "payments"}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 200
    assert "configuration changes are not allowed" in page_text(response)
    assert not Topic.objects.filter(name="PAY").exists()


def test_in_maintenance_a_console_action_is_flashed_not_a_500(operator, orders):
    ha_mode("maintenance")

    response = logged_in(operator).post(
        "/queues/ORDERS.IN/pause/", {"paused": "1"}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 200
    assert '<li class="error">The HA pair is in maintenance' in response.content.decode()
    orders.refresh_from_db()
    assert orders.paused is False


def test_in_maintenance_publishing_diverged_messages_again_is_flashed(admin, orders, tmp_path):
    export = DivergedExport.objects.create(
        node="B", path=str(diverged_file(tmp_path, "ORDERS.IN")), messages=3
    )
    ha_mode("maintenance")

    response = logged_in(admin).post(
        f"/ha/exports/{export.id}/republish/", headers={"HX-Request": "true"}
    )

    assert response.status_code == 200
    assert '<li class="error">The HA pair is in maintenance' in response.content.decode()
    export.refresh_from_db()
    assert export.republished_at is None


def refused_write(how: str) -> Exception:
    """The error a write in maintenance raises, caught inside a savepoint so
    the test's transaction goes on: Django's DatabaseError from the ORM, the
    driver's own from a publish's COPY."""
    ha_mode("maintenance")
    try:
        with transaction.atomic():
            if how == "orm":
                Queue.objects.create(name="REFUSED.Q")
            else:
                messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"x")])
    except (DatabaseError, psycopg.Error) as error:
        return error
    raise AssertionError("the guard let the write through")


@pytest.mark.parametrize("how", ["orm", "copy"])
@pytest.mark.parametrize(
    ("path", "content_type"), [("/queues/X/", "text/html"), ("/api/v1/x/", "application/json")]
)
def test_a_refused_write_no_view_caught_is_a_503_page_or_json(
    viewer, orders, path, content_type, how
):
    request = RequestFactory().post(path)
    request.user = viewer
    middleware = RefusalMiddleware(lambda request: None)  # type: ignore[arg-type, return-value]

    response = middleware.process_exception(request, refused_write(how))

    assert response is not None
    assert response.status_code == 503
    assert response["Content-Type"].startswith(content_type)
    if content_type == "application/json":
        assert json.loads(response.content)["code"] == "ha_maintenance"
    else:
        assert 'data-code="ha_maintenance"' in response.content.decode()
        assert "until an admin picks the primary" in unescape(response.content.decode())


def test_other_database_errors_are_left_alone(viewer):
    request = RequestFactory().get("/")
    middleware = RefusalMiddleware(lambda request: None)  # type: ignore[arg-type, return-value]

    assert middleware.process_exception(request, DatabaseError("disk full")) is None
    assert middleware.process_exception(request, ValueError("no")) is None
