"""The dead-letter handler: process a dead-letter queue by its active rules
table (IBM MQ runmqdlq syntax, parsed by broker.rules).

For each waiting message with a dead-letter header, the first matching rule
whose RETRY count is not yet used up for that message acts:

* RETRY puts the message back on its original queue (TBDL, fresh counters);
* FWD moves it to FWDQ, keeping the dead-letter header for HEADER(YES);
* DISCARD deletes it (with an audit event);
* IGNORE leaves it.

An action fails when its target queue is missing, full (a reject_new limit
reached) or on another instance; the failure counts against that message and
rule, and the message is looked at again after RETRYINT. A paused target
takes the message: pausing stops delivery, not arrivals. With no rule left,
the message is ignored. Each scan reads the queue once, in id order, in
chunks locked with FOR UPDATE SKIP LOCKED: several handlers on one queue
never act on the same message. The messages themselves move through
``broker.services.transitions.dead_lettered``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache, partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from broker.models import (
    SCAN_COUNTS,
    DeadLetterAttempt,
    DeadLetterScan,
    Overflow,
    Queue,
    QueueKind,
    RuleTable,
    ScanResult,
)
from broker.rules import Rule, RulesTable, applicable_rule, destination, parse
from broker.rules import message_attributes as rules_attributes
from broker.selectors import active_rule_table, live_count, queue_depths
from broker.services.audit import AuditEntry, audit_record_many
from broker.services.counting import dead_letter_actions_count
from broker.services.transitions.dead_lettered import (
    messages_defer,
    messages_discard,
    messages_forward,
    messages_retry_dead_lettered,
)

logger = logging.getLogger(__name__)

CHUNK = 500

_CHUNK_SQL = """
SELECT id, dead_letter, headers, content_type, put_application, put_user
FROM broker_message
WHERE queue_id = %(queue_id)s AND state = 'TBDL' AND available_at <= now() AND id > %(after)s
  AND updated_at <= %(started)s
ORDER BY id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""
_COUNT_ATTEMPT_SQL = """
INSERT INTO broker_deadletterattempt (message_id, rule_table_id, rule_number, attempts)
SELECT message_id, %(table)s, rule_number, 1
FROM unnest(%(ids)s::bigint[], %(rules)s::int[]) AS a(message_id, rule_number)
ON CONFLICT (message_id, rule_table_id, rule_number)
DO UPDATE SET attempts = broker_deadletterattempt.attempts + 1
"""

_MARK_IGNORED_SQL = """
INSERT INTO broker_deadletterattempt (message_id, rule_table_id, rule_number, attempts)
SELECT message_id, %(table)s, rule_number, 0
FROM unnest(%(ids)s::bigint[], %(rules)s::int[]) AS a(message_id, rule_number)
ON CONFLICT (message_id, rule_table_id, rule_number) DO NOTHING
"""


@cache
def _parsed(table_id: int, text: str) -> RulesTable:
    result = parse(text)
    if result.table is None:  # activation refuses invalid tables
        raise ValueError(f"rules table {table_id} is not valid")
    return result.table


def active_table(queue: Queue) -> tuple[RuleTable, RulesTable] | None:
    """The queue's active table version and its parsed rules."""
    row = active_rule_table(queue=queue)
    if row is None:
        return None
    return row, _parsed(row.id, row.text)


def message_attributes(
    *,
    dead_letter: dict[str, Any],
    headers: dict[str, str],
    content_type: str,
    put_application: str,
    put_user: str,
) -> dict[str, str | int]:
    """What the rules' patterns match against, in MQ's terms, on this instance."""
    return rules_attributes(
        dead_letter=dead_letter,
        headers=headers,
        content_type=content_type,
        put_application=put_application,
        put_user=put_user,
        queue_manager=settings.LAZARETTO_INSTANCE_NAME,
    )


Used = dict[tuple[int, int], int]


@dataclass
class _Chunk:
    """What one chunk decided, written in a few set-based statements."""

    # Messages to move, by (action, target queue id, keep the header).
    moves: dict[tuple[str, int, bool], list[int]] = field(default_factory=lambda: defaultdict(list))
    discards: list[int] = field(default_factory=list)
    later: list[int] = field(default_factory=list)
    failures: list[tuple[int, int]] = field(default_factory=list)
    # Messages ignored for the first time under this table (rule 0: no rule
    # matched or all were used up), so the audit log says so only once.
    first_ignores: list[tuple[int, int]] = field(default_factory=list)
    events: list[AuditEntry] = field(default_factory=list)
    # Live depth of each target, counting this chunk's own moves.
    live: dict[int, int] = field(default_factory=dict)


class _Targets:
    """Target queues by name (and id), loaded once per chunk."""

    def __init__(self) -> None:
        self._queues: dict[str, Queue | None] = {}
        self.by_id: dict[int, Queue] = {}

    def get(self, name: str) -> Queue | None:
        if name not in self._queues:
            queue = Queue.objects.filter(name=name).first()
            self._queues[name] = queue
            if queue is not None:
                self.by_id[queue.id] = queue
        return self._queues[name]


