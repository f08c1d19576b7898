"""Console pages of dead-letter queues and their rules tables."""

from __future__ import annotations

import re
from html import unescape

import pytest

from broker.models import AuditEvent, Message, Queue, RuleTable
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_activate, rule_table_create
from console.views import dead_letters as dead_letter_views
from tests.support.console import error_beside, logged_in
from tests.support.messages import dead_lettered

pytestmark = pytest.mark.django_db

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
BASE = f"/dead-letters/{DLQ}/"


@pytest.fixture
def dead(orders) -> list[int]:
    """Three messages dead-lettered from ORDERS.IN, two of them format errors."""
    return [
        *dead_lettered(orders, 2, reason="format_error"),
        *dead_lettered(orders, 1, reason="handler_error"),
    ]


def test_the_queue_page_counts_by_reason_and_original_queue(viewer, dead):
    html = logged_in(viewer).get(BASE).content.decode()

    assert 'data-reason="format_error">2<' in html
    assert 'data-reason="handler_error">1<' in html
    assert 'data-original="ORDERS.IN">3<' in html
    assert "Retry" not in html  # viewers get no buttons


def test_an_operator_retries_forwards_and_discards_inline(operator, dead):
    queue_create(name="PARKED.Q")
    client = logged_in(operator)
    hx = {"HX-Request": "true"}

    retried = client.post(f"{BASE}messages/{dead[0]}/retry/", headers=hx).content.decode()
    forwarded = client.post(f"{BASE}messages/{dead[1]}/forward/", {"queue": "PARKED.Q"}, headers=hx)
    discarded = client.post(f"{BASE}messages/{dead[2]}/discard/", headers=hx)

    assert "back on its original queue" in retried
    assert "forwarded to PARKED.Q" in forwarded.content.decode()
    assert "discarded" in discarded.content.decode()
    assert Message.objects.get(id=dead[0]).queue.name == "ORDERS.IN"
    assert Message.objects.get(id=dead[1]).queue.name == "PARKED.Q"
    assert not Message.objects.filter(id=dead[2]).exists()
    assert (
        AuditEvent.objects.get(action="message_discard").details["dead_letter"]["reason"]
        == "handler_error"
    )


def test_forwarding_to_an_unknown_queue_says_so_and_changes_nothing(operator, dead):
    html = (
        logged_in(operator)
        .post(
            f"{BASE}messages/{dead[0]}/forward/",
            {"queue": "NO.SUCH"},
            headers={"HX-Request": "true"},
        )
        .content.decode()
    )

    assert "There is no queue named" in html
    assert Message.objects.get(id=dead[0]).queue.name == DLQ


def test_apply_rules_now_runs_the_active_table(operator, dead):
    table = rule_table_create(
        queue=Queue.objects.get(name=DLQ), text="REASON(MQRC_FORMAT_ERROR) ACTION(DISCARD)\n"
    )
    rule_table_activate(table=table)

    response = logged_in(operator).post(f"{BASE}apply/", follow=True)

    assert "discarded 2" in response.content.decode()
    assert list(Message.objects.filter(queue__name=DLQ).values_list("id", flat=True)) == [dead[2]]


def test_the_editor_shows_each_error_at_its_line(admin, dead):
    response = logged_in(admin).post(
        f"{BASE}rules/",
        {"text": "* ok\nACTION(FLY)\nACTION(DISCARD) HEADER(NO)\n", "intent": "check"},
        headers={"HX-Request": "true"},
    )

    html = response.content.decode()
    assert html.lstrip().startswith('<section id="rules-result">')
    assert re.search(r'data-line="2">line 2, column \d+: invalid ACTION', html)
    assert re.search(r'data-line="3">line 3, column \d+: HEADER is only allowed', html)
    assert not RuleTable.objects.exists()


def test_a_dry_run_in_the_editor_counts_hits_and_changes_nothing(admin, dead):
    html = (
        logged_in(admin)
        .post(
            f"{BASE}rules/",
            {
                "text": "REASON(MQRC_FORMAT_ERROR) ACTION(DISCARD)\nACTION(IGNORE)\n",
                "intent": "dry-run",
            },
        )
        .content.decode()
    )

    assert re.search(r'<tr data-rule="1">.*?data-hits>2<', html, re.S)
    assert re.search(r'<tr data-rule="2">.*?data-hits>1<', html, re.S)
    assert Message.objects.filter(queue__name=DLQ).count() == 3
    assert not RuleTable.objects.exists()


def test_an_admin_activates_from_the_editor_and_rolls_back(admin, dead):
    client = logged_in(admin)
    client.post(f"{BASE}rules/", {"text": "ACTION(IGNORE)\n", "intent": "activate"})
    client.post(f"{BASE}rules/", {"text": "ACTION(DISCARD)\n", "intent": "activate"})

    history = client.get(f"{BASE}rules/").content.decode()
    client.post(f"{BASE}rules/rollback/")

    assert 'data-version="2"' in history
    assert RuleTable.objects.get(status="active").version == 1
    diff = client.get(f"{BASE}rules/2/").content.decode()
    assert "-ACTION(IGNORE)" in diff
    assert "+ACTION(DISCARD)" in diff


def test_a_table_with_errors_is_neither_saved_nor_activated(admin, dead):
    html = (
        logged_in(admin)
        .post(f"{BASE}rules/", {"text": "ACTION(FWD)\n", "intent": "activate"})
        .content.decode()
    )

    assert "cannot be activated" in html
    assert not RuleTable.objects.exists()


