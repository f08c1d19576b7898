"""Versioned rules tables of dead-letter queues: draft, validate, dry-run,
activate, roll back."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from broker.errors import (
    InvalidInput,
    NotADraft,
    NothingToRollBack,
    RulesInvalid,
    RuleTableNotFound,
)
from broker.models import Queue, QueueKind, RuleTable, RuleTableStatus
from broker.rules import matching_rules, parse, validation_report
from broker.selectors import active_rule_table
from broker.services.audit import Actor, audit_record
from broker.services.dead_letters import message_attributes
from broker.services.transitions.dead_lettered import messages_wake_deferred

MAX_TEXT = 200_000
SAMPLES = 5
_DRY_RUN_CHUNK = 2000


def rule_table_get(*, table_id: int) -> RuleTable:
    table = RuleTable.objects.select_related("queue").filter(id=table_id).first()
    if table is None:
        raise RuleTableNotFound(f"There is no rules table {table_id}.")
    return table


def rule_table_report(*, text: str, queue: Queue) -> dict[str, Any]:
    """``broker.rules.validation_report`` for this instance, plus the checks
    that need the queue: INPUTQ must name it and INPUTQM this instance."""
    report = validation_report(text, instance=settings.LAZARETTO_INSTANCE_NAME)
    control = report["control"]
    extra = []
    if control.get("INPUTQ") not in (None, queue.name):
        extra.append(f"INPUTQ({control['INPUTQ']}) is not this table's queue {queue.name}.")
    if control.get("INPUTQM") not in (None, settings.LAZARETTO_INSTANCE_NAME):
        extra.append(
            f"INPUTQM({control['INPUTQM']}) is not this instance "
            f"({settings.LAZARETTO_INSTANCE_NAME})."
        )
    report["errors"] += [{"line": 1, "column": 1, "message": message} for message in extra]
    report["valid"] = not report["errors"]
    return report


def _checked_text(text: str) -> str:
    if not text.strip():
        raise InvalidInput("The rules table is empty.", field_errors={"text": ["Enter a table."]})
    if len(text) > MAX_TEXT:
        problem = f"A rules table may hold at most {MAX_TEXT:,} characters."
        raise InvalidInput(problem, field_errors={"text": [problem]})
    return text


@transaction.atomic
def rule_table_create(*, queue: Queue, text: str, actor: Actor = None) -> RuleTable:
    """A new draft version for a dead-letter queue. Drafts may hold errors;
    only activation insists on a valid table."""
    if queue.kind != QueueKind.DEAD_LETTER:
        problem = f"{queue.name} is not a dead-letter queue."
        raise InvalidInput(problem, field_errors={"queue": [problem]})
    # Lock the queue so two drafts cannot take the same version number.
    Queue.objects.select_for_update().filter(id=queue.id).first()
    latest = RuleTable.objects.filter(queue=queue).aggregate(latest=Max("version"))["latest"]
    table = RuleTable.objects.create(
        queue=queue,
        version=(latest or 0) + 1,
        text=_checked_text(text),
        created_by=actor if actor is not None and actor.is_authenticated else None,
    )
    audit_record(
        action="rule_table_create",
        actor=actor,
        queue_name=queue.name,
        details={"version": table.version},
    )
    return table


@transaction.atomic
def rule_table_update(*, table: RuleTable, text: str, actor: Actor = None) -> RuleTable:
    """Change a draft's text; an activated version never changes."""
    if table.status != RuleTableStatus.DRAFT:
        raise NotADraft(
            f"Version {table.version} has been activated and cannot change; create a new draft."
        )
    table.text = _checked_text(text)
    table.save(update_fields=["text"])
    audit_record(
        action="rule_table_update",
        actor=actor,
        queue_name=table.queue.name,
        details={"version": table.version},
    )
    return table


