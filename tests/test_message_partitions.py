"""Delivered messages leave the hot table: broker_message is partitioned by
state (migration 0011), acknowledged messages move to the delivered
partition, and the live partition stays the size of the backlog however much
is delivered."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from django.db import connection

from broker.models import Message, MessageState, Queue
from broker.selectors import DUE_QUEUES_SQL, queue_depths, queues_with_due_messages
from broker.services.delivery import queue_courier, queue_deliver
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.sweeper import LEASES_SQL
from broker.services.transitions.blacklist import message_fail
from broker.services.transitions.in_flight import (
    _ACK_COUNTED_CLAIM_RESUMED_SQL,
    _REQUEUE_UNANSWERED_SQL,
    ACK_SQL,
    CLAIM_RESUMED_SQL,
    CLAIM_SQL,
)
from rig.processes import database_url_for_workers, wait_until
from tests.support.messages import claimed

pytestmark = pytest.mark.django_db(transaction=True)
S = MessageState


def partition_of() -> dict[int, tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, tableoid::regclass::text, state FROM broker_message")
        return {id_: (table, state) for id_, table, state in cursor.fetchall()}


def live_pages() -> int:
    with connection.cursor() as cursor:
        cursor.execute("VACUUM broker_message_live")
        cursor.execute("SELECT pg_relation_size('broker_message_live') / 8192")
        return cursor.fetchone()[0]


def wait_for_lock(observer: psycopg.Connection, pid: int, *, what: str) -> None:
    """Until the session ``pid`` waits for a lock, as ``observer`` sees it."""
    wait_until(
        lambda: observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        == ("Lock",),
        timeout=10,
        what=what,
    )


def test_acknowledged_messages_move_to_the_delivered_partition_and_nothing_else_does():
    queue = queue_create(name="Q", consumer="noop", batch_size=4)
    ids = messages_publish(queue_name="Q", messages=[NewMessage(payload=b"{}")] * 10)

    queue_deliver(queue_id=queue.id, worker="test:1")  # 4 delivered
    in_flight = claimed(queue, 2)  # 2 in flight, their worker gone
    Message.objects.filter(id=ids[-1]).update(state=S.NOT_DELIVERABLE)
    message_fail(message_id=ids[-1], actor=None)

    where = partition_of()
    assert sorted(where.values()) == sorted(
        [("broker_message_delivered", "DLVD")] * 4
        + [("broker_message_live", "DLNG")] * 2
        + [("broker_message_live", "TBDL")] * 3
        + [("broker_message_live", "FAIL")]
    )
    assert {where[id_] for id_ in in_flight} == {("broker_message_live", "DLNG")}
    # The counters see a move between partitions as the state change it is.
    assert queue_depths(queue_ids=[queue.id])[queue.id] == {
        "TBDL": 3,
        "DLNG": 2,
        "DLVD": 4,
        "NDLV": 0,
        "FAIL": 1,
    }
    # Readers of broker_message still see every message.
    assert Message.objects.filter(queue=queue).count() == 10
    assert set(Message.objects.filter(state=S.DELIVERED).values_list("id", flat=True)) == {
        id_ for id_, (_, state) in where.items() if state == "DLVD"
    }


def test_the_live_partition_stays_the_size_of_the_backlog_however_much_is_delivered():
    queue = queue_create(name="Q", consumer="noop", batch_size=500)
    sizes = []
    for _ in range(4):
        for _ in range(2):
            messages_publish(queue_name="Q", messages=[NewMessage(payload=b"x" * 1024)] * 1000)
        while queue_deliver(queue_id=queue.id, worker="test:1").claimed:
            pass
        sizes.append(live_pages())

    assert Message.objects.filter(state=S.DELIVERED).count() == 8000
    # Vacuum hands the space of the moved rows back to the next publishes: the
    # live partition does not grow with what was delivered before.
    assert sizes[-1] <= sizes[0] * 1.25, sizes
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM broker_message_live")
        assert cursor.fetchone()[0] == 0


def test_the_claim_reads_and_writes_the_live_partition_only():
    queue = queue_create(name="Q", consumer="noop")
    messages_publish(queue_name="Q", messages=[NewMessage(payload=b"{}")] * 3)
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN " + CLAIM_SQL,
            {
                "queue_id": queue.id,
                "suspect": False,
                "limit": 10,
                "owner": "o",
                "lease_seconds": 30,
            },
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "broker_message_live" in plan
    assert "broker_message_delivered" not in plan


def test_a_statement_waiting_for_a_message_the_ack_moves_out_finds_it_gone():
    # A purge of the waiting messages sees the message TBDL and waits for the
    # claim's lock on it; the same transaction then acknowledges it, so it
    # leaves the live partition. The purge must find it gone and go on, not
    # fail as it would on a row that an UPDATE of its state had moved.
    queue = queue_create(name="Q", consumer="noop")
    [message_id] = messages_publish(queue_name="Q", messages=[NewMessage(payload=b"{}")])
    url = database_url_for_workers()
    with psycopg.connect(url) as worker, psycopg.connect(url, autocommit=True) as purger:
        claim = {"queue_id": queue.id, "suspect": False, "limit": 1}
        worker.execute(CLAIM_SQL, {**claim, "owner": "w", "lease_seconds": 30})
        purger_pid = purger.info.backend_pid
        with ThreadPoolExecutor(1) as pool:
            purge = pool.submit(
                purger.execute,
                "DELETE FROM broker_message WHERE queue_id = %s AND state = 'TBDL'",
                [queue.id],
            )
            wait_for_lock(worker, purger_pid, what="the purge to wait for the claim's lock")
            acked = worker.execute(
                ACK_SQL,
                {"ids": [message_id], "owner": "w", "queue_id": queue.id, "handler_errors": 0},
            ).fetchall()
            worker.commit()

            assert purge.result(timeout=10).rowcount == 0
    assert len(acked) == 1
    assert partition_of() == {message_id: ("broker_message_delivered", "DLVD")}


def test_a_courier_that_acknowledges_and_claims_holds_no_lock_on_the_other_couriers_batch():
    # Two couriers of a queue: A has delivered 1-2, B is claiming 3-4. A's
    # statement acknowledges 1-2 and claims on after 2. B's claim commits
    # while A's statement runs (here: while A's ack waits for a lock). Had
    # A's claim scanned after that commit, it would have locked 3-4 in their
    # new, claimed version, skipped them as no longer due, and kept the lock
    # until A committed: B's ack of its own batch would wait for A.
    queue = queue_create(name="Q", consumer="noop", batch_size=2)
    ids = messages_publish(queue_name="Q", messages=[NewMessage(payload=b"{}")] * 6)
    url = database_url_for_workers()
    claim = {"queue_id": queue.id, "suspect": False, "limit": 2, "lease_seconds": 30}
    with (
        psycopg.connect(url) as a,
        psycopg.connect(url) as b,
        psycopg.connect(url) as holder,
    ):
        a.execute(CLAIM_SQL, {**claim, "owner": "a"})
        a.commit()
        [(a_after,)] = a.execute("SELECT max(id) FROM broker_message WHERE lease_owner = 'a'")
        b_claimed = b.execute(CLAIM_SQL, {**claim, "owner": "b"}).fetchall()
        assert sorted(row[0] for row in b_claimed) == ids[2:4]
        holder.execute("SELECT 1 FROM broker_message WHERE id = %s FOR KEY SHARE", [ids[0]])
        a_pid = a.info.backend_pid
        with ThreadPoolExecutor(1) as pool:
            statement = pool.submit(
                a.execute,
                _ACK_COUNTED_CLAIM_RESUMED_SQL,
                {
                    **claim,
                    "ids": ids[:2],
                    "owner": "a",
                    "handler_errors": 0,
                    "after_priority": 4,
                    "after_id": a_after,
                },
            )
            wait_for_lock(b, a_pid, what="A's statement to wait for the held lock")
            b.commit()
            holder.rollback()
            rows = statement.result(timeout=10).fetchall()
        # A acknowledged its batch and claimed the next one; its transaction
        # is still open.
        assert sorted(row[1] for row in rows if row[0] is None) == ids[4:6]
        assert sum(row[0] is not None for row in rows) == 2

        b.execute("SET lock_timeout = '2s'")
        acked = b.execute(
            ACK_SQL, {"ids": ids[2:4], "owner": "b", "queue_id": queue.id, "handler_errors": 0}
        ).fetchall()
        b.commit()
        a.commit()

    assert len(acked) == 2


def test_the_dispatcher_finds_a_due_queue_through_the_index_under_a_large_backlog():
    queue = queue_create(name="Q", consumer="noop")
    delayed = queue_create(name="LATER", consumer="noop")
    with connection.cursor() as cursor:
        for waiting, count, due_in in [(queue, 100_000, "0 s"), (delayed, 10, "1 hour")]:
            cursor.execute(
                "INSERT INTO broker_message (queue_id, payload, content_type, headers, priority,"
                " state, available_at, put_application, put_user)"
                " SELECT %s, '\\x00', 'a', '{}', 4, 'TBDL', now() + %s::interval, '', ''"
                " FROM generate_series(1, %s)",
                [waiting.id, due_in, count],
            )
        cursor.execute("ANALYZE broker_message")
        cursor.execute("EXPLAIN " + DUE_QUEUES_SQL)
        plan = "\n".join(row[0] for row in cursor.fetchall())

    # Walked from the top of message_ready_idx per queue, never a scan of
    # the whole live partition (which an EXISTS probe became).
    assert "Seq Scan on broker_message_live" not in plan, plan
    assert "Index Scan using broker_message_live_queue_id_priority_id_idx on" in plan, plan
    assert [due.queue_id for due in queues_with_due_messages()] == [queue.id]


def test_the_sweepers_scans_read_the_index_of_leases_under_a_large_backlog():
    """The index names the lease, not the state (migration 0013); the
    sweeper's statements must say so to use it."""
    queue = queue_create(name="Q", consumer="noop")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO broker_message (queue_id, payload, content_type, headers, priority,"
            " state, available_at, put_application, put_user, lease_owner, lease_deadline)"
            " SELECT %s, '\\x00', 'a', '{}', 4, CASE WHEN i <= 20 THEN 'DLNG' ELSE 'TBDL' END,"
            " now(), '', '', CASE WHEN i <= 20 THEN 'w:1:1' ELSE '' END,"
            " CASE WHEN i <= 20 THEN now() + interval '30 s' END"
            " FROM generate_series(1, 100000) AS i",
            [queue.id],
        )
        cursor.execute("ANALYZE broker_message")
        plans = []
        cursor.execute("EXPLAIN " + LEASES_SQL, {"overdue": 3})
        plans.append("\n".join(row[0] for row in cursor.fetchall()))
        cursor.execute("EXPLAIN " + _REQUEUE_UNANSWERED_SQL, {"dead": ["w:2:1"], "overdue": 3})
        plans.append("\n".join(row[0] for row in cursor.fetchall()))

    for plan in plans:
        assert "Seq Scan on broker_message_live" not in plan, plan
        assert "broker_message_live_lease_deadline_idx" in plan, plan


