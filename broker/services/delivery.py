"""Delivery: claim a batch, hand each message to the queue's consumer, settle.

A courier delivers one unit of work for one queue at a time:

* a crash suspect, alone, if one is due: a message that was in flight when
  its worker died (or its lease ran out) is never delivered in a batch
  again; or
* otherwise a batch of up to ``batch_size`` due messages.

The lease. Before claiming, the worker takes a session-level advisory lock
keyed by a random token that is part of the lease owner it writes into the
claimed rows. PostgreSQL releases that lock when the worker's session ends,
however the process died, so the sweeper can tell a dead delivery from a slow
one without any transaction staying open during delivery. The claim and the
settlement are short transactions, each a single statement (no BEGIN or
COMMIT round trip) when the consumer acknowledged the whole batch; the
settlement also adds the batch to the per-minute counts and, when the
courier goes on delivering (``claim_next``), claims the next batch: one
commit per batch.

Why suspects may go in parallel. A courier's units follow one another, so a
lease has at most one unit in flight, and a process that dies takes down only
its own lease. When a process dies while it delivers one suspect alone, that
suspect is the only message the crash can be blamed on, whatever the other
processes deliver meanwhile. So every worker process may deliver a suspect
of the same queue at once: the innocent batch-mates of a poison message are
cleared in parallel, and the poison crashes only the process it is given to.
A suspect that fails again waits before its next try (the evidence-based
back-off, ``broker.services.transitions.in_flight``); nothing else waits.

Waiting for the next message. Every transaction that makes messages due
announces their queue when it commits (``queue_announce``: a NOTIFY on
``WAKE_CHANNEL``). A courier that finds its queue empty may wait for that
announcement for the rest of its task's time (``Courier.listening``,
``Courier.wait_announced``), as an SQS receive waits for a message, so a
message published meanwhile is claimed at once rather than after a wake-up
task has gone through Redis and a worker. One courier a queue waits (an
advisory lock), and it gives its process up as soon as another queue is
announced, whose delivery task may be waiting for a process.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from structlog.contextvars import bind_contextvars, bound_contextvars, reset_contextvars

from broker.consumers import Delivery, FormatError, Handler, WebhookOptions, consumer_for
from broker.metrics import delivery_latency_observe
from broker.models import MessageState, Queue, QueueKind
from broker.services.counting import minute_count
from broker.services.transitions.in_flight import (
    Claimed,
    DeadLetterCause,
    Retry,
    messages_ack,
    messages_ack_and_claim,
    messages_claim,
    messages_dead_letter,
    messages_retry,
)

logger = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 300.0
# A courier's claims read on from where the last batch of its queue ended
# (``in_flight._RESUMED_DUE``), and from the queue's head every
# HEAD_CLAIM_SECONDS, or, when a claim from the head took long,
# HEAD_CLAIM_COST_FACTOR times as long as it took. The head is slow to read
# while a transaction older than the messages delivered since stays open:
# VACUUM may remove none of their index entries, and the claim walks them
# all (0.6 s after two minutes at 8,000 messages a second). A message of
# higher priority published behind the point, or a retry that fell due
# there, waits that long.
HEAD_CLAIM_SECONDS = 1.0
HEAD_CLAIM_COST_FACTOR = 10.0
# Announcements of queues with messages due: the payload is the queue's id.
WAKE_CHANNEL = "lazaretto_wake"
# With a queue's id, the key of the advisory lock its waiting courier holds
# (the two-key form: no delivery lease's key can equal it).
LISTENER_LOCK_CLASS = 0x4C5A  # "LZ"
# With a queue's id, the key of the lock a publish that relies on a waiting
# courier holds, shared, until it commits (see the module's docstring).
RELIANCE_LOCK_CLASS = 0x4C5B
# How long a courier that stops waiting waits for the publishes that relied
# on it to commit; past it, it has a task woken for its queue all the same.
RELIANCE_WAIT_SECONDS = 2.0


def waiting_sql(queue_id: int) -> str:
    """The statement a courier runs last before it waits for the queue's
    announcements: while its session is idle after it, the courier waits."""
    return f"SELECT 'lazaretto: a courier waits for queue {int(queue_id)}'"


@dataclass
class Head:
    """Where a queue's claims read on from, as this process's couriers of
    the queue hand it on: where the last batch claimed ended (priority, id),
    when the last claim from the queue's head was made and how long it
    took."""

    resume_after: tuple[int, int] | None = None
    claimed_at: float = -math.inf
    seconds: float = 0.0

    def due(self, now: float) -> bool:
        """The next claim reads from the head."""
        every = max(HEAD_CLAIM_SECONDS, HEAD_CLAIM_COST_FACTOR * self.seconds)
        return self.resume_after is None or now - self.claimed_at >= every


# Per queue id, in this process.
_heads: dict[int, Head] = {}


@dataclass
class Outcome:
    """What one delivery unit (``Courier.deliver``) did."""

    claimed: int = 0
    acked: int = 0
    retried: int = 0
    dead_lettered: int = 0
    isolated: bool = False
    lease_seconds: int = 0


def task_time_limit(lease_seconds: int) -> int:
    """Seconds after which a delivery task is killed: its loop budget plus
    the longest one delivery unit may take."""
    return lease_seconds + math.ceil(settings.LAZARETTO_DELIVERY_TASK_SECONDS)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def lease_token(owner: str) -> int | None:
    """The advisory-lock key in a lease owner ``host:pid:token``."""
    try:
        return int(owner.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


@contextmanager
def _lease(worker: str) -> Iterator[str]:
    """Hold a session-level advisory lock and yield the lease owner that
    names it; every message claimed under that owner is covered by it.

    Meanwhile the session plans without bitmap scans. A claim reads an
    index of the waiting messages in its order and stops at its batch; when
    the planner expects few after the claim's point (its row count and its
    histogram of ids were taken before the backlog built up), it would
    rather gather every one of them with a bitmap scan and sort them: 68,715
    rows read for a batch of 100, 170 ms, in a soak under an old
    transaction.

    And it keeps the generic plan of each prepared delivery statement
    (``broker.store.cursors.bound_cursor``). Left to choose, PostgreSQL found the
    generic plan dearer than a custom one and planned the ack and claim
    afresh at every execution: 0.65 ms a delivery unit, as long as running
    it at batch 10. The statements are written for the generic plan (the
    claim's index is fixed by literals, the ids come by key), which uses the
    same indexes; an ANALYZE of their tables makes PostgreSQL plan them
    again."""
    token = secrets.randbits(62) + 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('enable_bitmapscan'), current_setting('plan_cache_mode'),"
            " pg_advisory_lock(%s), set_config('enable_bitmapscan', 'off', false),"
            " set_config('plan_cache_mode', 'force_generic_plan', false)",
            [token],
        )
        [(bitmapscan, plan_cache_mode, *_)] = cursor.fetchall()
    try:
        yield f"{worker}:{token}"
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_unlock(%s), set_config('enable_bitmapscan', %s, false),"
                " set_config('plan_cache_mode', %s, false)",
                [token, bitmapscan, plan_cache_mode],
            )


@dataclass
class Courier:
    """Delivers one queue's messages under one lease."""

    queue: Queue
    owner: str
    handler: Handler
    # The batch the last settlement claimed (``claim_next``): the next unit.
    claimed_next: list[Claimed] = field(default_factory=list)
    # Where the next claim of a batch reads on from (``Head``).
    head: Head = field(default_factory=Head)
    # Whether it has said it waits (``waiting_sql``) since it began listening.
    said_waiting: bool = False
    # Whether, when it stopped listening, messages of its queue were due:
    # some may have been published in reliance on its waiting.
    due_on_leaving: bool = False

    def deliver(self, *, suspects: bool = True, claim_next: bool = False) -> Outcome:
        """Deliver one unit of work: TBDL -> DLNG -> DLVD, or back to TBDL for
        a retry, or on to the dead-letter queue. The unit is the batch the
        last unit claimed, if any; else a due crash suspect alone (when
        ``suspects`` and the queue may deliver one now); else a batch of up
        to ``batch_size`` messages. With ``claim_next``, the settlement of a
        batch also claims the next one, which the caller must then deliver
        (``claimed_next``)."""
        queue = self.queue
        batch, self.claimed_next = self.claimed_next, []
        isolated = False
        if not batch and suspects:
            batch = _claim(queue, self.owner, suspect=True, limit=1)
            isolated = bool(batch)
        if not batch:
            after, started = self._after(), time.monotonic()
            batch = _claim(queue, self.owner, suspect=False, limit=queue.batch_size, after=after)
            self._claimed(batch, after, started)
        if not batch:
            return Outcome()
        outcome = Outcome(claimed=len(batch), isolated=isolated, lease_seconds=queue.lease_seconds)
        # Whatever the consumer logs names its queue and message too.
        with bound_contextvars(queue=queue.name):
            results = [_deliver(self.handler, queue, message, isolated) for message in batch]
        # A suspect is settled alone: the next unit probes for suspects first.
        claims = claim_next and not isolated
        after, started = (self._after() if claims else None), time.monotonic()
        latencies, self.claimed_next = _settle(
            queue, self.owner, batch, results, outcome, claim_next=claims, after=after
        )
        if claims:
            self._claimed(self.claimed_next, after, started)
        delivery_latency_observe(queue=queue.name, seconds=latencies)
        return outcome

    @contextmanager
    def listening(self, *, take_over_within: float = 0.0) -> Iterator[bool]:
        """Listen for announcements of the queue, unless another courier of
        the queue does (or still does ``take_over_within`` seconds from
        now); yields whether this one does. A message announced from then on
        is not missed: announcements that arrive during a statement wait for
        ``wait_announced``."""
        key = [LISTENER_LOCK_CLASS, self.queue.id]
        with connection.cursor() as cursor:
            if take_over_within > 0:
                alone = _advisory_lock_within(cursor, key, take_over_within)
            else:
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", key)
                [(alone,)] = cursor.fetchall()
            if alone:
                cursor.execute(f"LISTEN {WAKE_CHANNEL}")
        if not alone:
            yield False
            return
        self.said_waiting = self.due_on_leaving = False
        try:
            yield True
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"UNLISTEN {WAKE_CHANNEL}")
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", key)
                if self.said_waiting:
                    self.due_on_leaving = _due_after_reliance(cursor, self.queue.id)
            # Announcements received but not waited for: none is kept.
            for _ in connection.connection.notifies(timeout=0):
                pass

    def wait_announced(self, until: float) -> int | None:
        """Wait, while ``listening``, until a queue is announced or the
        monotonic clock reaches ``until``; the id of the queue announced,
        None if none was."""
        remaining = until - time.monotonic()
        if remaining <= 0:
            return None
        with connection.cursor() as cursor:
            cursor.execute(waiting_sql(self.queue.id))
        self.said_waiting = True
        for announced in connection.connection.notifies(timeout=remaining):
            if announced.payload.isdigit():
                return int(announced.payload)
        return None

    def _after(self) -> tuple[int, int] | None:
        """Where the next claim of a batch reads on from; None: from the
        queue's head."""
        now = time.monotonic()
        if self.head.due(now):
            self.head.claimed_at = now
            return None
        return self.head.resume_after

    def _claimed(self, batch: list[Claimed], after: tuple[int, int] | None, started: float) -> None:
        """Note where ``batch`` ended and, for a claim from the head (no
        ``after``), how long the statement that made it took."""
        self.head.resume_after = (batch[-1].priority, batch[-1].id) if batch else None
        if after is None:
            self.head.seconds = time.monotonic() - started


