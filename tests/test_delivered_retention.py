"""What a queue keeps of the messages it delivers (``delivered_retention``):
the whole message (``full``, the default), all but its payload
(``headers``), or nothing (``none``). Every reader of delivered messages says
what it found, and deliveries are counted the same in every mode."""

from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth.models import User

from broker.models import DeliveredRetention, Message, MessageState, Queue, ReplaySource
from broker.pipeline.archive_reads import archive_count
from broker.pipeline.selection import MessageSelection, ReplaySpec
from broker.pipeline.source import source_count
from broker.selectors import MessageFilter, queue_depths
from broker.services.counting import counters_fold
from broker.services.delivery import queue_deliver
from broker.services.publish import NewMessage, messages_publish, topic_publish
from broker.services.queues import queue_create, queue_update
from broker.services.topics import subscription_create, topic_create
from broker.services.transfer import ImportInvalid, messages_export, messages_import
from tests.support.archive import DAY, archived, message_row
from tests.support.console import QUEUE_SETTINGS_FORM, logged_in
from tests.support.messages import totals

pytestmark = pytest.mark.django_db
MODES = [mode.value for mode in DeliveredRetention]


def make_queue(name: str = "PAYROLL", retention: str = "full") -> Queue:
    return queue_create(name=name, consumer="demo", delivered_retention=retention)


def publish_and_deliver(queue: Queue, count: int = 3) -> list[int]:
    ids = messages_publish(
        queue_name=queue.name,
        messages=[
            NewMessage(payload=f"pay {n}".encode(), headers={"n": str(n)}) for n in range(count)
        ],
    )
    queue_deliver(queue_id=queue.id)
    return ids


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_keeps_what_it_says_and_counts_every_delivery(mode: str) -> None:
    queue = make_queue(retention=mode)
    ids = publish_and_deliver(queue)
    counters_fold()

    kept = {m.id: m for m in Message.objects.filter(id__in=ids)}
    assert totals(queue.name)["delivered"] == 3
    assert queue_depths(queue_ids=[queue.id])[queue.id][MessageState.DELIVERED] == len(kept)
    if mode == "none":
        assert kept == {}
        return
    assert sorted(kept) == ids
    for n, message_id in enumerate(ids):
        message = kept[message_id]
        assert (message.state, message.headers, message.attempts) == ("DLVD", {"n": str(n)}, 1)
        expected = f"pay {n}".encode() if mode == "full" else None
        assert (None if message.payload is None else bytes(message.payload)) == expected


def test_a_change_applies_to_the_messages_acknowledged_from_then_on() -> None:
    queue = make_queue()
    first = publish_and_deliver(queue, 2)
    queue_update(queue=queue, delivered_retention="headers")
    second = publish_and_deliver(queue, 2)
    queue_update(queue=queue, delivered_retention="none")
    third = publish_and_deliver(queue, 2)

    payloads = dict(Message.objects.filter(queue=queue).values_list("id", "payload"))
    assert sorted(payloads) == first + second
    assert all(payloads[i] is not None for i in first)
    assert all(payloads[i] is None for i in second)
    assert not set(third) & set(payloads)
    assert totals(queue.name)["delivered"] == 6


def test_each_subscription_follows_its_own_queues_setting() -> None:
    topic = topic_create(name="ORDERS", topic_string="orders")
    for name, mode in [("KEEPS", "full"), ("FORGETS", "none")]:
        subscription_create(name=name, topic=topic, queue_name=f"{name}.Q", topic_filter="orders")
        queue_update(
            queue=Queue.objects.get(name=f"{name}.Q"), consumer="demo", delivered_retention=mode
        )
    topic_publish(topic_name="ORDERS", messages=[NewMessage(payload=b"order 1")])
    for queue in Queue.objects.filter(name__in=["KEEPS.Q", "FORGETS.Q"]):
        queue_deliver(queue_id=queue.id)

    assert Message.objects.filter(queue__name="KEEPS.Q", state="DLVD").count() == 1
    assert not Message.objects.filter(queue__name="FORGETS.Q").exists()
    assert totals("FORGETS.Q")["delivered"] == 1


def test_the_api_refuses_an_unknown_mode_by_naming_the_three(admin_api) -> None:
    make_queue()

    answer = admin_api.patch(
        "/api/v1/queues/PAYROLL/", {"delivered_retention": "forever"}, format="json"
    )

    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "invalid"
    assert body["field_errors"]["delivered_retention"] == [
        '"forever" is not one of full, headers, none.'
    ]
    assert Queue.objects.get(name="PAYROLL").delivered_retention == "full"
    changed = admin_api.patch(
        "/api/v1/queues/PAYROLL/", {"delivered_retention": "headers"}, format="json"
    )
    assert changed.json()["delivered_retention"] == "headers"


