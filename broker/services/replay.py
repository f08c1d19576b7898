"""Replay jobs: dead (or delivered, or archived) messages written back to
queues in bulk by a Spark job (workers.spark.replay).

A job is checked whole at submission (``replay_job_submit``): anything wrong
is refused with an error per field and nothing is written. Workers launch
it; the Spark driver reports through ``replay_run_*`` below. Every run of a
job writes each source message at most once (the ReplayedMessage record),
so a failed or cancelled job may simply be run again.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from psycopg import sql

from broker.errors import InvalidInput, ReplayJobBusy, ReplayJobNotFound
from broker.models import (
    Queue,
    QueueKind,
    ReplayedMessage,
    ReplayJob,
    ReplayJobStatus,
    ReplaySource,
)
from broker.rules import parse
from broker.services.audit import Actor, audit_record
from broker.signals import messages_available, replay_job_submitted

logger = logging.getLogger(__name__)

MAX_VELOCITY = 1_000_000
MAX_TEXT_FILTER = 1000
# A running job whose driver has been silent this long is taken for dead.
STALE_AFTER = timedelta(minutes=2)

_SOURCE_STATES: dict[str, str] = {
    ReplaySource.BLACKLIST.value: "NDLV",
    ReplaySource.FAILED.value: "FAIL",
    ReplaySource.DELIVERED.value: "DLVD",
}


@dataclass(frozen=True)
class ReplayFilter:
    """Which source messages a job takes: on these queues (for a dead-letter
    queue, the queues they were dead-lettered from), with this dead-letter
    reason, published in [since, until), with header ``name=value``, with
    this text in their payload. Empty parts take everything."""

    queues: tuple[str, ...] = ()
    reason: str = ""
    since: datetime | None = None
    until: datetime | None = None
    header: str = ""
    payload_text: str = ""

    def stored(self) -> dict[str, Any]:
        values = asdict(self)
        values["queues"] = list(self.queues)
        for key in ("since", "until"):
            values[key] = values[key].isoformat() if values[key] else None
        return {key: value for key, value in values.items() if value}

    @classmethod
    def from_stored(cls, values: dict[str, Any]) -> ReplayFilter:
        return cls(
            queues=tuple(values.get("queues", ())),
            reason=values.get("reason", ""),
            since=datetime.fromisoformat(values["since"]) if values.get("since") else None,
            until=datetime.fromisoformat(values["until"]) if values.get("until") else None,
            header=values.get("header", ""),
            payload_text=values.get("payload_text", ""),
        )

    @property
    def header_pair(self) -> tuple[str, str] | None:
        if not self.header:
            return None
        name, _, value = self.header.partition("=")
        return name.strip(), value


@dataclass(frozen=True)
class ReplaySpec:
    """What a replay job does; see ReplayJob."""

    source: str
    source_queue: str = ""
    filter: ReplayFilter = field(default_factory=ReplayFilter)
    target_queue: str = ""
    rules_text: str = ""
    velocity: int | None = None
    dry_run: bool = False

    @classmethod
    def of(cls, job: ReplayJob) -> ReplaySpec:
        return cls(
            source=job.source,
            source_queue=job.source_queue,
            filter=ReplayFilter.from_stored(job.filters),
            target_queue=job.target_queue,
            rules_text=job.rules_text,
            velocity=job.velocity,
            dry_run=job.dry_run,
        )


def _queue_problems(spec: ReplaySpec) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    names = {spec.source_queue, spec.target_queue, *spec.filter.queues} - {""}
    queues = {queue.name: queue for queue in Queue.objects.filter(name__in=names)}
    if spec.source == ReplaySource.DEAD_LETTER:
        source = queues.get(spec.source_queue)
        if not spec.source_queue:
            errors["source_queue"] = ["Name the dead-letter queue to replay from."]
        elif source is None:
            errors["source_queue"] = [f"There is no queue named {spec.source_queue!r}."]
        elif source.kind != QueueKind.DEAD_LETTER:
            errors["source_queue"] = [f"{spec.source_queue} is not a dead-letter queue."]
    elif spec.source_queue:
        errors["source_queue"] = ["Only a dead-letter source names a source queue."]
    unknown = sorted(set(spec.filter.queues) - set(queues))
    if unknown:
        errors["queues"] = [f"There is no queue named {', '.join(map(repr, unknown))}."]
    if spec.target_queue:
        target = queues.get(spec.target_queue)
        if target is None:
            errors["target_queue"] = [f"There is no queue named {spec.target_queue!r}."]
        elif target.kind == QueueKind.DEAD_LETTER:
            errors["target_queue"] = [
                f"{spec.target_queue} is a dead-letter queue; replay to a queue that delivers."
            ]
    return errors


def replay_validate(spec: ReplaySpec) -> None:
    """Refuse a job that cannot run as asked, with every problem by field."""
    errors: dict[str, list[str]] = {}
    if spec.source not in ReplaySource.values:
        errors["source"] = [f"Choose one of {', '.join(ReplaySource.values)}."]
    errors.update(_queue_problems(spec))
    window = spec.filter
    if window.since and window.until and window.until <= window.since:
        errors["until"] = ["The time range ends before it starts."]
    pair = window.header_pair
    if pair is not None and (not pair[0] or "=" not in window.header):
        errors["header"] = ["Write the header filter as name=value."]
    for name, value in (("payload_text", window.payload_text), ("reason", window.reason)):
        if len(value) > MAX_TEXT_FILTER:
            errors[name] = [f"At most {MAX_TEXT_FILTER} characters."]
    if spec.velocity is not None and not 1 <= spec.velocity <= MAX_VELOCITY:
        errors["velocity"] = [
            f"Give from 1 to {MAX_VELOCITY:,} messages per second, or leave it empty for no limit."
        ]
    if spec.rules_text.strip():
        result = parse(spec.rules_text)
        if result.errors:
            errors["rules_text"] = [
                f"line {error.line}, column {error.column}: {error.message}"
                for error in result.errors
            ]
    if errors:
        raise InvalidInput("The replay job is not valid.", field_errors=errors)


# --- what a job reads ----------------------------------------------------------

_COLUMNS = sql.SQL(
    "m.id, CASE WHEN q.kind = 'dead_letter' THEN m.dead_letter->>'original_queue' "
    "ELSE q.name END AS original_queue, q.name AS queue_name, m.dead_letter::text AS dead_letter, "
    "m.headers::text AS headers, m.content_type, m.put_application, m.put_user, m.created_at"
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
        if window.queues:
            parts.append(sql.SQL("q.name = ANY({})").format(sql.Literal(list(window.queues))))
    # In UTC: Python takes offsets up to ±23:59, PostgreSQL only to ±15:59.
    if window.since:
        since = window.since.astimezone(UTC)
        parts.append(sql.SQL("m.created_at >= {}").format(sql.Literal(since)))
    if window.until:
        until = window.until.astimezone(UTC)
        parts.append(sql.SQL("m.created_at < {}").format(sql.Literal(until)))
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


def _render(query: sql.Composable) -> str:
    connection.ensure_connection()
    return query.as_string(connection.connection)


def source_query(spec: ReplaySpec, *, with_payload: bool) -> str:
    """The SELECT the Spark job reads over JDBC (partitioned on ``id``)."""
    columns = sql.SQL("{}, m.payload").format(_COLUMNS) if with_payload else _COLUMNS
    query = sql.SQL(
        "SELECT {} FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id WHERE {}"
    ).format(columns, source_predicate(spec, all_filters=False))
    return _render(query)


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


def replay_preview(spec: ReplaySpec) -> int:
    """How many messages the job's filter matches (before any rules)."""
    replay_validate(spec)
    if spec.source == ReplaySource.ARCHIVE:
        from broker.services.archive import archive_count

        return archive_count(spec.filter)
    query = sql.SQL(
        "SELECT count(*) FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id "
        "WHERE {}"
    ).format(source_predicate(spec, all_filters=True))
    with connection.cursor() as cursor:
        cursor.execute(_render(query))
        (count,) = cursor.fetchone()
    return int(count)