@contextmanager
def queue_courier(*, queue_id: int, worker: str | None = None) -> Iterator[Courier | None]:
    """Lease a queue for delivery; None for a paused, dead-letter or
    consumer-less queue, which delivers nothing."""
    queue = (
        Queue.objects.filter(id=queue_id, paused=False, kind=QueueKind.STANDARD)
        .exclude(consumer="")
        .first()
    )
    if queue is None:
        yield None
        return
    # The queue row read above carries the webhook's timeout and secret: no
    # further query per message.
    webhook = WebhookOptions(timeout=queue.webhook_timeout, secret=queue.webhook_secret)
    with _lease(worker or worker_name()) as owner:
        yield Courier(
            queue=queue,
            owner=owner,
            handler=consumer_for(queue.consumer, webhook),
            head=_heads.setdefault(queue.id, Head()),
        )


def _due_after_reliance(cursor: CursorWrapper, queue_id: int) -> bool:
    """Whether messages of the queue are due once every publish that relied
    on its courier's waiting has committed (True if that takes longer than
    RELIANCE_WAIT_SECONDS)."""
    key = [RELIANCE_LOCK_CLASS, queue_id]
    if not _advisory_lock_within(cursor, key, RELIANCE_WAIT_SECONDS):
        return True
    # A statement of its own, whose snapshot sees those publishes.
    cursor.execute(
        "SELECT pg_advisory_unlock(%s, %s), EXISTS (SELECT FROM broker_message"
        " WHERE queue_id = %s AND state = %s AND available_at <= now())",
        [*key, queue_id, MessageState.TO_BE_DELIVERED.value],
    )
    [(_, due)] = cursor.fetchall()
    return bool(due)


