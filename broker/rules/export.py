"""Writing a table back as runmqdlq text.

The output is canonical: one entry per line, keywords in a fixed order,
values unquoted whenever reading them back unquoted gives the same value.
Parsing the output gives back an equal table, which is what lets a table be
stored or shown as text and edited by hand.
"""

from __future__ import annotations

from collections.abc import Mapping

from .keywords import CANONICAL_ORDER
from .model import RulesTable
from .scanner import QUOTE, fold_case

# Characters that end an unquoted value, or that a reader could not get back.
_NEEDS_QUOTES = frozenset(" \t,()'")
_LINE_BREAKS = frozenset("\n\r")


def export(table: RulesTable) -> str:
    """The table as text; raises ValueError for a value holding a line break,
    which the rules-table language cannot express."""
    entries = [rule.keywords for rule in table.rules]
    if table.control.keywords:
        entries.insert(0, table.control.keywords)
    return "".join(_entry_line(keywords) + "\n" for keywords in entries)


def _entry_line(keywords: Mapping[str, str]) -> str:
    ordered = sorted(keywords, key=_canonical_rank)
    return " ".join(f"{keyword}({_value_text(keywords[keyword])})" for keyword in ordered)


def _canonical_rank(keyword: str) -> tuple[int, str]:
    """Known keywords in their canonical order; any others after them, by name."""
    if keyword in CANONICAL_ORDER:
        return CANONICAL_ORDER.index(keyword), ""
    return len(CANONICAL_ORDER), keyword


def _value_text(value: str) -> str:
    if not _LINE_BREAKS.isdisjoint(value):
        raise ValueError(f"a rules table value cannot contain a line break: {value!r}")
    if value and fold_case(value) == value and _NEEDS_QUOTES.isdisjoint(value):
        return value
    return QUOTE + value.replace(QUOTE, QUOTE * 2) + QUOTE
