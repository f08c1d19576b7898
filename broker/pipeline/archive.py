"""The message archive: delivered and failed messages past their queue's
retention, kept as Parquet files under ARCHIVE_DIR, partitioned by queue
and by the day they were published (``queue=NAME/day=YYYY-MM-DD/``).

A Spark job writes it (workers.spark.archive) in chunks, and each chunk's
state changes here: ``archive_run_start`` finishes what a crash left,
``archive_chunk_start`` checks a chunk Spark wrote to ``_incoming/<chunk>/``
(which readers ignore) against the ids it was to hold and records it as
WRITTEN (ArchiveChunk, with its files), and ``archive_chunk_finish`` moves
its files into place and only then deletes its messages from PostgreSQL, in
bounded transactions. So a crash at any step neither loses a message nor
archives one twice. The console reads the archive with pyarrow
(``broker.pipeline.archive_reads``).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pyarrow.dataset as ds
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from broker.models import ArchiveChunk, ArchiveChunkStatus, Queue
from broker.services.audit import audit_record
from broker.services.transitions.replayed import messages_archived

logger = logging.getLogger(__name__)

INCOMING = "_incoming"
DELETE_ROWS = 5_000


def archive_dir() -> Path:
    return Path(settings.ARCHIVE_DIR)


def partition_value(queue: str) -> str:
    """A queue name as a partition directory holds it ('/' and '%' escaped,
    as Spark and pyarrow both read them)."""
    return quote(queue, safe="._")


def retention_cutoffs(*, now: datetime | None = None) -> dict[int, datetime]:
    """Per queue id: messages published before this are due for the archive."""
    now = now or timezone.now()
    default = settings.LAZARETTO_ARCHIVE_RETENTION_DAYS
    return {
        queue_id: now - timedelta(days=days)
        for queue_id, days in Queue.objects.annotate(
            days=Coalesce(F("archive_retention_days"), default)
        ).values_list("id", "days")
    }


def utc_day(moment: datetime) -> str:
    """The archive's day partition a moment falls in."""
    return moment.astimezone(UTC).date().isoformat()


def archive_incoming(name: str) -> Path:
    """Where Spark writes chunk ``name`` before it is checked and recorded."""
    return archive_dir() / INCOMING / name


def archive_chunk_name() -> str:
    return f"{timezone.now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def _ids_in(files: list[str]) -> list[int]:
    table = ds.dataset(files, format="parquet").to_table(columns=["id"])
    return sorted(table.column("id").to_pylist())


# --- an archive run and its chunks -----------------------------------------------------


def archive_run_start() -> None:
    """Finish every WRITTEN chunk a crash left behind, then remove the
    _incoming leftovers of chunks a crash stopped before they were recorded
    (their messages are still in PostgreSQL)."""
    root = archive_dir()
    (root / INCOMING).mkdir(parents=True, exist_ok=True)
    for chunk in ArchiveChunk.objects.filter(status=ArchiveChunkStatus.WRITTEN).order_by("id"):
        logger.info("archive: finishing %s, written before a crash", chunk.name)
        archive_chunk_finish(chunk=chunk)
    recorded = set(ArchiveChunk.objects.values_list("name", flat=True))
    for path in (root / INCOMING).iterdir():
        if path.name not in recorded:
            shutil.rmtree(path, ignore_errors=True)


def archive_chunk_start(*, name: str, ids: list[int], spark_app_id: str) -> ArchiveChunk:
    """Check the chunk Spark wrote to ``archive_incoming(name)`` and record
    it as WRITTEN: every message of ``ids`` must be there once (a message
    that fell due between the two reads may be there too, and is deleted
    with the rest). A chunk that fails the check is removed, nothing is
    recorded, and RuntimeError says why."""
    incoming = archive_incoming(name)
    files = sorted(incoming.glob("queue=*/day=*/*.parquet"))
    found = _ids_in([str(path) for path in files])
    if len(found) != len(set(found)) or not set(ids).issubset(found):
        shutil.rmtree(incoming, ignore_errors=True)
        raise RuntimeError(
            f"archive chunk {name}: wrote {len(found)} rows for {len(ids)} messages; nothing deleted"
        )
    relative = [str(path.relative_to(incoming).parent / f"{name}-{path.name}") for path in files]
    return ArchiveChunk.objects.create(
        name=name,
        status=ArchiveChunkStatus.WRITTEN,
        rows=len(found),
        first_id=found[0],
        last_id=found[-1],
        files=relative,
        spark_app_id=spark_app_id,
    )


def _place(chunk: ArchiveChunk) -> list[str]:
    """Move a WRITTEN chunk's files from _incoming into place (those a
    crash already moved stay); returns their paths."""
    root = archive_dir()
    incoming = archive_incoming(chunk.name)
    for relative in chunk.files:
        final = root / relative
        staged = (
            incoming / Path(relative).parent / Path(relative).name.removeprefix(f"{chunk.name}-")
        )
        if not final.exists() and staged.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, final)
    return [str(root / relative) for relative in chunk.files]


def archive_chunk_finish(*, chunk: ArchiveChunk) -> int:
    """WRITTEN -> DELETED: move the chunk's files into place, delete the
    messages they hold from PostgreSQL in transactions of DELETE_ROWS, then
    mark the chunk DELETED with its audit event in one transaction. Returns
    the messages deleted."""
    ids = _ids_in(_place(chunk))
    deleted = 0
    for start in range(0, len(ids), DELETE_ROWS):
        with transaction.atomic():
            deleted += messages_archived(message_ids=ids[start : start + DELETE_ROWS])
    with transaction.atomic():
        ArchiveChunk.objects.filter(id=chunk.id).update(
            status=ArchiveChunkStatus.DELETED, deleted_at=timezone.now()
        )
        audit_record(
            action="archive",
            reason=f"{chunk.rows} delivered or failed message(s) moved to the archive",
            details={
                "chunk": chunk.name,
                "rows": chunk.rows,
                "deleted": deleted,
                "first_id": chunk.first_id,
                "last_id": chunk.last_id,
            },
        )
    shutil.rmtree(archive_incoming(chunk.name), ignore_errors=True)
    return deleted