def _advisory_lock_within(cursor: CursorWrapper, key: list[int], seconds: float) -> bool:
    """Take the advisory lock ``key`` (two keys), waiting at most ``seconds``."""
    cursor.execute(
        "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, false)",
        [f"{max(1, round(seconds * 1000))}ms"],
    )
    [(before, _)] = cursor.fetchall()
    try:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", key)
    except OperationalError:  # lock_timeout: another courier still listens
        return False
    else:
        return True
    finally:
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [before])


def queue_announce(*, queue_id: int) -> None:
    """Announce that the queue has messages due, to a courier waiting for
    them (``Courier.wait_announced``), when the caller's transaction commits:
    a NOTIFY is sent at the commit, and not at all on a rollback."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [WAKE_CHANNEL, str(queue_id)])


def queue_deliver(*, queue_id: int, worker: str | None = None) -> Outcome:
    """Deliver one unit of work of a queue (see ``Courier.deliver``)."""
    with queue_courier(queue_id=queue_id, worker=worker) as courier:
        return courier.deliver() if courier else Outcome()


def _claim(
    queue: Queue,
    owner: str,
    *,
    suspect: bool,
    limit: int,
    after: tuple[int, int] | None = None,
) -> list[Claimed]:
    return messages_claim(
        queue_id=queue.id,
        owner=owner,
        lease_seconds=queue.lease_seconds,
        limit=limit,
        suspect=suspect,
        after=after,
    )


def _deliver(handler: Handler, queue: Queue, message: Claimed, isolated: bool) -> Exception | None:
    """Call the consumer; None means acknowledged, else the error it raised."""
    delivery = Delivery(
        message_id=message.id,
        queue=queue.name,
        payload=bytes(message.payload),
        content_type=message.content_type,
        headers=message.headers,
        attempt=message.attempts,
        isolated=isolated,
    )
    # Bound and reset by hand: a context manager per message cost a tenth of
    # a worker's time at batch 100.
    tokens = bind_contextvars(message_id=message.id)
    try:
        handler(delivery)
    except Exception as error:  # any failure of the consumer is a handler error
        return error
    finally:
        reset_contextvars(**tokens)
    return None


def _backoff(queue: Queue, attempts: int) -> float:
    return float(min(queue.retry_backoff_seconds * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS))


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:2000]


def _settle(
    queue: Queue,
    owner: str,
    batch: list[Claimed],
    results: list[Exception | None],
    outcome: Outcome,
    *,
    claim_next: bool,
    after: tuple[int, int] | None = None,
) -> tuple[list[float], list[Claimed]]:
    """Record every answer of the batch, and count them on the queue's
    per-minute counts, in one transaction: a batch acknowledged
    whole is one statement (one commit), which with ``claim_next`` also
    claims the queue's next batch (resumed ``after``, as ``messages_claim``).
    Returns the publish-to-ack seconds of each message acknowledged, and the
    batch claimed."""
    acked = [m.id for m, error in zip(batch, results, strict=True) if error is None]
    retries, dead, answers = _sort_failures(queue, batch, results)
    with transaction.atomic() if answers else nullcontext():
        claimed: list[Claimed] = []
        if claim_next:
            latencies, claimed = messages_ack_and_claim(
                queue_id=queue.id,
                message_ids=acked,
                owner=owner,
                handler_errors=len(answers),
                lease_seconds=queue.lease_seconds,
                limit=queue.batch_size,
                after=after,
            )
        else:
            latencies = messages_ack(
                queue_id=queue.id, message_ids=acked, owner=owner, handler_errors=len(answers)
            )
        outcome.acked = len(latencies)
        outcome.retried = messages_retry(retries=retries, owner=owner)
        outcome.dead_lettered = len(messages_dead_letter(causes=dead, owner=owner))
        if outcome.dead_lettered:
            minute_count(queue_id=queue.id, failed=outcome.dead_lettered)
    _log_settled(queue, owner, len(batch), acked, answers, outcome)
    return latencies, claimed


def _sort_failures(
    queue: Queue, batch: list[Claimed], results: list[Exception | None]
) -> tuple[list[Retry], dict[int, DeadLetterCause], list[tuple[Claimed, Exception, str]]]:
    """Decide what each failed message of the batch becomes: dead-lettered
    at once for a format error, retried after a backoff while attempts
    remain, dead-lettered as a handler error after that. Returns the
    retries, the dead-letter causes, and each failure with the words that
    log what became of it."""
    retries: list[Retry] = []
    dead: dict[int, DeadLetterCause] = {}
    answers: list[tuple[Claimed, Exception, str]] = []
    for message, error in zip(batch, results, strict=True):
        if error is None:
            continue
        if isinstance(error, FormatError):
            dead[message.id] = DeadLetterCause("format_error", _describe(error))
            answers.append((message, error, "dead-lettered (format_error)"))
        elif message.attempts <= queue.retry_limit:
            delay = _backoff(queue, message.attempts)
            retries.append(Retry(message.id, delay, _describe(error)))
            answers.append((message, error, f"retry in {delay:g} s"))
        else:
            dead[message.id] = DeadLetterCause("handler_error", _describe(error))
            answers.append((message, error, "dead-lettered (handler_error)"))
    return retries, dead, answers


def _log_settled(
    queue: Queue,
    owner: str,
    batch_size: int,
    acked: list[int],
    answers: list[tuple[Claimed, Exception, str]],
    outcome: Outcome,
) -> None:
    """Log what became of a settled batch: each delivery (at debug level),
    each failure and what was done with it, and any message the sweeper
    took back before the batch was settled."""
    if logger.isEnabledFor(logging.DEBUG):  # one line per ack: not on the hot path otherwise
        for message_id in acked:
            logger.debug(
                "message %s on %s delivered",
                message_id,
                queue.name,
                extra=_fields(queue, message_id),
            )
    for message, error, then in answers:
        logger.info(
            "message %s on %s, attempt %s: %s; %s",
            message.id,
            queue.name,
            message.attempts,
            _describe(error),
            then,
            extra={**_fields(queue, message.id), "attempt": message.attempts},
        )
    lost = batch_size - outcome.acked - outcome.retried - outcome.dead_lettered
    if lost:
        logger.warning(
            "%s: %s message(s) of the batch were taken back by the sweeper",
            owner,
            lost,
            extra={"queue": queue.name},
        )


def _fields(queue: Queue, message_id: int) -> dict[str, object]:
    """What a delivery's log line carries as fields (the worker is added to
    every line: console.logs)."""
    return {"message_id": message_id, "queue": queue.name}
