"""The dead-letter handler: rules tables acting on a real dead-letter queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from broker.models import AuditEvent, DeadLetterAttempt, Message, Queue, RuleTable
from broker.services.dead_letters import ScanResult, dead_letter_scan
from broker.services.delivery import queue_deliver
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.rule_tables import (
    rule_table_activate,
    rule_table_create,
    rule_table_rollback,
)
from rig.processes import ROOT, database_url_for_workers, wait_until
from tests.support import messages

pytestmark = pytest.mark.django_db(transaction=True)
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def dead_lettered(
    count: int, *, original: str = "ORDERS.IN", reason: str = "handler_error", **headers: str
) -> list[int]:
    """Messages as the delivery engine dead-letters them: published to
    ``original``, claimed, then moved to the dead-letter queue with a header."""
    return messages.dead_lettered(Queue.objects.get(name=original), count, reason=reason, **headers)


def activate(text: str) -> RuleTable:
    table = rule_table_create(queue=Queue.objects.get(name=DLQ), text=text)
    return rule_table_activate(table=table)


def scan() -> ScanResult:
    return dead_letter_scan(queue=Queue.objects.get(name=DLQ))


def where(message_id: int) -> str:
    return (
        Message.objects.filter(id=message_id).values_list("queue__name", flat=True).first()
        or "gone"
    )


@pytest.fixture(autouse=True)
def queues(db: None) -> None:
    queue_create(name="ORDERS.IN", consumer="noop")
    queue_create(name="REALLY.DEAD", kind="dead_letter")
    queue_create(name="PARKED.Q")


def test_a_retry_into_a_full_queue_is_tried_retry_times_then_the_next_matching_rule_acts():
    [message_id] = dead_lettered(1)
    Queue.objects.filter(name="ORDERS.IN").update(max_messages=1)
    messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"filler")])
    activate(
        "RETRYINT(0) WAIT(NO)\n"
        "REASON(LZRC_HANDLER_ERROR) ACTION(RETRY) RETRY(3)\n"
        "DESTQ(ORDERS.*) ACTION(FWD) FWDQ(REALLY.DEAD) HEADER(YES)\n"
    )

    for _ in range(3):
        assert scan().failed == 1
        assert where(message_id) == DLQ
    result = scan()

    assert (result.forwarded, where(message_id)) == (1, "REALLY.DEAD")
    events = AuditEvent.objects.filter(message_id=message_id).order_by("id")
    assert [(e.action, e.details["rule"]) for e in events] == [
        ("dlq_action_failed", 1),
        ("dlq_action_failed", 1),
        ("dlq_action_failed", 1),
        ("dlq_fwd", 2),
    ]
    assert "queue ORDERS.IN is full" in events[0].reason
    assert "rules table version 1, rule 2" in events[3].reason
    assert not DeadLetterAttempt.objects.filter(message_id=message_id).exists()


def test_first_match_wins():
    [message_id] = dead_lettered(1)
    activate("ACTION(FWD) FWDQ(PARKED.Q)\nACTION(DISCARD)\n")

    scan()

    assert where(message_id) == "PARKED.Q"


def test_retry_puts_the_message_back_on_its_original_queue_with_fresh_counters():
    [message_id] = dead_lettered(1)
    activate("REASON(LZRC_HANDLER_ERROR) ACTION(RETRY)\n")

    assert scan().retried == 1

    message = Message.objects.get(id=message_id)
    assert (message.queue.name, message.state, message.attempts) == ("ORDERS.IN", "TBDL", 0)


def test_with_no_match_the_message_stays_and_is_counted_as_ignored():
    [message_id] = dead_lettered(1)
    activate("WAIT(NO)\nDESTQ(PAYMENTS.*) ACTION(DISCARD)\n")

    result = scan()

    assert (result.ignored, where(message_id)) == (1, DLQ)
    assert AuditEvent.objects.get(message_id=message_id, action="dlq_ignore")
    scan()  # looked at again after RETRYINT only
    assert AuditEvent.objects.filter(message_id=message_id, action="dlq_ignore").count() == 1


@pytest.mark.parametrize(("header", "kept"), [("YES", True), ("NO", False)])
def test_header_yes_keeps_the_dead_letter_header_and_no_drops_it(header, kept):
    [message_id] = dead_lettered(1)
    activate(f"ACTION(FWD) FWDQ(&DESTQ) HEADER({header})\n")

    scan()

    message = Message.objects.get(id=message_id)
    assert message.queue.name == "ORDERS.IN"
    assert (message.dead_letter is not None) is kept


def test_discard_removes_the_message_with_an_audit_event():
    [message_id] = dead_lettered(1, reason="format_error")
    activate("REASON(MQRC_FORMAT_ERROR) ACTION(DISCARD)\nACTION(IGNORE)\n")

    assert scan().discarded == 1

    assert where(message_id) == "gone"
    event = AuditEvent.objects.get(message_id=message_id, action="dlq_discard")
    assert (event.details, event.queue_name) == ({"rule_table_version": 1, "rule": 1}, DLQ)


def test_a_message_without_a_dead_letter_header_is_reported_and_left():
    [message_id] = dead_lettered(1)
    Message.objects.filter(id=message_id).update(dead_letter=None)
    activate("ACTION(DISCARD)\n")

    assert scan().without_header == 1
    assert where(message_id) == DLQ


def test_a_forward_to_a_missing_queue_or_another_instance_fails():
    ids = dead_lettered(3)
    activate("RETRYINT(0)\nACTION(FWD) FWDQ(NO.SUCH.Q) RETRY(1)\n")
    assert scan().failed == 3
    activate("ACTION(FWD) FWDQ(ORDERS.IN) FWDQM(ELSEWHERE)\n")
    assert scan().failed == 3

    reasons = set(
        AuditEvent.objects.filter(action="dlq_action_failed").values_list("reason", flat=True)
    )
    assert any("NO.SUCH.Q does not exist" in r for r in reasons)
    assert any("ELSEWHERE is not this instance" in r for r in reasons)
    assert {where(i) for i in ids} == {DLQ}


def test_a_forward_or_retry_into_a_paused_queue_lands_and_waits_there():
    orders = Queue.objects.get(name="ORDERS.IN")
    forwarded = dead_lettered(2, reason="format_error")
    retried = dead_lettered(1, reason="handler_error")
    Queue.objects.filter(name__in=["PARKED.Q", "ORDERS.IN"]).update(paused=True)
    activate(
        "REASON(MQRC_FORMAT_ERROR) ACTION(FWD) FWDQ(PARKED.Q)\n"
        "REASON(LZRC_HANDLER_ERROR) ACTION(RETRY)\n"
    )

    result = scan()

    assert (result.forwarded, result.retried, result.failed) == (2, 1, 0)
    assert {where(i) for i in forwarded} == {"PARKED.Q"}
    assert where(retried[0]) == "ORDERS.IN"
    waiting = Message.objects.filter(id__in=forwarded + retried, state="TBDL")
    assert waiting.count() == 3
    assert queue_deliver(queue_id=orders.id).claimed == 0  # paused: nothing is delivered


def run_handler(*extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": database_url_for_workers(), "DEBUG": "1"}
    return subprocess.Popen(
        [sys.executable, "manage.py", "dlq", "run", "--queue", DLQ, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_two_handler_processes_act_on_each_of_10000_messages_exactly_once():
    for _ in range(10):
        dead_lettered(1000)
    activate("WAIT(NO)\nACTION(FWD) FWDQ(PARKED.Q) HEADER(YES)\n")

    handlers = [run_handler(), run_handler()]
    outputs = [handler.communicate(timeout=300)[0].decode() for handler in handlers]

    assert [handler.returncode for handler in handlers] == [0, 0], outputs
    assert Message.objects.filter(queue__name="PARKED.Q").count() == 10_000
    assert not Message.objects.filter(queue__name=DLQ).exists()
    forwards = list(
        AuditEvent.objects.filter(action="dlq_fwd").values_list("message_id", flat=True)
    )
    assert len(forwards) == len(set(forwards)) == 10_000
    assert all("forwarded" in output for output in outputs), "both handlers took part"


def _blocked_retry(rules: str) -> int:
    """A dead-lettered message whose RETRY target, ORDERS.IN, is full."""
    [message_id] = dead_lettered(1)
    Queue.objects.filter(name="ORDERS.IN").update(max_messages=1)
    messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"blocker")])
    activate(rules)
    return message_id


@pytest.mark.slow
def test_wait_no_keeps_retrying_at_retryint_until_the_action_succeeds():
    message_id = _blocked_retry("RETRYINT(1) WAIT(NO)\nACTION(RETRY) RETRY(5)\n")
    handler = run_handler()
    try:
        wait_until(
            lambda: AuditEvent.objects.filter(action="dlq_action_failed").exists(),
            timeout=30,
            what="the first failed retry",
        )
        messages.delivered(Queue.objects.get(name="ORDERS.IN"), 1)  # room again

        output = handler.communicate(timeout=30)[0].decode()
    finally:
        handler.kill()
        handler.wait()

    assert handler.returncode == 0, output
    assert where(message_id) == "ORDERS.IN"


@pytest.mark.slow
def test_wait_no_ends_once_every_matching_rule_is_used_up():
    message_id = _blocked_retry("RETRYINT(1) WAIT(NO)\nACTION(RETRY) RETRY(3)\n")

    handler = run_handler()
    output = handler.communicate(timeout=60)[0].decode()

    assert handler.returncode == 0, output
    assert where(message_id) == DLQ
    failures = AuditEvent.objects.filter(action="dlq_action_failed", message_id=message_id)
    assert failures.count() == 3


@pytest.mark.slow
def test_a_running_handler_follows_activation_and_rollback_without_a_restart():
    activate("RETRYINT(1) WAIT(YES)\nACTION(FWD) FWDQ(PARKED.Q)\n")
    handler = run_handler()
    try:
        [first] = dead_lettered(1)
        wait_until(lambda: where(first) == "PARKED.Q", timeout=30, what="v1 forwarding")

        activate("RETRYINT(1) WAIT(YES)\nACTION(FWD) FWDQ(REALLY.DEAD)\n")
        [second] = dead_lettered(1)
        wait_until(lambda: where(second) == "REALLY.DEAD", timeout=30, what="v2 forwarding")

        rule_table_rollback(queue=Queue.objects.get(name=DLQ))
        [third] = dead_lettered(1)
        wait_until(lambda: where(third) == "PARKED.Q", timeout=30, what="v1 again")
        assert handler.poll() is None, "the handler restarted"
    finally:
        handler.kill()
        handler.wait()


def test_dlq_validate_exits_0_for_a_valid_table_and_1_with_every_error(tmp_path: Path, capsys):
    good = tmp_path / "good.rules"
    good.write_text("* park everything\nACTION(FWD) FWDQ(PARKED.Q)\n")
    bad = tmp_path / "bad.rules"
    bad.write_text("ACTION(FLY)\nFWDQ(X)\nACTION(DISCARD) HEADER(NO)\n")

    call_command("dlq", "validate", str(good))
    with pytest.raises(SystemExit) as exit_info:
        call_command("dlq", "validate", str(bad))

    assert exit_info.value.code == 1
    errors = capsys.readouterr().err
    assert f"{bad}:1:" in errors
    assert f"{bad}:2:" in errors
    assert f"{bad}:3:" in errors


def test_dlq_validate_prints_warnings_and_still_exits_0(tmp_path: Path, capsys, settings):
    settings.LAZARETTO_INSTANCE_NAME = "HERE"
    table = tmp_path / "t.rules"
    table.write_text("ACTION(FWD) FWDQ(PARKED.Q) FWDQM(THERE) PUTAUT(DEF)\n")

    call_command("dlq", "validate", str(table))

    output = capsys.readouterr()
    assert f"{table}: valid, 1 rule(s)" in output.out
    assert f"{table}:1:28: warning: FWDQM(THERE) is another queue manager" in output.err
    assert f"{table}:1:41: warning: PUTAUT(DEF) has no effect here" in output.err


def test_dlq_validate_json_prints_the_parse(tmp_path: Path, capsys):
    table = tmp_path / "t.rules"
    table.write_text(
        "INPUTQ(SYSTEM.DEAD.LETTER.QUEUE)\nreason(mqrc_q_full) action(retry) retry(5)\n"
    )

    call_command("dlq", "validate", str(table), "--json")

    assert json.loads(capsys.readouterr().out) == {
        "valid": True,
        "control": {"INPUTQ": "SYSTEM.DEAD.LETTER.QUEUE"},
        "rules": [
            {"line": 2, "keywords": {"REASON": "MQRC_Q_FULL", "ACTION": "RETRY", "RETRY": "5"}}
        ],
        "errors": [],
        "warnings": [],
    }


def test_dlq_import_and_export_round_trip(tmp_path: Path, capsys):
    source = tmp_path / "in.rules"
    source.write_text("WAIT(NO)\ndestq(orders.*) action(fwd) fwdq('PARKED.Q')\n")

    call_command("dlq", "import", str(source), "--queue", DLQ, "--activate")
    capsys.readouterr()
    call_command("dlq", "export", "--queue", DLQ)
    exported = capsys.readouterr().out
    again = tmp_path / "again.rules"
    again.write_text(exported)
    call_command("dlq", "import", str(again), "--queue", DLQ)

    first, second = RuleTable.objects.order_by("version")
    from broker.rules import parse

    assert parse(first.text).table == parse(second.text).table
    assert "DESTQ(ORDERS.*)" in exported
