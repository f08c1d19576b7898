"""A replay job's writes, without Spark: what its driver stages, written
through broker.pipeline.replay as the driver writes it. Each copy is one row
carrying its job and source; the job's mark, committed with each write, keeps
a run again from writing a source twice, whatever became of the first copy;
among the live rows a unique index keeps a second writer of the job from
writing it again. The migration that put the ledger table's records on the
copies and the jobs is tried on a database holding ledgers."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor

from broker.models import (
    DeliveredRetention,
    Message,
    MessageState,
    Queue,
    ReplayJob,
    ReplayJobStatus,
)
from broker.pipeline.replay import (
    replay_job_run_again,
    replay_run_finish,
    replay_run_start,
    replay_stage_bounds,
    replay_stage_clear,
    replay_write_staged,
)
from broker.services.publish import NewMessage
from broker.services.queues import queue_create
from broker.services.transitions.replayed import messages_archived, messages_replay_staged
from rig.processes import wait_until
from tests.support.messages import dead_lettered, delivered
from tests.support.publishing import published
from workers.spark.replay import Writes, id_ranges

S = MessageState
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
MAX_ID = 2**63 - 1  # an archive replay writes one range, up to bigint's largest
BEFORE = ("broker", "0019_delivered_retention")
AFTER = ("broker", "0020_replay_marks_on_copies")


def a_job(**fields: Any) -> ReplayJob:
    fields = {"source": "dead_letter", "source_queue": DLQ, "status": "running", **fields}
    return ReplayJob.objects.create(**fields)


def staged(job: ReplayJob, sources: list[int], target: str = "ORDERS.IN", **archived: Any) -> None:
    """The driver's staging rows: each source routed to ``target``; a
    replay from the archive stages the message itself (``archived``)."""
    columns = ["job_id", "source_id", "target", "rule_number", "keep_header", *archived]
    rows = [[job.id, source, target, 0, True, *archived.values()] for source in sources]
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO broker_replaystage ({', '.join(columns)})"
            f" VALUES ({', '.join(['%s'] * len(columns))})",
            rows,
        )


def run_again(job: ReplayJob) -> ReplayJob:
    """The run ends (failed: its driver died), the job is run again, and a
    new driver takes it: counts from zero, the staging table empty, to be
    loaded again."""
    replay_run_finish(job_id=job.id, status=ReplayJobStatus.FAILED, error="killed")
    replay_job_run_again(job_id=job.id, actor=None)
    started = replay_run_start(job_id=job.id, pid=1)
    assert started is not None
    return started


def write(job: ReplayJob, after: int, upto: int) -> ReplayJob:
    return replay_write_staged(job=job, after=after, upto=upto, progress={})


def copies(job: ReplayJob) -> Counter[int | None]:
    """How many copies of each source the job's rows in PostgreSQL hold."""
    marked = Message.objects.filter(replay_job_id=job.id)
    return Counter(marked.values_list("replay_source_id", flat=True))


def on(queue: Queue) -> int:
    return Message.objects.filter(queue=queue).count()


# --- the mark ------------------------------------------------------------------------


def test_a_write_marks_each_copy_with_its_job_and_source_and_moves_the_jobs_mark(db):
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 3)
    job = a_job()
    staged(job, sources)

    stored = write(job, 0, sources[-1])

    assert (stored.written, stored.skipped, stored.written_upto) == (3, 0, sources[-1])
    assert stored.per_target == {"ORDERS.IN": 3}
    assert copies(job) == Counter(sources)
    assert set(Message.objects.filter(replay_job_id=job.id).values_list("state", flat=True)) == {
        S.TO_BE_DELIVERED
    }


@pytest.mark.parametrize(
    ("retention", "archived"),
    [
        pytest.param(DeliveredRetention.FULL, False, id="delivered"),
        pytest.param(DeliveredRetention.NONE, False, id="deleted-on-delivery"),
        pytest.param(DeliveredRetention.FULL, True, id="archived"),
    ],
)
def test_a_run_again_writes_no_source_whatever_became_of_its_copy(db, retention, archived):
    orders = queue_create(name="ORDERS.IN", consumer="", delivered_retention=retention)
    sources = dead_lettered(orders, 4)
    job = a_job()
    staged(job, sources)
    write(job, 0, sources[-1])
    written = sorted(Message.objects.filter(replay_job_id=job.id).values_list("id", flat=True))
    # The copies are delivered: kept in the delivered partition, out of the
    # live one's unique index; deleted by the ack; or archived, which deletes
    # them once the Parquet files hold them.
    copied = delivered(orders, 4)
    assert sorted(copied) == written
    if archived:
        assert messages_archived(message_ids=copied) == 4

    again = run_again(job)
    staged(job, sources)
    again = write(again, 0, sources[-1])

    assert (again.written, again.skipped, again.per_target) == (0, 4, {})
    kept = retention == DeliveredRetention.FULL and not archived
    # A delivered copy keeps its job and source in the delivered partition.
    assert copies(job) == (Counter(sources) if kept else Counter())
    assert on(orders) == (4 if kept else 0)
    assert not Message.objects.filter(queue=orders, state=S.TO_BE_DELIVERED).exists()


