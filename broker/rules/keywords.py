"""The keywords of a rules table: their role and the values each accepts.

Every check receives a non-empty value after quote removal and case folding
and returns an error message, or None when the value is acceptable. Checks
look at one value only; rules that relate keywords to each other (FWD needs
FWDQ, ...) live in the parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from .symbols import SYMBOLIC_NAMES, is_unsigned_integer

WILDCARDS = frozenset("*?")
MQLONG_MAX = 2_147_483_647
RETRY_MAX = 999_999_999
_SYMBOLIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")

ValueCheck = Callable[[str, str], str | None]
"""(keyword, value) -> error message, or None when the value is valid."""


class Role(Enum):
    """Which kind of entry a keyword belongs to."""

    CONTROL = "control"
    PATTERN = "pattern"
    ACTION = "action"


@dataclass(frozen=True)
class KeywordSpec:
    name: str
    role: Role
    check: ValueCheck


def _too_long(keyword: str, value: str, max_length: int) -> str | None:
    if len(value) <= max_length:
        return None
    return f"{keyword} value is {len(value)} characters long; at most {max_length} are allowed"


def _has_wildcard(value: str) -> bool:
    return not WILDCARDS.isdisjoint(value)


def _at_most(max_length: int) -> ValueCheck:
    """A string pattern (where ``*`` and ``?`` are wildcards) or a control
    data name: any text that fits the MQ field."""

    def check(keyword: str, value: str) -> str | None:
        return _too_long(keyword, value, max_length)

    return check


def _numeric_pattern(keyword: str, value: str) -> str | None:
    """A number, a symbolic name of the keyword's family, or a lone ``*``.

    Partial wildcards make no sense for a number (``REASON(20*)``), so a
    wildcard is only accepted as the whole value.
    """
    if value == "*":
        return None
    if _has_wildcard(value):
        return f"wildcards in {keyword} are allowed only as a lone '*'"
    if is_unsigned_integer(value):
        return _out_of_range(keyword, value, 0, MQLONG_MAX)
    if _looks_symbolic(value):
        if value in SYMBOLIC_NAMES[keyword]:
            return None
        return f"unknown symbolic name {value} for {keyword}"
    return (
        f"invalid {keyword} value {value!r}: "
        "expected a non-negative integer, a symbolic name or '*'"
    )


def _looks_symbolic(value: str) -> bool:
    return _SYMBOLIC_NAME.fullmatch(value) is not None


def _out_of_range(keyword: str, value: str, low: int, high: int) -> str | None:
    if low <= int(value) <= high:
        return None
    return f"{keyword} value {value} is out of range ({low} to {high})"


def _choice(*options: str) -> ValueCheck:
    """One of a fixed set of words, such as ACTION's."""

    def check(keyword: str, value: str) -> str | None:
        if value in options:
            return None
        if _has_wildcard(value):
            return f"wildcards are not allowed in {keyword}"
        expected = ", ".join(options[:-1]) + f" or {options[-1]}"
        return f"invalid {keyword} value {value!r}: expected {expected}"

    return check


def _forward_name(*references: str) -> ValueCheck:
    """FWDQ and FWDQM: a name, or a reference to a field of the message."""

    def check(keyword: str, value: str) -> str | None:
        if _has_wildcard(value):
            return f"wildcards are not allowed in {keyword}"
        if value.startswith("&") and value not in references:
            allowed = " or ".join(references)
            return f"invalid {keyword} value {value!r}: the only references allowed are {allowed}"
        return _too_long(keyword, value, 48)

    return check


def _retry(keyword: str, value: str) -> str | None:
    if _has_wildcard(value):
        return f"wildcards are not allowed in {keyword}"
    if not is_unsigned_integer(value):
        return f"invalid {keyword} value {value!r}: expected an integer from 1 to {RETRY_MAX}"
    return _out_of_range(keyword, value, 1, RETRY_MAX)


def _seconds(keyword: str, value: str) -> str | None:
    if not is_unsigned_integer(value):
        return f"invalid {keyword} value {value!r}: expected a non-negative number of seconds"
    return _out_of_range(keyword, value, 0, MQLONG_MAX)


def _wait(keyword: str, value: str) -> str | None:
    if value in ("YES", "NO"):
        return None
    if not is_unsigned_integer(value):
        return (
            f"invalid {keyword} value {value!r}: "
            "expected YES, NO or a non-negative number of seconds"
        )
    return _out_of_range(keyword, value, 0, MQLONG_MAX)


_SPECS = (
    KeywordSpec("INPUTQ", Role.CONTROL, _at_most(48)),
    KeywordSpec("INPUTQM", Role.CONTROL, _at_most(48)),
    KeywordSpec("RETRYINT", Role.CONTROL, _seconds),
    KeywordSpec("WAIT", Role.CONTROL, _wait),
    KeywordSpec("APPLIDAT", Role.PATTERN, _at_most(32)),
    KeywordSpec("APPLNAME", Role.PATTERN, _at_most(28)),
    KeywordSpec("APPLTYPE", Role.PATTERN, _numeric_pattern),
    KeywordSpec("DESTQ", Role.PATTERN, _at_most(48)),
    KeywordSpec("DESTQM", Role.PATTERN, _at_most(48)),
    KeywordSpec("FEEDBACK", Role.PATTERN, _numeric_pattern),
    KeywordSpec("FORMAT", Role.PATTERN, _at_most(8)),
    KeywordSpec("MSGTYPE", Role.PATTERN, _numeric_pattern),
    KeywordSpec("PERSIST", Role.PATTERN, _numeric_pattern),
    KeywordSpec("REASON", Role.PATTERN, _numeric_pattern),
    KeywordSpec("REPLYQ", Role.PATTERN, _at_most(48)),
    KeywordSpec("REPLYQM", Role.PATTERN, _at_most(48)),
    KeywordSpec("USERID", Role.PATTERN, _at_most(12)),
    KeywordSpec("ACTION", Role.ACTION, _choice("DISCARD", "IGNORE", "RETRY", "FWD")),
    KeywordSpec("FWDQ", Role.ACTION, _forward_name("&DESTQ", "&REPLYQ")),
    KeywordSpec("FWDQM", Role.ACTION, _forward_name("&DESTQM", "&REPLYQM")),
    KeywordSpec("HEADER", Role.ACTION, _choice("YES", "NO")),
    KeywordSpec("PUTAUT", Role.ACTION, _choice("DEF", "CTX")),
    KeywordSpec("RETRY", Role.ACTION, _retry),
)

KEYWORDS: Mapping[str, KeywordSpec] = {spec.name: spec for spec in _SPECS}
"""Every keyword by name, in the canonical order ``export`` writes them."""

CANONICAL_ORDER: tuple[str, ...] = tuple(KEYWORDS)
