"""Reads. Nothing here counts the message table: depths come from the
per-queue counters kept by triggers (see migration 0002), lists use keyset
pagination over the indexes named in broker.models."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import (
    BinaryField,
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone

from broker.errors import BulkJobNotFound, MessageNotFound, QueueNotFound, RuleTableNotFound
from broker.models import (
    COUNTER_COLUMNS,
    AuditEvent,
    BulkJob,
    DeadLetterActionTotal,
    DeadLetterScan,
    Heartbeat,
    Message,
    MessageState,
    Node,
    NodeRole,
    PoisonAlarm,
    Queue,
    QueueAlert,
    QueueKind,
    RuleTable,
    RuleTableStatus,
    Subscription,
    Topic,
)

HIGH_WATER_FRACTION = 0.8


@dataclass(frozen=True)
class LimitState:
    """Where a queue or subscription stands against its max-messages limit.

    ``live`` counts what the limit counts: waiting and in-flight messages.
    ``over_limit`` can only come from internal moves (dead-letter retry or
    forward, release, replay), which never drop a message; ``high_water`` is
    80 % of the limit or more."""

    live: int
    max_messages: int | None

    @property
    def over_limit(self) -> bool:
        return self.max_messages is not None and self.live > self.max_messages

    @property
    def high_water(self) -> bool:
        return (
            self.max_messages is not None and self.live >= HIGH_WATER_FRACTION * self.max_messages
        )


def live_count(depth: dict[str, int]) -> int:
    return depth[MessageState.TO_BE_DELIVERED] + depth[MessageState.DELIVERING]


@dataclass(frozen=True)
class QueueSummary:
    queue: Queue
    depth: dict[str, int]

    @property
    def limit(self) -> LimitState:
        return LimitState(live=live_count(self.depth), max_messages=self.queue.max_messages)


@dataclass(frozen=True)
class SubscriptionSummary:
    subscription: Subscription
    depth: dict[str, int]

    @property
    def limit(self) -> LimitState:
        return LimitState(live=live_count(self.depth), max_messages=self.subscription.max_messages)


def subscription_summaries(*, within: Q | None = None) -> list[SubscriptionSummary]:
    """Every subscription (of those ``within`` selects) by name, with its
    queue's depth: two queries."""
    selected = Subscription.objects.select_related("topic", "queue").order_by("name")
    subscriptions = list(selected if within is None else selected.filter(within))
    depths = queue_depths(queue_ids=[subscription.queue_id for subscription in subscriptions])
    return [
        SubscriptionSummary(subscription=subscription, depth=depths[subscription.queue_id])
        for subscription in subscriptions
    ]


def subscription_summary(*, subscription: Subscription) -> SubscriptionSummary:
    depth = queue_depths(queue_ids=[subscription.queue_id])[subscription.queue_id]
    return SubscriptionSummary(subscription=subscription, depth=depth)


def queue_depths(*, queue_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    """Each queue's message count by state, every state present."""
    depths: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(MessageState.values, 0))
    ids = list(queue_ids)
    for queue_id in ids:
        depths[queue_id]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue_id, state, count FROM broker_queuedepth_current WHERE queue_id = ANY(%s)",
            [ids],
        )
        for queue_id, state, count in cursor.fetchall():
            depths[queue_id][state] = count
    return dict(depths)


def queue_summaries(*, by_kind: bool = False, within: Q | None = None) -> list[QueueSummary]:
    """Every queue (of those ``within`` selects) with its depth by state, by
    name (``by_kind``: by kind, dead-letter queues first, then by name): two
    queries whatever the backlog."""
    ordering = ("kind", "name") if by_kind else ("name",)
    selected = Queue.objects.select_related("dead_letter_queue").order_by(*ordering)
    queues = list(selected.filter(within) if within is not None else selected)
    depths = queue_depths(queue_ids=[queue.id for queue in queues])
    return [QueueSummary(queue=queue, depth=depths[queue.id]) for queue in queues]


def queue_summary(*, queue: Queue) -> QueueSummary:
    return QueueSummary(queue=queue, depth=queue_depths(queue_ids=[queue.id])[queue.id])


