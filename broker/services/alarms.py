"""Poison alarms: every message the broker quarantines or purges on its own
is logged as a WARNING, counted (``QueueMinute.poisoned``) and stored as a
``PoisonAlarm`` in the same transaction as the move, so no alarm is lost;
``broker.services.notify`` posts it to the alarm webhook afterwards."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from broker.models import NotificationState, PoisonAction, PoisonAlarm
from broker.services.counting import minute_count

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alarm:
    """A message set aside: quarantined (NDLV) or purged."""

    queue_id: int
    queue_name: str
    message_id: int
    action: str
    reason: str
    crash_count: int
    timeout_count: int
    attempts: int
    dump_path: str
    # The queue's own alarm webhook; blank: the installation's.
    queue_webhook_url: str = ""


def alarms_record(*, alarms: Sequence[Alarm]) -> None:
    """Store the alarms in the caller's transaction; once it commits, log each
    and count them per queue."""
    if not alarms:
        return
    installation_url = settings.LAZARETTO_ALARM_WEBHOOK_URL
    rows = []
    for alarm in alarms:
        url = alarm.queue_webhook_url or installation_url
        rows.append(
            PoisonAlarm(
                queue_name=alarm.queue_name,
                message_id=alarm.message_id,
                action=alarm.action,
                reason=alarm.reason,
                crash_count=alarm.crash_count,
                timeout_count=alarm.timeout_count,
                attempts=alarm.attempts,
                dump_path=alarm.dump_path,
                webhook_url=url,
                notification=NotificationState.PENDING if url else NotificationState.NONE,
                notify_next_at=Now() if url else None,
            )
        )
    PoisonAlarm.objects.bulk_create(rows)
    transaction.on_commit(lambda: _announce(alarms), robust=True)


def _announce(alarms: Sequence[Alarm]) -> None:
    for alarm in alarms:
        logger.warning(
            "poison message %s on %s %s: crash count %s, timeouts %s, dump %s (%s)",
            alarm.message_id,
            alarm.queue_name,
            "purged" if alarm.action == "purge" else "quarantined",
            alarm.crash_count,
            alarm.timeout_count,
            alarm.dump_path,
            alarm.reason,
            extra={"message_id": alarm.message_id, "queue": alarm.queue_name},
        )
    blacklisted = Counter(
        alarm.queue_id for alarm in alarms if alarm.action == PoisonAction.QUARANTINE
    )
    for queue_id, count in Counter(alarm.queue_id for alarm in alarms).items():
        minute_count(queue_id=queue_id, poisoned=count, blacklisted=blacklisted[queue_id])
