"""When each Celery queue last had a worker take a task from it (the
dashboard's worker status, /readyz)."""

from __future__ import annotations

from django.db.models.functions import Now

from broker.models import Heartbeat


def heartbeat(*, name: str) -> None:
    Heartbeat.objects.update_or_create(name=name, defaults={"seen_at": Now()})
