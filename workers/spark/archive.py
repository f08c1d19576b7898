"""The archive's Spark driver: delivered and failed messages past their
queue's retention move to Parquet under ARCHIVE_DIR, partitioned by queue
and by the day they were published, in chunks of
LAZARETTO_ARCHIVE_CHUNK_ROWS messages.

Each chunk is written to ``_incoming/<chunk>/`` (which readers ignore),
read back and checked against the ids it was to hold, recorded as WRITTEN
(ArchiveChunk, with its files), moved into place, and only then deleted from
PostgreSQL, in bounded transactions. A run first finishes any WRITTEN chunk
a crash left behind, and clears any unrecorded ``_incoming`` leftovers: so a
crash at any step neither loses a message nor archives one twice.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import uuid
from pathlib import Path

import pyarrow.dataset as ds
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker.models import ArchiveChunk, ArchiveChunkStatus
from broker.pipeline.archive import INCOMING, archive_dir
from broker.services.audit import audit_record
from broker.services.transitions.replayed import messages_archived
from workers.spark.session import read_range, spark_session

logger = logging.getLogger(__name__)

DELETE_ROWS = 5_000
# Set in tests to stop the driver dead (SIGKILL) once a chunk is written
# and verified, before anything is deleted.
KILL_AFTER_WRITE = "LAZARETTO_ARCHIVE_KILL_AFTER_WRITE"

# Messages due for the archive: delivered or failed, published before their
# queue's retention (in days) ran out.
_DUE = """
FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id
WHERE m.state IN ('DLVD', 'FAIL')
  AND m.created_at < now() - make_interval(days => coalesce(q.archive_retention_days, {days}))
"""
_DUE_IDS_SQL = "SELECT m.id " + _DUE + " AND m.id > %s ORDER BY m.id LIMIT %s"
_READ_SQL = (
    "SELECT m.id, q.name AS queue, m.state, m.payload, m.content_type, m.headers::text AS headers,"
    " m.priority::int AS priority, m.attempts, m.crash_count, m.timeout_count,"
    " m.dead_letter::text AS dead_letter, m.last_error, m.put_application, m.put_user,"
    " m.created_at, m.updated_at " + _DUE
)


def archive_main() -> int:
    """Finish what a crash left, then archive every due message."""
    root = archive_dir()
    (root / INCOMING).mkdir(parents=True, exist_ok=True)
    for chunk in ArchiveChunk.objects.filter(status=ArchiveChunkStatus.WRITTEN).order_by("id"):
        logger.info("archive: finishing %s, written before a crash", chunk.name)
        _finish(chunk)
    _clear_unrecorded(root)
    spark: SparkSession | None = None
    archived = 0
    after = 0
    days = int(settings.LAZARETTO_ARCHIVE_RETENTION_DAYS)
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                _DUE_IDS_SQL.format(days=days), [after, settings.LAZARETTO_ARCHIVE_CHUNK_ROWS]
            )
            ids = [message_id for (message_id,) in cursor.fetchall()]
        if not ids:
            break
        spark = spark or spark_session("lazaretto-archive")
        chunk = _write(spark, ids, days)
        _finish(chunk)
        archived += chunk.rows
        after = ids[-1]
    logger.info("archive: %s message(s) archived", archived)
    return 0


def _write(spark: SparkSession, ids: list[int], days: int) -> ArchiveChunk:
    """Write one chunk to _incoming, check it, record it as WRITTEN."""
    root = archive_dir()
    name = f"{timezone.now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    incoming = root / INCOMING / name
    frame = read_range(spark, _READ_SQL.format(days=days), ids[0], ids[-1])
    (
        frame.withColumn("day", F.date_format("created_at", "yyyy-MM-dd"))
        .write.partitionBy("queue", "day")
        .parquet(str(incoming))
    )
    files = sorted(incoming.glob("queue=*/day=*/*.parquet"))
    written = ds.dataset([str(path) for path in files], format="parquet").to_table(columns=["id"])
    found = sorted(written.column("id").to_pylist())
    # Every message read must be there once; a message that fell due between
    # the two reads may be there too, and is deleted with the rest.
    if len(found) != len(set(found)) or not set(ids).issubset(found):
        shutil.rmtree(incoming, ignore_errors=True)
        raise RuntimeError(
            f"archive chunk {name}: wrote {len(found)} rows for {len(ids)} messages; nothing deleted"
        )
    relative = [str(path.relative_to(incoming).parent / f"{name}-{path.name}") for path in files]
    chunk = ArchiveChunk.objects.create(
        name=name,
        status=ArchiveChunkStatus.WRITTEN,
        rows=len(found),
        first_id=found[0],
        last_id=found[-1],
        files=relative,
        spark_app_id=spark.sparkContext.applicationId,
    )
    if os.environ.get(KILL_AFTER_WRITE):
        os.kill(os.getpid(), signal.SIGKILL)
    return chunk


def _finish(chunk: ArchiveChunk) -> None:
    """Move a WRITTEN chunk's files into place, delete its messages from
    PostgreSQL in bounded transactions, and mark it DELETED."""
    root = archive_dir()
    incoming = root / INCOMING / chunk.name
    for relative in chunk.files:
        final = root / relative
        staged = (
            incoming / Path(relative).parent / Path(relative).name.removeprefix(f"{chunk.name}-")
        )
        if not final.exists() and staged.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, final)
    files = [str(root / relative) for relative in chunk.files]
    ids = sorted(
        ds.dataset(files, format="parquet").to_table(columns=["id"]).column("id").to_pylist()
    )
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
    shutil.rmtree(incoming, ignore_errors=True)


def _clear_unrecorded(root: Path) -> None:
    """Remove _incoming leftovers of chunks a crash stopped before they
    were recorded: their messages are still in PostgreSQL."""
    recorded = set(ArchiveChunk.objects.values_list("name", flat=True))
    for path in (root / INCOMING).iterdir():
        if path.name not in recorded:
            shutil.rmtree(path, ignore_errors=True)