def test_a_vacuum_keeps_the_live_partitions_emptied_pages(db):
    """Truncating them takes an exclusive lock that every claim, ack and
    publish would queue behind."""
    queue = queue_create(name="Q", consumer="noop")
    messages_publish(queue_name="Q", messages=[NewMessage(payload=b"x" * 1000)] * 400)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size('broker_message_live')")
        [(filled,)] = cursor.fetchall()
        cursor.execute("DELETE FROM broker_message WHERE queue_id = %s", [queue.id])
        cursor.execute("VACUUM broker_message_live")
        cursor.execute("SELECT pg_relation_size('broker_message_live')")
        [(after,)] = cursor.fetchall()

    assert filled >= 400 * 1000
    assert after == filled


def scan_blocks(sql: str, queue: Queue, after: tuple[int, int]) -> int:
    """The buffers (shared, hit or read) one claim of 100, rolled back, reads
    in its scans of the ready index and the rows they point to."""
    params = {
        "queue_id": queue.id,
        "limit": 100,
        "owner": "w",
        "lease_seconds": 30,
        "after_priority": after[0],
        "after_id": after[1],
    }
    with psycopg.connect(database_url_for_workers()) as conn:
        [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchall()
        conn.rollback()

    def scans(node: dict) -> Iterator[dict]:
        if node["Node Type"] == "Index Scan" and not node["Index Name"].endswith("_pkey"):
            yield node
        for child in node.get("Plans", []):
            yield from scans(child)

    return sum(
        scan["Shared Hit Blocks"] + scan["Shared Read Blocks"] for scan in scans(plan[0]["Plan"])
    )


def test_under_an_old_transaction_a_resumed_claim_reads_past_none_of_the_delivered():
    # While a transaction older than the deliveries stays open, VACUUM can
    # remove none of the ready index's entries for the delivered messages,
    # nor can a scan mark them dead: a claim from the queue's head reads them
    # all, and their rows. One resumed after the last batch does not.
    queue = queue_create(name="Q", consumer="noop", batch_size=100)
    for _ in range(3):
        messages_publish(queue_name="Q", messages=[NewMessage(payload=b"x" * 1024)] * 1000)
    # Planned on these rows' statistics, not on what earlier tests left.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_message_live")
    with psycopg.connect(database_url_for_workers()) as old:
        old.execute("SELECT txid_current()")
        with queue_courier(queue_id=queue.id, worker="test:1") as courier:
            assert courier is not None
            for _ in range(25):
                courier.deliver(claim_next=False)
            after = courier.head.resume_after
        assert after is not None

        from_head = scan_blocks(CLAIM_SQL, queue, after)
        resumed = scan_blocks(CLAIM_RESUMED_SQL, queue, after)

    assert Message.objects.filter(state=S.DELIVERED).count() == 2500
    assert from_head > 300, from_head
    assert resumed * 5 < from_head, (resumed, from_head)
    # The head's walk reads the pages the delivered rows were published on,
    # full pages (migration 0022): 7 rows of 1 kB a page, 357 pages. On pages
    # filled to 45 % it read twice as many.
    assert from_head < 2 * 2500 / 7, from_head