def queue_names(*, exclude: Queue | None = None, within: Q | None = None) -> list[str]:
    """Every queue's name (of those ``within`` selects) in order, but
    ``exclude``'s: where a message can go."""
    queues = Queue.objects.order_by("name")
    if within is not None:
        queues = queues.filter(within)
    if exclude is not None:
        queues = queues.exclude(id=exclude.id)
    return list(queues.values_list("name", flat=True))


def dead_letter_queue_list() -> QuerySet[Queue]:
    """The dead-letter queues by name (lazy: forms choose among them)."""
    return Queue.objects.filter(kind=QueueKind.DEAD_LETTER).order_by("name")


def dead_letter_queue_get(*, name: str) -> Queue:
    """The dead-letter queue ``name``; a standard queue of that name is not
    one (QueueNotFound either way)."""
    queue = Queue.objects.filter(name=name).first()
    if queue is None:
        raise QueueNotFound(f"There is no queue named {name!r}.")
    if queue.kind != QueueKind.DEAD_LETTER:
        raise QueueNotFound(f"{name} is not a dead-letter queue.")
    return queue


def topic_list() -> QuerySet[Topic]:
    """Every topic by name (lazy: forms choose among them)."""
    return Topic.objects.order_by("name")


@dataclass(frozen=True)
class DueQueue:
    queue_id: int
    lease_seconds: int
    batch_size: int
    waiting: int
    # Due crash suspects among the waiting, each delivered alone.
    suspects: int


# Deliverable queues holding at least one due TBDL message. The TBDL
# counter rules out idle queues; the probe for the next due message rules
# out queues whose waiting messages are all delayed. It reads
# message_ready_idx in its own order, so the planner walks that index from
# the top: as an EXISTS, PostgreSQL made it a semi-join over a scan of the
# whole live partition, which took seconds under a backlog of millions.
# Suspects are counted on message_suspect_idx, which holds the few waiting
# suspects only.
DUE_QUEUES_SQL = """
SELECT q.id, q.lease_seconds, q.batch_size, d.count,
       (SELECT count(*) FROM broker_message AS s
        WHERE s.queue_id = q.id AND s.state = 'TBDL' AND s.suspect
          AND s.available_at <= now())
FROM broker_queue AS q
JOIN broker_queuedepth_current AS d ON d.queue_id = q.id AND d.state = 'TBDL'
CROSS JOIN LATERAL (
    SELECT 1 FROM broker_message AS m
    WHERE m.queue_id = q.id AND m.state = 'TBDL' AND m.available_at <= now()
    ORDER BY m.priority DESC, m.id
    LIMIT 1
) AS due
WHERE q.kind = 'standard' AND NOT q.paused AND q.consumer <> '' AND d.count > 0
"""


def queues_with_due_messages() -> list[DueQueue]:
    """Deliverable queues holding at least one due TBDL message
    (``DUE_QUEUES_SQL``)."""
    with connection.cursor() as cursor:
        cursor.execute(DUE_QUEUES_SQL)
        return [DueQueue(*row) for row in cursor.fetchall()]


def message_get(*, message_id: int) -> Message:
    try:
        return Message.objects.select_related("queue").get(id=message_id)
    except Message.DoesNotExist:
        raise MessageNotFound(f"There is no message {message_id}.") from None


@dataclass(frozen=True)
class MessageFilter:
    """What the console's message browser narrows by; blank means any."""

    queue: str = ""
    state: str = ""
    reason: str = ""
    since: datetime | None = None
    until: datetime | None = None
    # "name=value": messages whose headers hold that pair.
    header: str = ""
    # Bytes the payload contains.
    text: str = ""


@dataclass(frozen=True)
class SearchedIds:
    """The ids a page of a search read: from ``low`` up to, not including,
    ``high``."""

    low: int
    high: int