# --- submitting, cancelling, running again ---------------------------------------


def replay_job_get(*, job_id: int) -> ReplayJob:
    job = ReplayJob.objects.select_related("created_by").filter(id=job_id).first()
    if job is None:
        raise ReplayJobNotFound(f"There is no replay job {job_id}.")
    return job


def _user(actor: Actor) -> Any:
    return actor if actor is not None and actor.is_authenticated else None


@transaction.atomic
def replay_job_submit(*, spec: ReplaySpec, actor: Actor) -> ReplayJob:
    """Check and queue a replay job; a worker launches its Spark job."""
    replay_validate(spec)
    job = ReplayJob.objects.create(
        source=spec.source,
        source_queue=spec.source_queue,
        filters=spec.filter.stored(),
        target_queue=spec.target_queue,
        rules_text=spec.rules_text,
        velocity=spec.velocity,
        dry_run=spec.dry_run,
        created_by=_user(actor),
    )
    audit_record(
        action="replay_submit",
        actor=actor,
        queue_name=spec.target_queue or spec.source_queue,
        details={"job": job.id, "dry_run": spec.dry_run, "source": spec.source},
    )
    replay_job_submitted.send(sender=ReplayJob, job=job)
    return job


@transaction.atomic
def replay_job_cancel(*, job_id: int, actor: Actor) -> ReplayJob:
    """Stop a job: a queued one at once, a running one as soon as its
    launcher sees the request (it stops the Spark driver; what was written
    stays written, and a run again completes the job)."""
    job = ReplayJob.objects.select_for_update().filter(id=job_id).first()
    if job is None:
        raise ReplayJobNotFound(f"There is no replay job {job_id}.")
    if job.finished:
        raise ReplayJobBusy(f"Replay job {job_id} has already finished ({job.status}).")
    job.cancel_requested = True
    fields = ["cancel_requested"]
    if job.status == ReplayJobStatus.QUEUED:
        job.status = ReplayJobStatus.CANCELLED
        job.finished_at = timezone.now()
        fields += ["status", "finished_at"]
    job.save(update_fields=fields)
    audit_record(action="replay_cancel", actor=actor, details={"job": job.id})
    return job


