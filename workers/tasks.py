"""Celery tasks: thin wrappers that take ids and call broker services.

Redis carries only wake-ups. A lost wake-up (Redis down, a worker killed)
costs latency, never a message: ``dispatch`` finds every queue with due
messages each second and wakes it again.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import redis
from celery import Task
from django.conf import settings
from django.db import DatabaseError, transaction
from django.dispatch import receiver
from prometheus_client import Gauge

from broker.errors import StaleEpoch
from broker.ha.guard import primary_duty
from broker.metrics import DISPATCHER_LAG, SWEEPER_LAG
from broker.models import BulkJob, Queue, ReplayJob, ReplayJobStatus
from broker.pipeline.schedules import FIRE_TASK, schedule_fire
from broker.selectors import queues_with_active_rules, queues_with_due_messages
from broker.services.alarms import alarms_notify_due
from broker.services.alerts import alerts_check
from broker.services.bulk import bulk_job_run
from broker.services.counting import counters_fold
from broker.services.dead_letters import dead_letter_scan
from broker.services.delivery import Courier, queue_announce, queue_courier, task_time_limit
from broker.services.heartbeats import heartbeat
from broker.services.job_starts import JobStart, job_start_sent, jobs_to_start
from broker.services.live_statistics import live_statistics_refresh
from broker.services.sweeper import messages_sweep
from broker.services.transitions.expiry import messages_expire
from broker.signals import bulk_job_submitted, messages_available, replay_job_submitted
from workers.celery import SENT_AT_HEADER, app
from workers.pipeline import archive_launch, replay_job_launch

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _duty(name: str, epoch: int | None, run: Callable[[], T]) -> T | None:
    """Run the primary duty ``name`` under ``epoch`` (the broker node that
    sent it): a duty of a stale epoch does nothing but say so."""
    try:
        with primary_duty(epoch):
            return run()
    except StaleEpoch as stale:
        logger.warning("%s refused: %s", name, stale.detail)
        return None


# The sweep's and the dispatch's scans come every second and walk index
# entries that VACUUM may not remove while a transaction older than them
# stays open: 0.6 s each after two minutes at 8,000 messages a second, most
# of a database core between them, taken from the deliveries they serve. So
# each rests, in this process, this many times as long as its last scan took
# before it scans again, and takes at most a tenth of a control process's
# time. A quick scan (a few ms) rests less than its interval; a slow one
# finds a crashed worker's messages, or wakes a queue, that much later.
SCAN_REST_FACTOR = 9.0
_rest_until: dict[str, float] = {}


def _scan(name: str, run: Callable[[], None]) -> None:
    """``run`` the scan ``name``, unless it is resting."""
    started = time.monotonic()
    if started < _rest_until.get(name, -math.inf):
        return
    try:
        run()
    finally:
        ended = time.monotonic()
        _rest_until[name] = ended + SCAN_REST_FACTOR * (ended - started)


def wake(
    *,
    queue_id: int,
    lease_seconds: int,
    tasks: int = 1,
    expires: float = 60.0,
    successor: bool = False,
    coalesce: bool = False,
    priority: int = 0,
) -> None:
    """Ask workers to deliver from a queue, best effort; a ``successor``
    takes over the waiting for the queue's announcements from the task that
    asks for it; with ``coalesce``, no task is sent while one sent so for
    the queue has yet to start (``WAKE_PENDING_SECONDS``).

    A delivery task that outlives its time limit (a hung consumer) is killed
    with its worker process, which the sweeper counts as a crash.
    """
    options: dict[str, Any] = {"successor": successor, "coalesced": coalesce}
    try:
        if coalesce and not _wake_pending_mark(queue_id):
            return
        for _ in range(tasks):
            deliver.apply_async(
                (queue_id,),
                {name: value for name, value in options.items() if value} or None,
                time_limit=task_time_limit(lease_seconds),
                expires=expires,
                retry=False,
                priority=priority,
            )
    except Exception as error:  # Redis down: the periodic dispatch will catch up
        logger.warning("could not wake queue %s: %s", queue_id, error)


# A publish that finds no courier waiting wakes a task, unless a task woken
# so for the queue has yet to start. At 1,000 publishes a second with both
# processes delivering, a task for each publish was hundreds a second, each
# finding its messages claimed: half the publish's processor time (1 of 2
# ms) and a worker's turn each. The pending task is marked by a key in the
# broker's Redis, set as it is sent and deleted by the task as it starts,
# before it claims: a publish that finds the key committed before that
# claim, which sees its messages. The key lapses after this long, so a task
# lost with its worker or its Redis holds wake-ups back no longer than the
# dispatch would.
WAKE_PENDING_SECONDS = 1.0


def _wake_pending_key(queue_id: int) -> str:
    return f"lazaretto:wake-pending:{int(queue_id)}"


@functools.cache
def _redis_at(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)


def _broker_redis() -> redis.Redis:
    """A client of the Redis Celery sends tasks to: one a process, where a
    client from kombu's pool costs as much again as the command."""
    return _redis_at(app.conf.broker_write_url or app.conf.broker_url)


