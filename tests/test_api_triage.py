"""Triage through the REST API: the message browser with every console
filter, the actions on one message, bulk jobs, queue pause/resume/purge,
dead-letter queues and the audit log."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.utils import timezone

from broker import selectors
from broker.models import AuditEvent, BulkJob, Message, MessageState, Queue
from broker.pipeline.archive_reads import SCHEMA
from broker.services.bulk import bulk_job_run
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_activate, rule_table_create
from tests.support.archive import DAY, DEFAULTS, archived, message_row
from tests.support.messages import blacklisted, dead_lettered, payload_of

pytestmark = pytest.mark.django_db

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
MESSAGES = "/api/v1/messages/"


def ids_of(response) -> list[int]:
    assert response.status_code == 200, response.content
    return sorted(row["id"] for row in response.json()["results"])


# --- the message browser -------------------------------------------------------


def test_the_browser_narrows_by_each_console_filter(viewer_api, orders):
    dead = dead_lettered(orders, 1, reason="format_error")
    other = queue_create(name="OTHER.Q")
    plain = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"plain")])
    tagged = messages_publish(
        queue_name="ORDERS.IN",
        messages=[NewMessage(payload=b"needle inside", headers={"tenant": "acme"})],
    )
    elsewhere = messages_publish(queue_name=other.name, messages=[NewMessage(payload=b"x")])
    poisoned = blacklisted("ORDERS.IN", 2)
    old = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"old")])
    Message.objects.filter(id__in=old).update(created_at=timezone.now() - timedelta(days=3))
    day_ago = (timezone.now() - timedelta(days=1)).isoformat()

    assert ids_of(viewer_api.get(MESSAGES, {"queue": "OTHER.Q"})) == elsewhere
    assert ids_of(viewer_api.get(MESSAGES, {"state": "NDLV"})) == sorted(poisoned)
    assert ids_of(viewer_api.get(MESSAGES, {"reason": "format_error"})) == dead
    assert ids_of(viewer_api.get(MESSAGES, {"header": "tenant=acme"})) == tagged
    assert ids_of(viewer_api.get(MESSAGES, {"text": "needle"})) == tagged
    assert ids_of(viewer_api.get(MESSAGES, {"until": day_ago})) == old
    recent = ids_of(viewer_api.get(MESSAGES, {"since": day_ago, "queue": "ORDERS.IN"}))
    assert old[0] not in recent
    assert plain[0] in recent


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"state": "DONE"}, "state"),
        ({"reason": "bored"}, "reason"),
        ({"header": "no-equals-sign"}, "header"),
        ({"since": "yesterday"}, "since"),
        ({"text": "nul\x00byte"}, "text"),
        ({"queue": "Q" * 49}, "queue"),
        ({"page_size": "100000000000000000000"}, "page_size"),
    ],
)
def test_a_bad_filter_is_a_field_error(viewer_api, orders, query, field):
    response = viewer_api.get(MESSAGES, query)

    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert field in response.json()["field_errors"]


def test_pages_hold_at_most_500(viewer_api, orders, publish):
    publish(orders, 501)

    first = viewer_api.get(MESSAGES, {"page_size": 500}).json()

    assert len(first["results"]) == 500
    assert first["next"]


# --- one message -----------------------------------------------------------------


def test_a_header_search_reads_a_span_of_ids_a_page_and_goes_on_below_it(
    viewer_api, orders, monkeypatch
):
    monkeypatch.setattr(selectors, "SEARCH_SPAN", 10)
    ids = messages_publish(
        queue_name="ORDERS.IN",
        messages=[
            NewMessage(payload=b"x", headers={"tenant": "acme" if n in (3, 25) else "other"})
            for n in range(30)
        ],
    )

    first = viewer_api.get(MESSAGES, {"header": "tenant=acme"}).json()
    second = viewer_api.get(first["next"]).json()
    third = viewer_api.get(second["next"]).json()

    assert [row["id"] for row in first["results"]] == [ids[25]]
    assert first["searched"] == {"from_id": ids[20], "to_id": ids[29]}
    assert (second["results"], second["searched"]) == ([], {"from_id": ids[10], "to_id": ids[19]})
    assert [row["id"] for row in third["results"]] == [ids[3]]
    assert first["previous"] is None


def test_a_list_without_a_search_reads_every_id(viewer_api, orders, publish):
    publish(orders, 3)

    body = viewer_api.get(MESSAGES, {"queue": "ORDERS.IN"}).json()

    assert (len(body["results"]), body["searched"], body["next"]) == (3, None, None)


def test_an_operator_releases_fails_and_purges_blacklisted_messages(operator_api, orders):
    released, failed, purged = blacklisted("ORDERS.IN", 3)

    answer = operator_api.post(f"{MESSAGES}{released}/release/", {"reason": "fixed"}, format="json")
    assert (answer.status_code, answer.json()["state"]) == (200, "TBDL")
    answer = operator_api.post(f"{MESSAGES}{failed}/fail/", format="json")
    assert (answer.status_code, answer.json()["state"]) == (200, "FAIL")
    assert operator_api.post(f"{MESSAGES}{purged}/purge/").status_code == 204
    assert not Message.objects.filter(id=purged).exists()

    event = AuditEvent.objects.get(action="message_release", message_id=released)
    assert (event.actor_name, event.reason, event.details["via_token"]) == (
        "oscar",
        "fixed",
        "tests",
    )


def test_an_action_on_a_message_in_the_wrong_state_is_409_and_changes_nothing(
    operator_api, orders, publish
):
    [waiting] = publish(orders)

    for action in ("release", "fail", "purge", "retry", "discard"):
        answer = operator_api.post(f"{MESSAGES}{waiting}/{action}/")
        assert answer.status_code == 409, action
        assert answer.json()["code"] == "illegal_transition"
    assert Message.objects.get(id=waiting).state == MessageState.TO_BE_DELIVERED


def test_an_unknown_message_is_404(operator_api, orders):
    answer = operator_api.post(f"{MESSAGES}999999/release/")

    assert (answer.status_code, answer.json()["code"]) == (404, "message_not_found")


def test_dead_lettered_messages_are_retried_forwarded_and_discarded(operator_api, orders):
    queue_create(name="PARKING.Q")
    retried, forwarded, discarded = dead_lettered(orders, 3, reason="handler_error")

    answer = operator_api.post(f"{MESSAGES}{retried}/retry/")
    assert (answer.status_code, answer.json()["queue"]) == (200, "ORDERS.IN")
    answer = operator_api.post(
        f"{MESSAGES}{forwarded}/forward/",
        {"queue": "PARKING.Q", "keep_header": False},
        format="json",
    )
    assert (answer.status_code, answer.json()["queue"]) == (200, "PARKING.Q")
    assert answer.json()["dead_letter"] in (None, {})
    assert operator_api.post(f"{MESSAGES}{discarded}/discard/").status_code == 204

    assert not Message.objects.filter(id=discarded).exists()


def test_forwarding_to_an_unknown_queue_is_404_and_the_message_stays(operator_api, orders):
    [dead] = dead_lettered(orders, 1, reason="handler_error")

    answer = operator_api.post(f"{MESSAGES}{dead}/forward/", {"queue": "NOPE"}, format="json")
    missing = operator_api.post(f"{MESSAGES}{dead}/forward/", {}, format="json")

    assert (answer.status_code, answer.json()["code"]) == (404, "queue_not_found")
    assert "queue" in missing.json()["field_errors"]
    assert Message.objects.get(id=dead).queue.name == DLQ


def test_edit_and_resubmit_publishes_a_corrected_copy(operator_api, orders):
    [bad] = blacklisted("ORDERS.IN", 1)

    answer = operator_api.post(
        f"{MESSAGES}{bad}/resubmit/",
        {"payload": "eyJvayI6IHRydWV9", "payload_encoding": "base64", "headers": {"v": "2"}},
        format="json",
    )

    assert answer.status_code == 201
    copy = Message.objects.get(id=answer.json()["id"])
    assert (copy.queue.name, payload_of(copy), copy.state) == (
        "ORDERS.IN",
        b'{"ok": true}',
        "TBDL",
    )
    assert copy.headers == {"v": "2", "lazaretto-resubmitted-from": str(bad)}
    assert Message.objects.get(id=bad).state == MessageState.NOT_DELIVERABLE


def test_a_resubmit_with_bad_input_stores_nothing(operator_api, orders):
    [bad] = blacklisted("ORDERS.IN", 1)
    before = Message.objects.count()

    answer = operator_api.post(
        f"{MESSAGES}{bad}/resubmit/",
        {"payload": "x", "priority": 12},
        format="json",
    )
    not_base64 = operator_api.post(
        f"{MESSAGES}{bad}/resubmit/",
        {"payload": "%%%", "payload_encoding": "base64"},
        format="json",
    )

    assert (answer.status_code, list(answer.json()["field_errors"])) == (400, ["priority"])
    assert (not_base64.status_code, list(not_base64.json()["field_errors"])) == (400, ["payload"])
    assert Message.objects.count() == before


def test_viewers_cannot_act(viewer_api, orders):
    [bad] = blacklisted("ORDERS.IN", 1)

    answer = viewer_api.post(f"{MESSAGES}{bad}/release/")

    assert (answer.status_code, answer.json()["code"]) == (403, "permission_denied")
    assert Message.objects.get(id=bad).state == MessageState.NOT_DELIVERABLE


# --- bulk jobs -----------------------------------------------------------------


def test_a_bulk_action_on_a_filter_answers_202_with_a_job_that_reports_progress(
    operator_api, orders
):
    other = queue_create(name="OTHER.Q")
    poisoned = blacklisted("ORDERS.IN", 30)
    spared = blacklisted(other.name, 5)

    answer = operator_api.post(
        f"{MESSAGES}bulk/",
        {"action": "fail", "filter": {"queue": "ORDERS.IN"}, "reason": "bad batch"},
        format="json",
    )

    assert answer.status_code == 202
    job = answer.json()
    assert (job["status"], job["total"], job["done"]) == ("queued", 30, 0)
    assert answer["Location"] == f"/api/v1/jobs/{job['id']}/"
    bulk_job_run(job_id=job["id"])
    progress = operator_api.get(answer["Location"]).json()
    assert (progress["status"], progress["done"], progress["percent"]) == ("done", 30, 100)
    assert Message.objects.filter(id__in=poisoned, state="FAIL").count() == 30
    assert Message.objects.filter(id__in=spared, state="NDLV").count() == 5


def test_a_bulk_action_on_a_selection(operator_api, orders):
    poisoned = blacklisted("ORDERS.IN", 4)

    answer = operator_api.post(
        f"{MESSAGES}bulk/", {"action": "release", "ids": poisoned[:2]}, format="json"
    )

    assert (answer.status_code, answer.json()["total"]) == (202, 2)
    bulk_job_run(job_id=answer.json()["id"])
    assert Message.objects.filter(id__in=poisoned, state="TBDL").count() == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "explode", "ids": [1]}, "action"),
        ({"action": "fail"}, "non_field_errors"),
        ({"action": "fail", "ids": [1], "filter": {}}, "non_field_errors"),
        ({"action": "fail", "ids": []}, "ids"),
        ({"action": "fail", "ids": [-1]}, "ids[0]"),
        ({"action": "fail", "ids": [2**70]}, "ids[0]"),
        ({"action": "fail", "filter": {"state": "NOPE"}}, "filter.state"),
    ],
)
def test_a_bad_bulk_request_is_a_field_error_and_no_job(operator_api, orders, body, field):
    answer = operator_api.post(f"{MESSAGES}bulk/", body, format="json")

    assert answer.status_code == 400
    assert field in answer.json()["field_errors"]
    assert not BulkJob.objects.exists()


def test_an_unknown_job_is_404(viewer_api):
    answer = viewer_api.get("/api/v1/jobs/424242/")

    assert (answer.status_code, answer.json()["code"]) == (404, "bulk_job_not_found")


# --- queues ----------------------------------------------------------------------


def test_an_operator_pauses_resumes_and_purges_a_queue(operator_api, orders, publish):
    publish(orders, 3)

    assert operator_api.post("/api/v1/queues/ORDERS.IN/pause/").json()["paused"] is True
    assert Queue.objects.get(name="ORDERS.IN").paused
    assert operator_api.post("/api/v1/queues/ORDERS.IN/resume/").json()["paused"] is False
    wrong = operator_api.post(
        "/api/v1/queues/ORDERS.IN/purge/", {"confirm": "orders.in"}, format="json"
    )
    assert (wrong.status_code, wrong.json()["code"]) == (409, "confirmation_mismatch")
    assert Message.objects.filter(queue=orders).count() == 3
    purged = operator_api.post(
        "/api/v1/queues/ORDERS.IN/purge/", {"confirm": "ORDERS.IN"}, format="json"
    )
    assert purged.json() == {"deleted": 3}
    assert not Message.objects.filter(queue=orders).exists()


# --- dead-letter queues ------------------------------------------------------------


def test_a_dead_letter_queue_counts_by_reason_and_original_queue(viewer_api, orders):
    dead_lettered(orders, 2, reason="format_error")
    dead_lettered(orders, 1, reason="handler_error")

    body = viewer_api.get(f"/api/v1/dead-letter-queues/{DLQ}/").json()

    assert body["by_reason"] == [
        {"key": "format_error", "count": 2},
        {"key": "handler_error", "count": 1},
    ]
    assert body["by_original_queue"] == [{"key": "ORDERS.IN", "count": 3}]
    assert body["active_rule_table"] is None


def test_a_standard_queue_is_not_a_dead_letter_queue(viewer_api, orders):
    answer = viewer_api.get("/api/v1/dead-letter-queues/ORDERS.IN/")

    assert answer.status_code == 404


def test_apply_the_active_rules_now(operator_api, orders):
    dead = dead_lettered(orders, 2, reason="format_error") + dead_lettered(
        orders, 1, reason="handler_error"
    )
    none_yet = operator_api.post(f"/api/v1/dead-letter-queues/{DLQ}/apply/")
    assert (none_yet.status_code, none_yet.json()["code"]) == (409, "no_active_rules")
    table = rule_table_create(
        queue=Queue.objects.get(name=DLQ), text="REASON(MQRC_FORMAT_ERROR) ACTION(DISCARD)\n"
    )
    rule_table_activate(table=table)

    answer = operator_api.post(f"/api/v1/dead-letter-queues/{DLQ}/apply/")

    assert answer.status_code == 200
    assert (answer.json()["examined"], answer.json()["discarded"]) == (3, 2)
    assert list(Message.objects.filter(queue__name=DLQ).values_list("id", flat=True)) == [dead[2]]


# --- audit -----------------------------------------------------------------------


def test_the_audit_log_filters_by_actor_action_queue_and_message(viewer_api, operator_api, orders):
    first, second = blacklisted("ORDERS.IN", 2)
    operator_api.post(f"{MESSAGES}{first}/release/")
    operator_api.post(f"{MESSAGES}{second}/fail/")

    def events(**query):
        body = viewer_api.get("/api/v1/audit/", query).json()
        return [(e["action"], e["message_id"]) for e in body["results"]]

    assert events(actor="oscar")[:2] == [("message_fail", second), ("message_release", first)]
    assert events(action="message_release") == [("message_release", first)]
    assert events(message_id=second)[0] == ("message_fail", second)
    assert {message for _, message in events(message_id=second)} == {second}
    assert ("message_fail", second) in events(queue="ORDERS.IN")
    bad = viewer_api.get("/api/v1/audit/", {"message_id": "-3"})
    assert "message_id" in bad.json()["field_errors"]


# --- the archive --------------------------------------------------------------------


def test_the_archive_search_pages_a_queues_archived_messages(
    viewer_api, orders, settings, tmp_path
):
    settings.ARCHIVE_DIR = tmp_path
    archived(
        tmp_path,
        "ORDERS.IN",
        [
            message_row(n, DAY + timedelta(hours=n), payload=b"\x00\xff" if n == 3 else b"ok")
            for n in range(1, 5)
        ]
        + [message_row(5, DAY + timedelta(hours=5), replay_job_id=9, replay_source_id=1)],
    )

    first = viewer_api.get("/api/v1/archive/", {"queue": "ORDERS.IN", "page_size": 2}).json()
    rest = viewer_api.get(
        "/api/v1/archive/",
        {"queue": "ORDERS.IN", "page_size": 2, "before_id": first["next_before_id"]},
    ).json()
    window = viewer_api.get(
        "/api/v1/archive/",
        {
            "queue": "ORDERS.IN",
            "since": (DAY + timedelta(hours=2)).isoformat(),
            "until": (DAY + timedelta(hours=4)).isoformat(),
        },
    ).json()

    assert [m["id"] for m in first["results"]] == [5, 4]
    assert [(m["replay_job_id"], m["replay_source_id"]) for m in first["results"]] == [
        (9, 1),
        (None, None),
    ]
    assert [m["id"] for m in rest["results"]] == [3, 2]
    assert (rest["results"][0]["payload"], rest["results"][0]["payload_encoding"]) == (
        "AP8=",
        "base64",
    )
    assert [m["id"] for m in window["results"]] == [3, 2]
    assert window["next_before_id"] is None


def test_archive_files_written_before_copies_carried_their_replay_still_read(
    viewer_api, orders, settings, tmp_path
):
    settings.ARCHIVE_DIR = tmp_path
    earlier = pa.schema([f for f in SCHEMA if not f.name.startswith("replay_")])
    directory = tmp_path / "queue=ORDERS.IN" / f"day={DAY.date().isoformat()}"
    directory.mkdir(parents=True)
    row = {**DEFAULTS, **message_row(1, DAY)}
    pq.write_table(
        pa.table({name: [row[name]] for name in earlier.names}, schema=earlier),
        directory / "part-0.parquet",
    )

    [message] = viewer_api.get("/api/v1/archive/", {"queue": "ORDERS.IN"}).json()["results"]

    assert (message["id"], message["replay_job_id"], message["replay_source_id"]) == (1, None, None)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({}, "queue"),
        ({"queue": "bad name"}, "queue"),
        ({"queue": "ORDERS.IN", "page_size": 501}, "page_size"),
        ({"queue": "ORDERS.IN", "before_id": -1}, "before_id"),
    ],
)
def test_a_bad_archive_search_is_a_field_error(viewer_api, query, field):
    answer = viewer_api.get("/api/v1/archive/", query)

    assert answer.status_code == 400
    assert field in answer.json()["field_errors"]