@dataclass(frozen=True)
class MessagePage:
    messages: list[Message]
    # The id to continue below, or None on the last page. A search that
    # reached the bottom of its SEARCH_SPAN gives ``searched.low``.
    next_before: int | None
    # How many match, counted up to COUNT_CAP; None past it ("more than").
    # For a search, how many of the searched ids match.
    total: int | None
    # A header or payload-text search: which ids this page read. None for
    # the other filters, which read the whole table through an index.
    searched: SearchedIds | None = None


COUNT_CAP = 1000
# A header or payload-text term is served by no index: a GIN or trigram
# index would be written by every publish and every delivery, the paths
# whose throughput the broker is for. A page of such a search reads at most
# this many ids below its cursor, newest first, and says which it read; the
# next page searches the span below, as a log search does.
SEARCH_SPAN = 100_000


def filtered_messages(filters: MessageFilter, *, within: Q | None = None) -> QuerySet[Message]:
    """The messages ``filters`` select (of those ``within``, a filter on
    messages, selects), unordered.

    The queue is matched by its id from a subquery, not through a join: the
    planner then reads message_queue_id_idx by (queue_id, id), in id order,
    where a join hashes every message of the table first."""
    rows = Message.objects.all() if within is None else Message.objects.filter(within)
    if filters.queue:
        queue = Queue.objects.filter(name=filters.queue).values("id")
        rows = rows.filter(queue_id=Subquery(queue))
    if filters.state:
        rows = rows.filter(state=filters.state)
    if filters.reason:
        # As text (->>), the expression message_dead_letter_idx holds.
        rows = rows.alias(reason=KeyTextTransform("reason", "dead_letter")).filter(
            reason=filters.reason
        )
    # In UTC: Python takes offsets up to ±23:59, PostgreSQL only to ±15:59.
    if filters.since:
        rows = rows.filter(created_at__gte=filters.since.astimezone(UTC))
    if filters.until:
        rows = rows.filter(created_at__lt=filters.until.astimezone(UTC))
    if filters.header:
        name, _, value = filters.header.partition("=")
        rows = rows.filter(headers__contains={name.strip(): value.strip()})
    if filters.text:
        position = Func(
            Value(filters.text.encode(), output_field=BinaryField()),
            F("payload"),
            function="position",
            arg_joiner=" IN ",
            output_field=IntegerField(),
        )
        rows = rows.annotate(found_at=position).filter(found_at__gt=0)
    return rows


def search_span(*, filters: MessageFilter, before: int | None) -> SearchedIds | None:
    """The ids one page of a header or payload-text search reads: the
    SEARCH_SPAN ids below ``before`` (or the newest), none below 1. None when
    ``filters`` search neither."""
    if not (filters.header or filters.text):
        return None
    if before is None:
        newest = Message.objects.order_by("-id").values_list("id", flat=True).first()
        before = (newest or 0) + 1
    return SearchedIds(low=max(1, before - SEARCH_SPAN), high=max(1, before))


def messages_page(
    *, filters: MessageFilter, before: int | None = None, size: int = 50, within: Q | None = None
) -> MessagePage:
    """Newest first, by keyset on the id (index message_queue_id_idx or the
    primary key): a page costs the same however deep the reader goes. The
    count stops at COUNT_CAP, so a page never counts the whole table. A
    header or payload-text search reads one span of ids (``search_span``).
    ``within``: a filter on messages (the queues a caller sees)."""
    span = search_span(filters=filters, before=before)
    if span is not None:
        return _searched_page(filters=filters, span=span, size=size, within=within)
    rows = filtered_messages(filters, within=within)
    page_rows = rows.filter(id__lt=before) if before else rows
    found = list(page_rows.select_related("queue").defer("payload").order_by("-id")[: size + 1])
    capped = rows.order_by()[: COUNT_CAP + 1].count()
    return MessagePage(
        messages=found[:size],
        next_before=found[size - 1].id if len(found) > size else None,
        total=capped if capped <= COUNT_CAP else None,
    )


