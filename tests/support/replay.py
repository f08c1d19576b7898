"""A replay job moved on as its Spark driver would report it."""

from __future__ import annotations

from typing import Any

from broker.models import ReplayJob


def reported(job_id: int, status: str, counts: tuple[int, ...], **fields: Any) -> None:
    """Job ``job_id`` in ``status`` with ``counts``: total, read, matched,
    written, skipped and failed, the ones left out staying 0; ``fields`` sets
    any other field (per_target, per_rule, spark_app_id, error, …)."""
    names = ("total", "read", "matched", "written", "skipped", "failed")
    ReplayJob.objects.filter(id=job_id).update(
        status=status, **dict(zip(names, counts, strict=False)), **fields
    )
