"""The dead-letter handler: process a dead-letter queue by its active rules
table (IBM MQ runmqdlq syntax, parsed by broker.rules).

For each waiting message with a dead-letter header, the first matching rule
whose RETRY count is not yet used up for that message acts:

* RETRY puts the message back on its original queue (TBDL, fresh counters);
* FWD moves it to FWDQ, keeping the dead-letter header for HEADER(YES);
* DISCARD deletes it (with an audit event);
* IGNORE leaves it.

An action fails when its target queue is missing, paused, full (a reject_new
limit reached) or on another instance; the failure counts against that
message and rule, and the message is looked at again after RETRYINT. With no
rule left, the message is ignored. Each scan reads the queue once, in id
order, in chunks locked with FOR UPDATE SKIP LOCKED: several handlers on one
queue never act on the same message.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from broker.models import (
    AuditEvent,
    DeadLetterAttempt,
    Overflow,
    Queue,
    QueueKind,
    RuleTable,
    RuleTableStatus,
)
from broker.rules import Rule, RulesTable, matching_rules, parse, reason_code
from broker.selectors import live_count, queue_depths
from broker.services.audit import SYSTEM_ACTOR
from broker.signals import messages_available

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
_MOVE_SQL = """
UPDATE broker_message
SET queue_id = %(target)s, attempts = 0, crash_count = 0, suspect = false,
    available_at = now(), updated_at = now(),
    dead_letter = CASE WHEN %(keep_header)s THEN dead_letter ELSE NULL END
WHERE id = ANY(%(ids)s)
"""
_LATER_SQL = """
UPDATE broker_message SET available_at = now() + make_interval(secs => %(seconds)s)
WHERE id = ANY(%(ids)s)
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

TEXT_FORMATS = ("text/", "application/json", "application/xml")


@cache
def _parsed(table_id: int, text: str) -> RulesTable:
    result = parse(text)
    if result.table is None:  # activation refuses invalid tables
        raise ValueError(f"rules table {table_id} is not valid")
    return result.table


def active_table(queue: Queue) -> tuple[RuleTable, RulesTable] | None:
    """The queue's active table version and its parsed rules."""
    row = RuleTable.objects.filter(queue=queue, status=RuleTableStatus.ACTIVE).first()
    if row is None:
        return None
    return row, _parsed(row.id, row.text)


def _int_header(headers: dict[str, str], name: str, default: int) -> int:
    try:
        return int(headers.get(name, default))
    except (TypeError, ValueError):
        return default


def mq_format(content_type: str, headers: dict[str, str]) -> str:
    """MQ's FORMAT: the ``mq-format`` header, else MQSTR for text."""
    if "mq-format" in headers:
        return headers["mq-format"]
    text = content_type.startswith(TEXT_FORMATS) or content_type.endswith(("+json", "+xml"))
    return "MQSTR" if text else ""


def message_attributes(
    *,
    dead_letter: dict[str, Any],
    headers: dict[str, str],
    content_type: str,
    put_application: str,
    put_user: str,
) -> dict[str, str | int]:
    """What the rules' patterns match against, in MQ's terms."""
    try:
        reason = reason_code(str(dead_letter.get("reason", "")))
    except KeyError:
        reason = 0
    return {
        "DESTQ": str(dead_letter.get("original_queue", "")),
        "DESTQM": settings.LAZARETTO_INSTANCE_NAME,
        "REASON": reason,
        "APPLNAME": put_application,
        "USERID": put_user,
        "FORMAT": mq_format(content_type, headers),
        "APPLIDAT": headers.get("mq-appl-identity-data", ""),
        "APPLTYPE": _int_header(headers, "mq-appl-type", 0),
        "PERSIST": _int_header(headers, "mq-persistence", 1),
        "MSGTYPE": _int_header(headers, "mq-msg-type", 8),
        "FEEDBACK": _int_header(headers, "mq-feedback", 0),
        "REPLYQ": headers.get("mq-reply-to-q", ""),
        "REPLYQM": headers.get("mq-reply-to-qm", ""),
    }


