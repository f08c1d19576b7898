"""The message browser, a message's page, the blacklist and the audit log."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from broker import selectors
from broker.models import AuditEvent, Message, MessageState
from broker.services.publish import NewMessage, messages_publish
from tests.support.console import logged_in
from tests.support.messages import blacklisted

pytestmark = pytest.mark.django_db
S = MessageState


def shown_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr (?:id="message-\d+" )?data-message="(\d+)"', html)]


def test_the_browser_pages_newest_first_by_keyset(viewer, orders, publish):
    ids = publish(orders, 120)
    client = logged_in(viewer)

    first = client.get("/messages/", {"queue": "ORDERS.IN"}).content.decode()
    cursor = re.search(r"before=(\d+)", first)
    assert cursor
    second = client.get(
        "/messages/", {"queue": "ORDERS.IN", "before": cursor.group(1)}
    ).content.decode()

    assert shown_ids(first) == sorted(ids, reverse=True)[:50]
    assert shown_ids(second) == sorted(ids, reverse=True)[50:100]
    assert "120 matching messages" in first


def test_past_1000_matches_it_says_more_than(viewer, orders, publish):
    for _ in range(2):
        messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"x")] * 501)

    assert "More than 1,000 matching" in logged_in(viewer).get("/messages/").content.decode()


def test_the_browser_filters_by_state_reason_header_text_and_time(viewer, orders):
    plain = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"apple pie")])
    tagged = messages_publish(
        queue_name="ORDERS.IN", messages=[NewMessage(payload=b"banana", headers={"region": "eu"})]
    )
    [old] = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"cherry")])
    Message.objects.filter(id=old).update(created_at=timezone.now() - timedelta(days=3))
    [dead] = blacklisted("ORDERS.IN")
    Message.objects.filter(id=dead).update(dead_letter={"reason": "format_error"})
    client = logged_in(viewer)

    def ids(**filters: str) -> list[int]:
        return shown_ids(client.get("/messages/", filters).content.decode())

    assert ids(state="NDLV") == [dead]
    assert ids(reason="format_error") == [dead]
    assert ids(header="region=eu") == tagged
    assert ids(text="apple") == plain
    assert old not in ids(since=(timezone.now() - timedelta(days=1)).strftime("%Y-%m-%d %H:%M"))


def test_a_text_search_reads_a_span_of_ids_and_offers_to_search_older(viewer, orders, monkeypatch):
    monkeypatch.setattr(selectors, "SEARCH_SPAN", 10)
    payloads = [b"needle" if n in (3, 25) else b"hay" for n in range(30)]
    ids = messages_publish(
        queue_name="ORDERS.IN", messages=[NewMessage(payload=payload) for payload in payloads]
    )
    client = logged_in(viewer)

    def searched(before: int | None = None) -> str:
        query = {"text": "needle", **({"before": str(before)} if before else {})}
        return client.get("/messages/", query).content.decode()

    first = searched()
    second = searched(ids[20])
    third = searched(ids[10])

    assert shown_ids(first) == [ids[25]]
    assert f"1 matching message among ids {ids[20]} to {ids[29]}" in first
    assert f"before={ids[20]}" in first
    assert "Search older messages" in first
    assert f"0 matching messages among ids {ids[10]} to {ids[19]}" in second
    assert shown_ids(third) == [ids[3]]


@pytest.mark.parametrize(
    ("field", "value"), [("since", "yesterday"), ("header", "region"), ("state", "DONE")]
)
def test_bad_filters_are_shown_beside_their_field(viewer, orders, field, value):
    html = logged_in(viewer).get("/messages/", {field: value}).content.decode()

    assert re.search(rf'id="id_{field}-error">[^<]+<', html)
    assert "Fix the filters above." in html


@pytest.mark.parametrize(
    "payload", [b"<script>alert(1)</script>", b'"><img src=x onerror=alert(1)>']
)
def test_payloads_and_headers_are_escaped(viewer, orders, payload):
    [message_id] = messages_publish(
        queue_name="ORDERS.IN",
        messages=[
            NewMessage(payload=payload, content_type="text/html", headers={"x": payload.decode()})
        ],
    )

    html = logged_in(viewer).get(f"/messages/{message_id}/").content.decode()

    assert payload.decode() not in html
    assert "&lt;" in html
    assert "onerror=alert(1)&gt;" in html or "&lt;script&gt;" in html


def test_json_is_pretty_printed_binary_is_hex_and_big_payloads_are_cut(viewer, orders):
    json_id, binary_id, big_id = (
        messages_publish(queue_name="ORDERS.IN", messages=[message])[0]
        for message in (
            NewMessage(payload=b'{"b": 1, "a": [1, 2]}', content_type="application/json"),
            NewMessage(payload=b"\x00\x01\x02\x03\xff\xfe" * 7),
            NewMessage(payload=b"z" * (200 * 1024), content_type="text/plain"),
        )
    )
    client = logged_in(viewer)

    pretty = client.get(f"/messages/{json_id}/").content.decode()
    binary = client.get(f"/messages/{binary_id}/").content.decode()
    big = client.get(f"/messages/{big_id}/").content.decode()
    download = client.get(f"/messages/{big_id}/payload/")

    assert 'data-encoding="json"' in pretty
    assert "&quot;a&quot;: [\n    1,\n    2\n  ]" in pretty
    assert 'data-encoding="hex"' in binary
    assert "00000000  00 01 02 03 ff fe 00 01" in binary
    assert "Only the first 64 KiB are shown." in big
    assert big.count("z") < 70 * 1024
    assert download["Content-Disposition"] == f'attachment; filename="message-{big_id}.bin"'
    assert download.getvalue() == b"z" * (200 * 1024)


def test_a_message_page_shows_its_audit_timeline_and_dump(viewer, orders, settings, tmp_path):
    settings.DUMP_DIR = tmp_path
    [message_id] = blacklisted("ORDERS.IN", payload=b"poison")
    client = logged_in(viewer)

    html = client.get(f"/messages/{message_id}/").content.decode()
    dump = client.get(f"/messages/{message_id}/dump/")

    assert "message_quarantine" in html
    assert "crashed twice" in html
    assert json.loads(dump.getvalue())["id"] == message_id
    assert client.get("/messages/999999/").status_code == 404


def test_the_blacklist_lists_only_ndlv_messages(viewer, orders, publish):
    publish(orders, 3)
    ids = blacklisted("ORDERS.IN", 2)

    html = logged_in(viewer).get("/blacklist/").content.decode()

    assert sorted(shown_ids(html)) == ids
    assert "Release" not in html  # a viewer sees no action buttons


@pytest.mark.parametrize(
    ("verb", "state", "said"),
    [
        ("release", S.TO_BE_DELIVERED, "released"),
        ("fail", S.FAILED, "failed for good"),
        ("purge", None, "purged"),
    ],
)
def test_an_operator_acts_on_one_message_inline(operator, orders, verb, state, said):
    [message_id] = blacklisted("ORDERS.IN")

    response = logged_in(operator).post(
        f"/messages/{message_id}/{verb}/", {"reason": "checked"}, headers={"HX-Request": "true"}
    )

    html = response.content.decode()
    assert html.lstrip().startswith(f'<tr id="message-{message_id}"')
    assert said in html
    assert Message.objects.filter(id=message_id).values_list("state", flat=True).first() == state
    assert AuditEvent.objects.get(action=f"message_{verb}").reason == "checked"


def test_an_action_without_htmx_redirects_back_with_the_outcome(operator, orders):
    [message_id] = blacklisted("ORDERS.IN")

    response = logged_in(operator).post(
        f"/messages/{message_id}/release/", {"next": f"/messages/{message_id}/"}, follow=True
    )

    assert response.redirect_chain[-1][0] == f"/messages/{message_id}/"
    assert f"Message {message_id} released" in response.content.decode()


def test_an_illegal_action_shows_why_and_changes_nothing(operator, orders, publish):
    [message_id] = publish(orders)

    html = (
        logged_in(operator)
        .post(f"/messages/{message_id}/fail/", headers={"HX-Request": "true"})
        .content.decode()
    )

    assert "is TBDL" in html
    assert Message.objects.get(id=message_id).state == S.TO_BE_DELIVERED


def test_a_viewer_cannot_act_and_an_offsite_next_is_ignored(viewer, operator, orders):
    [message_id] = blacklisted("ORDERS.IN")

    assert logged_in(viewer).post(f"/messages/{message_id}/release/").status_code == 403
    response = logged_in(operator).post(
        f"/messages/{message_id}/release/", {"next": "https://evil.example.com/"}
    )
    assert response["Location"] == "/blacklist/"


def test_the_audit_log_filters_by_action_and_message(viewer, orders):
    [first, second] = blacklisted("ORDERS.IN", 2)
    client = logged_in(viewer)

    html = client.get(
        "/audit/", {"action": "message_quarantine", "message": str(first)}
    ).content.decode()

    assert f'<a href="/messages/{first}/">{first}</a>' in html
    assert f'<a href="/messages/{second}/">' not in html


@pytest.mark.parametrize("path", ["/messages/", "/blacklist/", "/audit/", "/messages/1/"])
def test_anonymous_users_go_to_the_login_page(client, path, db):
    assert client.get(path)["Location"].startswith("/login/")
