"""The archive's Spark driver: delivered and failed messages past their
queue's retention move to Parquet under ARCHIVE_DIR, partitioned by queue
and by the day they were published, in chunks of
LAZARETTO_ARCHIVE_CHUNK_ROWS messages.

Spark reads each chunk over JDBC and writes it to the chunk's ``_incoming``
directory; every state change of a run and of its chunks (recorded as
WRITTEN, finished as DELETED, what a crash left) is
``broker.pipeline.archive``'s.
"""

from __future__ import annotations

import logging
import os
import signal

from django.conf import settings
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker.models import ArchiveChunk
from broker.pipeline.archive import (
    archive_chunk_finish,
    archive_chunk_name,
    archive_chunk_start,
    archive_incoming,
    archive_run_start,
)
from broker.pipeline.source import archive_due_ids, archive_source_query
from workers.spark.session import (
    interrupt_on_sigterm,
    read_range,
    spark_app_id,
    spark_failure,
    spark_session,
)

logger = logging.getLogger(__name__)

# Set in tests to stop the driver dead (SIGKILL) once a chunk is written
# and verified, before anything is deleted.
KILL_AFTER_WRITE = "LAZARETTO_ARCHIVE_KILL_AFTER_WRITE"


def archive_main() -> int:
    """Finish what a crash left, then archive every due message; a failure
    is logged with what to fix, and the exit status says so."""
    try:
        archived = _archive()
    except Exception as error:
        logger.exception("archive failed")
        logger.error("archive failed: %s", spark_failure(error))
        return 1
    logger.info("archive: %s message(s) archived", archived)
    return 0


def _archive() -> int:
    archive_run_start()
    spark: SparkSession | None = None
    archived = 0
    after = 0
    while True:
        ids = archive_due_ids(after=after, limit=settings.LAZARETTO_ARCHIVE_CHUNK_ROWS)
        if not ids:
            break
        if spark is None:
            spark = spark_session("lazaretto-archive")
            interrupt_on_sigterm(spark)
        chunk = _write(spark, ids)
        archive_chunk_finish(chunk=chunk)
        archived += chunk.rows
        after = ids[-1]
    return archived


def _write(spark: SparkSession, ids: list[int]) -> ArchiveChunk:
    """Write one chunk to _incoming; the archive checks and records it."""
    name = archive_chunk_name()
    frame = read_range(spark, archive_source_query(), ids[0], ids[-1])
    (
        frame.withColumn("day", F.date_format("created_at", "yyyy-MM-dd"))
        .write.partitionBy("queue", "day")
        .parquet(str(archive_incoming(name)))
    )
    chunk = archive_chunk_start(name=name, ids=ids, spark_app_id=spark_app_id(spark))
    if os.environ.get(KILL_AFTER_WRITE):
        os.kill(os.getpid(), signal.SIGKILL)
    return chunk
