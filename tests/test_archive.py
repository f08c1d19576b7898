"""The archive end to end, in both Spark modes (a driver of its own, a
client of a Spark Connect server): a real Spark driver moves old delivered and
failed messages to Parquet and deletes them only once they are written and
checked; a driver killed between the two steps leaves nothing lost and
nothing twice; replay reads the archive."""

from __future__ import annotations

import signal
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import pyarrow.dataset as ds
import pytest
from django.conf import settings
from django.utils import timezone

from broker.models import (
    ArchiveChunk,
    ArchiveChunkStatus,
    AuditEvent,
    Message,
    MessageState,
    Queue,
    ReplayJobStatus,
)
from broker.pipeline.archive_reads import archive_search
from broker.pipeline.replay import replay_job_submit
from broker.pipeline.selection import MessageSelection, ReplaySpec
from broker.services.publish import NewMessage
from broker.services.queues import queue_create
from broker.services.transitions.blacklist import messages_fail
from tests.conftest import SPARK_MODES
from tests.support.messages import claimed, delivered, quarantined
from tests.support.publishing import published
from workers.pipeline import archive_launch, replay_job_launch

S = MessageState

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("spark_env"),
    pytest.mark.parametrize("spark_mode", SPARK_MODES, indirect=True),
]


def archived_ids() -> list[int]:
    files = [str(path) for path in Path(settings.ARCHIVE_DIR).glob("queue=*/day=*/*.parquet")]
    if not files:
        return []
    return sorted(ds.dataset(files, format="parquet").to_table(columns=["id"])["id"].to_pylist())


def aged(ids: list[int], days: int) -> None:
    Message.objects.filter(id__in=ids).update(created_at=timezone.now() - timedelta(days=days))


def test_old_delivered_messages_move_to_parquet_once_even_when_the_driver_dies_midway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = old_and_recent_messages()
    # The failed message is a replayed copy: the archive keeps its job and source.
    Message.objects.filter(id=stored.failed).update(replay_job_id=7, replay_source_id=3)
    monkeypatch.setenv("LAZARETTO_ARCHIVE_CHUNK_ROWS", "8000")
    the_driver_dies_after_its_first_chunk(monkeypatch, stored)

    assert archive_launch() == 0
    gone = [*stored.old, stored.failed]
    assert archived_ids() == sorted(gone)
    assert not Message.objects.filter(id__in=gone).exists()
    assert set(ArchiveChunk.objects.values_list("status", flat=True)) == {
        ArchiveChunkStatus.DELETED
    }
    assert sum(ArchiveChunk.objects.values_list("rows", flat=True)) == 20_001
    # Recent messages and a queue with a longer retention stay.
    assert Message.objects.filter(id__in=[*stored.recent, *stored.long_kept]).count() == 15
    assert AuditEvent.objects.filter(action="archive").count() == ArchiveChunk.objects.count()

    # A third run finds nothing to do and changes nothing.
    assert archive_launch() == 0
    assert len(archived_ids()) == 20_001

    # The console's search reads it; replay takes it back.
    page = archive_search(queue="ORDERS.IN", limit=5)
    assert [message.id for message in page] == sorted(gone, reverse=True)[:5]
    assert (page[0].state, page[0].replay_job_id, page[0].replay_source_id) == (S.FAILED, 7, 3)
    assert (page[1].replay_job_id, page[1].replay_source_id) == (None, None)
    the_archived_days_replay_into_a_queue(gone)


class Stored(NamedTuple):
    old: list[int]
    recent: list[int]
    long_kept: list[int]
    failed: int


def old_and_recent_messages() -> Stored:
    """20,000 delivered messages 10 days old and one failed, on ORDERS.IN;
    10 recent ones; 5 old ones on a queue that keeps them 30 days."""
    orders = queue_create(name="ORDERS.IN", consumer="")
    old = delivered_many(orders, 20_000)
    aged(old, 10)
    recent = delivered_many(orders, 10)
    kept_longer = queue_create(name="AUDIT.TRAIL", consumer="")
    Queue.objects.filter(id=kept_longer.id).update(archive_retention_days=30)
    long_kept = delivered_many(kept_longer, 5)
    aged(long_kept, 10)
    [failed] = published(orders, 1, ARCHIVED)
    claimed(orders, 1)
    quarantined([failed])
    messages_fail(message_ids=[failed], actor=None, reason="bad data")
    aged([failed], 10)
    return Stored(old, recent, long_kept, failed)


def the_driver_dies_after_its_first_chunk(monkeypatch: pytest.MonkeyPatch, stored: Stored) -> None:
    """The driver dies right after the first chunk is written and checked."""
    monkeypatch.setenv("LAZARETTO_ARCHIVE_KILL_AFTER_WRITE", "1")
    assert archive_launch() == -signal.SIGKILL
    [chunk] = ArchiveChunk.objects.all()
    assert (chunk.status, chunk.rows) == (ArchiveChunkStatus.WRITTEN, 8000)
    assert Message.objects.filter(id__in=stored.old).count() == 20_000  # nothing deleted yet
    assert archived_ids() == []  # still in _incoming, which readers skip
    monkeypatch.delenv("LAZARETTO_ARCHIVE_KILL_AFTER_WRITE")


def the_archived_days_replay_into_a_queue(archived: list[int]) -> None:
    queue_create(name="ORDERS.REPLAYED", consumer="")
    job = replay_job_submit(
        spec=ReplaySpec(
            source="archive",
            filter=MessageSelection(
                queues=("ORDERS.IN",),
                since=timezone.now() - timedelta(days=11),
                until=timezone.now() - timedelta(days=9),
            ),
            target_queue="ORDERS.REPLAYED",
        ),
        actor=None,
    )
    job = replay_job_launch(job.id)
    assert job.status == ReplayJobStatus.DONE, job.error
    assert (job.read, job.written) == (20_001, 20_001)
    copies = Message.objects.filter(queue__name="ORDERS.REPLAYED")
    assert copies.count() == 20_001
    assert set(copies.values_list("state", flat=True)) == {S.TO_BE_DELIVERED}
    assert copies.filter(payload=b"archived").count() == 20_001
    # Each copy names its job and its archived source, and the job's mark is
    # the highest source it wrote, not the end of its one range.
    assert set(copies.values_list("replay_job_id", flat=True)) == {job.id}
    assert set(copies.values_list("replay_source_id", flat=True)) == set(archived)
    assert job.written_upto == max(archived)


ARCHIVED = NewMessage(payload=b"archived", headers={"source": "test"})


def delivered_many(queue: Queue, count: int) -> list[int]:
    ids = published(queue, count, ARCHIVED)
    assert sorted(delivered(queue, count)) == sorted(ids)
    return ids
