"""From table text to entries: comments, blank lines and continuations.

Each entry starts on a new line and runs over the lines its continuation
characters join to it. Joining loses the layout the author sees, so every
character of an entry keeps the line and column it came from, and errors
point into the text as written.

A continuation line is always part of its entry, even when it is blank or
starts with ``*``: it may carry the rest of a pattern such as ``*.QUEUE``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import RuleError

BLANKS = " \t"
KEEP_LEADING_BLANKS = "-"
SKIP_LEADING_BLANKS = "+"


@dataclass(frozen=True)
class Position:
    line: int
    column: int


@dataclass(frozen=True)
class Entry:
    """The text of one entry, with the original position of each character."""

    text: str
    positions: tuple[Position, ...]
    end: Position
    """Just past the last character: where something missing would have been."""
    unfinished: bool = False
    """True when the table ended while the entry asked for a continuation line."""

    def position(self, index: int) -> Position:
        if index < len(self.positions):
            return self.positions[index]
        return self.end


class _EntryBuilder:
    """Collects the pieces of one entry as continuation lines arrive."""

    def __init__(self) -> None:
        self.characters: list[str] = []
        self.positions: list[Position] = []

    def add(self, line_number: int, line: str, start: int, stop: int) -> None:
        for index in range(start, stop):
            self.characters.append(line[index])
            self.positions.append(Position(line_number, index + 1))

    def build(self, end: Position, *, unfinished: bool = False) -> Entry:
        return Entry("".join(self.characters), tuple(self.positions), end, unfinished)


def split_entries(text: str) -> tuple[list[Entry], list[RuleError]]:
    """The entries of a table, and an error if the last line asks to continue."""
    entries: list[Entry] = []
    builder: _EntryBuilder | None = None
    keep_leading_blanks = True
    marker_at = Position(1, 1)
    for line_number, line in enumerate(_lines(text), start=1):
        if builder is None:
            if _is_blank_or_comment(line):
                continue
            builder = _EntryBuilder()
            keep_leading_blanks = True
        start = 0 if keep_leading_blanks else _first_non_blank(line)
        stop, marker = _continuation(line)
        builder.add(line_number, line, start, stop)
        if marker is None:
            entries.append(builder.build(end=Position(line_number, stop + 1)))
            builder = None
        else:
            keep_leading_blanks = marker == KEEP_LEADING_BLANKS
            marker_at = Position(line_number, stop + 1)
    if builder is None:
        return entries, []
    entries.append(builder.build(end=marker_at, unfinished=True))
    error = RuleError(
        marker_at.line,
        marker_at.column,
        "the last line ends with a continuation character but no line follows",
    )
    return entries, [error]


def _lines(text: str) -> list[str]:
    """Lines split on newlines only, so line numbers agree with editors
    (``str.splitlines`` also splits on form feeds and other separators).

    The newline that ends the last line does not start another one: a
    table ending in ``+`` and a newline has nothing to continue with.
    """
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines[-1] == "":
        lines.pop()
    return lines


def _is_blank_or_comment(line: str) -> bool:
    stripped = line.lstrip(BLANKS)
    return not stripped or stripped.startswith("*")


def _first_non_blank(line: str) -> int:
    return len(line) - len(line.lstrip(BLANKS))


def _continuation(line: str) -> tuple[int, str | None]:
    """Where the line's content stops, and its continuation character if any.

    Trailing blanks never count, so a ``+`` followed by blanks still
    continues the entry.
    """
    stop = len(line.rstrip(BLANKS))
    if stop and line[stop - 1] in (KEEP_LEADING_BLANKS, SKIP_LEADING_BLANKS):
        return stop - 1, line[stop - 1]
    return stop, None