def _searched_page(
    *, filters: MessageFilter, span: SearchedIds, size: int, within: Q | None
) -> MessagePage:
    """One pass over the span finds the ids of up to COUNT_CAP + 1 matches,
    newest first; the page's rows are then read by id."""
    ids = list(
        filtered_messages(filters, within=within)
        .filter(id__gte=span.low, id__lt=span.high)
        .order_by("-id")
        .values_list("id", flat=True)[: COUNT_CAP + 1]
    )
    shown = ids[:size]
    found = Message.objects.filter(id__in=shown).select_related("queue").defer("payload")
    if len(ids) > size:
        next_before: int | None = ids[size - 1]
    else:
        next_before = span.low if span.low > 1 else None
    return MessagePage(
        messages=sorted(found, key=lambda message: -message.id),
        next_before=next_before,
        total=len(ids) if len(ids) <= COUNT_CAP else None,
        searched=span,
    )


def message_timeline(*, message_id: int) -> list[AuditEvent]:
    """The message's audit events, oldest first (index audit_message_idx)."""
    return list(AuditEvent.objects.filter(message_id=message_id).order_by("id"))


@dataclass(frozen=True)
class AuditFilter:
    actor: str = ""
    action: str = ""
    queue: str = ""
    message_id: int | None = None


def audit_events(filters: AuditFilter, *, within: Q | None = None) -> QuerySet[AuditEvent]:
    """The events ``filters`` select (of those ``within`` selects), unordered."""
    events = AuditEvent.objects.all() if within is None else AuditEvent.objects.filter(within)
    if filters.actor:
        events = events.filter(actor_name=filters.actor)
    if filters.action:
        events = events.filter(action=filters.action)
    if filters.queue:
        events = events.filter(queue_name=filters.queue)
    if filters.message_id is not None:
        events = events.filter(message_id=filters.message_id)
    return events


def audit_page(
    *, filters: AuditFilter, before: int | None = None, size: int = 100, within: Q | None = None
) -> tuple[list[AuditEvent], int | None]:
    """Newest first, keyset on the id (of the events ``within`` selects);
    returns the events and the next cursor."""
    events = audit_events(filters, within=within)
    if before:
        events = events.filter(id__lt=before)
    found = list(events.order_by("-id")[: size + 1])
    return found[:size], (found[size - 1].id if len(found) > size else None)


NO_HEADER = "(no header)"


@dataclass(frozen=True)
class DeadLetterGroups:
    """A dead-letter queue's waiting messages counted by reason and by the
    queue they came from (most first; NO_HEADER for messages without a
    dead-letter header), and when the one waiting longest arrived."""

    by_reason: list[tuple[str, int]]
    by_original_queue: list[tuple[str, int]]
    oldest_at: datetime | None = None


