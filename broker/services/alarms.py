"""Poison alarms, from the move to the webhook, and the posting of every
notice to an alarm webhook: poison alarms and threshold alerts
(``broker.services.alerts``).

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

An alert episode (``QueueAlert``) posts twice, firing then resolved: its
``notify_event`` names the post due, and the outcome of the firing's post
moves it on to the resolution when the episode has ended meanwhile, so a
receiver never hears of the end before the start.

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
from django.db.models import Case, Q, QuerySet, Value, When
from django.db.models.functions import Now

from broker.consumers import signature_headers
from broker.models import (
    AlertEvent,
    NotificationState,
    PoisonAction,
    PoisonAlarm,
    QueueAlert,
    WebhookNotice,
)
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
# httpx applies its timeout to connecting, writing and reading in turn; the
# lease covers all three plus this margin.
NOTIFY_LEASE_MARGIN_SECONDS = 10.0
NOTIFY_ERROR_MAX_CHARS = 500


# What the runner posts: poison alarms and alert episodes, taken in turn so
# a flood of one kind does not hold the other back.
NoticeModel = type[PoisonAlarm] | type[QueueAlert]
NOTICE_MODELS: tuple[NoticeModel, ...] = (PoisonAlarm, QueueAlert)


def notice_key(notice: WebhookNotice) -> str:
    """``alarm <id>`` or ``alert <id>``: a notice's name in results and logs."""
    return f"{'alert' if isinstance(notice, QueueAlert) else 'alarm'} {notice.pk}"


@dataclass
class NotifyResult:
    """What one run did: the notices (``notice_key``) posted, to be retried,
    and given up on; ``busy`` when another runner held the lock and this one
    did nothing."""

    sent: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    busy: bool = False

    @property
    def posted(self) -> int:
        return len(self.sent) + len(self.retrying) + len(self.failed)


def alarms_notify_due(*, budget_seconds: float = 5.0) -> NotifyResult:
    """Post due notices (poison alarms, alert episodes) one at a time until
    none is due or the budget is spent (a post already under way is
    finished). Each outcome is recorded: pending -> sent on a 2xx answer;
    anything else counts an attempt and schedules the next after
    ``min(2**attempts, LAZARETTO_ALARM_RETRY_MAX_SECONDS)`` s, and after
    ``LAZARETTO_ALARM_NOTIFY_ATTEMPTS`` attempts pending -> failed. No
    transaction may stay open while a webhook is called: called inside one
    with a notice due, it raises RuntimeError."""
    if not any(_due(model).exists() for model in NOTICE_MODELS):  # the common run
        return NotifyResult()
    with session_lock(NOTIFY_LOCK_KEY) as alone:
        if not alone:
            return NotifyResult(busy=True)
        result = NotifyResult()
        timeout = settings.LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS
        lease_seconds = 3 * timeout + NOTIFY_LEASE_MARGIN_SECONDS
        budget_ends = time.monotonic() + budget_seconds
        turn = list(NOTICE_MODELS)
        notice = _claim_next(turn, lease_seconds=lease_seconds)
        if notice is None:
            # No client made: its TLS context takes tens of milliseconds of
            # CPU, which every run would take from the deliveries.
            return result
        with outbound_client(timeout=timeout) as client:
            while notice is not None:
                _record(notice, _post(client, notice), result)
                if time.monotonic() >= budget_ends:
                    break
                notice = _claim_next(turn, lease_seconds=lease_seconds)
    return result


def _due(model: type[WebhookNotice]) -> QuerySet[WebhookNotice]:
    """Notices waiting for their next post, due now (alarm_pending_idx,
    alert_pending_idx)."""
    return model._default_manager.filter(
        notification=NotificationState.PENDING, notify_next_at__lte=Now()
    )


def _claim_next(turn: list[NoticeModel], *, lease_seconds: float) -> WebhookNotice | None:
    """The due notice of the next kind in ``turn`` that has one (which then
    goes last), leased."""
    for _ in range(len(turn)):
        model = turn.pop(0)
        turn.append(model)
        notice = _claim_due(model, lease_seconds=lease_seconds)
        if notice is not None:
            return notice
    return None


def _claim_due(model: type[WebhookNotice], *, lease_seconds: float) -> WebhookNotice | None:
    """Take the notice due longest, and lease it by moving its next try past
    the post's longest possible duration. Durable: the lease must be
    committed before the webhook is called. SKIP LOCKED so a notice whose
    outcome is being recorded is not waited for."""
    with transaction.atomic(durable=True):
        notice = (
            _due(model).select_for_update(skip_locked=True).order_by("notify_next_at", "id").first()
        )
        if notice is not None:
            model._default_manager.filter(pk=notice.pk).update(
                notify_next_at=Now() + timedelta(seconds=lease_seconds)
            )
    return notice


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


