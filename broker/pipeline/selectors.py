"""The pipeline's reads for display: replay jobs and the copies they wrote,
a job's preview, and what the archive's reads
(``broker.pipeline.archive_reads``) return.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q

from broker.errors import ReplayJobNotFound
from broker.models import Message, ReplayJob, ReplaySource
from broker.pipeline.selection import ReplaySpec, replay_validate
from broker.pipeline.source import source_count

# --- replay jobs -------------------------------------------------------------------


def replay_job_get(*, job_id: int) -> ReplayJob:
    job = ReplayJob.objects.select_related("created_by").filter(id=job_id).first()
    if job is None:
        raise ReplayJobNotFound(f"There is no replay job {job_id}.")
    return job


@dataclass(frozen=True)
class Replayed:
    """A copy a replay job wrote: the job, the message it copied (the
    source) and the copy, written at ``created_at``."""

    job_id: int
    source_message_id: int
    message_id: int
    created_at: datetime


_REPLAYED = ("replay_job_id", "replay_source_id", "id", "created_at")


def replays_of(*, message_id: int) -> list[Replayed]:
    """The copies replay jobs wrote of a message and PostgreSQL still holds
    (an archived copy is in the archive with the same marks), oldest first.
    Reads message_replay_source_idx."""
    copies = Message.objects.filter(replay_source_id=message_id).order_by("id")
    return [Replayed(*row) for row in copies.values_list(*_REPLAYED)]


def replayed_from(*, message_id: int) -> Replayed | None:
    """The replay that wrote this message, if one did."""
    row = (
        Message.objects.filter(id=message_id, replay_job_id__isnull=False)
        .values_list(*_REPLAYED)
        .first()
    )
    return None if row is None else Replayed(*row)


def replay_jobs_recent(*, limit: int = 50, within: Q | None = None) -> list[ReplayJob]:
    """The latest jobs (of those ``within`` selects), newest first."""
    jobs = ReplayJob.objects.select_related("created_by")
    if within is not None:
        jobs = jobs.filter(within)
    return list(jobs.order_by("-id")[:limit])


def replay_preview(spec: ReplaySpec) -> int:
    """How many messages the job's filter matches (before any rules)."""
    replay_validate(spec)
    if spec.source == ReplaySource.ARCHIVE:
        from broker.pipeline.archive_reads import archive_count

        return archive_count(spec.filter)
    return source_count(spec)


@dataclass(frozen=True)
class ArchivedMessage:
    """A message the archive holds, as an archive search returns it."""

    id: int
    queue: str
    state: str
    # None: not retained (the queue kept its delivered messages without it).
    payload: bytes | None
    content_type: str
    headers: dict[str, Any]
    dead_letter: dict[str, Any] | None
    put_application: str
    put_user: str
    created_at: datetime
    updated_at: datetime
    # A replayed copy's job and source message.
    replay_job_id: int | None = None
    replay_source_id: int | None = None