def test_velocity_limited_writes_resume_after_the_last_one_committed(db):
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 10)
    job = a_job(velocity=4)
    staged(job, sources)
    bounds = replay_stage_bounds(job_id=job.id, after=0, upto=sources[-1], velocity=4)
    assert bounds == [sources[3], sources[7], sources[9]]
    # The driver dies after its first write of four.
    killed = write(job, 0, bounds[0])
    assert (killed.written, killed.written_upto) == (4, sources[3])

    again = run_again(job)
    staged(job, sources)
    after = 0
    for upper in replay_stage_bounds(job_id=job.id, after=0, upto=sources[-1], velocity=4):
        again = write(again, after, upper)
        after = upper

    assert (again.written, again.skipped, again.written_upto) == (6, 4, sources[-1])
    assert killed.written + again.written == 10
    assert copies(job) == Counter(sources)


def test_an_archive_replay_resumes_above_its_highest_source_and_takes_later_ones(db):
    """An archive replay writes one range up to bigint's largest id: its mark
    is the highest source it staged, so a run again still takes messages
    archived since with higher ids."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    job = a_job(source="archive", source_queue="")
    message: dict[str, Any] = {
        "payload": b"archived",
        "content_type": "text/plain",
        "headers": "{}",
    }
    staged(job, [11, 12, 13], **message)

    first = write(job, 0, MAX_ID)
    assert (first.written, first.written_upto) == (3, 13)

    again = run_again(job)
    staged(job, [11, 12, 13, 14], **message)
    again = write(again, 0, MAX_ID)

    assert (again.written, again.skipped, again.written_upto) == (1, 3, 14)
    assert copies(job) == Counter([11, 12, 13, 14])
    assert set(Message.objects.filter(queue=orders).values_list("payload", flat=True)) == {
        b"archived"
    }


def test_a_second_writer_of_the_same_range_waits_for_the_first_then_fails_writing_nothing(
    transactional_db,
):
    """Two writers of one job's range that bypass its mark (the write alone,
    not replay_write_staged, which locks the job first): the unique index of
    the live partition holds, the second waits for the first to commit and
    then fails as a whole, writing nothing."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 3)
    job = a_job()
    staged(job, sources)
    wrote: dict[str, dict[int, int] | Exception] = {}
    first_wrote, commit = threading.Event(), threading.Event()

    def writer(name: str, hold: bool) -> None:
        try:
            with transaction.atomic():
                wrote[name] = messages_replay_staged(
                    job_id=job.id, after=0, upto=sources[-1], from_archive=False
                )
                if hold:
                    first_wrote.set()
                    commit.wait(30)
        except IntegrityError as error:
            wrote[name] = error
        finally:
            connections.close_all()

    first = threading.Thread(target=writer, args=("first", True))
    second = threading.Thread(target=writer, args=("second", False))
    try:
        first.start()
        assert first_wrote.wait(30)
        second.start()
        wait_until(_waiting_on_a_lock, timeout=30, what="the second writer to wait for the first")
        assert "second" not in wrote
    finally:
        commit.set()
        first.join(30)
        second.join(30)
        replay_stage_clear(job_id=job.id)

    assert wrote["first"] == {orders.id: 3}
    assert "message_replayed_once_idx" in str(wrote["second"])
    assert copies(job) == Counter(sources)


