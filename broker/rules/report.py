"""A validation report made of plain data, ready to serialize as JSON."""

from __future__ import annotations

from typing import Any

from .parser import read_table


def validation_report(text: str) -> dict[str, Any]:
    """Errors and everything that could be read, even from an invalid table,
    so an editor can show both at once.

    The shape is ``{"valid": bool, "control": {KEYWORD: value}, "rules":
    [{"line": n, "keywords": {KEYWORD: value}}], "errors": [{"line": n,
    "column": n, "message": str}]}``. Values are as the entries hold them:
    quotes removed, unquoted text in upper case, symbolic names as written.
    Keywords with invalid values are left out.
    """
    draft = read_table(text)
    return {
        "valid": not draft.errors,
        "control": dict(draft.control),
        "rules": [{"line": rule.line, "keywords": dict(rule.keywords)} for rule in draft.rules],
        "errors": [
            {"line": error.line, "column": error.column, "message": error.message}
            for error in draft.errors
        ],
    }