def test_viewers_check_but_do_not_save(viewer, dead):
    client = logged_in(viewer)

    assert (
        client.post(f"{BASE}rules/", {"text": "ACTION(IGNORE)\n", "intent": "check"}).status_code
        == 200
    )
    assert (
        client.post(f"{BASE}rules/", {"text": "ACTION(IGNORE)\n", "intent": "save"}).status_code
        == 403
    )
    assert client.post(f"{BASE}messages/{dead[0]}/discard/").status_code == 403
    assert not RuleTable.objects.exists()


def test_a_standard_queue_has_no_dead_letter_pages(viewer, orders):
    assert logged_in(viewer).get("/dead-letters/ORDERS.IN/").status_code == 404


@pytest.mark.parametrize("intent", ["activate", "save"])
def test_a_whitespace_only_table_is_an_error_beside_the_field_and_nothing_is_stored(admin, intent):
    response = logged_in(admin).post(f"{BASE}rules/", {"text": "  \n\t\n", "intent": intent})

    assert response.status_code == 200
    assert error_beside(response.content.decode(), "text") == "Enter a table."
    assert not RuleTable.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="rule_table").exists()


def test_a_table_with_errors_saved_and_activated_says_why_beside_the_field(admin):
    response = logged_in(admin).post(
        f"{BASE}rules/", {"text": "ACTION(FWD)\n", "intent": "activate"}
    )

    assert response.status_code == 200
    assert "cannot be activated" in error_beside(response.content.decode(), "text")
    assert not RuleTable.objects.exists()


def test_warnings_show_at_their_lines_as_notes_and_the_table_stays_valid(admin):
    text = "* park\nACTION(FWD) FWDQ(PARKED.Q) PUTAUT(DEF)\nACTION(IGNORE)\n"

    html = (
        logged_in(admin)
        .post(f"{BASE}rules/", {"text": text, "intent": "check"}, headers={"HX-Request": "true"})
        .content.decode()
    )

    assert "Valid: 2 rules. 1 note." in html
    assert re.search(
        r'<li id="line-2" class="has-warning".*?<p class="warning" data-line="2">'
        r"note: line 2, column \d+: PUTAUT\(DEF\) has no effect here",
        html,
        re.S,
    )
    assert 'class="error" data-line' not in html


def test_a_table_with_warnings_is_activated(admin):
    logged_in(admin).post(
        f"{BASE}rules/", {"text": "ACTION(IGNORE) PUTAUT(DEF)\n", "intent": "activate"}
    )

    assert RuleTable.objects.get().status == "active"


def test_the_editor_works_with_a_report_that_has_no_warnings_key(admin, monkeypatch):
    real = dead_letter_views.rule_table_report

    def without_warnings(**kwargs):
        report = real(**kwargs)
        report.pop("warnings", None)
        return report

    monkeypatch.setattr(dead_letter_views, "rule_table_report", without_warnings)

    html = (
        logged_in(admin)
        .post(f"{BASE}rules/", {"text": "ACTION(FLY)\n", "intent": "check"})
        .content.decode()
    )

    assert re.search(r'data-line="1">line 1, column \d+: invalid ACTION', html)
    assert 'class="warning"' not in html


@pytest.mark.parametrize("intent", ["save", "activate"])
def test_viewers_and_operators_cannot_save_or_activate_from_the_editor(viewer, operator, intent):
    for user in (viewer, operator):
        response = logged_in(user).post(
            f"{BASE}rules/", {"text": "ACTION(IGNORE)\n", "intent": intent}
        )
        assert response.status_code == 403

    assert not RuleTable.objects.exists()


@pytest.mark.parametrize("intent", ["check", "dry-run"])
def test_viewers_check_and_dry_run_in_the_editor(viewer, dead, intent):
    response = logged_in(viewer).post(
        f"{BASE}rules/", {"text": "ACTION(DISCARD)\n", "intent": intent}
    )

    assert response.status_code == 200
    assert "Valid: 1 rule." in response.content.decode()
    assert Message.objects.filter(queue__name=DLQ).count() == 3
    assert not RuleTable.objects.exists()


def test_rolling_back_without_history_says_why_in_the_flash_area(admin):
    response = logged_in(admin).post(f"{BASE}rules/rollback/", follow=True)

    assert response.redirect_chain[-1][0] == f"{BASE}rules/"
    assert re.search(
        r'<li class="error">[^<]*has no earlier active rules table',
        unescape(response.content.decode()),
    )


def test_activating_a_version_with_errors_says_why_in_the_flash_area(admin):
    table = rule_table_create(queue=Queue.objects.get(name=DLQ), text="ACTION(FWD)\n")

    response = logged_in(admin).post(f"{BASE}rules/{table.version}/activate/", follow=True)

    assert re.search(r'<li class="error">Version 1 has 1 error\(s\)', response.content.decode())
    assert RuleTable.objects.get().status == "draft"


def test_a_row_action_shows_its_outcome_in_the_row_only(operator, dead):
    client = logged_in(operator)

    refused = client.post(
        f"{BASE}messages/{dead[0]}/forward/", {"queue": "NO.SUCH"}, headers={"HX-Request": "true"}
    ).content.decode()
    done = client.post(
        f"{BASE}messages/{dead[1]}/discard/", headers={"HX-Request": "true"}
    ).content.decode()
    later = client.get(BASE).content.decode()

    assert re.search(r'<span class="outcome bad" role="status">There is no queue named', refused)
    assert f'<span class="outcome ok" role="status">Message {dead[1]} discarded.' in done
    assert "There is no queue named" not in later  # consumed by the row, not shown again
    assert "discarded." not in later