def _wake_pending_mark(queue_id: int) -> bool:
    """Mark a coalesced wake-up of the queue pending; False if one is."""
    milliseconds = round(WAKE_PENDING_SECONDS * 1000)
    return bool(_broker_redis().set(_wake_pending_key(queue_id), 1, nx=True, px=milliseconds))


def _wake_pending_clear(queue_id: int) -> None:
    """The coalesced wake-up of the queue has started: later publishes
    send their own."""
    try:
        _broker_redis().delete(_wake_pending_key(queue_id))
    except Exception as error:  # the mark lapses on its own
        logger.warning("could not clear the pending wake-up of queue %s: %s", queue_id, error)


# Redis hands a worker the tasks of priority 0 (the default: the dispatch's,
# the sweeper's, a task's successor) before those of PUBLISH_WAKE_PRIORITY.
# A publish finding no courier waiting wakes a task; at 1,000 publishes a
# second with both processes delivering, that is hundreds a second, each of
# which finds its messages claimed. The successor a task wakes when its
# time is up then waited behind them: 300-400 ms without a delivery every
# few seconds, where now it waits for at most the tasks already reserved.
PUBLISH_WAKE_PRIORITY = 9


def _fanout(waiting: int, batch_size: int, suspects: int = 0) -> int:
    """Delivery tasks for a queue: one per batch of waiting messages and one
    per suspect (each is delivered alone), at most the configured fan-out."""
    units = math.ceil(max(waiting - suspects, 0) / batch_size) + suspects
    return max(1, min(units, settings.LAZARETTO_DELIVERY_FANOUT))


@receiver(messages_available)
def wake_when_available(
    sender: Any,
    queue: Queue,
    count: int,
    announced: bool = False,
    courier_waits: bool = False,
    **kwargs: Any,
) -> None:
    """Announce the queue (unless the sender did) and, after the commit,
    wake a delivery task for each batch of the messages, unless they are one
    batch that a courier waiting for the queue's announcements will claim
    (``courier_waits``). A single task is coalesced with one still pending
    for the queue, which will find these messages."""
    if not announced:
        queue_announce(queue_id=queue.id)
    tasks = _fanout(count, queue.batch_size)
    if courier_waits and tasks == 1:
        return
    transaction.on_commit(
        lambda: wake(
            queue_id=queue.id,
            lease_seconds=queue.lease_seconds,
            tasks=tasks,
            coalesce=tasks == 1,
            priority=PUBLISH_WAKE_PRIORITY,
        ),
        robust=True,
    )


def _observe_lag(task: Task, gauge: Gauge) -> None:
    """How late this run of a scheduled task started: from its sending
    (beat's clock, stamped by workers.celery) to now."""
    sent_at = task.request.get(SENT_AT_HEADER)
    if isinstance(sent_at, int | float):
        gauge.set(max(time.time() - sent_at, 0.0))


