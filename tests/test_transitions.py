"""The state machine, through the set-based statements delivery uses and the
single-message actions operators use. A transition the table does not allow
changes nothing; a refused operator action says why."""

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from broker.errors import IllegalTransition, MessageNotFound
from broker.models import AuditEvent, DeadLetterAttempt, Message, MessageState, Queue, RuleTable
from broker.services.dead_letters import dead_letter_scan
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_create_and_activate
from broker.services.transitions.blacklist import (
    message_fail,
    message_purge,
    message_release,
    messages_fail,
    messages_quarantine,
    messages_release,
)
from broker.services.transitions.dead_lettered import (
    message_discard,
    message_forward,
    message_retry,
)
from broker.services.transitions.in_flight import (
    DeadLetterCause,
    Retry,
    messages_ack,
    messages_dead_letter,
    messages_retry,
)
from broker.services.transitions.table import MACHINE, Transition, allows, guard
from rig.processes import ROOT
from tests.support.messages import OWNER, claimed, dead_lettered, delivered, quarantined

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("dumps")]
S = MessageState
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def snapshot(message_id: int) -> dict[str, Any]:
    return dict(Message.objects.filter(id=message_id).values().get())


def test_a_message_is_claimed_and_acknowledged_by_the_batch_statements(orders, publish):
    ids = publish(orders, 3)

    assert sorted(claimed(orders, 3)) == ids
    assert len(messages_ack(queue_id=orders.id, message_ids=ids, owner=OWNER)) == 3

    for message in Message.objects.filter(id__in=ids):
        assert (message.state, message.attempts, message.lease_deadline) == (S.DELIVERED, 1, None)


def test_a_delivered_message_is_neither_claimed_nor_acknowledged_again(orders, publish):
    [message_id] = publish(orders)
    delivered(orders, 1)
    before = snapshot(message_id)

    assert claimed(orders, 1) == []
    assert messages_ack(queue_id=orders.id, message_ids=[message_id], owner=OWNER) == []
    assert snapshot(message_id) == before


def test_only_the_lease_owner_settles_a_delivery(orders, publish):
    [message_id] = publish(orders)
    claimed(orders, 1, owner="host:1:777")

    assert messages_ack(queue_id=orders.id, message_ids=[message_id], owner="host:2:888") == []
    retry = Retry(message_id, 5.0, "boom")
    assert messages_retry(retries=[retry], owner="host:2:888") == 0
    cause = DeadLetterCause("handler_error", "boom")
    assert messages_dead_letter(causes={message_id: cause}, owner="host:2:888") == []
    assert Message.objects.get(id=message_id).state == S.DELIVERING


def test_a_blacklisted_message_cannot_be_acknowledged(orders, publish):
    [message_id] = publish(orders)
    claimed(orders, 1)
    quarantined([message_id])
    before = snapshot(message_id)

    assert messages_ack(queue_id=orders.id, message_ids=[message_id], owner=OWNER) == []

    assert snapshot(message_id) == before


def test_a_failed_message_is_terminal(orders, publish, operator):
    [message_id] = publish(orders)
    quarantined([message_id])
    message_fail(message_id=message_id, actor=operator)

    for action in (message_release, message_fail, message_purge):
        with pytest.raises(IllegalTransition, match="is FAIL"):
            action(message_id=message_id, actor=operator)
    assert messages_quarantine(reasons={message_id: "again"}) == []
    assert claimed(orders, 1) == []
    assert Message.objects.get(id=message_id).state == S.FAILED


def test_release_puts_a_blacklisted_message_back_with_counters_reset(orders, publish, operator):
    [message_id] = publish(orders)
    claimed(orders, 1)
    quarantined([message_id])

    message = message_release(message_id=message_id, actor=operator, reason="fixed consumer")

    assert message.state == S.TO_BE_DELIVERED
    assert (message.attempts, message.crash_count, message.suspect) == (0, 0, False)
    event = AuditEvent.objects.get(action="message_release")
    assert (event.message_id, event.actor_name, event.reason) == (
        message_id,
        "oscar",
        "fixed consumer",
    )


def test_release_of_a_waiting_message_is_refused_and_says_why(orders, publish, operator):
    [message_id] = publish(orders)

    with pytest.raises(IllegalTransition) as refused:
        message_release(message_id=message_id, actor=operator)

    assert str(refused.value) == (
        f"Message {message_id} is TBDL on ORDERS.IN; only blacklisted (NDLV) messages are released."
    )
    assert not AuditEvent.objects.filter(action="message_release").exists()


@pytest.mark.parametrize("action", [message_release, message_fail, message_purge])
def test_refusals_read_as_english(orders, publish, operator, action):
    [message_id] = publish(orders)

    with pytest.raises(IllegalTransition) as refused:
        action(message_id=message_id, actor=operator)

    assert "purgeed" not in str(refused.value)
    assert re.search(r"are (released|failed|purged)\.$", str(refused.value))


def test_the_set_based_triage_acts_only_on_blacklisted_messages(orders, publish, operator):
    ids = publish(orders, 4)
    quarantined(ids[:2])

    assert messages_release(message_ids=ids, actor=operator) == ids[:2]
    assert messages_fail(message_ids=ids, actor=operator) == []
    assert Message.objects.filter(id__in=ids, state=S.TO_BE_DELIVERED).count() == 4


def test_an_unknown_message_is_reported(db, operator):
    with pytest.raises(MessageNotFound):
        message_release(message_id=987654, actor=operator)