def _most_first(counts: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def dead_letter_groups_of(
    *, queue_ids: Iterable[int], depths: dict[int, dict[str, int]] | None = None
) -> dict[int, DeadLetterGroups]:
    """Each queue's grouped counts (every queue present), read from indexes
    only: one GROUP BY over the waiting messages with a header
    (message_dead_letter_idx), the queues' depth counters, whose remainder
    is the messages without one, and each queue's oldest waiting message
    (message_waiting_idx). ``depths``: the queues' depths, if read already."""
    ids = list(queue_ids)
    rows = (
        Message.objects.filter(
            queue_id__in=ids, state=MessageState.TO_BE_DELIVERED, dead_letter__isnull=False
        )
        .annotate(
            reason=KeyTextTransform("reason", "dead_letter"),
            origin=KeyTextTransform("original_queue", "dead_letter"),
        )
        .values_list("queue_id", "reason", "origin")
        .annotate(count=Count("id"))
        .order_by()
    )
    reasons: dict[int, dict[str, int]] = {queue_id: defaultdict(int) for queue_id in ids}
    origins: dict[int, dict[str, int]] = {queue_id: defaultdict(int) for queue_id in ids}
    for queue_id, reason, origin, count in rows:
        reasons[queue_id][reason or NO_HEADER] += count
        origins[queue_id][origin or NO_HEADER] += count
    depths = depths if depths is not None else queue_depths(queue_ids=ids)
    for queue_id in ids:
        without = depths[queue_id][MessageState.TO_BE_DELIVERED] - sum(reasons[queue_id].values())
        if without > 0:
            reasons[queue_id][NO_HEADER] += without
            origins[queue_id][NO_HEADER] += without
    oldest = _oldest_waiting(ids)
    return {
        queue_id: DeadLetterGroups(
            by_reason=_most_first(reasons[queue_id]),
            by_original_queue=_most_first(origins[queue_id]),
            oldest_at=oldest.get(queue_id),
        )
        for queue_id in ids
    }


def _oldest_waiting(queue_ids: list[int]) -> dict[int, datetime]:
    """When each queue's longest-waiting message arrived, for the queues
    with any: the first entry of message_waiting_idx per queue."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT q.id, (SELECT m.enqueued_at FROM broker_message AS m"
            " WHERE m.queue_id = q.id AND m.state = 'TBDL' ORDER BY m.enqueued_at LIMIT 1)"
            " FROM unnest(%s::bigint[]) AS q(id)",
            [queue_ids],
        )
        return {queue_id: at for queue_id, at in cursor.fetchall() if at is not None}


def dead_letter_groups(*, queue: Queue) -> DeadLetterGroups:
    """One queue's grouped counts (``dead_letter_groups_of``)."""
    return dead_letter_groups_of(queue_ids=[queue.id])[queue.id]


@dataclass(frozen=True)
class DeadLetterTriage:
    """What an operator starting triage sees of one dead-letter queue: its
    depth, its waiting messages grouped, the active rules table version, and
    the handler's last scan (None: never scanned)."""

    queue: Queue
    waiting: int
    groups: DeadLetterGroups
    active: RuleTable | None
    last_scan: DeadLetterScan | None


def dead_letter_triage(*, within: Q | None = None) -> list[DeadLetterTriage]:
    """Every dead-letter queue (of those ``within`` selects) by name with
    what triage starts from: five queries however many queues and messages
    (queues with their last scan, active tables, depth counters, the grouped
    counts, the oldest arrivals), each on an index."""
    listed = dead_letter_queue_list().select_related("last_scan")
    queues = list(listed if within is None else listed.filter(within))
    ids = [queue.id for queue in queues]
    active = {
        table.queue_id: table
        for table in RuleTable.objects.filter(queue_id__in=ids, status=RuleTableStatus.ACTIVE)
    }
    depths = queue_depths(queue_ids=ids)
    groups = dead_letter_groups_of(queue_ids=ids, depths=depths)
    return [
        DeadLetterTriage(
            queue=queue,
            waiting=depths[queue.id][MessageState.TO_BE_DELIVERED],
            groups=groups[queue.id],
            active=active.get(queue.id),
            last_scan=getattr(queue, "last_scan", None),
        )
        for queue in queues
    ]


@dataclass(frozen=True)
class MinuteCounts:
    minute: datetime
    delivered: int
    failed: int


def last_hour(*, queue_ids: list[int] | None = None) -> list[MinuteCounts]:
    """Deliveries and failures of every queue (or of ``queue_ids``) for each
    of the last 60 minutes, oldest first, minutes without any as zeros."""
    now = timezone.now().replace(second=0, microsecond=0)
    first = now - timedelta(minutes=59)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT minute, sum(delivered), sum(failed) FROM broker_queueminute_current"
            " WHERE minute >= %s AND (%s IS NULL OR queue_id = ANY(%s)) GROUP BY minute",
            [first, queue_ids, queue_ids],
        )
        rows = {
            minute: {"delivered": delivered, "failed": failed}
            for minute, delivered, failed in cursor.fetchall()
        }
    slots = [first + timedelta(minutes=n) for n in range(60)]
    return [
        MinuteCounts(
            minute=slot,
            delivered=rows.get(slot, {}).get("delivered") or 0,
            failed=rows.get(slot, {}).get("failed") or 0,
        )
        for slot in slots
    ]


def heartbeats() -> dict[str, float]:
    """Seconds since each Celery queue last had a worker take a task."""
    now = timezone.now()
    return {beat.name: (now - beat.seen_at).total_seconds() for beat in Heartbeat.objects.all()}


