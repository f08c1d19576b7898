"""A rule's pattern: which dead-letter messages the rule applies to.

Matching runs once per rule per message, so each pattern turns its string
fields into regular expressions the first time it is used and keeps them;
fields left at ``*`` are not checked at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from .symbols import pattern_number

TEXT_FIELDS = ("APPLIDAT", "APPLNAME", "DESTQ", "DESTQM", "FORMAT", "REPLYQ", "REPLYQM", "USERID")
NUMERIC_FIELDS = ("APPLTYPE", "FEEDBACK", "MSGTYPE", "PERSIST", "REASON")

Message = Mapping[str, str | int]
"""A dead-letter message's fields, keyed by the pattern keyword that tests them."""


@dataclass(frozen=True)
class Pattern:
    """String fields hold MQ patterns; numeric fields a number, or None for ``*``."""

    applidat: str = "*"
    applname: str = "*"
    appltype: int | None = None
    destq: str = "*"
    destqm: str = "*"
    feedback: int | None = None
    format: str = "*"
    msgtype: int | None = None
    persist: int | None = None
    reason: int | None = None
    replyq: str = "*"
    replyqm: str = "*"
    userid: str = "*"

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, str]) -> Pattern:
        """The pattern of validated rule keywords, with ``*`` for those left out."""

        def number(keyword: str) -> int | None:
            return pattern_number(keyword, keywords.get(keyword, "*"))

        return cls(
            applidat=keywords.get("APPLIDAT", "*"),
            applname=keywords.get("APPLNAME", "*"),
            appltype=number("APPLTYPE"),
            destq=keywords.get("DESTQ", "*"),
            destqm=keywords.get("DESTQM", "*"),
            feedback=number("FEEDBACK"),
            format=keywords.get("FORMAT", "*"),
            msgtype=number("MSGTYPE"),
            persist=number("PERSIST"),
            reason=number("REASON"),
            replyq=keywords.get("REPLYQ", "*"),
            replyqm=keywords.get("REPLYQM", "*"),
            userid=keywords.get("USERID", "*"),
        )

    def text_fields(self) -> dict[str, str]:
        return {
            "APPLIDAT": self.applidat,
            "APPLNAME": self.applname,
            "DESTQ": self.destq,
            "DESTQM": self.destqm,
            "FORMAT": self.format,
            "REPLYQ": self.replyq,
            "REPLYQM": self.replyqm,
            "USERID": self.userid,
        }

    def numeric_fields(self) -> dict[str, int | None]:
        return {
            "APPLTYPE": self.appltype,
            "FEEDBACK": self.feedback,
            "MSGTYPE": self.msgtype,
            "PERSIST": self.persist,
            "REASON": self.reason,
        }

    def matches(self, message: Message) -> bool:
        """True when every field of the message fits the pattern.

        A missing string field counts as empty and a missing number as 0,
        like the blank and zero fields of an MQ message descriptor. Numbers
        are compared first: they are the cheaper test.
        """
        for keyword, number in self._numeric_checks:
            if int(message.get(keyword, 0)) != number:
                return False
        for keyword, expression in self._text_checks:
            value = str(message.get(keyword, "")).rstrip(" ")
            if expression.fullmatch(value) is None:
                return False
        return True

    @cached_property
    def _text_checks(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        return tuple(
            (keyword, compile_text_pattern(pattern))
            for keyword, pattern in self.text_fields().items()
            if pattern != "*"
        )

    @cached_property
    def _numeric_checks(self) -> tuple[tuple[str, int], ...]:
        return tuple(
            (keyword, number)
            for keyword, number in self.numeric_fields().items()
            if number is not None
        )


def compile_text_pattern(pattern: str) -> re.Pattern[str]:
    """An expression that fully matches what an MQ pattern matches.

    ``*`` stands for any run of characters and ``?`` for exactly one; every
    other character matches itself, case included. Trailing blanks are not
    significant in MQ fields, so they are dropped here, and callers drop
    them from the value. Runs of ``*`` are collapsed first, since ``.*.*``
    means the same as ``.*`` but can backtrack far longer.
    """
    pattern = re.sub(r"\*+", "*", pattern.rstrip(" "))
    parts = [_pattern_part(character) for character in pattern]
    return re.compile("".join(parts), re.DOTALL)


def _pattern_part(character: str) -> str:
    if character == "*":
        return ".*"
    if character == "?":
        return "."
    return re.escape(character)