def test_dead_lettering_moves_the_message_with_a_header(orders):
    [message_id] = dead_lettered(orders, 1, reason="handler_error", error="boom")

    message = Message.objects.select_related("queue").get(id=message_id)
    assert (message.queue.name, message.state) == (DLQ, S.TO_BE_DELIVERED)
    assert message.dead_letter is not None
    assert message.dead_letter["original_queue"] == "ORDERS.IN"
    assert message.dead_letter["reason"] == "handler_error"
    assert message.dead_letter["error"] == "boom"
    assert message.dead_letter["format"] == "application/octet-stream"
    assert message.last_error == "boom"


def test_a_queue_without_dead_letter_queue_blacklists_instead(db):
    queue = queue_create(name="LONELY.Q", consumer="noop", dead_letter_queue=None)
    [message_id] = messages_publish(queue_name=queue.name, messages=[NewMessage(payload=b"x")])
    claimed(queue, 1)

    left = messages_dead_letter(
        causes={message_id: DeadLetterCause("format_error", "not JSON")}, owner=OWNER
    )

    assert left == [message_id]
    message = Message.objects.get(id=message_id)
    assert message.state == S.NOT_DELIVERABLE
    assert "has no dead-letter queue" in AuditEvent.objects.get(message_id=message_id).reason


def rules(text: str) -> RuleTable:
    return rule_table_create_and_activate(queue=Queue.objects.get(name=DLQ), text=text)


@pytest.mark.parametrize(
    "act",
    [
        lambda message_id, actor: message_retry(message_id=message_id, actor=actor),
        lambda message_id, actor: message_forward(
            message_id=message_id, queue_name="PARKED.Q", actor=actor
        ),
        lambda message_id, actor: message_discard(message_id=message_id, actor=actor),
    ],
    ids=["retry", "forward", "discard"],
)
def test_an_operator_action_on_a_dead_lettered_message_forgets_the_handlers_attempts(
    orders, operator, act
):
    queue_create(name="PARKED.Q")
    [message_id] = dead_lettered(orders, 1)
    rules("ACTION(FWD) FWDQ(NO.SUCH.Q) RETRY(3)\n")
    dead_letter_scan(queue=Queue.objects.get(name=DLQ))
    assert DeadLetterAttempt.objects.filter(message_id=message_id).exists()

    act(message_id, operator)

    assert not DeadLetterAttempt.objects.filter(message_id=message_id).exists()


def test_forwarding_a_message_that_is_not_dead_lettered_is_refused(orders, publish, operator):
    queue_create(name="PARKED.Q")
    [message_id] = publish(orders)

    with pytest.raises(IllegalTransition, match="only waiting .TBDL. messages on a dead-letter"):
        message_forward(message_id=message_id, queue_name="PARKED.Q", actor=operator)

    assert Message.objects.get(id=message_id).queue == orders


def test_every_guard_is_built_from_the_table():
    assert guard(Transition.ACK) == "(m.state IN ('DLNG'))"
    assert guard(Transition.QUARANTINE) == "(m.state IN ('DLNG', 'TBDL'))"
    assert guard(Transition.DISCARD) == "((m.state IN ('TBDL') AND q.kind = 'dead_letter'))"
    for transition, edge in MACHINE.items():
        for state in S.values:
            expected = state in edge.sources
            assert allows(transition, state=state, on_dead_letter_queue=False) is expected
            on_dlq = state in edge.sources or state in edge.dead_letter_sources
            assert allows(transition, state=state, on_dead_letter_queue=True) is on_dlq


def test_the_demo_blacklists_through_quarantine_with_dump_files_and_audit_events(
    transactional_db, dumps
):
    call_command("demo", stdout=open("/dev/null", "w"))  # noqa: SIM115

    blacklisted_ids = list(
        Message.objects.filter(state=S.NOT_DELIVERABLE).values_list("id", flat=True)
    )
    assert len(blacklisted_ids) == 7  # 8 crashed twice, one of them failed by an operator
    for message in Message.objects.filter(id__in=blacklisted_ids):
        assert message.crash_count == 2
        assert Path(message.dump_path).is_file()
        assert AuditEvent.objects.filter(action="message_quarantine", message_id=message.id)
    assert Message.objects.filter(state=S.FAILED).count() == 1


def test_the_database_refuses_an_unknown_state(orders, publish):
    [message_id] = publish(orders)

    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.filter(id=message_id).update(state="GONE")


@pytest.mark.parametrize("assignment", ["attempts = -1", "crash_count = -1", "priority = 10"])
def test_the_database_refuses_negative_counters_and_bad_priorities(orders, publish, assignment):
    [message_id] = publish(orders)

    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE broker_message SET {assignment} WHERE id = %s", [message_id])


def test_a_delivering_message_must_have_a_lease(orders, publish):
    [message_id] = publish(orders)

    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.filter(id=message_id).update(state=S.DELIVERING)


# What writes a message's state or queue, in the code that runs in production.
STATE_WRITES = re.compile(
    r"SET\s+state\b|SET\s+queue_id\b|UPDATE\s+broker_message\b|DELETE\s+FROM\s+broker_message\b"
    r"|\.update\(\s*(state|queue|queue_id)\s*=",
    re.IGNORECASE,
)
TRANSITIONS = ROOT / "broker" / "services" / "transitions"


def test_only_the_transitions_package_writes_message_state():
    writers = []
    for package in ("broker", "console", "workers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if TRANSITIONS in path.parents or "migrations" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if STATE_WRITES.search(line):
                    writers.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")

    assert writers == []


def test_the_structural_scan_finds_a_state_write():
    assert STATE_WRITES.search("UPDATE broker_message AS m SET state = 'DLVD'")
    assert STATE_WRITES.search("Message.objects.filter(id=1).update(state=S.FAILED)")
    assert STATE_WRITES.search("    SET queue_id = %(target)s,")
    assert not STATE_WRITES.search("UPDATE broker_queue SET suspect_next_at = now()")