def _stale(job: ReplayJob) -> bool:
    seen = job.heartbeat_at or job.started_at
    return seen is None or timezone.now() - seen > STALE_AFTER


@transaction.atomic
def replay_job_run_again(*, job_id: int, actor: Actor) -> ReplayJob:
    """Queue a finished, failed or cancelled job again (a running one whose
    driver went silent too): it writes only what its earlier runs did not."""
    job = ReplayJob.objects.select_for_update().filter(id=job_id).first()
    if job is None:
        raise ReplayJobNotFound(f"There is no replay job {job_id}.")
    if job.status == ReplayJobStatus.QUEUED or (
        job.status == ReplayJobStatus.RUNNING and not _stale(job)
    ):
        raise ReplayJobBusy(f"Replay job {job_id} is {job.status}; wait for it or cancel it.")
    job.status = ReplayJobStatus.QUEUED
    job.cancel_requested = False
    job.error = ""
    job.finished_at = None
    job.save(update_fields=["status", "cancel_requested", "error", "finished_at"])
    audit_record(action="replay_run_again", actor=actor, details={"job": job.id})
    replay_job_submitted.send(sender=ReplayJob, job=job)
    return job


def replays_of(*, message_id: int) -> list[ReplayedMessage]:
    """The copies replay jobs wrote of a message, oldest first."""
    return list(ReplayedMessage.objects.filter(source_message_id=message_id).order_by("id"))


def replayed_from(*, message_id: int) -> ReplayedMessage | None:
    """The replay that wrote this message, if one did."""
    return ReplayedMessage.objects.filter(message_id=message_id).first()


