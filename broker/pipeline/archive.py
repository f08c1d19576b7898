"""The message archive: delivered and failed messages past their queue's
retention, kept as Parquet files under ARCHIVE_DIR, partitioned by queue
and by the day they were published (``queue=NAME/day=YYYY-MM-DD/``).

A Spark job writes it (workers.spark.archive); the console reads it with
pyarrow (``broker.pipeline.selectors``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.dataset as ds
from django.conf import settings
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from broker.models import Queue

# The archive's columns, in the order the archive job writes them.
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("state", pa.string()),
        ("payload", pa.binary()),
        ("content_type", pa.string()),
        ("headers", pa.string()),
        ("priority", pa.int32()),
        ("attempts", pa.int32()),
        ("crash_count", pa.int32()),
        ("timeout_count", pa.int32()),
        ("dead_letter", pa.string()),
        ("last_error", pa.string()),
        ("put_application", pa.string()),
        ("put_user", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
PARTITION_FIELDS = pa.schema([("queue", pa.string()), ("day", pa.string())])
PARTITIONING = ds.partitioning(PARTITION_FIELDS, flavor="hive")
DATASET_SCHEMA = pa.unify_schemas([SCHEMA, PARTITION_FIELDS])
INCOMING = "_incoming"


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
