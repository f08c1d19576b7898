"""From the text of one entry to its ``KEYWORD(value)`` items.

The scanner only knows the shape of an item; whether the keyword exists or
its value makes sense is the parser's business. When the shape is wrong it
reports the problem once and resumes at the next place an item can start, so
one mistake does not hide the rest of the entry.

Items need a blank or a comma between them, except right after a ``)``,
where the next item cannot be misread: ``ACTION(FWD)FWDQ(Q)`` is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .model import RuleError
from .source import BLANKS, Entry, Position

SEPARATORS = " \t,"
QUOTE = "'"
_UNQUOTED_STOP = frozenset(" \t,()'")
_ITEM_START = re.compile(r"([A-Za-z][A-Za-z0-9_]*)[ \t]*\(")
_NEXT_ITEM_START = re.compile(r"(?<=[ \t,)])[A-Za-z][A-Za-z0-9_]*[ \t]*\(")
_PARENTHESIS = re.compile(r"[()]")
_QUOTE_HINT = "; quote values that contain blanks, commas, quotes or parentheses"
_FOLD_ASCII = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True)
class Item:
    """One ``KEYWORD(value)`` as written: keyword in upper case, value after
    quote removal or, when unquoted, case folding."""

    keyword: str
    value: str
    keyword_at: Position
    value_at: Position


def scan_entry(entry: Entry) -> tuple[list[Item], list[RuleError]]:
    scanner = _Scanner(entry)
    scanner.scan()
    return scanner.items, scanner.errors


def fold_case(value: str) -> str:
    """Upper-case ASCII letters only, as MQ does; ``str.upper`` would also
    change the length of values such as 'ß'."""
    return value.translate(_FOLD_ASCII)


class _Scanner:
    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.text = entry.text
        self.index = 0
        self.items: list[Item] = []
        self.errors: list[RuleError] = []

    def scan(self) -> None:
        while self._skip(SEPARATORS):
            item_start = _ITEM_START.match(self.text, self.index)
            if item_start is None:
                self._skip_unexpected_text()
            else:
                self._read_item(item_start)

    def _skip(self, characters: str) -> bool:
        """Move past any of the characters; False when the entry is used up."""
        while self.index < len(self.text) and self.text[self.index] in characters:
            self.index += 1
        return self.index < len(self.text)

    def _error(self, index: int, message: str) -> None:
        position = self.entry.position(index)
        self.errors.append(RuleError(position.line, position.column, message))

    def _skip_unexpected_text(self) -> None:
        """Report text that is not an item, up to where the next item starts."""
        start = self.index
        next_item = _NEXT_ITEM_START.search(self.text, start)
        self.index = len(self.text) if next_item is None else next_item.start()
        unexpected = self.text[start : self.index].rstrip(SEPARATORS)
        if unexpected.startswith(")"):
            self._error(start, "unbalanced parentheses: ')' without a matching '('")
        else:
            self._error(start, f"unexpected text {unexpected!r}; expected KEYWORD(value)")

    def _read_item(self, item_start: re.Match[str]) -> None:
        keyword = item_start.group(1).upper()
        keyword_at = self.entry.position(self.index)
        open_index = item_start.end() - 1
        self.index = item_start.end()
        self._skip(BLANKS)
        value_at = self.entry.position(self.index)
        value = self._read_value(keyword, open_index)
        if value is not None:
            self.items.append(Item(keyword, value, keyword_at, value_at))

    def _read_value(self, keyword: str, open_index: int) -> str | None:
        """The value up to its closing parenthesis, or None after an error."""
        if self.text.startswith(QUOTE, self.index):
            value = self._read_quoted()
            if value is None:
                return None
            hint = ""
        else:
            value = fold_case(self._read_unquoted())
            hint = _QUOTE_HINT
        if self._close(keyword, open_index, hint):
            return value
        return None

    def _read_quoted(self) -> str | None:
        """A quoted value, where ``''`` stands for one quote."""
        quote_index = self.index
        self.index += 1
        characters: list[str] = []
        while self.index < len(self.text):
            character = self.text[self.index]
            self.index += 1
            if character != QUOTE:
                characters.append(character)
            elif self.text.startswith(QUOTE, self.index):
                characters.append(QUOTE)
                self.index += 1
            else:
                return "".join(characters)
        self._error(quote_index, "unterminated quoted value: the closing quote is missing")
        return None

    def _read_unquoted(self) -> str:
        start = self.index
        while self.index < len(self.text) and self.text[self.index] not in _UNQUOTED_STOP:
            self.index += 1
        return self.text[start : self.index]

    def _close(self, keyword: str, open_index: int, hint: str) -> bool:
        """Consume the ``)`` that ends a value; False after reporting why not.

        When something other than ``)`` follows the value, either the value
        goes on up to a ``)`` (it holds a blank or another character it may
        not), or the ``)`` is missing and what follows is the next item.
        """
        stray_index = self.index
        self._skip(BLANKS)
        if self.text.startswith(")", self.index):
            self.index += 1
            return True
        parenthesis = _PARENTHESIS.search(self.text, self.index)
        if parenthesis is None or parenthesis.group() == "(":
            self._error(open_index, "unbalanced parentheses: '(' without a matching ')'")
            return False
        stray = _describe(self.text[stray_index])
        self._error(stray_index, f"unexpected {stray} in the value of {keyword}{hint}")
        self.index = parenthesis.end()
        return False


def _describe(character: str) -> str:
    if character in BLANKS:
        return "blank"
    return repr(character)
