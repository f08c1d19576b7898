"""Rules tables for the tests of broker.rules, which is pure Python: nothing
here imports Django."""

from __future__ import annotations

from broker.rules import RulesTable, parse


def table_of(text: str) -> RulesTable:
    """The table ``text`` parses to; fails the test, with the parse errors,
    when it does not parse."""
    result = parse(text)
    assert result.table is not None, result.errors
    return result.table