# --- what the Spark driver reports -------------------------------------------------


def replay_run_start(*, job_id: int, pid: int) -> ReplayJob | None:
    """Take a queued job for this driver; None when it is not queued (a
    cancel came first, or another driver has it)."""
    now = timezone.now()
    taken = ReplayJob.objects.filter(id=job_id, status=ReplayJobStatus.QUEUED).update(
        status=ReplayJobStatus.RUNNING,
        driver_pid=pid,
        runs=F("runs") + 1,
        started_at=now,
        heartbeat_at=now,
        read=0,
        matched=0,
        written=0,
        skipped=0,
        failed=0,
        per_target={},
        per_rule={},
        sample=[],
        spark_app_id="",
    )
    return ReplayJob.objects.get(id=job_id) if taken else None


def replay_run_progress(*, job_id: int, **values: Any) -> bool:
    """Store the job's counts; returns whether a cancel was asked for."""
    ReplayJob.objects.filter(id=job_id).update(heartbeat_at=timezone.now(), **values)
    return ReplayJob.objects.filter(id=job_id, cancel_requested=True).exists()


def replay_stage_clear(*, job_id: int, upto: int | None = None) -> None:
    """Empty the job's staging rows (up to a source id)."""
    with connection.cursor() as cursor:
        if upto is None:
            cursor.execute("DELETE FROM broker_replaystage WHERE job_id = %s", [job_id])
        else:
            cursor.execute(
                "DELETE FROM broker_replaystage WHERE job_id = %s AND source_id <= %s",
                [job_id, upto],
            )


def replay_stage_analyze() -> None:
    """Refresh the statistics of the staging table and of the job records
    after a load, so the insert that follows is planned for the rows they
    hold now: with stale figures for a job's records the planner may rescan
    them for every staged row (minutes instead of seconds per range)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_replaystage, broker_replayedmessage")


def replay_write_staged(*, job: ReplayJob, after: int, upto: int) -> dict[str, int]:
    """Write the staged messages of (after, upto] in one transaction and wake
    their queues; returns messages written per queue name."""
    from broker.services.transitions.replayed import messages_replay_staged

    with transaction.atomic():
        by_id = messages_replay_staged(
            job_id=job.id, after=after, upto=upto, from_archive=job.source == ReplaySource.ARCHIVE
        )
        queues = Queue.objects.in_bulk(list(by_id))
        for queue_id, count in by_id.items():
            queue = queues[queue_id]
            if queue.kind == QueueKind.STANDARD:
                messages_available.send(sender=Queue, queue=queue, count=count)
    return {queues[queue_id].name: count for queue_id, count in by_id.items()}


@transaction.atomic
def replay_run_finish(
    *, job_id: int, status: str, error: str = "", actor_name: str = ""
) -> ReplayJob:
    """Close a run: its status, any error, and the job's audit event, in one
    transaction, so whoever sees the run ended also finds its audit event."""
    ReplayJob.objects.filter(id=job_id).update(
        status=status, error=error[:4000], finished_at=timezone.now(), driver_pid=None
    )
    replay_stage_clear(job_id=job_id)
    job = ReplayJob.objects.select_related("created_by").get(id=job_id)
    audit_record(
        action="replay_finish",
        actor=job.created_by,
        queue_name=job.target_queue or job.source_queue,
        reason=error[:500],
        details={
            "job": job.id,
            "status": status,
            "dry_run": job.dry_run,
            "read": job.read,
            "matched": job.matched,
            "written": job.written,
            "skipped": job.skipped,
            "failed": job.failed,
            "per_target": job.per_target,
            "per_rule": job.per_rule,
            "spark_app_id": job.spark_app_id,
        },
    )
    return job


def replay_jobs_recent(*, limit: int = 50) -> list[ReplayJob]:
    return list(ReplayJob.objects.select_related("created_by").order_by("-id")[:limit])