def _scan_started() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (started,) = cursor.fetchone() or (None,)
    return started


def dead_letter_scan(*, queue: Queue) -> ScanResult:
    """One pass over a dead-letter queue under its active rules table, in
    chunks of CHUNK messages, one transaction each."""
    active = active_table(queue)
    result = ScanResult()
    if active is None or queue.kind != QueueKind.DEAD_LETTER:
        return result
    row, table = active
    after = 0
    # A scan covers the messages that arrived before it started; later ones
    # wait for the next scan, which reads the then active table.
    started = _scan_started()
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    _CHUNK_SQL,
                    {"queue_id": queue.id, "after": after, "limit": CHUNK, "started": started},
                )
                messages = cursor.fetchall()
            if not messages:
                _scan_record(queue, row, result)
                return result
            after = messages[-1][0]
            _process_chunk(queue, row, table, messages, result)


def _scan_record(queue: Queue, row: RuleTable, result: ScanResult) -> None:
    """Replace the queue's last-scan row (DeadLetterScan) with this scan's
    outcome: one upsert, so concurrent handlers on one queue never collide."""
    counts = {name: getattr(result, name) for name in SCAN_COUNTS}
    DeadLetterScan.objects.bulk_create(
        [
            DeadLetterScan(
                queue=queue,
                rule_table_version=row.version,
                finished_at=timezone.now(),
                **counts,
            )
        ],
        update_conflicts=True,
        unique_fields=["queue"],
        update_fields=["rule_table_version", "finished_at", *counts],
    )


def _used(row: RuleTable, ids: list[int]) -> Used:
    return {
        (attempt.message_id, attempt.rule_number): attempt.attempts
        for attempt in DeadLetterAttempt.objects.filter(rule_table=row, message_id__in=ids)
    }


def _attributes(
    dead_letter: Any, headers: Any, content_type: str, put_application: str, put_user: str
) -> dict[str, str | int] | None:
    """The rules' view of a row (jsonb arrives as text through Django's
    connection); None for a message without a dead-letter header."""
    header = json.loads(dead_letter) if isinstance(dead_letter, str) else dead_letter
    if not header:
        return None
    return message_attributes(
        dead_letter=header,
        headers=json.loads(headers) if isinstance(headers, str) else headers,
        content_type=content_type,
        put_application=put_application,
        put_user=put_user,
    )


def _process_chunk(
    queue: Queue,
    row: RuleTable,
    table: RulesTable,
    messages: list[tuple[Any, ...]],
    result: ScanResult,
) -> None:
    used = _used(row, [message[0] for message in messages])
    chunk = _Chunk()
    targets = _Targets()
    for message_id, *columns in messages:
        result.examined += 1
        attributes = _attributes(*columns)
        if attributes is None:
            result.without_header += 1
            logger.warning(
                "message %s on %s has no dead-letter header; left", message_id, queue.name
            )
            chunk.later.append(message_id)
            continue
        _decide(queue, row, table, message_id, attributes, used, chunk, targets, result)
    _write(row, table, chunk, targets)


def _decide(
    queue: Queue,
    row: RuleTable,
    table: RulesTable,
    message_id: int,
    attributes: dict[str, str | int],
    used: Used,
    chunk: _Chunk,
    targets: _Targets,
    result: ScanResult,
) -> None:
    """Take the first applicable rule; at most one try per scan."""
    applicable = applicable_rule(table, attributes, message_id, used)
    if applicable is None:
        result.ignored += 1
        _ignore(queue, row, 0, message_id, used, chunk)
        return
    number, rule = applicable
    problem = _act(rule, message_id, attributes, chunk, targets)
    if problem is not None:
        result.failed += 1
        chunk.failures.append((message_id, number))
        chunk.later.append(message_id)
        what = f"{_describe(rule)}: {problem}"
        chunk.events.append(_event(queue, row, number, message_id, "dlq_action_failed", what))
        return
    _count(rule, result)
    if rule.action == "IGNORE":
        _ignore(queue, row, number, message_id, used, chunk)
    else:
        action = f"dlq_{rule.action.lower()}"
        chunk.events.append(_event(queue, row, number, message_id, action, _describe(rule)))


def _ignore(
    queue: Queue, row: RuleTable, number: int, message_id: int, used: Used, chunk: _Chunk
) -> None:
    """Leave the message for RETRYINT; say so once per message and table."""
    chunk.later.append(message_id)
    if (message_id, number) not in used:
        chunk.first_ignores.append((message_id, number))
        what = "IGNORE" if number else "no rule matched or all were tried: ignored"
        chunk.events.append(_event(queue, row, number, message_id, "dlq_ignore", what))


def _count(rule: Rule, result: ScanResult) -> None:
    if rule.action == "RETRY":
        result.retried += 1
    elif rule.action == "FWD":
        result.forwarded += 1
    elif rule.action == "DISCARD":
        result.discarded += 1
    else:
        result.ignored += 1


def _describe(rule: Rule) -> str:
    if rule.action == "FWD":
        return f"FWD to {rule.fwdq} with HEADER({'YES' if rule.header else 'NO'})"
    return rule.action


