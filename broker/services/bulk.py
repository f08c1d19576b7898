"""Bulk triage: release, fail or purge every blacklisted message of a
selection or a filter, in the background, with progress."""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from broker.errors import InvalidInput
from broker.models import BulkJob, BulkJobStatus, Message, MessageState
from broker.selectors import MessageFilter, filtered_messages
from broker.services.audit import Actor, audit_record
from broker.services.locks import session_lock
from broker.services.transitions.blacklist import TRIAGE, TRIAGE_ACTIONS
from broker.signals import bulk_job_submitted

logger = logging.getLogger(__name__)

CHUNK = 500
MAX_SELECTED = 10_000
# With a job's id, the key of the advisory lock its run holds (the two-key
# form, as broker.services.delivery's: no other lock's key can equal it).
RUN_LOCK_CLASS = 0x4C5D


def _matching(filters: dict[str, Any]) -> QuerySet[Message]:
    """The blacklisted messages a job's stored filters name."""
    if "ids" in filters:
        return Message.objects.filter(id__in=filters["ids"], state=MessageState.NOT_DELIVERABLE)
    values: dict[str, Any] = {
        key: datetime.fromisoformat(value) if key in {"since", "until"} else value
        for key, value in filters.items()
    }
    values["state"] = MessageState.NOT_DELIVERABLE.value
    return filtered_messages(MessageFilter(**values))


def bulk_preview(*, filters: MessageFilter) -> int:
    """How many blacklisted messages match (index message_blacklist_idx)."""
    return _matching(_stored(filters)).count()


def _stored(filters: MessageFilter) -> dict[str, Any]:
    return {
        key: value.isoformat() if isinstance(value, datetime) else value
        for key, value in asdict(filters).items()
        if value and key != "state"
    }


@transaction.atomic
def bulk_job_submit(
    *,
    action: str,
    actor: Actor,
    filters: MessageFilter | None = None,
    message_ids: list[int] | None = None,
    reason: str = "",
) -> BulkJob:
    """Queue a job over a filter or an explicit selection; workers run it."""
    if action not in TRIAGE_ACTIONS:
        raise InvalidInput(
            f"Unknown action {action!r}.",
            field_errors={"action": ["Choose release, fail or purge."]},
        )
    if message_ids is not None:
        if not message_ids or len(message_ids) > MAX_SELECTED:
            problem = f"Select from 1 to {MAX_SELECTED:,} messages."
            raise InvalidInput(problem, field_errors={"ids": [problem]})
        stored: dict[str, Any] = {"ids": sorted(set(message_ids))}
    else:
        stored = _stored(filters or MessageFilter())
    job = BulkJob.objects.create(
        action=action,
        filters=stored,
        reason=reason[:500],
        total=_matching(stored).count(),
        created_by=actor if actor is not None and actor.is_authenticated else None,
    )
    audit_record(
        action="bulk_job_submit",
        actor=actor,
        reason=reason,
        details={"job": job.id, "action": action, "filters": stored, "total": job.total},
    )
    bulk_job_submitted.send(sender=BulkJob, job=job)
    return job


def bulk_job_run(*, job_id: int) -> BulkJob:
    """Work through a job in chunks of CHUNK messages, one transaction each,
    counting progress. Safe to run again: it takes up what is still
    blacklisted. A run that finds another one under way (its start sent
    twice, see broker.services.job_starts) leaves the job to it."""
    with session_lock(RUN_LOCK_CLASS, job_id) as alone:
        if not alone:
            logger.info("bulk job %s: already running in another process", job_id)
            return BulkJob.objects.get(id=job_id)
        return _run(BulkJob.objects.get(id=job_id))


def _run(job: BulkJob) -> BulkJob:
    if job.status == BulkJobStatus.DONE:
        return job
    BulkJob.objects.filter(id=job.id).update(status=BulkJobStatus.RUNNING)
    actor = job.created_by
    after = 0
    try:
        while True:
            ids = list(
                _matching(job.filters)
                .filter(id__gt=after)
                .order_by("id")
                .values_list("id", flat=True)[:CHUNK]
            )
            if not ids:
                break
            after = ids[-1]
            acted = TRIAGE[job.action](message_ids=ids, actor=actor, reason=job.reason)
            job.done += len(acted)
            BulkJob.objects.filter(id=job.id).update(done=job.done)
    except Exception as error:
        logger.exception("bulk job %s failed", job.id)
        BulkJob.objects.filter(id=job.id).update(
            status=BulkJobStatus.FAILED, error=str(error)[:2000], finished_at=timezone.now()
        )
        raise
    BulkJob.objects.filter(id=job.id).update(status=BulkJobStatus.DONE, finished_at=timezone.now())
    job.refresh_from_db()
    return job