# A task waiting on its queue that has delivered asks for its successor this
# long before its time is up; the successor waits up to HANDOVER_WAIT_SECONDS
# for its place, so no announcement falls between the two.
HANDOVER_SECONDS = 0.2
HANDOVER_WAIT_SECONDS = 1.0


class Drained(enum.Enum):
    """How ``_deliver_due`` ended."""

    NOTHING = "nothing was due"
    EMPTIED = "delivered until nothing was due"
    BUDGET_SPENT = "the budget ran out with more due: a new task was woken to go on"


@app.task(name="lazaretto.deliver", acks_late=True, ignore_result=True)
def deliver(queue_id: int, successor: bool = False, coalesced: bool = False) -> None:
    """Deliver batches (or suspects, each alone) of a queue until it has
    nothing due or the task's time budget is spent; then hand over. Having
    emptied the queue with budget left, wait for the queue to be announced
    (``broker.services.delivery``) and deliver again, until the budget is
    spent or another queue is announced. A task that finds nothing due was
    woken for messages another task delivered: it returns at once, leaving
    its process to the tasks queued behind it (of other queues, whose
    announcements it could not have heard). A ``successor`` waits for its
    predecessor's place whatever it finds. A ``coalesced`` wake-up clears
    its queue's mark before it claims anything."""
    if coalesced:
        _wake_pending_clear(queue_id)
    budget_ends = time.monotonic() + settings.LAZARETTO_DELIVERY_TASK_SECONDS
    with queue_courier(queue_id=queue_id) as courier:
        if courier is None:
            return
        drained = _deliver_due(courier, budget_ends, suspects=True)
        if drained is Drained.BUDGET_SPENT or (drained is Drained.NOTHING and not successor):
            return
        take_over = HANDOVER_WAIT_SECONDS if successor else 0.0
        with courier.listening(take_over_within=take_over) as listener:
            if listener:
                _listen(courier, budget_ends)
        if courier.due_on_leaving:
            # Some may have been published in reliance on its waiting.
            wake(queue_id=queue_id, lease_seconds=courier.queue.lease_seconds)


def _listen(courier: Courier, budget_ends: float) -> None:
    """While listening: deliver what is due, then wait for the queue's next
    announcement, until the budget is spent (a new task is then woken to go
    on), nothing is announced by the end of the budget, or another queue is
    announced, whose task may need this process. A courier that has
    delivered hands the waiting over to a successor task shortly before its
    budget ends."""
    queue = courier.queue
    delivered = handed_over = False
    # Listening from now on: look once more for what was announced before.
    # No probe for suspects on an announcement, one round trip less before
    # the claim: the sweeper wakes a task for each suspect.
    while _deliver_due(courier, budget_ends, suspects=False) is not Drained.BUDGET_SPENT:
        handover = delivered and not handed_over
        until = budget_ends - HANDOVER_SECONDS if handover else budget_ends
        announced = courier.wait_announced(until)
        if announced is None and handover:
            # Messages keep coming: a new task takes over the waiting.
            wake(queue_id=queue.id, lease_seconds=queue.lease_seconds, successor=True)
            handed_over = True
            continue
        if announced != queue.id:
            return
        delivered = True


def _deliver_due(courier: Courier, budget_ends: float, *, suspects: bool) -> Drained:
    """Deliver the queue's due units until none is left or the budget is
    spent."""
    # Within its budget, each unit's settlement also claims the next batch; a
    # batch claimed so is always delivered.
    outcome = courier.deliver(suspects=suspects, claim_next=time.monotonic() < budget_ends)
    if not outcome.claimed:
        return Drained.NOTHING
    while outcome.claimed:
        if time.monotonic() >= budget_ends and not courier.claimed_next:
            wake(queue_id=courier.queue.id, lease_seconds=outcome.lease_seconds)
            return Drained.BUDGET_SPENT
        # Suspects are probed for only while they keep turning up: with no
        # crash, one probe per task is all they cost.
        outcome = courier.deliver(
            suspects=outcome.isolated, claim_next=time.monotonic() < budget_ends
        )
    return Drained.EMPTIED


