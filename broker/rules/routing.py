"""What a rules table does with one dead-letter message.

The dead-letter handler and replay jobs decide alike: the message's
attributes (what patterns match: DESTQ, REASON, FORMAT, …) come from its
stored fields by ``message_attributes``, and the first matching rule whose
RETRY count is not used up acts (``applicable_rule``). A replay takes each
message once, so nothing is used up yet; ``replay_route`` says where the
message goes.

``route_rows`` runs on Spark executors over a partition of rows: like the
rest of this package it needs nothing but the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from .matcher import matching_rules
from .model import Rule, RulesTable
from .parser import parse
from .symbols import reason_code

TEXT_FORMATS = ("text/", "application/json", "application/xml")

Attributes = dict[str, str | int]
# (message id, rule number) -> tries of that rule on that message.
Used = Mapping[tuple[int, int], int]


def mq_format(content_type: str, headers: Mapping[str, Any]) -> str:
    """MQ's FORMAT: the ``mq-format`` header, else MQSTR for text."""
    if "mq-format" in headers:
        return str(headers["mq-format"])
    text = content_type.startswith(TEXT_FORMATS) or content_type.endswith(("+json", "+xml"))
    return "MQSTR" if text else ""


def _int_header(headers: Mapping[str, Any], name: str, default: int) -> int:
    try:
        return int(headers.get(name, default))
    except (TypeError, ValueError):
        return default


def message_attributes(
    *,
    dead_letter: Mapping[str, Any],
    headers: Mapping[str, Any],
    content_type: str,
    put_application: str,
    put_user: str,
    queue_manager: str,
) -> Attributes:
    """What the rules' patterns match against, in MQ's terms;
    ``queue_manager`` is this instance's name (DESTQM)."""
    try:
        reason = reason_code(str(dead_letter.get("reason", "")))
    except KeyError:
        reason = 0
    return {
        "DESTQ": str(dead_letter.get("original_queue", "")),
        "DESTQM": queue_manager,
        "REASON": reason,
        "APPLNAME": put_application,
        "USERID": put_user,
        "FORMAT": mq_format(content_type, headers),
        "APPLIDAT": str(headers.get("mq-appl-identity-data", "")),
        "APPLTYPE": _int_header(headers, "mq-appl-type", 0),
        "PERSIST": _int_header(headers, "mq-persistence", 1),
        "MSGTYPE": _int_header(headers, "mq-msg-type", 8),
        "FEEDBACK": _int_header(headers, "mq-feedback", 0),
        "REPLYQ": str(headers.get("mq-reply-to-q", "")),
        "REPLYQM": str(headers.get("mq-reply-to-qm", "")),
    }


def applicable_rule(
    table: RulesTable, attributes: Attributes, message_id: int, used: Used
) -> tuple[int, Rule] | None:
    """The first matching rule (numbered from 1) whose RETRY count is not used
    up for this message; None means the message is ignored."""
    for number, rule in matching_rules(table, attributes):
        if used.get((message_id, number), 0) < rule.retry:
            return number, rule
    return None


def resolve(value: str, attributes: Attributes) -> str:
    """FWDQ / FWDQM values, with &DESTQ, &REPLYQ, &DESTQM, &REPLYQM resolved."""
    return str(attributes[value[1:]]) if value.startswith("&") else value


@dataclass(frozen=True)
class Destination:
    """Where a rule sends a message: a queue (and queue manager, None for
    this instance), keeping the dead-letter header or not; or nowhere."""

    action: str
    queue: str = ""
    manager: str | None = None
    keep_header: bool = True


def destination(rule: Rule, attributes: Attributes) -> Destination:
    """The effect of ``rule`` on a message: RETRY goes back to DESTQ, FWD to
    FWDQ (at FWDQM); DISCARD and IGNORE go nowhere."""
    if rule.action == "RETRY":
        return Destination("RETRY", str(attributes["DESTQ"]))
    if rule.action == "FWD":
        manager = resolve(rule.fwdqm, attributes) if rule.fwdqm else None
        return Destination("FWD", resolve(rule.fwdq or "", attributes), manager, rule.header)
    return Destination(rule.action)


# What a replay decided for one message: write it to a queue, skip it (the
# rules discard or ignore it), or fail it (no queue to write it to).
WRITE = "write"
SKIP = "skip"
FAIL = "fail"


@dataclass(frozen=True)
class Route:
    verdict: str
    target: str
    rule: int
    keep_header: bool


def replay_route(
    table: RulesTable | None, attributes: Attributes, target: str, queue_manager: str
) -> Route:
    """Where a replay sends a message: to ``target`` (its original queue or
    the job's named queue) without a table; with one, as the handler's first
    look at it would: RETRY to ``target``, FWD to FWDQ, DISCARD, IGNORE or no
    matching rule skip it. A forward to another queue manager fails."""
    if table is None:
        return Route(WRITE if target else FAIL, target, 0, True)
    applicable = applicable_rule(table, attributes, 0, {})
    if applicable is None:
        return Route(SKIP, "", 0, True)
    number, rule = applicable
    where = destination(rule, attributes)
    if where.action == "RETRY":
        return Route(WRITE if target else FAIL, target, number, True)
    if where.action != "FWD":
        return Route(SKIP, "", number, True)
    if where.manager and where.manager != queue_manager:
        return Route(FAIL, where.queue, number, where.keep_header)
    return Route(WRITE if where.queue else FAIL, where.queue, number, where.keep_header)


@cache
def _table(text: str) -> RulesTable:
    result = parse(text)
    if result.table is None:
        raise ValueError("the rules table has errors; a replay job validates it at submission")
    return result.table


def rules_in(rules_text: str) -> int:
    """How many rules the table in ``rules_text`` has (none for a blank
    text): the numbers ``route_rows`` gives are 0 to that."""
    return len(_table(rules_text).rules) if rules_text.strip() else 0


def _json(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    loaded = json.loads(value) if isinstance(value, str | bytes) else value
    return loaded if isinstance(loaded, dict) else {}


def route_rows(
    rows: Iterable[Any], *, rules_text: str, target: str, queue_manager: str
) -> Iterator[tuple[int, str, str, int, bool]]:
    """Route a partition of source rows (fields id, original_queue,
    dead_letter, headers, content_type, put_application, put_user; JSON as
    text) by the rules table in ``rules_text``. ``target`` blank means each
    message's original queue. Yields (id, verdict, target, rule number, keep
    header)."""
    table = _table(rules_text) if rules_text.strip() else None
    for row in rows:
        dead_letter = _json(row["dead_letter"])
        headers = _json(row["headers"])
        attributes = message_attributes(
            dead_letter=dead_letter,
            headers=headers,
            content_type=row["content_type"] or "",
            put_application=row["put_application"] or "",
            put_user=row["put_user"] or "",
            queue_manager=queue_manager,
        )
        original = str(row["original_queue"] or "")
        route = replay_route(table, attributes, target or original, queue_manager)
        yield row["id"], route.verdict, route.target, route.rule, route.keep_header