@dataclass
class ScanResult:
    examined: int = 0
    retried: int = 0
    forwarded: int = 0
    discarded: int = 0
    ignored: int = 0
    failed: int = 0
    without_header: int = 0

    @property
    def acted(self) -> int:
        """Messages that left the dead-letter queue."""
        return self.retried + self.forwarded + self.discarded


@dataclass
class _Chunk:
    """What one chunk decided, written in a few set-based statements."""

    moves: dict[tuple[int, bool], list[int]] = field(default_factory=lambda: defaultdict(list))
    discards: list[int] = field(default_factory=list)
    later: list[int] = field(default_factory=list)
    failures: list[tuple[int, int]] = field(default_factory=list)
    # Messages ignored for the first time under this table (rule 0: no rule
    # matched or all were used up), so the audit log says so only once.
    first_ignores: list[tuple[int, int]] = field(default_factory=list)
    events: list[AuditEvent] = field(default_factory=list)
    # Live depth of each target, counting this chunk's own moves.
    live: dict[int, int] = field(default_factory=dict)


class _Targets:
    """Target queues by name, loaded once per chunk."""

    def __init__(self) -> None:
        self._queues: dict[str, Queue | None] = {}

    def get(self, name: str) -> Queue | None:
        if name not in self._queues:
            self._queues[name] = Queue.objects.filter(name=name).first()
        return self._queues[name]


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
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (started,) = cursor.fetchone() or (None,)
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    _CHUNK_SQL,
                    {"queue_id": queue.id, "after": after, "limit": CHUNK, "started": started},
                )
                messages = cursor.fetchall()
            if not messages:
                return result
            after = messages[-1][0]
            _process_chunk(queue, row, table, messages, result)


def _process_chunk(
    queue: Queue,
    row: RuleTable,
    table: RulesTable,
    messages: list[tuple[Any, ...]],
    result: ScanResult,
) -> None:
    ids = [message[0] for message in messages]
    used: dict[tuple[int, int], int] = {
        (attempt.message_id, attempt.rule_number): attempt.attempts
        for attempt in DeadLetterAttempt.objects.filter(rule_table=row, message_id__in=ids)
    }
    chunk = _Chunk()
    targets = _Targets()
    for message_id, dead_letter, headers, content_type, put_application, put_user in messages:
        result.examined += 1
        # Django has psycopg hand jsonb over as text.
        header = json.loads(dead_letter) if dead_letter else None
        if not header:
            result.without_header += 1
            logger.warning(
                "message %s on %s has no dead-letter header; left", message_id, queue.name
            )
            chunk.later.append(message_id)
            continue
        attributes = message_attributes(
            dead_letter=header,
            headers=json.loads(headers),
            content_type=content_type,
            put_application=put_application,
            put_user=put_user,
        )
        _decide(queue, row, table, message_id, attributes, used, chunk, targets, result)
    _write(queue, row, table, chunk)


def _decide(
    queue: Queue,
    row: RuleTable,
    table: RulesTable,
    message_id: int,
    attributes: dict[str, str | int],
    used: dict[tuple[int, int], int],
    chunk: _Chunk,
    targets: _Targets,
    result: ScanResult,
) -> None:
    """Take the first matching rule with tries left; at most one try per scan."""
    for number, rule in matching_rules(table, attributes):
        if used.get((message_id, number), 0) >= rule.retry:
            continue
        problem = _act(rule, message_id, attributes, chunk, targets)
        if problem is None:
            _count(rule, result)
            if rule.action == "IGNORE":
                _ignore(queue, row, number, message_id, used, chunk)
            else:
                action = f"dlq_{rule.action.lower()}"
                chunk.events.append(_event(queue, row, number, message_id, action, _describe(rule)))
            return
        result.failed += 1
        chunk.failures.append((message_id, number))
        chunk.later.append(message_id)
        chunk.events.append(
            _event(
                queue, row, number, message_id, "dlq_action_failed", f"{_describe(rule)}: {problem}"
            )
        )
        return
    result.ignored += 1
    _ignore(queue, row, 0, message_id, used, chunk)


