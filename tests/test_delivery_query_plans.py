"""The delivery path's SQL as PostgreSQL prepares and plans it.

Its statements are prepared once per connection: the claim, the suspect probe
and the ack are planned from a parse PostgreSQL keeps, not sent as new text
every batch."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection

from broker.models import Message, MessageState, Queue
from broker.services.delivery import queue_courier, queue_deliver
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.transitions.in_flight import _ACK_COUNTED_CLAIM_RESUMED_SQL, CLAIM_RESUMED_SQL

pytestmark = pytest.mark.django_db(transaction=True)


def prepared() -> dict[str, int]:
    """This connection's prepared statements: their text, how often run."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements")
        return dict(cursor.fetchall())


def analyzed_queue(*, batch_size: int, waiting: int) -> Queue:
    """Queue Q with ``waiting`` messages, its statistics taken."""
    queue = queue_create(name="Q", consumer="noop", batch_size=batch_size)
    for start in range(0, waiting, 1000):
        count = min(1000, waiting - start)
        messages_publish(queue_name="Q", messages=[NewMessage(payload=b"{}")] * count)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_message")
    return queue


def run_count(statements: dict[str, int], *fragments: str) -> int:
    return sum(runs for text, runs in statements.items() if all(part in text for part in fragments))


def test_the_claim_the_suspect_probe_and_the_ack_are_prepared_and_reused(db):
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    messages_publish(queue_name="Q", messages=[NewMessage(payload=b"{}")] * 30)

    for _ in range(3):
        assert queue_deliver(queue_id=queue.id, worker="test:1").acked == 10

    statements = prepared()
    # Each delivery unit probes for a suspect first, then claims a batch.
    assert run_count(statements, "SELECT * FROM claimed", "m.suspect = true") == 3
    assert run_count(statements, "SELECT * FROM claimed", "m.suspect = false") == 3
    assert run_count(statements, "DELETE FROM broker_message", "INSERT INTO broker_message") == 3


def test_a_courier_plans_each_delivery_statement_once(db):
    """Left to choose, PostgreSQL planned the ack and the claim afresh at
    every execution (it found the generic plan dearer), which cost as much as
    running them at batch 10. A courier runs them on their generic plans,
    and its session plans as before once it is done."""
    queue = analyzed_queue(batch_size=10, waiting=200)

    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        for _ in range(12):
            assert courier.deliver(claim_next=True).acked == 10
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        plans = cursor.fetchall()
        cursor.execute("SHOW plan_cache_mode")
        [(after_the_courier,)] = cursor.fetchall()

    settled = [row for row in plans if "DELETE FROM broker_message" in row[0]]
    assert sum(generic for _, generic, _ in settled) >= 11, plans
    assert [custom for _, _, custom in plans] == [0] * len(plans), plans
    assert after_the_courier == "auto"


def test_a_suspect_probe_reads_the_suspect_index_after_many_runs(db):
    """A generic plan would serve the probe and the batch claim alike; the
    probe must not walk the waiting backlog to find no suspect."""
    queue = queue_create(name="Q", consumer="noop", batch_size=10)
    messages_publish(queue_name="Q", messages=[NewMessage(payload=b"{}")] * 500)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_message")
    for _ in range(12):
        queue_deliver(queue_id=queue.id, worker="test:1")

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%m.suspect = true%"],
        )
        [(name,)] = cursor.fetchall()
        cursor.execute(
            f"EXPLAIN EXECUTE {name}(%s, %s, %s, %s)",  # a name PostgreSQL gave
            [queue.id, 1, "test:1:1", 30],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute(
            "SELECT indexrelid::regclass::text FROM pg_index"
            " WHERE indrelid = 'broker_message_live'::regclass"
            " AND pg_get_indexdef(indexrelid) LIKE '%%suspect)'"
        )
        suspect_indexes = [name for (name,) in cursor.fetchall()]

    assert suspect_indexes
    assert any(index in plan for index in suspect_indexes), plan
    waiting = Message.objects.filter(queue=queue, state=MessageState.TO_BE_DELIVERED)
    assert waiting.count() == 500 - 12 * 10


def test_the_settle_and_claim_statement_finds_the_claimed_rows_by_key_in_a_generic_plan(db):
    """After a few runs a prepared statement may take a generic plan, which
    cannot tell how many messages the claim's CTEs return; it must still
    fetch each one by its key, not scan the live partition to hash them."""
    queue = analyzed_queue(batch_size=100, waiting=20_000)

    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        for _ in range(8):
            courier.deliver(suspects=False, claim_next=True)
        courier.deliver(suspects=False)
        assert courier.head.resume_after is not None
        priority, after_id = courier.head.resume_after

    plan = generic_plan(
        _ACK_COUNTED_CLAIM_RESUMED_SQL,
        {
            "ids": [0],
            "owner": "test:1:1",
            "queue_id": queue.id,
            "handler_errors": 0,
            "lease_seconds": 30,
            "limit": 100,
            "after_priority": priority,
            "after_id": after_id,
        },
    )

    assert "Seq Scan on broker_message_live" not in plan, plan
    assert "Index Scan using broker_message_live_pkey" in plan, plan
    # The acknowledged rows too: the index of leases keeps an entry for each
    # message delivered until VACUUM removes it, which an open transaction
    # holds off; read whole, it cost a worker 400 ms a batch.
    assert "lease_deadline" not in plan, plan


def generic_plan(sql: str, values: dict[str, Any]) -> str:
    """EXPLAIN of ``sql`` as this connection prepared it, with a generic plan:
    ``values`` by the names ``sql`` uses, which psycopg numbered in the order
    of their first use."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
    sent = re.sub(r"%\((\w+)\)s", lambda found: f"${names.index(found[1]) + 1}", sql)
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE statement = %s", [sent])
        [(name,)] = cursor.fetchall()
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute(
                f"EXPLAIN EXECUTE {name}({', '.join(['%s'] * len(names))})",
                [values[each] for each in names],
            )
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET plan_cache_mode")


def test_a_courier_reads_on_in_index_order_when_the_planner_expects_few_waiting(
    db, live_partition_without_autovacuum
):
    """The planner's count and histogram of ids come from a time with few
    messages, spread over many ids; 30,000 have been published since. Past
    a claim's point it expects 2 and would gather all 30,000 with a bitmap
    scan and sort them; a courier's session plans without bitmap scans and
    reads an index in its order, stopping at the batch."""
    queue = queue_create(name="Q", consumer="noop", batch_size=100)
    for _ in range(50):
        messages_publish(queue_name="Q", messages=[NewMessage(payload=b"x" * 100)] * 1000)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM broker_message WHERE id % 300 <> 0")
        cursor.execute("VACUUM ANALYZE broker_message_live")
        cursor.execute("SELECT max(id) FROM broker_message")
        [(last,)] = cursor.fetchall()
    for _ in range(30):
        messages_publish(queue_name="Q", messages=[NewMessage(payload=b"x" * 100)] * 1000)
    values = {
        "queue_id": queue.id,
        "owner": "test:1:1",
        "lease_seconds": 30,
        "limit": 100,
        "after_priority": 4,
        "after_id": last + 1000,
    }

    with queue_courier(queue_id=queue.id, worker="test:1") as courier:
        assert courier is not None
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + CLAIM_RESUMED_SQL, values)
            plan = "\n".join(row[0] for row in cursor.fetchall())
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_bitmapscan")
        [(after_the_courier,)] = cursor.fetchall()

    assert "Bitmap" not in plan, plan
    assert "Sort" not in plan, plan
    # The session's own setting is back once the courier is done.
    assert after_the_courier == "on"
