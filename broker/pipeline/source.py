"""What the Spark drivers read: the SQL of a replay job's source (and its
size), counted here too for a preview, and the messages due for the archive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

from django.conf import settings
from django.db import connection
from psycopg import sql

from broker.models import ReplaySource
from broker.pipeline.selection import ReplaySpec, ScheduleLimits

_SOURCE_STATES: dict[str, str] = {
    ReplaySource.BLACKLIST.value: "NDLV",
    ReplaySource.FAILED.value: "FAIL",
    ReplaySource.DELIVERED.value: "DLVD",
}

# Where a message goes back to, by itself: its id and queues.
_TARGET_COLUMNS = (
    "m.id, CASE WHEN q.kind = 'dead_letter' THEN m.dead_letter->>'original_queue' "
    "ELSE q.name END AS original_queue, q.name AS queue_name"
)
# What a rules table may match besides.
_COLUMNS = sql.SQL(
    f"{_TARGET_COLUMNS}, m.dead_letter::text AS dead_letter, m.headers::text AS headers, "
    "m.content_type, m.put_application, m.put_user, m.created_at"
)


def source_predicate(spec: ReplaySpec, *, all_filters: bool) -> sql.Composed:
    """The SQL condition (on message ``m`` of queue ``q``) for a hot-table
    source. The Spark job reads with the source, queue and time parts and
    applies the rest itself; ``all_filters`` adds the rest too (for counts)."""
    window = spec.filter
    parts: list[sql.Composable] = []
    if spec.source == ReplaySource.DEAD_LETTER:
        parts.append(
            sql.SQL("q.name = {} AND m.state = 'TBDL'").format(sql.Literal(spec.source_queue))
        )
        if window.queues:
            parts.append(
                sql.SQL("m.dead_letter->>'original_queue' = ANY({})").format(
                    sql.Literal(list(window.queues))
                )
            )
    else:
        parts.append(sql.SQL("m.state = {}").format(sql.Literal(_SOURCE_STATES[spec.source])))
        if spec.source == ReplaySource.DELIVERED:
            # Kept without its payload (delivered_retention headers): nothing to replay.
            parts.append(sql.SQL("m.payload IS NOT NULL"))
        if window.queues:
            parts.append(sql.SQL("q.name = ANY({})").format(sql.Literal(list(window.queues))))
    # In UTC: Python takes offsets up to ±23:59, PostgreSQL only to ±15:59.
    if window.since:
        since = window.since.astimezone(UTC)
        parts.append(sql.SQL("m.created_at >= {}").format(sql.Literal(since)))
    if window.until:
        until = window.until.astimezone(UTC)
        parts.append(sql.SQL("m.created_at < {}").format(sql.Literal(until)))
    if spec.limits is not None:
        parts.append(_limits_predicate(spec.source, spec.limits))
    if all_filters:
        if window.reason:
            parts.append(
                sql.SQL("m.dead_letter->>'reason' = {}").format(sql.Literal(window.reason))
            )
        pair = window.header_pair
        if pair is not None:
            parts.append(
                sql.SQL("m.headers->>{} = {}").format(sql.Literal(pair[0]), sql.Literal(pair[1]))
            )
        if window.payload_text:
            parts.append(
                sql.SQL("position(convert_to({}, 'UTF8') in m.payload) > 0").format(
                    sql.Literal(window.payload_text)
                )
            )
    return sql.SQL(" AND ").join(parts)


def _limits_predicate(source: str, limits: ScheduleLimits) -> sql.Composed:
    """A schedule's job: sources in their state since before the cool-off
    (a dead letter since it was dead-lettered), below the give-up
    generation, not copied by a schedule's job before."""
    entered = "m.enqueued_at" if source == ReplaySource.DEAD_LETTER else "m.updated_at"
    return sql.SQL("{} < {} AND m.generation < {} AND m.schedule_replayed_at IS NULL").format(
        sql.SQL(entered),
        sql.Literal(limits.entered_before.astimezone(UTC)),
        sql.Literal(limits.generation_below),
    )


def _render(query: sql.Composable) -> str:
    connection.ensure_connection()
    return query.as_string(connection.connection)


def source_query(spec: ReplaySpec, *, with_payload: bool) -> str:
    """The SELECT the Spark job reads over JDBC (partitioned on ``id``): what
    its rules table may match, or without one only the id, the queues and
    the columns its filters read (a third of the bytes of a dead letter)."""
    columns = _COLUMNS if spec.rules_text.strip() else _filter_columns(spec)
    if with_payload:
        columns = sql.SQL("{}, m.payload").format(columns)
    query = sql.SQL(
        "SELECT {} FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id WHERE {}"
    ).format(columns, source_predicate(spec, all_filters=False))
    return _render(query)


def _filter_columns(spec: ReplaySpec) -> sql.Composable:
    """The id, the queues, and the columns the job's filters read."""
    columns = [_TARGET_COLUMNS]
    if spec.filter.reason:
        columns.append("m.dead_letter::text AS dead_letter")
    if spec.filter.header_pair is not None:
        columns.append("m.headers::text AS headers")
    return sql.SQL(", ".join(columns))


@dataclass(frozen=True)
class SourceRange:
    rows: int
    first_id: int
    last_id: int


def source_range(spec: ReplaySpec) -> SourceRange:
    """How many rows the job reads and their id range."""
    query = sql.SQL(
        "SELECT count(*), coalesce(min(m.id), 0), coalesce(max(m.id), 0) "
        "FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id WHERE {}"
    ).format(source_predicate(spec, all_filters=False))
    with connection.cursor() as cursor:
        cursor.execute(_render(query))
        rows, first, last = cursor.fetchone()
    return SourceRange(rows, first, last)


def source_count(spec: ReplaySpec) -> int:
    """How many hot-table messages the whole filter matches."""
    query = sql.SQL(
        "SELECT count(*) FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id "
        "WHERE {}"
    ).format(source_predicate(spec, all_filters=True))
    with connection.cursor() as cursor:
        cursor.execute(_render(query))
        (count,) = cursor.fetchone()
    return int(count)


# --- what the archive reads -------------------------------------------------------------

# Messages due for the archive: delivered or failed, published before their
# queue's retention (in days) ran out.
_DUE = """
FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id
WHERE m.state IN ('DLVD', 'FAIL')
  AND m.created_at < now() - make_interval(days => coalesce(q.archive_retention_days, {days}))
"""
_DUE_IDS_SQL = "SELECT m.id " + _DUE + " AND m.id > %s ORDER BY m.id LIMIT %s"
_ARCHIVE_READ_SQL = (
    "SELECT m.id, q.name AS queue, m.state, m.payload, m.content_type, m.headers::text AS headers,"
    " m.priority::int AS priority, m.attempts, m.crash_count, m.timeout_count,"
    " m.dead_letter::text AS dead_letter, m.last_error, m.put_application, m.put_user,"
    " m.created_at, m.updated_at, m.replay_job_id, m.replay_source_id " + _DUE
)


def _retention_days() -> int:
    return int(settings.LAZARETTO_ARCHIVE_RETENTION_DAYS)


def archive_due_ids(*, after: int, limit: int) -> list[int]:
    """The ids of the next ``limit`` messages due for the archive above
    ``after``, in order: the next chunk."""
    with connection.cursor() as cursor:
        cursor.execute(_DUE_IDS_SQL.format(days=_retention_days()), [after, limit])
        return [message_id for (message_id,) in cursor.fetchall()]


def archive_source_query() -> str:
    """The SELECT the archive's driver reads over JDBC (partitioned on ``id``)."""
    return _ARCHIVE_READ_SQL.format(days=_retention_days())