def _ignore(
    queue: Queue,
    row: RuleTable,
    number: int,
    message_id: int,
    used: dict[tuple[int, int], int],
    chunk: _Chunk,
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
    if rule.action == "RETRY":
        name, manager, keep_header = str(attributes["DESTQ"]), None, True
    else:
        name = _resolve(rule.fwdq or "", attributes)
        manager = _resolve(rule.fwdqm, attributes) if rule.fwdqm else None
        keep_header = rule.header
    if manager and manager != settings.LAZARETTO_INSTANCE_NAME:
        return f"queue manager {manager} is not this instance"
    target = targets.get(name)
    problem = _unavailable(name, target, chunk)
    if problem is not None or target is None:
        return problem
    chunk.moves[(target.id, keep_header)].append(message_id)
    chunk.live[target.id] += 1
    return None


def _resolve(value: str, attributes: dict[str, str | int]) -> str:
    """FWDQ / FWDQM values, with &DESTQ, &REPLYQ, &DESTQM, &REPLYQM resolved."""
    return str(attributes[value[1:]]) if value.startswith("&") else value


def _unavailable(name: str, target: Queue | None, chunk: _Chunk) -> str | None:
    if target is None:
        return f"queue {name or '(none)'} does not exist"
    if target.paused:
        return f"queue {name} is paused"
    if target.id not in chunk.live:
        chunk.live[target.id] = live_count(queue_depths(queue_ids=[target.id])[target.id])
    full = target.max_messages is not None and target.overflow == Overflow.REJECT_NEW
    if full and chunk.live[target.id] >= (target.max_messages or 0):
        return f"queue {name} is full ({target.max_messages} messages, reject_new)"
    return None


def _event(
    queue: Queue, row: RuleTable, number: int, message_id: int, action: str, what: str
) -> AuditEvent:
    return AuditEvent(
        actor_name=SYSTEM_ACTOR,
        action=action,
        queue_name=queue.name,
        message_id=message_id,
        reason=f"rules table version {row.version}, rule {number}: {what}",
        details={"rule_table_version": row.version, "rule": number},
    )


def _write(queue: Queue, row: RuleTable, table: RulesTable, chunk: _Chunk) -> None:
    """Apply one chunk's decisions; the caller's transaction holds the rows."""
    gone: list[int] = list(chunk.discards)
    with connection.cursor() as cursor:
        for (target_id, keep_header), ids in chunk.moves.items():
            cursor.execute(_MOVE_SQL, {"target": target_id, "keep_header": keep_header, "ids": ids})
            gone += ids
        if chunk.discards:
            cursor.execute("DELETE FROM broker_message WHERE id = ANY(%s)", [chunk.discards])
        if chunk.later:
            cursor.execute(_LATER_SQL, {"seconds": table.control.retryint, "ids": chunk.later})
        for sql, marks in (
            (_COUNT_ATTEMPT_SQL, chunk.failures),
            (_MARK_IGNORED_SQL, chunk.first_ignores),
        ):
            if marks:
                message_ids, rules = zip(*marks, strict=True)
                cursor.execute(
                    sql, {"table": row.id, "ids": list(message_ids), "rules": list(rules)}
                )
    if gone:
        DeadLetterAttempt.objects.filter(message_id__in=gone).delete()
    AuditEvent.objects.bulk_create(chunk.events)
    for (target_id, _), ids in chunk.moves.items():
        target = Queue.objects.get(id=target_id)
        if target.kind == QueueKind.STANDARD:
            messages_available.send(sender=Queue, queue=target, count=len(ids))
