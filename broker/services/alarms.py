"""Poison alarms, from the move to the webhook.

Every message the broker quarantines or purges on its own is logged as a
WARNING, counted (``QueueMinute.poisoned``) and stored as a ``PoisonAlarm``
in the same transaction as the move, so no alarm is lost
(``alarms_record``). The control worker then posts each to its webhook, with
retries (``alarms_notify_due``).

No transaction is open while a webhook is called: an alarm is claimed in a
short transaction that pushes its ``notify_next_at`` past the HTTP timeout (a
lease: if the runner dies mid-post, the alarm is due again once the lease runs
out), posted, and its outcome recorded with a conditional update. A slow or
dead webhook therefore holds no lock that delivery or the sweeper could wait
on, and no message is ever touched by the posting.

One runner at a time: each run takes a session-level advisory lock and returns
at once when another runner holds it, so a control worker with two processes
keeps one free for sweeps and dispatches while the other waits on a webhook.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from broker.consumers import signature_headers
from broker.models import NotificationState, PoisonAction, PoisonAlarm
from broker.outbound import DestinationRefused, outbound_client
from broker.services.counting import minute_count
from broker.services.locks import session_lock

if TYPE_CHECKING:
    import httpx

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


# --- posting them ------------------------------------------------------------

# The advisory-lock key of the notification runner. Negative, so it can never
# equal a delivery lease's lock, whose keys are positive
# (broker.services.delivery._lease).
NOTIFY_LOCK_KEY = -0x4C5A_414C_524D  # "LZALRM"
# Backoff between attempts: 2, 4, 8, … seconds, at most this long.
NOTIFY_BACKOFF_MAX_SECONDS = 300
# httpx applies its timeout to connecting, writing and reading in turn; the
# lease covers all three plus this margin.
NOTIFY_LEASE_MARGIN_SECONDS = 10.0
NOTIFY_ERROR_MAX_CHARS = 500


@dataclass
class NotifyResult:
    """What one run did: alarm ids sent, to be retried, and given up on;
    ``busy`` when another runner held the lock and this one did nothing."""

    sent: list[int] = field(default_factory=list)
    retrying: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    busy: bool = False

    @property
    def posted(self) -> int:
        return len(self.sent) + len(self.retrying) + len(self.failed)


def alarms_notify_due(*, budget_seconds: float = 5.0) -> NotifyResult:
    """Post due pending alarms one at a time until none is due or the budget
    is spent (a post already under way is finished). Each outcome is recorded:
    pending -> sent on a 2xx answer; anything else counts an attempt and
    schedules the next after ``min(2**attempts, 300)`` s, and after
    ``LAZARETTO_ALARM_NOTIFY_ATTEMPTS`` attempts pending -> failed. No
    transaction may stay open while a webhook is called: called inside one
    with an alarm due, it raises RuntimeError."""
    if not _due().exists():  # the common run: one statement
        return NotifyResult()
    with session_lock(NOTIFY_LOCK_KEY) as alone:
        if not alone:
            return NotifyResult(busy=True)
        result = NotifyResult()
        timeout = settings.LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS
        lease_seconds = 3 * timeout + NOTIFY_LEASE_MARGIN_SECONDS
        budget_ends = time.monotonic() + budget_seconds
        alarm = _claim_due(lease_seconds=lease_seconds)
        if alarm is None:
            # No client made: its TLS context takes tens of milliseconds of
            # CPU, which every run would take from the deliveries.
            return result
        with outbound_client(timeout=timeout) as client:
            while alarm is not None:
                _record(alarm, _post(client, alarm), result)
                if time.monotonic() >= budget_ends:
                    break
                alarm = _claim_due(lease_seconds=lease_seconds)
    return result


def _due() -> QuerySet[PoisonAlarm]:
    """Alarms waiting for their next post, due now (alarm_pending_idx)."""
    return PoisonAlarm.objects.filter(
        notification=NotificationState.PENDING, notify_next_at__lte=Now()
    )


def _claim_due(*, lease_seconds: float) -> PoisonAlarm | None:
    """Take the alarm due longest, and lease it by moving its next try past
    the post's longest possible duration. Durable: the lease must be
    committed before the webhook is called. Uses alarm_pending_idx; SKIP
    LOCKED so an alarm whose outcome is being recorded is not waited for."""
    with transaction.atomic(durable=True):
        alarm = _due().select_for_update(skip_locked=True).order_by("notify_next_at", "id").first()
        if alarm is not None:
            PoisonAlarm.objects.filter(id=alarm.id).update(
                notify_next_at=Now() + timedelta(seconds=lease_seconds)
            )
    return alarm


def alarm_body(alarm: PoisonAlarm) -> dict[str, object]:
    """The JSON document posted for an alarm."""
    return {
        "event": "poison_message",
        "action": alarm.action,
        "queue": alarm.queue_name,
        "message_id": alarm.message_id,
        "reason": alarm.reason,
        "crash_count": alarm.crash_count,
        "timeout_count": alarm.timeout_count,
        "attempts": alarm.attempts,
        "dump_path": alarm.dump_path,
        "time": alarm.created_at.isoformat(),
        "instance": settings.LAZARETTO_INSTANCE_NAME,
    }


def _post(client: httpx.Client, alarm: PoisonAlarm) -> str:
    """POST the alarm, signed with LAZARETTO_ALARM_WEBHOOK_SECRET if set; an
    empty string on a 2xx answer, else why not."""
    import httpx  # imported by the first alarm posted (broker.outbound)

    body = json.dumps(alarm_body(alarm)).encode()
    headers = {"Content-Type": "application/json", "Lazaretto-Alarm-Id": str(alarm.id)}
    if secret := settings.LAZARETTO_ALARM_WEBHOOK_SECRET:
        headers.update(signature_headers(secret=secret, body=body))
    try:
        response = client.post(alarm.webhook_url, content=body, headers=headers)
    except DestinationRefused as refused:
        return f"not an allowed destination: {refused}"[:NOTIFY_ERROR_MAX_CHARS]
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        # The error's class, not the socket's text (viewers read it).
        return f"no answer ({type(error).__name__})"[:NOTIFY_ERROR_MAX_CHARS]
    if response.is_success:
        return ""
    if response.is_redirect:
        return f"HTTP {response.status_code} (redirects are not followed)"
    return f"HTTP {response.status_code}"


def _record(alarm: PoisonAlarm, error: str, result: NotifyResult) -> None:
    """pending -> sent, or one more failed attempt (pending, or failed once
    they are used up). Guarded by the attempts read at the claim, so an
    outcome is recorded once."""
    still_claimed = PoisonAlarm.objects.filter(
        id=alarm.id, notification=NotificationState.PENDING, notify_attempts=alarm.notify_attempts
    )
    if not error:
        still_claimed.update(
            notification=NotificationState.SENT,
            notified_at=Now(),
            notify_next_at=None,
            notify_error="",
        )
        result.sent.append(alarm.id)
        return
    attempts = alarm.notify_attempts + 1
    if attempts >= settings.LAZARETTO_ALARM_NOTIFY_ATTEMPTS:
        still_claimed.update(
            notification=NotificationState.FAILED,
            notify_attempts=attempts,
            notify_error=error,
            notify_next_at=None,
        )
        result.failed.append(alarm.id)
        logger.warning(
            "alarm %s (message %s on %s): gave up posting it to its webhook after %s attempts: %s",
            alarm.id,
            alarm.message_id,
            alarm.queue_name,
            attempts,
            error,
        )
        return
    delay = min(2**attempts, NOTIFY_BACKOFF_MAX_SECONDS)
    still_claimed.update(
        notify_attempts=attempts,
        notify_error=error,
        notify_next_at=Now() + timedelta(seconds=delay),
    )
    result.retrying.append(alarm.id)
    logger.info(
        "alarm %s: posting it to its webhook failed (attempt %s, next in %s s): %s",
        alarm.id,
        attempts,
        delay,
        error,
    )
