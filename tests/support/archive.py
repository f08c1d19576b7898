"""The archive as the archive job leaves it: Parquet files, one per queue and
(UTC) day of publication, written here without Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from broker.pipeline.archive_reads import SCHEMA

# A day of publication for archived rows; tests add hours or days to it.
DAY = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)

# What an archived row holds where a test does not say.
DEFAULTS: dict[str, Any] = {
    "state": "DLVD",
    "payload": b"{}",
    "content_type": "application/json",
    "headers": "{}",
    "priority": 0,
    "attempts": 1,
    "crash_count": 0,
    "timeout_count": 0,
    "dead_letter": None,
    "last_error": "",
    "put_application": "test",
    "put_user": "test",
}


def message_row(message_id: int, at: datetime, **values: Any) -> dict[str, Any]:
    """An archived message published ``at`` and settled a minute later."""
    return {"id": message_id, "created_at": at, "updated_at": at + timedelta(minutes=1), **values}


def archived(root: Path, queue: str, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` under ``root`` as the archive job lays them out, each
    column ``DEFAULTS``' value where a row does not name it."""
    by_day: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_day.setdefault(row["created_at"].date().isoformat(), []).append(row)
    for day, day_rows in by_day.items():
        directory = root / f"queue={queue}" / f"day={day}"
        directory.mkdir(parents=True)
        columns = {
            name: [row.get(name, DEFAULTS.get(name)) for row in day_rows] for name in SCHEMA.names
        }
        pq.write_table(pa.table(columns, schema=SCHEMA), directory / "part-0.parquet")
