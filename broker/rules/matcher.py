"""Finding the rules that apply to a dead-letter message.

runmqdlq tries the matching rules in table order: the first one's action,
and the next one's only when the first has used up its retries. So the
answer is every matching rule, in order, with its number in the table for
reports and counters.
"""

from __future__ import annotations

from .model import Rule, RulesTable
from .pattern import Message


def rule_matches(rule: Rule, message: Message) -> bool:
    """Whether the rule's pattern fits the message (keys as in ``Message``)."""
    return rule.pattern.matches(message)


def matching_rules(table: RulesTable, message: Message) -> list[tuple[int, Rule]]:
    """The matching rules in table order, each with its 1-based number."""
    return [
        (number, rule)
        for number, rule in enumerate(table.rules, start=1)
        if rule.pattern.matches(message)
    ]