@transaction.atomic
def rule_table_activate(*, table: RuleTable, actor: Actor = None) -> RuleTable:
    """Make ``table`` the queue's active version (the previous one retires).
    The handler picks it up at its next scan, and every waiting message of
    the queue is looked at again under the new rules."""
    report = rule_table_report(text=table.text, queue=table.queue)
    if not report["valid"]:
        raise RulesInvalid(
            f"Version {table.version} has {len(report['errors'])} error(s) and cannot be activated.",
            errors=report["errors"],
        )
    Queue.objects.select_for_update().filter(id=table.queue_id).first()
    RuleTable.objects.filter(queue_id=table.queue_id, status=RuleTableStatus.ACTIVE).exclude(
        id=table.id
    ).update(status=RuleTableStatus.RETIRED)
    table.status = RuleTableStatus.ACTIVE
    table.activated_at = timezone.now()
    table.save(update_fields=["status", "activated_at"])
    messages_wake_deferred(queue_id=table.queue_id)
    audit_record(
        action="rule_table_activate",
        actor=actor,
        queue_name=table.queue.name,
        details={"version": table.version},
    )
    return table


@transaction.atomic
def rule_table_create_and_activate(*, queue: Queue, text: str, actor: Actor = None) -> RuleTable:
    """A new version of ``queue``'s rules table, active at once; an empty
    text or a table with errors stores nothing (``InvalidInput``,
    ``RulesInvalid``)."""
    _checked_text(text)
    report = rule_table_report(text=text, queue=queue)
    if not report["valid"]:
        raise RulesInvalid(
            f"The table has {len(report['errors'])} error(s) and cannot be activated; "
            "nothing was stored.",
            errors=report["errors"],
        )
    table = rule_table_create(queue=queue, text=text, actor=actor)
    return rule_table_activate(table=table, actor=actor)


@transaction.atomic
def rule_table_rollback(*, queue: Queue, actor: Actor = None) -> RuleTable:
    """Re-activate the version that was active before the current one."""
    current = active_rule_table(queue=queue)
    previous = (
        RuleTable.objects.filter(
            queue=queue, status=RuleTableStatus.RETIRED, activated_at__isnull=False
        )
        .order_by("-activated_at")
        .first()
    )
    if previous is None:
        raise NothingToRollBack(f"{queue.name} has no earlier active rules table.")
    table = rule_table_activate(table=previous, actor=actor)
    audit_record(
        action="rule_table_rollback",
        actor=actor,
        queue_name=queue.name,
        details={"from": current.version if current else None, "to": table.version},
    )
    return table


@dataclass
class DryRun:
    """What the table would do to the queue's waiting messages now."""

    examined: int = 0
    without_header: int = 0
    ignored: int = 0
    hits: Counter[int] = field(default_factory=Counter)
    samples: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def as_dict(self, table: Any) -> dict[str, Any]:
        return {
            "examined": self.examined,
            "without_header": self.without_header,
            "ignored": self.ignored,
            "rules": [
                {
                    "rule": number,
                    "line": rule.line,
                    "action": rule.action,
                    "hits": self.hits[number],
                    "samples": self.samples[number],
                }
                for number, rule in enumerate(table.rules, start=1)
            ],
        }


def rule_table_dry_run(*, table: RuleTable) -> dict[str, Any]:
    """Per-rule hit counts and sample message ids over the queue's waiting
    messages, by first match; nothing changes."""
    result = parse(table.text)
    if result.table is None:
        raise RulesInvalid(
            "A table with errors cannot be dry-run.",
            errors=[error.__dict__ for error in result.errors],
        )
    run = DryRun()
    after = 0
    while True:
        rows = list(
            table.queue.message_set.filter(state="TBDL", id__gt=after)
            .order_by("id")
            .values_list(
                "id", "dead_letter", "headers", "content_type", "put_application", "put_user"
            )[:_DRY_RUN_CHUNK]
        )
        if not rows:
            return run.as_dict(result.table)
        after = rows[-1][0]
        for message_id, header, headers, content_type, application, user in rows:
            run.examined += 1
            if not header:
                run.without_header += 1
                continue
            attributes = message_attributes(
                dead_letter=header,
                headers=headers,
                content_type=content_type,
                put_application=application,
                put_user=user,
            )
            first = next(iter(matching_rules(result.table, attributes)), None)
            if first is None:
                run.ignored += 1
                continue
            number = first[0]
            run.hits[number] += 1
            if len(run.samples[number]) < SAMPLES:
                run.samples[number].append(message_id)