def alert_body(episode: QueueAlert) -> dict[str, object]:
    """The JSON document posted for an alert episode's ``notify_event``:
    ``status`` firing, or resolved with its end."""
    from broker.services.alerts import alert_summary

    resolved = episode.notify_event == AlertEvent.RESOLVED
    value = episode.end_value if resolved else episode.value
    return {
        "event": "queue_alert",
        "status": episode.notify_event,
        "alert_id": episode.id,
        "queue": episode.queue.name,
        "condition": episode.condition,
        "threshold": episode.threshold,
        "value": value,
        "peak": episode.peak,
        "summary": alert_summary(
            queue_name=episode.queue.name,
            condition=episode.condition,
            value=value,
            threshold=episode.threshold,
            resolved=resolved,
        ),
        "started_at": episode.started_at.isoformat(),
        "ended_at": episode.ended_at.isoformat() if resolved and episode.ended_at else None,
        "instance": settings.LAZARETTO_INSTANCE_NAME,
    }


def _post(client: httpx.Client, notice: WebhookNotice) -> str:
    """POST the notice, signed with LAZARETTO_ALARM_WEBHOOK_SECRET if set; an
    empty string on a 2xx answer, else why not."""
    import httpx  # imported by the first alarm posted (broker.outbound)

    headers = {"Content-Type": "application/json"}
    if isinstance(notice, QueueAlert):
        document = alert_body(notice)
        headers.update(
            {"Lazaretto-Alert-Id": str(notice.id), "Lazaretto-Alert-Status": notice.notify_event}
        )
    else:
        assert isinstance(notice, PoisonAlarm)
        document = alarm_body(notice)
        headers["Lazaretto-Alarm-Id"] = str(notice.id)
    body = json.dumps(document).encode()
    if secret := settings.LAZARETTO_ALARM_WEBHOOK_SECRET:
        headers.update(signature_headers(secret=secret, body=body))
    try:
        response = client.post(notice.webhook_url, content=body, headers=headers)
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


# An alert episode whose firing is posted (or given up on) once it has ended
# goes on to its resolution, at once and with fresh attempts.
_ENDED = Q(ended_at__isnull=False)


def _done(notice: WebhookNotice, state: str, attempts: int) -> dict[str, object]:
    """The columns that close a notice's current post: ``state`` sent or
    failed after ``attempts``; an alert episode whose firing it was and which
    has ended meanwhile goes on to post its resolution instead, at once and
    with attempts of its own."""
    if not isinstance(notice, QueueAlert):
        return {"notification": state, "notify_next_at": None, "notify_attempts": attempts}
    if notice.notify_event == AlertEvent.RESOLVED:
        return {
            "notification": state,
            "notify_next_at": None,
            "notify_attempts": attempts,
            "notify_event": "",
        }
    return {
        "notification": Case(
            When(_ENDED, then=Value(NotificationState.PENDING)), default=Value(state)
        ),
        "notify_event": Case(When(_ENDED, then=Value(AlertEvent.RESOLVED)), default=Value("")),
        "notify_next_at": Case(When(_ENDED, then=Now()), default=None),
        "notify_attempts": Case(When(_ENDED, then=Value(0)), default=Value(attempts)),
    }


def _record(notice: WebhookNotice, error: str, result: NotifyResult) -> None:
    """pending -> sent, or one more failed attempt (pending, or failed once
    they are used up). Guarded by the attempts (and an episode's event) read
    at the claim, so an outcome is recorded once."""
    key = notice_key(notice)
    claim = Q(notification=NotificationState.PENDING, notify_attempts=notice.notify_attempts)
    if isinstance(notice, QueueAlert):
        claim &= Q(notify_event=notice.notify_event)
    still_claimed = type(notice)._default_manager.filter(claim, pk=notice.pk)
    if not error:
        still_claimed.update(
            **_done(notice, NotificationState.SENT, notice.notify_attempts),
            notified_at=Now(),
            notify_error="",
        )
        result.sent.append(key)
        return
    attempts = notice.notify_attempts + 1
    if attempts >= settings.LAZARETTO_ALARM_NOTIFY_ATTEMPTS:
        still_claimed.update(
            **_done(notice, NotificationState.FAILED, attempts), notify_error=error
        )
        result.failed.append(key)
        logger.warning(
            "%s (%s): gave up posting it to its webhook after %s attempts: %s",
            key,
            _about(notice),
            attempts,
            error,
        )
        return
    delay = min(2**attempts, settings.LAZARETTO_ALARM_RETRY_MAX_SECONDS)
    still_claimed.update(
        notify_attempts=attempts,
        notify_error=error,
        notify_next_at=Now() + timedelta(seconds=delay),
    )
    result.retrying.append(key)
    logger.info(
        "%s: posting it to its webhook failed (attempt %s, next in %s s): %s",
        key,
        attempts,
        delay,
        error,
    )


def _about(notice: WebhookNotice) -> str:
    if isinstance(notice, QueueAlert):
        return f"{notice.notify_event} {notice.condition} on {notice.queue.name}"
    assert isinstance(notice, PoisonAlarm)
    return f"message {notice.message_id} on {notice.queue_name}"