def test_a_source_staged_twice_is_written_once(db):
    """A Spark task retried after part of its staging load committed."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    sources = dead_lettered(orders, 3)
    job = a_job()
    staged(job, sources)
    staged(job, sources[:2])

    stored = replay_write_staged(job=job, after=0, upto=sources[-1], progress={})

    assert (stored.written, stored.skipped, stored.per_target) == (3, 0, {"ORDERS.IN": 3})
    assert copies(job) == Counter(sources)


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return bool(cursor.fetchone()[0])


# --- the migration from the ledger table ------------------------------------------------


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([target])


def _all(query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params or [])
        return cursor.fetchall() if cursor.description else []


def test_the_migration_moves_the_ledgers_onto_the_copies_and_the_jobs_marks(db):
    """Migrated back, the ledger is built from the marked copies; a ledger
    row whose copy is gone is added on the old schema; migrated forward,
    the copies still here get their marks again (in either partition), each
    job its mark from the whole ledger, and the ledger goes. DDL is
    transactional: the test's rollback undoes it all."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    kept = published(orders, 3, NewMessage(payload=b"copy"))
    # One copy is delivered: its row moves to the delivered partition.
    assert delivered(orders, 1) == [kept[0]]
    [partial] = published(orders, 1, NewMessage(payload=b"copy"))
    sources = published(orders, 3, NewMessage(payload=b"source"))
    done, failed = a_job(), a_job()
    for source, copy in zip(sources, kept, strict=True):
        Message.objects.filter(id=copy).update(replay_job_id=done.id, replay_source_id=source)
    Message.objects.filter(id=partial).update(replay_job_id=failed.id, replay_source_id=sources[0])
    records = [(done.id, source, copy) for source, copy in zip(sources, kept, strict=True)]
    records.append((failed.id, sources[0], partial))
    # Deferred key checks must not be pending when a table is altered.
    _all("SET CONSTRAINTS ALL IMMEDIATE")

    _migrate(BEFORE)
    ledger = "SELECT job_id, source_message_id, message_id FROM broker_replayedmessage"
    assert sorted(_all(ledger)) == sorted(records)
    # The failed job also wrote source 2; its copy was deleted since.
    _all(
        "INSERT INTO broker_replayedmessage (job_id, source_message_id, message_id)"
        " VALUES (%s, %s, %s)",
        [failed.id, sources[1], 10**9],
    )

    _migrate(AFTER)

    marked = Message.objects.filter(replay_job_id__isnull=False)
    assert sorted(marked.values_list("replay_job_id", "replay_source_id", "id")) == sorted(records)
    assert marked.values_list("state", flat=True).get(id=kept[0]) == S.DELIVERED
    marks = dict(ReplayJob.objects.values_list("id", "written_upto"))
    assert marks == {done.id: sources[2], failed.id: sources[1]}
    assert _all("SELECT to_regclass('broker_replayedmessage')") == [(None,)]
    assert _all(
        "SELECT indexrelid::regclass::text FROM pg_index"
        " WHERE indrelid = 'broker_message_live'::regclass AND indisunique AND NOT indisprimary"
    ) == [("message_replayed_once_idx",)]


def test_a_replay_reads_small_ranges_first_then_full_ones():
    ranges = list(id_ranges(1, 1_000_000, 1_000_000, 250_000))

    assert [last - first + 1 for first, last in ranges] == [5_000, 20_000, 80_000] + [
        250_000
    ] * 3 + [145_000]
    assert ranges[0][0] == 1
    assert ranges[-1][1] == 1_000_000
    assert all(after[0] == before[1] + 1 for before, after in itertools.pairwise(ranges))
    # Ids spread ten to a row: ranges of ten times as many ids.
    assert next(id_ranges(1, 10_000_000, 1_000_000, 250_000)) == (1, 50_000)
    # A source of one slice or less is one range.
    assert list(id_ranges(1, 100_000, 10_000, 250_000)) == [(1, 100_000)]
    # Ranges smaller than the first one's size stay as asked.
    assert list(id_ranges(1, 300, 300, 100)) == [(1, 100), (101, 200), (201, 300)]


def test_writes_run_two_at_once_and_commit_in_the_order_they_were_submitted():
    events: list[str] = []
    first_may_end = threading.Event()

    def write(name: str, *, fail: bool = False) -> Any:
        def run(before: Any) -> str:
            events.append(f"{name} inserts")
            if name == "first":
                assert first_may_end.wait(10)
            before()
            if fail:
                raise RuntimeError(f"{name} failed")
            events.append(f"{name} commits")
            return name

        return run

    with Writes() as writes:
        writes.submit(write("first"))
        writes.submit(write("second"))
        wait_until(lambda: events == ["first inserts", "second inserts"], timeout=10)
        first_may_end.set()
        assert writes.settle() == "second"
    assert events == ["first inserts", "second inserts", "first commits", "second commits"]

    events.clear()
    with Writes() as writes:
        writes.submit(write("first", fail=True))
        writes.submit(write("second"))
        with pytest.raises(RuntimeError, match="first failed"):
            writes.room()
        # The second write waited for the first, which failed: it raises
        # the same error and does not commit.
        with pytest.raises(RuntimeError, match="first failed"):
            writes.settle()
    assert "second commits" not in events