@app.task(name="lazaretto.sweep", ignore_result=True)
def sweep(epoch: int | None = None) -> None:
    """Requeue unanswered deliveries as suspects, set aside the poison, and
    wake a delivery task per suspect so they are isolated in parallel."""
    _observe_lag(sweep, SWEEPER_LAG)
    _duty("sweep", epoch, _sweep)


def _sweep() -> None:
    heartbeat(name="control")
    try:
        counters_fold()
    except DatabaseError:  # the counters stay exact unfolded: sweep on
        logger.exception("sweep: could not fold the counters' changes")
    live_statistics_refresh()
    _scan("sweep", _sweep_messages)


def _sweep_messages() -> None:
    expired = messages_expire()
    if expired:
        logger.info("sweep: %s expired message(s) moved to dead-letter queues", len(expired))
    result = messages_sweep()
    if not result.found:
        return
    logger.info(
        "sweep: %s unanswered message(s) back to TBDL as suspects, %s quarantined, %s purged",
        len(result.requeued),
        len(result.quarantined),
        len(result.purged),
    )
    lease_seconds = dict(
        Queue.objects.filter(id__in=result.suspects_by_queue).values_list("id", "lease_seconds")
    )
    for queue_id, suspects in result.suspects_by_queue.items():
        if queue_id in lease_seconds:
            # A task waiting on another queue gives its process up to these.
            queue_announce(queue_id=queue_id)
            wake(
                queue_id=queue_id,
                lease_seconds=lease_seconds[queue_id],
                tasks=_fanout(suspects, 1, suspects),
            )
    if result.quarantined or result.purged:
        _send_notify_alarms()


def _send_notify_alarms() -> None:
    try:
        notify_alarms.apply_async(expires=30.0, retry=False)
    except Exception as error:  # Redis down: beat asks again every few seconds
        logger.warning("could not ask for the alarms to be posted: %s", error)


# A run finishes the post under way when its budget ends, so it can last this
# plus LAZARETTO_ALARM_WEBHOOK_TIMEOUT_SECONDS.
NOTIFY_TASK_BUDGET_SECONDS = 3.0


@app.task(name="lazaretto.notify_alarms", ignore_result=True)
def notify_alarms(epoch: int | None = None) -> None:
    """Post due poison alarms and alerts to their webhooks (one runner at a
    time; a second one returns at once)."""
    _duty("notify_alarms", epoch, _notify_alarms)


def _notify_alarms() -> None:
    result = alarms_notify_due(budget_seconds=NOTIFY_TASK_BUDGET_SECONDS)
    if result.posted:
        logger.info(
            "alarms: %s sent, %s to retry, %s given up",
            len(result.sent),
            len(result.retrying),
            len(result.failed),
        )


@app.task(name="lazaretto.check_alerts", ignore_result=True)
def check_alerts(epoch: int | None = None) -> None:
    """Open and end the episodes of queues past their alert thresholds; have
    their webhook posts made at once."""
    _duty("check_alerts", epoch, _check_alerts)


def _check_alerts() -> None:
    result = alerts_check()
    if result.notify:
        _send_notify_alarms()


@app.task(name="lazaretto.dispatch", ignore_result=True)
def dispatch(epoch: int | None = None) -> None:
    """Wake every queue that has due messages (new, delayed or retried)."""
    _observe_lag(dispatch, DISPATCHER_LAG)
    _duty("dispatch", epoch, _dispatch)


def _dispatch() -> None:
    _scan("dispatch", _dispatch_due)


def _dispatch_due() -> None:
    interval = settings.LAZARETTO_DISPATCH_INTERVAL_SECONDS
    for due in queues_with_due_messages():
        wake(
            queue_id=due.queue_id,
            lease_seconds=due.lease_seconds,
            tasks=_fanout(due.waiting, due.batch_size, due.suspects),
            expires=2 * interval,
        )


