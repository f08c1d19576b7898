"""Replay jobs in tests: moved on as their Spark driver would report them,
launched in the background, and the copies they made."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from django.db import connections

from broker.models import Message, ReplayJob
from workers.pipeline import replay_job_launch


def reported(job_id: int, status: str, counts: tuple[int, ...], **fields: Any) -> None:
    """Job ``job_id`` in ``status`` with ``counts``: total, read, matched,
    written, skipped and failed, the ones left out staying 0; ``fields`` sets
    any other field (per_target, per_rule, spark_app_id, error, …)."""
    names = ("total", "read", "matched", "written", "skipped", "failed")
    ReplayJob.objects.filter(id=job_id).update(
        status=status, **dict(zip(names, counts, strict=False)), **fields
    )


def copies_per_source(job: ReplayJob) -> Counter[int | None]:
    """How many copies job ``job`` made of each source message."""
    return Counter(
        Message.objects.filter(replay_job_id=job.id).values_list("replay_source_id", flat=True)
    )


def launched_in_background(job: ReplayJob) -> tuple[threading.Thread, dict[str, ReplayJob]]:
    """Launch ``job``'s driver from a thread; ``ended["job"]`` is the job as
    it ended, once the thread is joined."""
    ended: dict[str, ReplayJob] = {}

    def launch() -> None:
        try:
            ended["job"] = replay_job_launch(job.id)
        finally:
            connections.close_all()

    thread = threading.Thread(target=launch)
    thread.start()
    return thread, ended