def active_rule_table(*, queue: Queue) -> RuleTable | None:
    """The rules table version the dead-letter handler uses on ``queue`` now
    (at most one: constraint rule_table_one_active_per_queue)."""
    return RuleTable.objects.filter(queue=queue, status=RuleTableStatus.ACTIVE).first()


def queues_with_active_rules() -> list[Queue]:
    """The dead-letter queues that have an active rules table."""
    return list(
        Queue.objects.filter(
            kind=QueueKind.DEAD_LETTER, rule_tables__status=RuleTableStatus.ACTIVE
        ).order_by("name")
    )


def rule_table_versions(*, queue: Queue) -> list[RuleTable]:
    """Every version of a queue's rules table, newest first."""
    return list(queue.rule_tables.select_related("created_by").order_by("-version"))


def rule_table_version(*, queue: Queue, version: int) -> RuleTable:
    table = RuleTable.objects.filter(queue=queue, version=version).first()
    if table is None:
        raise RuleTableNotFound(f"{queue.name} has no rules table version {version}.")
    return table


def rule_table_version_before(*, table: RuleTable) -> RuleTable | None:
    """The version of the same queue's table just before ``table``, if any."""
    return (
        RuleTable.objects.filter(queue_id=table.queue_id, version__lt=table.version)
        .order_by("-version")
        .first()
    )


def bulk_job_get(*, job_id: int) -> BulkJob:
    job = BulkJob.objects.filter(id=job_id).first()
    if job is None:
        raise BulkJobNotFound(f"There is no job {job_id}.")
    return job


@dataclass(frozen=True)
class AlertFilter:
    queue: str = ""
    condition: str = ""
    # True: open now; False: ended; None: both.
    open: bool | None = None


def alert_episodes(filters: AlertFilter, *, within: Q | None = None) -> QuerySet[QueueAlert]:
    """The alert episodes ``filters`` select (of those ``within`` selects),
    unordered, with their queue."""
    episodes = QueueAlert.objects.select_related("queue")
    if within is not None:
        episodes = episodes.filter(within)
    if filters.queue:
        episodes = episodes.filter(queue__name=filters.queue)
    if filters.condition:
        episodes = episodes.filter(condition=filters.condition)
    if filters.open is not None:
        episodes = episodes.filter(ended_at__isnull=filters.open)
    return episodes


def alerts_recent(*, limit: int = 10, within: Q | None = None) -> list[QueueAlert]:
    """The alert episodes (of those ``within`` selects) open now, then the
    latest ended ones, up to ``limit`` in all, each with its queue."""
    episodes = QueueAlert.objects.select_related("queue")
    if within is not None:
        episodes = episodes.filter(within)
    return list(episodes.order_by(F("ended_at").desc(nulls_first=True), "-id")[:limit])


def queue_alerts(*, queue: Queue, limit: int = 10) -> list[QueueAlert]:
    """One queue's alert episodes: open ones first, then the latest ended."""
    return list(
        QueueAlert.objects.filter(queue=queue).order_by(
            F("ended_at").desc(nulls_first=True), "-id"
        )[:limit]
    )


def poison_alarms_recent(*, limit: int = 10, within: Q | None = None) -> list[PoisonAlarm]:
    """The latest messages quarantined or purged automatically (of those
    ``within`` selects), newest first, each with ``has_page``: whether its
    message still exists to be shown."""
    alarms = PoisonAlarm.objects.all() if within is None else PoisonAlarm.objects.filter(within)
    return list(
        alarms.annotate(
            has_page=Exists(Message.objects.filter(id=OuterRef("message_id")))
        ).order_by("-id")[:limit]
    )


@dataclass(frozen=True)
class QueueCounts:
    """A queue's depth by state and its all-time counters (``QueueTotal``;
    zeros before anything happened on it), as /metrics shows them, and
    whether the dispatcher delivers its messages: a standard queue, not
    paused, with a consumer (as ``DUE_QUEUES_SQL`` picks them)."""

    name: str
    depth: dict[str, int]
    totals: dict[str, int]
    deliverable: bool