@app.task(name="lazaretto.dead_letter_scan", ignore_result=True)
def dead_letter_scan_all(epoch: int | None = None) -> None:
    """Process every dead-letter queue that has an active rules table."""
    _duty("dead_letter_scan", epoch, _dead_letter_scan_all)


def _dead_letter_scan_all() -> None:
    for queue in queues_with_active_rules():
        result = dead_letter_scan(queue=queue)
        if result.acted or result.failed:
            logger.info(
                "%s: retried %s, forwarded %s, discarded %s, failed %s",
                queue.name,
                result.retried,
                result.forwarded,
                result.discarded,
                result.failed,
            )


def _send_start(start: JobStart) -> bool:
    """Send the task that starts a job; whether Redis took it."""
    task = bulk_job if start.kind == "bulk" else replay_job
    try:
        task.apply_async((start.job_id,), retry=False)
    except Exception as error:  # Redis down: the start-jobs duty sends it again
        logger.warning("could not start %s job %s: %s", start.kind, start.job_id, error)
        return False
    job_start_sent(kind=start.kind, job_id=start.job_id)
    return True


@receiver(bulk_job_submitted)
def run_after_submit(sender: Any, job: BulkJob, **kwargs: Any) -> None:
    transaction.on_commit(partial(_send_start, JobStart("bulk", job.id)), robust=True)


@app.task(name="lazaretto.bulk_job", acks_late=True, ignore_result=True)
def bulk_job(job_id: int) -> None:
    """Run a bulk triage job (idempotent: a rerun takes up what is left)."""
    bulk_job_run(job_id=job_id)


@receiver(replay_job_submitted)
def launch_after_submit(sender: Any, job: ReplayJob, **kwargs: Any) -> None:
    transaction.on_commit(partial(_send_start, JobStart("replay", job.id)), robust=True)


@app.task(name="lazaretto.replay_job", ignore_result=True)
def replay_job(job_id: int) -> None:
    """Run a replay job's Spark driver to its end (on the pipeline queue)."""
    if not ReplayJob.objects.filter(id=job_id, status=ReplayJobStatus.QUEUED).exists():
        # Its start arrived twice (broker.services.job_starts), or a cancel came first.
        logger.info("replay job %s is not queued: nothing to launch", job_id)
        return
    job = replay_job_launch(job_id)
    logger.info("replay job %s %s: %s written", job.id, job.status, job.written)


@app.task(name=FIRE_TASK, ignore_result=True)
def replay_schedule_fire(schedule_id: int) -> None:
    """Beat's firing of a replay schedule (broker.pipeline.schedules): its
    replay job, or a skipped firing while the previous one runs."""
    firing = schedule_fire(schedule_id=schedule_id)
    if firing is not None and firing.job_id is not None:
        logger.info("replay schedule %s fired: job %s", schedule_id, firing.job_id)


@app.task(name="lazaretto.start_jobs", ignore_result=True)
def start_jobs(epoch: int | None = None) -> None:
    """Send again the start of every queued job whose start Redis refused or
    may have lost."""
    _duty("start_jobs", epoch, _start_jobs)


def _start_jobs() -> None:
    resend_after = settings.LAZARETTO_JOB_RESEND_SECONDS
    for start in jobs_to_start(resend_after_seconds=resend_after):
        if _send_start(start):
            logger.info("%s job %s: start sent again", start.kind, start.job_id)


@app.task(name="lazaretto.archive", ignore_result=True)
def archive(epoch: int | None = None) -> None:
    """Move delivered and failed messages past retention to the archive."""
    status = _duty("archive", epoch, archive_launch)
    if status:
        logger.warning("the archive's Spark driver exited with status %s", status)


@app.task(name="lazaretto.heartbeat", ignore_result=True)
def delivery_heartbeat(epoch: int | None = None) -> None:
    """Scheduled on the deliveries queue: proves a delivery worker is taking tasks."""
    _duty("heartbeat", epoch, lambda: heartbeat(name="deliveries"))
