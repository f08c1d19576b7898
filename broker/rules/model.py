"""The parsed form of a rules table.

Entries keep their keywords as the table wrote them (after quote removal and
case folding), so a table can be reported and exported without losing the
author's choices: a symbolic REASON stays symbolic, a left-out keyword stays
left out. The typed properties add the defaults runmqdlq assumes for
keywords that were left out.

Tables compare by content: a rule's ``line`` is where it happened to be
written and takes no part in equality, so a table equals its own export
parsed back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .pattern import Pattern

DEFAULT_RETRYINT = 60
DEFAULT_RETRY = 1


@dataclass(frozen=True)
class RuleError:
    """A problem in the table text, at the 1-based line and column of its cause."""

    line: int
    column: int
    message: str


@dataclass(frozen=True)
class Control:
    """The optional first entry: which queue to serve and how to pace it."""

    keywords: dict[str, str] = field(default_factory=dict)

    @property
    def inputq(self) -> str | None:
        return self.keywords.get("INPUTQ")

    @property
    def inputqm(self) -> str | None:
        return self.keywords.get("INPUTQM")

    @property
    def retryint(self) -> int:
        """Seconds between retries of a RETRY action."""
        return int(self.keywords.get("RETRYINT", DEFAULT_RETRYINT))

    @property
    def wait(self) -> bool | int:
        """True to wait for new messages forever, False to stop when the
        queue is empty, or the seconds to wait for one."""
        value = self.keywords.get("WAIT", "YES")
        if value == "YES":
            return True
        if value == "NO":
            return False
        return int(value)


@dataclass(frozen=True)
class Rule:
    """A pattern and the action to take on a message that matches it."""

    line: int = field(compare=False)
    keywords: dict[str, str]

    @property
    def action(self) -> str:
        """DISCARD, IGNORE, RETRY or FWD; every rule that parses has one."""
        return self.keywords["ACTION"]

    @property
    def fwdq(self) -> str | None:
        return self.keywords.get("FWDQ")

    @property
    def fwdqm(self) -> str | None:
        return self.keywords.get("FWDQM")

    @property
    def header(self) -> bool:
        """Whether a forwarded message keeps its dead-letter header."""
        return self.keywords.get("HEADER", "YES") == "YES"

    @property
    def putaut(self) -> str:
        return self.keywords.get("PUTAUT", "DEF")

    @property
    def retry(self) -> int:
        """How many times the action is tried before the next matching rule."""
        return int(self.keywords.get("RETRY", DEFAULT_RETRY))

    @cached_property
    def pattern(self) -> Pattern:
        """Built once per rule: it holds the compiled matchers."""
        return Pattern.from_keywords(self.keywords)


@dataclass(frozen=True)
class RulesTable:
    control: Control
    rules: tuple[Rule, ...]


@dataclass(frozen=True)
class ParseResult:
    """A table, or every error that kept the text from being one."""

    table: RulesTable | None
    errors: tuple[RuleError, ...]

    @property
    def valid(self) -> bool:
        return not self.errors
