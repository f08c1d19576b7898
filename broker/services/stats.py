"""Small operational records: per-minute delivery counts and heartbeats."""

from __future__ import annotations

from django.db import connection
from django.db.models.functions import Now

from broker.models import Heartbeat

# One row per queue and minute; concurrent batches add to it. Run outside
# the batch's transaction so the row is locked for one statement only.
_COUNT_SQL = """
INSERT INTO broker_queueminute (queue_id, minute, delivered, failed, poisoned)
VALUES (%(queue_id)s, date_trunc('minute', now()), %(delivered)s, %(failed)s, %(poisoned)s)
ON CONFLICT (queue_id, minute) DO UPDATE
SET delivered = broker_queueminute.delivered + EXCLUDED.delivered,
    failed = broker_queueminute.failed + EXCLUDED.failed,
    poisoned = broker_queueminute.poisoned + EXCLUDED.poisoned
"""


def minute_count(*, queue_id: int, delivered: int, failed: int, poisoned: int = 0) -> None:
    """Add a batch's outcome to its queue's current minute; ``poisoned``
    counts messages set aside as poison (a part of ``failed``)."""
    if delivered or failed or poisoned:
        with connection.cursor() as cursor:
            cursor.execute(
                _COUNT_SQL,
                {
                    "queue_id": queue_id,
                    "delivered": delivered,
                    "failed": failed,
                    "poisoned": poisoned,
                },
            )


def heartbeat(*, name: str) -> None:
    Heartbeat.objects.update_or_create(name=name, defaults={"seen_at": Now()})
