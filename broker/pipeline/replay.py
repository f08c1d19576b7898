"""Replay jobs: dead (or delivered, or archived) messages written back to
queues in bulk by a Spark job (workers.spark.replay).

A job is checked whole at submission (``replay_job_submit``): anything wrong
is refused with an error per field and nothing is written. Workers launch
it; the Spark driver reports through ``replay_run_*`` below. A job writes
each source message at most once over all its runs: every write commits with
the job's mark (``written_upto``) and a run writes only above it, so a
failed or cancelled job may simply be run again. What a job reads is
``broker.pipeline.source``'s; reads for display are in
``broker.pipeline.selectors``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from broker.errors import ReplayJobBusy, ReplayJobNotFound
from broker.models import (
    Queue,
    QueueKind,
    ReplayJob,
    ReplayJobStatus,
    ReplaySchedule,
    ReplaySource,
)
from broker.pipeline.selection import ReplaySpec, replay_validate
from broker.services.audit import Actor, audit_record
from broker.services.transitions.replayed import messages_replay_staged
from broker.signals import messages_available, replay_job_submitted

logger = logging.getLogger(__name__)

# A running job whose driver has been silent this long is taken for dead.
STALE_AFTER = timedelta(minutes=2)


# --- submitting, cancelling, running again ---------------------------------------


def _user(actor: Actor) -> Any:
    return actor if actor is not None and actor.is_authenticated else None


@transaction.atomic
def replay_job_submit(
    *, spec: ReplaySpec, actor: Actor, schedule: ReplaySchedule | None = None
) -> ReplayJob:
    """Check and queue a replay job (a firing of ``schedule``); a worker
    launches its Spark job."""
    replay_validate(spec)
    limits = spec.limits
    job = ReplayJob.objects.create(
        source=spec.source,
        source_queue=spec.source_queue,
        filters=spec.filter.stored(),
        target_queue=spec.target_queue,
        rules_text=spec.rules_text,
        velocity=spec.velocity,
        dry_run=spec.dry_run,
        created_by=_user(actor),
        schedule=schedule,
        entered_before=limits.entered_before if limits else None,
        generation_below=limits.generation_below if limits else None,
    )
    details: dict[str, Any] = {"job": job.id, "dry_run": spec.dry_run, "source": spec.source}
    if schedule is not None:
        details["schedule"] = schedule.name
    audit_record(
        action="replay_submit",
        actor=actor,
        queue_name=spec.target_queue or spec.source_queue,
        details=details,
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


def replay_stage_bounds(*, job_id: int, after: int, upto: int, velocity: int) -> list[int]:
    """Source ids that cut the job's staged rows of (after, upto] into runs
    of ``velocity``, ``upto`` last."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT source_id FROM ("
            " SELECT source_id, row_number() OVER (ORDER BY source_id) AS n"
            " FROM broker_replaystage"
            " WHERE job_id = %s AND source_id > %s AND source_id <= %s"
            ") AS staged WHERE n %% %s = 0 ORDER BY source_id",
            [job_id, after, upto, velocity],
        )
        cuts = [source_id for (source_id,) in cursor.fetchall()]
    return [*cuts, upto] if not cuts or cuts[-1] != upto else cuts


def replay_stage_once(*, job_id: int, after: int, upto: int) -> int:
    """Keep one staging row per source of the job in (after, upto]: a
    staging load of an earlier run that outlived its driver (a Spark Connect
    server goes on with a dead client's write) adds a second row for a
    source. Runs in the caller's transaction, the write's: SHARE ROW
    EXCLUSIVE waits for loads in progress and keeps new ones out until the
    write commits, so the write sees each source once. Returns the rows
    removed."""
    if not connection.in_atomic_block:
        raise RuntimeError("replay_stage_once runs in the transaction of the write it guards")
    with connection.cursor() as cursor:
        cursor.execute("LOCK TABLE broker_replaystage IN SHARE ROW EXCLUSIVE MODE")
        cursor.execute(
            "DELETE FROM broker_replaystage AS s"
            " WHERE s.job_id = %(job)s AND s.source_id > %(after)s AND s.source_id <= %(upto)s"
            " AND EXISTS (SELECT 1 FROM broker_replaystage AS o"
            "  WHERE o.job_id = s.job_id AND o.source_id = s.source_id AND o.ctid < s.ctid)",
            {"job": job_id, "after": after, "upto": upto},
        )
        removed = cursor.rowcount
    if removed:
        logger.warning("replay job %s: %s staging row(s) an earlier run left", job_id, removed)
    return removed


