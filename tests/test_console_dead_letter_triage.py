"""The dead-letter queues page, where triage starts: each queue's depth, its
oldest waiting message, counts by reason and by original queue, the active
rules table, the handler's last scan, and the links that act on one reason."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html import unescape

import pytest
from django.http import StreamingHttpResponse
from django.utils import timezone

from broker.models import DeadLetterScan, Message, Queue, QueueKind
from broker.selectors import NO_HEADER, dead_letter_triage
from broker.services.dead_letters import dead_letter_scan
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_create_and_activate
from tests.support.console import logged_in
from tests.support.messages import dead_lettered

pytestmark = pytest.mark.django_db

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
PAGE = "/dead-letters/"


@pytest.fixture
def dead(orders) -> list[int]:
    """From ORDERS.IN: two format errors, one handler error; from PAY.IN
    (dead-lettering to PAY.DLQ): one expired."""
    pay_dlq = queue_create(name="PAY.DLQ", kind=QueueKind.DEAD_LETTER)
    pay = queue_create(name="PAY.IN", dead_letter_queue=pay_dlq)
    return [
        *dead_lettered(orders, 2, reason="format_error"),
        *dead_lettered(orders, 1, reason="handler_error"),
        *dead_lettered(pay, 1, reason="expired"),
    ]


def row(html: str, attribute: str, value: str) -> str:
    match = re.search(rf'<tr {attribute}="{re.escape(value)}">(.*?)</tr>', html, re.S)
    assert match, f"no row {attribute}={value}"
    return unescape(match.group(1))


def cell(html: str, fact: str) -> str:
    match = re.search(rf'data-fact="{fact}">(.*?)</td>', html, re.S)
    assert match, f"no {fact}"
    text = re.sub(r"<[^>]+>", "", unescape(match.group(1)))
    return re.sub(r"\s+", " ", text).strip()


def test_the_selector_groups_every_queue_in_five_queries(dead, django_assert_num_queries):
    with django_assert_num_queries(5):
        triage = {item.queue.name: item for item in dead_letter_triage()}

    system, pay = triage[DLQ], triage["PAY.DLQ"]
    assert system.waiting == 3
    assert system.groups.by_reason == [("format_error", 2), ("handler_error", 1)]
    assert system.groups.by_original_queue == [("ORDERS.IN", 3)]
    assert pay.waiting == 1
    assert pay.groups.by_reason == [("expired", 1)]
    assert pay.active is None
    assert pay.last_scan is None


def test_the_oldest_waiting_message_is_the_earliest_arrival(viewer, dead):
    arrived = timezone.now() - timedelta(hours=3)
    Message.objects.filter(id=dead[2]).update(enqueued_at=arrived)

    [system] = [item for item in dead_letter_triage() if item.queue.name == DLQ]
    html = logged_in(viewer).get(PAGE).content.decode()

    assert system.groups.oldest_at == arrived
    assert cell(row(html, "data-queue", DLQ), "oldest") == "arrived 3 h ago"


def test_the_page_shows_depths_counts_and_where_messages_came_from(viewer, dead):
    html = logged_in(viewer).get(PAGE).content.decode()

    assert cell(row(html, "data-queue", DLQ), "waiting") == "3"
    assert cell(row(html, "data-queue", "PAY.DLQ"), "waiting") == "1"
    assert re.search(r'<td class="num">2</td>', row(html, "data-reason", "format_error"))
    assert re.search(r'<td class="num">3</td>', row(html, "data-original", "ORDERS.IN"))
    assert re.search(r'<td class="num">1</td>', row(html, "data-original", "PAY.IN"))


def test_a_viewer_browses_a_reason_and_an_operator_also_replays_and_exports_it(
    viewer, operator, dead
):
    seen = row(logged_in(viewer).get(PAGE).content.decode(), "data-reason", "format_error")
    acted = row(logged_in(operator).get(PAGE).content.decode(), "data-reason", "format_error")

    browse = f"/messages/?queue={DLQ}&state=TBDL&reason=format_error"
    assert f'href="{browse}"' in seen
    assert "replay" not in seen
    assert "export" not in seen
    assert f'href="/replay/new/?source=dead_letter&source_queue={DLQ}&reason=format_error"' in acted
    export = f"/messages/export/?queue={DLQ}&state=TBDL&reason=format_error&format=jsonl"
    assert f'href="{export}"' in acted


def test_the_links_lead_to_the_messages_of_that_reason(operator, dead):
    client = logged_in(operator)
    acted = row(client.get(PAGE).content.decode(), "data-reason", "handler_error")
    by_text = {text: href for href, text in re.findall(r'href="([^"]+)">(\w+)</a>', acted)}

    browsed = client.get(by_text["browse"]).content.decode()
    replay_form = client.get(by_text["replay"]).content.decode()
    download = client.get(by_text["export"])
    assert isinstance(download, StreamingHttpResponse)
    exported = b"".join(download.streaming_content).decode()

    assert f'data-message="{dead[2]}"' in browsed
    assert f'data-message="{dead[0]}"' not in browsed
    assert re.search(r'<option value="SYSTEM.DEAD.LETTER.QUEUE" selected>', replay_form)
    assert 'value="handler_error"' in replay_form
    assert [json.loads(line)["id"] for line in exported.splitlines()] == [dead[2]]


def test_messages_without_a_header_are_counted_but_offer_no_links(viewer, dead):
    Message.objects.filter(id=dead[0]).update(dead_letter=None)

    html = logged_in(viewer).get(PAGE).content.decode()

    assert "browse" not in row(html, "data-reason", NO_HEADER)
    assert re.search(r'<td class="num">1</td>', row(html, "data-reason", NO_HEADER))


def test_the_page_shows_the_active_version_and_the_handlers_last_scan(viewer, admin, dead):
    system = Queue.objects.get(name=DLQ)
    rule_table_create_and_activate(queue=system, text="ACTION(IGNORE)\n", actor=admin)
    table = rule_table_create_and_activate(
        queue=system, text="REASON(MQRC_FORMAT_ERROR) ACTION(DISCARD)\n", actor=admin
    )

    result = dead_letter_scan(queue=system)
    html = logged_in(viewer).get(PAGE).content.decode()

    scan = DeadLetterScan.objects.get(queue=system)
    assert (scan.rule_table_version, scan.examined, scan.discarded) == (table.version, 3, 2)
    assert result.discarded == 2
    system_row = row(html, "data-queue", DLQ)
    assert cell(system_row, "rules").startswith(f"version {table.version} active")
    assert cell(system_row, "last-scan").startswith(f"0 s ago under version {table.version}:")
    assert "examined 3, retried 0, forwarded 0, discarded 2, ignored 1, failed 0" in cell(
        system_row, "last-scan"
    )
    assert cell(row(html, "data-queue", "PAY.DLQ"), "last-scan") == "never"


def test_a_scan_that_finds_nothing_is_recorded_too(admin, orders):
    system = Queue.objects.get(name=DLQ)
    rule_table_create_and_activate(queue=system, text="ACTION(IGNORE)\n", actor=admin)

    dead_letter_scan(queue=system)
    first = DeadLetterScan.objects.get(queue=system).finished_at
    dead_letter_scan(queue=system)

    scan = DeadLetterScan.objects.get(queue=system)
    assert scan.examined == 0
    assert scan.finished_at >= first
    assert DeadLetterScan.objects.count() == 1
