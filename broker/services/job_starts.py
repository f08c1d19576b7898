"""Starting background jobs: a bulk triage job or a replay job starts when a
Celery task for it, sent once its row commits, reaches a worker. Redis may
refuse that task (it is down), or lose it (it restarts without the task
saved). The job then stays queued, so the start-jobs duty sends the start
again of every queued job whose start was never sent, or was sent longer
ago than ``LAZARETTO_JOB_RESEND_SECONDS``.

A start may so arrive twice. Each kind of job runs once all the same: a
replay job's driver takes it only while it is queued
(``broker.pipeline.replay.replay_run_start``), and a bulk job's run holds
the job's advisory lock (``broker.services.bulk.bulk_job_run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from broker.models import BulkJob, BulkJobStatus, ReplayJob, ReplayJobStatus

JobKind = Literal["bulk", "replay"]
_MODELS: dict[JobKind, type[BulkJob] | type[ReplayJob]] = {"bulk": BulkJob, "replay": ReplayJob}
# A start is sent once the job's row commits; a job this young whose start is
# not recorded yet is most likely being started.
SEND_GRACE_SECONDS = 2.0
# Both kinds' queued status.
QUEUED = BulkJobStatus.QUEUED
assert QUEUED == ReplayJobStatus.QUEUED


@dataclass(frozen=True)
class JobStart:
    kind: JobKind
    job_id: int


def job_start_sent(*, kind: JobKind, job_id: int) -> None:
    """Record that the job's start task was sent (just now)."""
    _MODELS[kind].objects.filter(id=job_id).update(start_sent_at=Now())


def jobs_to_start(*, resend_after_seconds: float) -> list[JobStart]:
    """The queued jobs whose start was never sent, or was sent more than
    ``resend_after_seconds`` ago, oldest first (the *_job_queued_idx
    indexes)."""
    now = timezone.now()
    never = Q(
        start_sent_at__isnull=True, created_at__lt=now - timedelta(seconds=SEND_GRACE_SECONDS)
    )
    due = never | Q(start_sent_at__lt=now - timedelta(seconds=resend_after_seconds))
    starts: list[JobStart] = []
    for kind, model in _MODELS.items():
        queued: QuerySet[BulkJob] | QuerySet[ReplayJob] = model.objects.filter(status=QUEUED)
        ids = queued.filter(due).order_by("id").values_list("id", flat=True)
        starts += [JobStart(kind, job_id) for job_id in ids]
    return starts