def test_the_api_says_a_payload_was_not_retained(viewer_api) -> None:
    [message_id, *_] = publish_and_deliver(make_queue(retention="headers"))

    body = viewer_api.get(f"/api/v1/messages/{message_id}/").json()

    assert body["payload_retained"] is False
    assert (body["payload"], body["payload_encoding"], body["payload_bytes"]) == (None, None, None)
    assert (body["state"], body["headers"]) == ("DLVD", {"n": "0"})


def test_the_console_says_a_payload_was_not_retained(viewer: User) -> None:
    [message_id, *_] = publish_and_deliver(make_queue(retention="headers"))
    client = logged_in(viewer)

    page = client.get(f"/messages/{message_id}/").content.decode()
    download = client.get(f"/messages/{message_id}/payload/")

    assert "Payload not retained" in page
    assert "Download the payload" not in page
    assert download.status_code == 404
    assert "was not retained" in download.content.decode()


def test_an_admin_picks_a_mode_in_the_console_settings(admin: User) -> None:
    make_queue()
    client = logged_in(admin)
    page = client.get("/queues/PAYROLL/").content.decode()
    for mode in MODES:
        assert f'<option value="{mode}"' in page

    form = {**QUEUE_SETTINGS_FORM, "consumer": "demo", "delivered_retention": "none"}
    assert client.post("/queues/PAYROLL/settings/", form).status_code == 302
    assert Queue.objects.get(name="PAYROLL").delivered_retention == "none"


def test_an_export_says_so_and_an_import_of_it_is_refused_by_line(admin: User) -> None:
    queue = make_queue(retention="headers")
    publish_and_deliver(queue, 1)
    make_queue("TARGET")

    lines = exported(admin, "jsonl")
    [document] = [json.loads(line) for line in lines.splitlines()]
    csv_text = exported(admin, "csv")

    assert (document["payload"], document["payload_retained"]) == (None, False)
    assert ",False," in csv_text.splitlines()[1]
    with pytest.raises(ImportInvalid) as refused:
        messages_import(queue_name="TARGET", lines=lines.splitlines(), actor=admin, via="test")
    [error] = refused.value.errors
    assert error.line == 1
    assert error.problem.startswith("the payload was not retained")
    assert not Message.objects.filter(queue__name="TARGET").exists()


def exported(actor: User, export_format: str) -> str:
    chunks = messages_export(
        filters=MessageFilter(queue="PAYROLL"), export_format=export_format, actor=actor, via="test"
    )
    return "".join(chunks)


def test_a_replay_of_delivered_messages_leaves_out_those_without_a_payload() -> None:
    queue = make_queue()
    publish_and_deliver(queue, 2)
    queue_update(queue=queue, delivered_retention="headers")
    publish_and_deliver(queue, 3)

    spec = ReplaySpec(
        source=ReplaySource.DELIVERED,
        filter=MessageSelection(queues=("PAYROLL",)),
        target_queue="PAYROLL",
    )
    assert source_count(spec) == 2


DRAINED = 1500


@pytest.mark.slow
def test_changing_the_mode_under_a_running_drain_loses_no_message(start_workers) -> None:
    queue = make_queue()
    ids: list[int] = []
    for start in range(0, DRAINED, 500):
        ids += messages_publish(
            queue_name=queue.name,
            messages=[
                NewMessage(payload=f"m{n}".encode(), headers={"sleep-seconds": "0.005"})
                for n in range(start, start + 500)
            ],
        )
    workers = start_workers(concurrency=2)

    switches = 0
    while Message.objects.filter(queue=queue, state__in=["TBDL", "DLNG"]).exists():
        queue_update(queue=queue, delivered_retention=MODES[switches % 3])
        switches += 1
        time.sleep(0.2)
        assert switches < 600, "the drain did not end within two minutes"
    counters_fold()

    assert switches >= 5, "the drain ended before the mode changed under it"
    assert {record["id"] for record in workers.records()} == set(ids)
    assert totals(queue.name)["delivered"] == DRAINED
    kept = Message.objects.filter(queue=queue)
    assert set(kept.values_list("state", flat=True)) <= {"DLVD"}
    assert 0 < kept.count() < DRAINED, "no mode kept some and dropped others"
    assert kept.filter(payload__isnull=True).exists()
    assert kept.filter(payload__isnull=False).exists()


def test_the_archive_readers_say_a_payload_was_not_archived(
    viewer: User, viewer_api, settings, tmp_path
) -> None:
    make_queue()
    settings.ARCHIVE_DIR = tmp_path
    archived(
        tmp_path,
        "PAYROLL",
        [message_row(1, DAY, payload=b"kept"), message_row(2, DAY, payload=None)],
    )

    api = viewer_api.get("/api/v1/archive/", {"queue": "PAYROLL"}).json()
    page = logged_in(viewer).get("/archive/", {"queue": "PAYROLL"}).content.decode()

    by_id = {row["id"]: row for row in api["results"]}
    assert (by_id[1]["payload"], by_id[2]["payload"], by_id[2]["payload_encoding"]) == (
        "kept",
        None,
        None,
    )
    assert "payload not retained" in page
    assert archive_count(MessageSelection(queues=("PAYROLL",))) == 1