def _act(
    rule: Rule,
    message_id: int,
    attributes: dict[str, str | int],
    chunk: _Chunk,
    targets: _Targets,
) -> str | None:
    """Queue the rule's effect in ``chunk``; a reason when it cannot act."""
    if rule.action == "IGNORE":
        return None
    if rule.action == "DISCARD":
        chunk.discards.append(message_id)
        return None
    where = destination(rule, attributes)
    name, manager, keep_header = where.queue, where.manager, where.keep_header
    if manager and manager != settings.LAZARETTO_INSTANCE_NAME:
        return f"queue manager {manager} is not this instance"
    target = targets.get(name)
    if target is None:
        return f"queue {name or '(none)'} does not exist"
    problem = _full(target, chunk)
    if problem is not None:
        return problem
    chunk.moves[(rule.action, target.id, keep_header)].append(message_id)
    chunk.live[target.id] += 1
    return None


def _full(target: Queue, chunk: _Chunk) -> str | None:
    """Why a reject_new target at its limit cannot take one more message, as
    runmqdlq treats a full queue (MQRC_Q_FULL): the action fails and is
    tried again after RETRYINT."""
    if target.id not in chunk.live:
        chunk.live[target.id] = live_count(queue_depths(queue_ids=[target.id])[target.id])
    full = target.max_messages is not None and target.overflow == Overflow.REJECT_NEW
    if full and chunk.live[target.id] >= (target.max_messages or 0):
        return f"queue {target.name} is full ({target.max_messages} messages, reject_new)"
    return None


def _event(
    queue: Queue, row: RuleTable, number: int, message_id: int, action: str, what: str
) -> AuditEntry:
    return AuditEntry(
        action=action,
        queue_name=queue.name,
        message_id=message_id,
        reason=f"rules table version {row.version}, rule {number}: {what}",
        details={"rule_table_version": row.version, "rule": number},
    )


def _write(row: RuleTable, table: RulesTable, chunk: _Chunk, targets: _Targets) -> None:
    """Apply one chunk's decisions; the caller's transaction holds the rows."""
    for (action, target_id, keep_header), ids in chunk.moves.items():
        target = targets.by_id[target_id]
        if action == "RETRY":
            messages_retry_dead_lettered(message_ids=ids, target=target)
        else:
            messages_forward(message_ids=ids, target=target, keep_header=keep_header)
    if chunk.discards:
        messages_discard(message_ids=chunk.discards)
    if chunk.later:
        messages_defer(message_ids=chunk.later, seconds=table.control.retryint)
    with connection.cursor() as cursor:
        for sql, marks in (
            (_COUNT_ATTEMPT_SQL, chunk.failures),
            (_MARK_IGNORED_SQL, chunk.first_ignores),
        ):
            if marks:
                message_ids, rules = zip(*marks, strict=True)
                cursor.execute(
                    sql, {"table": row.id, "ids": list(message_ids), "rules": list(rules)}
                )
    audit_record_many(entries=chunk.events)
    # One count per audit event, once the chunk's transaction has committed.
    actions = Counter(
        (row.version, event.details["rule"], _METRIC_ACTIONS[event.action])
        for event in chunk.events
    )
    transaction.on_commit(
        partial(dead_letter_actions_count, queue_id=row.queue_id, actions=actions), robust=True
    )


# The handler's audit actions as /metrics names them.
_METRIC_ACTIONS = {
    "dlq_retry": "retry",
    "dlq_fwd": "fwd",
    "dlq_discard": "discard",
    "dlq_ignore": "ignore",
    "dlq_action_failed": "failed",
}


# Every waiting message of a dead-letter queue, deferred or not, read without
# locks: what the handler could still do to them.
_WAITING_SQL = """
SELECT id, dead_letter, headers, content_type, put_application, put_user, available_at
FROM broker_message
WHERE queue_id = %(queue_id)s AND state = 'TBDL' AND id > %(after)s
ORDER BY id LIMIT %(limit)s
"""


def dead_letter_next_due(*, queue: Queue) -> datetime | None:
    """When the handler next has something to do on ``queue``: the earliest
    time a waiting message with a rule still to try is due (it may be now),
    or None when every message has been acted on or has used up every
    matching rule (or is ignored). This is what runmqdlq's WAIT(NO) waits
    for before it ends."""
    active = active_table(queue)
    if active is None:
        return None
    row, table = active
    earliest: datetime | None = None
    after = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(_WAITING_SQL, {"queue_id": queue.id, "after": after, "limit": CHUNK})
            messages = cursor.fetchall()
        if not messages:
            return earliest
        after = messages[-1][0]
        used = _used(row, [message[0] for message in messages])
        for message_id, *columns, available_at in messages:
            attributes = _attributes(*columns)
            if attributes is None:
                continue
            applicable = applicable_rule(table, attributes, message_id, used)
            if applicable is None or applicable[1].action == "IGNORE":
                continue
            if earliest is None or available_at < earliest:
                earliest = available_at