def queue_counts() -> list[QueueCounts]:
    """Every queue's depth and totals by name: three small queries (queues,
    depth counters, totals), one row each per queue or state."""
    queues = list(
        Queue.objects.order_by("name")
        .annotate(
            deliverable=ExpressionWrapper(
                Q(kind=QueueKind.STANDARD, paused=False) & ~Q(consumer=""),
                output_field=BooleanField(),
            )
        )
        .values_list("id", "name", "deliverable")
    )
    depths = queue_depths(queue_ids=[queue_id for queue_id, _, _ in queues])
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT queue_id, {', '.join(COUNTER_COLUMNS)} FROM broker_queuetotal_current"  # noqa: S608
        )
        totals = {
            row[0]: dict(zip(COUNTER_COLUMNS, row[1:], strict=True)) for row in cursor.fetchall()
        }
    zeros = dict.fromkeys(COUNTER_COLUMNS, 0)
    return [
        QueueCounts(
            name=name,
            depth=depths[queue_id],
            totals={key: totals.get(queue_id, zeros)[key] for key in COUNTER_COLUMNS},
            deliverable=deliverable,
        )
        for queue_id, name, deliverable in queues
    ]


# How long each queue's longest-waiting message has waited, on the
# database's clock: for the queues whose TBDL counter is above zero, the
# first entry of message_waiting_idx (queue_id, enqueued_at, id WHERE
# state = 'TBDL'), one index probe each. Queues with nothing waiting are
# not probed: their index entries may all be dead ones awaiting VACUUM.
QUEUE_OLDEST_WAITING_SQL = """
SELECT q.name,
       greatest(extract(epoch FROM now() - (
           SELECT m.enqueued_at FROM broker_message AS m
           WHERE m.queue_id = q.id AND m.state = 'TBDL'
           ORDER BY m.enqueued_at LIMIT 1
       )), 0)
FROM broker_queue AS q
JOIN broker_queuedepth_current AS d ON d.queue_id = q.id AND d.state = 'TBDL'
WHERE d.count > 0
"""


def queue_oldest_waiting() -> dict[str, float]:
    """Seconds since each queue's longest-waiting (TBDL) message arrived
    (``enqueued_at``), for the queues with any waiting: one query
    (``QUEUE_OLDEST_WAITING_SQL``). A delayed message counts from its
    arrival, not from when it becomes due."""
    with connection.cursor() as cursor:
        cursor.execute(QUEUE_OLDEST_WAITING_SQL)
        return {name: float(seconds) for name, seconds in cursor.fetchall()}


@dataclass(frozen=True)
class RuleActionCount:
    queue: str
    rule_table_version: int
    rule: int
    action: str
    count: int


def dead_letter_action_counts() -> list[RuleActionCount]:
    """The dead-letter handler's actions by queue, table version, rule and
    action since each queue was created."""
    rows = DeadLetterActionTotal.objects.order_by(
        "queue__name", "rule_table_version", "rule", "action"
    ).values_list("queue__name", "rule_table_version", "rule", "action", "count")
    return [RuleActionCount(*row) for row in rows]


def ha_alert() -> str:
    """What the HA pair's state costs now, for the banner on every console
    page: ``maintenance`` (a split brain: every write refused),
    ``synchronising`` (a standby rejoining: configuration changes refused),
    ``alone`` (the primary lost its standby: a publish is on one store), else
    "". One query on the node table, which holds a row per node: two."""
    rows = set(
        Node.objects.filter(
            Q(role__in=[NodeRole.MAINTENANCE, NodeRole.SYNCHRONISING])
            | Q(role=NodeRole.PRIMARY, mode="alone")
        ).values_list("role", flat=True)
    )
    for role in (NodeRole.MAINTENANCE, NodeRole.SYNCHRONISING):
        if role in rows:
            return role.value
    return "alone" if NodeRole.PRIMARY in rows else ""


def ha_node_names() -> list[str]:
    """The names of the HA pair's nodes, as the store has them."""
    return list(Node.objects.order_by("name").values_list("name", flat=True))
