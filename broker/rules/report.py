"""A validation report made of plain data, ready to serialize as JSON."""

from __future__ import annotations

from typing import Any

from .model import RuleError
from .parser import read_table


def validation_report(text: str, *, instance: str | None = None) -> dict[str, Any]:
    """Errors and everything that could be read, even from an invalid table,
    so an editor can show both at once.

    The shape is ``{"valid": bool, "control": {KEYWORD: value}, "rules":
    [{"line": n, "keywords": {KEYWORD: value}}], "errors": [{"line": n,
    "column": n, "message": str}], "warnings": [...]}``, warnings shaped as
    errors. Warnings leave a table valid; ``instance`` (this installation's
    queue manager name) lets them name a FWDQM that is another one. Values are as the entries hold them:
    quotes removed, unquoted text in upper case, symbolic names as written.
    Keywords with invalid values are left out.
    """
    draft = read_table(text, instance=instance)
    return {
        "valid": not draft.errors,
        "control": dict(draft.control),
        "rules": [{"line": rule.line, "keywords": dict(rule.keywords)} for rule in draft.rules],
        "errors": [_located(error) for error in draft.errors],
        "warnings": [_located(warning) for warning in draft.warnings],
    }


def _located(problem: RuleError) -> dict[str, Any]:
    return {"line": problem.line, "column": problem.column, "message": problem.message}
