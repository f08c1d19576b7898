"""Reads of the message archive (``broker.pipeline.archive``), with
pyarrow, which opens only the partitions and columns a search needs and
answers in milliseconds, where a Spark session takes seconds to start.

pyarrow takes half a second to import, so this module is imported where an
archive is read, not with the URLconf: every Celery worker, management
command and web process would pay for it otherwise.
"""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from broker.pipeline.archive import archive_dir, partition_value, utc_day
from broker.pipeline.selection import MessageSelection
from broker.pipeline.selectors import ArchivedMessage

MAX_RESULTS = 500

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
        # A replayed copy's job and source (null for any other message, and
        # in files written before copies carried them).
        ("replay_job_id", pa.int64()),
        ("replay_source_id", pa.int64()),
    ]
)
PARTITION_FIELDS = pa.schema([("queue", pa.string()), ("day", pa.string())])
PARTITIONING = ds.partitioning(PARTITION_FIELDS, flavor="hive")
DATASET_SCHEMA = pa.unify_schemas([SCHEMA, PARTITION_FIELDS])


def _dataset() -> ds.Dataset | None:
    root = archive_dir()
    if not root.is_dir():
        return None
    files = [
        str(path)
        for path in root.glob("queue=*/day=*/*.parquet")
        if not path.name.startswith((".", "_"))
    ]
    if not files:
        return None
    return ds.dataset(
        files,
        schema=DATASET_SCHEMA,
        format="parquet",
        partitioning=PARTITIONING,
        partition_base_dir=str(root),
    )


def _expression(
    *, queues: tuple[str, ...], since: datetime | None, until: datetime | None
) -> ds.Expression | None:
    parts: list[ds.Expression] = []
    if queues:
        parts.append(ds.field("queue").isin(list(queues)))
    if since is not None:
        parts.append(ds.field("day") >= utc_day(since))
        parts.append(ds.field("created_at") >= pa.scalar(since, pa.timestamp("us", tz="UTC")))
    if until is not None:
        parts.append(ds.field("day") <= utc_day(until))
        parts.append(ds.field("created_at") < pa.scalar(until, pa.timestamp("us", tz="UTC")))
    if not parts:
        return None
    expression = parts[0]
    for part in parts[1:]:
        expression = expression & part
    return expression


def _header(value: str | None, name: str) -> str | None:
    try:
        headers = json.loads(value or "{}")
    except ValueError:
        return None
    found = headers.get(name) if isinstance(headers, dict) else None
    return None if found is None else str(found)


def _reason(value: str | None) -> str:
    try:
        header = json.loads(value or "null")
    except ValueError:
        return ""
    return str(header.get("reason", "")) if isinstance(header, dict) else ""


def _matches(table: pa.Table, window: MessageSelection) -> pa.Table:
    """The rows of ``table`` that pass the filter's reason, header and
    payload parts (queue and time are pushed down to the scan)."""
    if window.payload_text:
        needle = window.payload_text.encode()
        keep = [needle in (payload or b"") for payload in table.column("payload").to_pylist()]
        table = table.filter(pa.array(keep, pa.bool_()))
    pair = window.header_pair
    if pair is not None:
        keep = [_header(value, pair[0]) == pair[1] for value in table.column("headers").to_pylist()]
        table = table.filter(pa.array(keep, pa.bool_()))
    if window.reason:
        keep = [
            _reason(value) == window.reason for value in table.column("dead_letter").to_pylist()
        ]
        table = table.filter(pa.array(keep, pa.bool_()))
    return table


def archive_count(window: MessageSelection) -> int:
    """How many archived messages a replay filter matches: those archived
    with their payload (a replay has nothing to write for the others)."""
    dataset = _dataset()
    if dataset is None:
        return 0
    expression = _expression(queues=window.queues, since=window.since, until=window.until)
    expression = expression & ds.field("payload").is_valid()
    if not (window.payload_text or window.header or window.reason):
        return int(dataset.count_rows(filter=expression))
    columns = ["payload", "headers", "dead_letter"]
    total = 0
    for batch in dataset.to_batches(columns=columns, filter=expression):
        total += _matches(pa.Table.from_batches([batch]), window).num_rows
    return total


def archive_search(
    *,
    queue: str,
    since: datetime | None = None,
    until: datetime | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[ArchivedMessage]:
    """Archived messages of ``queue`` published in [since, until), newest
    (highest id) first, below ``before_id`` for the next page."""
    dataset = _dataset()
    if dataset is None:
        return []
    expression = _expression(queues=(queue,), since=since, until=until)
    if before_id is not None:
        below = ds.field("id") < before_id
        expression = below if expression is None else expression & below
    table = dataset.to_table(filter=expression)
    if table.num_rows == 0:
        return []
    order = pc.sort_indices(table, sort_keys=[("id", "descending")])
    table = table.take(order[: min(limit, MAX_RESULTS)])
    return [_archived(row) for row in table.to_pylist()]


def _archived(row: dict[str, Any]) -> ArchivedMessage:
    return ArchivedMessage(
        id=row["id"],
        queue=row["queue"],
        state=row["state"],
        payload=row["payload"],
        content_type=row["content_type"] or "",
        headers=json.loads(row["headers"] or "{}"),
        dead_letter=json.loads(row["dead_letter"]) if row["dead_letter"] else None,
        put_application=row["put_application"] or "",
        put_user=row["put_user"] or "",
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        replay_job_id=row["replay_job_id"],
        replay_source_id=row["replay_source_id"],
    )


def archive_days(*, queue: str) -> list[date]:
    """The days the archive holds messages of ``queue`` for, newest first."""
    root = archive_dir() / f"queue={partition_value(queue)}"
    if not root.is_dir():
        return []
    days = [date.fromisoformat(path.name.removeprefix("day=")) for path in root.glob("day=*")]
    return sorted(days, reverse=True)