def replay_stage_analyze() -> None:
    """Refresh the statistics of the staging table after a load, so the
    insert that follows is planned for the rows it holds now, not for the
    empty table it was."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_replaystage")


def replay_write_staged(
    *,
    job: ReplayJob,
    after: int,
    upto: int,
    progress: dict[str, Any],
    skipped: int = 0,
    before: Callable[[], None] | None = None,
) -> ReplayJob:
    """Write the staged messages of (after, upto] the job has not written
    yet, wake their queues, and in the same transaction store the job's mark
    and the run's counts (``_store_write``) and clear the range's staging rows.

    The mark (``written_upto``) is the job's idempotency record: the write
    starts above it, whatever became of earlier copies, and moves it to the
    highest source staged in the range; an uncommitted write leaves neither
    copies nor mark. A driver's writes may overlap: each inserts its copies,
    waits for ``before`` (which returns once the previous write committed,
    or raises, and this one rolls back), and only then locks the job's row,
    so they commit in the order of their ranges. A copy the job has already
    (a second driver of the job) fails the write on the unique index.

    Counts: ``progress`` is the driver's (read, matched, failed, per rule;
    never stored behind what is there); ``skipped`` the sources its rules
    skipped since its previous write, to which the write adds the staged
    sources it did not write. A driver killed right after the commit leaves
    counts that are those of the copies present. Returns the job as stored."""
    with transaction.atomic():
        mark = ReplayJob.objects.values_list("written_upto", flat=True).get(id=job.id)
        staged, highest = _staged(job_id=job.id, after=after, upto=upto)
        start = max(after, mark)
        by_id = (
            messages_replay_staged(
                job_id=job.id,
                after=start,
                upto=upto,
                from_archive=job.source == ReplaySource.ARCHIVE,
                scheduled=job.schedule_id is not None,
            )
            if start < upto
            else {}
        )
        if before is not None:
            before()
        queues = Queue.objects.in_bulk(list(by_id))
        stored = _store_write(
            job_id=job.id,
            progress=progress,
            skipped=skipped + staged - sum(by_id.values()),
            per_target={queues[queue_id].name: count for queue_id, count in by_id.items()},
            mark=highest or 0,
        )
        replay_stage_clear(job_id=job.id, upto=upto)
        for queue_id, count in by_id.items():
            if queues[queue_id].kind == QueueKind.STANDARD:
                messages_available.send(sender=Queue, queue=queues[queue_id], count=count)
    return stored


def _staged(*, job_id: int, after: int, upto: int) -> tuple[int, int | None]:
    """The sources staged in (after, upto], and the highest of them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT source_id), max(source_id) FROM broker_replaystage"
            " WHERE job_id = %s AND source_id > %s AND source_id <= %s",
            [job_id, after, upto],
        )
        staged, highest = cursor.fetchone()
    return staged, highest


def _store_write(
    *, job_id: int, progress: dict[str, Any], skipped: int, per_target: dict[str, int], mark: int
) -> ReplayJob:
    """Add a write's copies (``per_target``) and ``skipped`` to the job's
    counts, bring the driver's ``progress`` onward and move the job's mark
    up to ``mark``, under the job's row lock; returns the job as stored."""
    stored = ReplayJob.objects.select_for_update().get(id=job_id)
    for name, value in progress.items():
        setattr(stored, name, _onward(getattr(stored, name), value))
    stored.written += sum(per_target.values())
    stored.skipped += skipped
    for name, count in per_target.items():
        stored.per_target[name] = stored.per_target.get(name, 0) + count
    stored.written_upto = max(stored.written_upto, mark)
    stored.heartbeat_at = timezone.now()
    stored.save(
        update_fields={
            *progress,
            "written",
            "skipped",
            "per_target",
            "written_upto",
            "heartbeat_at",
        }
    )
    return stored


def _onward(stored: Any, counted: Any) -> Any:
    """A count as the driver reports it, never behind what is stored: the
    larger number, per key for counts by key, the longer sample."""
    if isinstance(counted, int) and isinstance(stored, int):
        return max(stored, counted)
    if isinstance(counted, dict) and isinstance(stored, dict):
        return {key: max(stored.get(key, 0), counted.get(key, 0)) for key in {*stored, *counted}}
    if isinstance(counted, list) and isinstance(stored, list):
        return counted if len(counted) >= len(stored) else stored
    return counted


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
