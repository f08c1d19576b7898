"""Validating a rules table and building its parsed form.

Validation reports every problem it can find in one pass, as runmqdlq does
when it starts, so an operator fixes a table in one round rather than one
error at a time. Two kinds of follow-on error are held back because they
would mostly repeat an earlier one:

* an entry with text that could not be read, or with an unknown keyword
  (often a misspelt one), is not also told that ACTION or FWDQ is missing:
  the missing keyword may well be the unreadable part;
* relations between keywords (HEADER needs ACTION(FWD), ...) are checked
  only once ACTION itself is valid.

Warnings leave a table valid: they name keywords runmqdlq acts on that have
no effect, or cannot work, in Lazaretto, so an IBM MQ user is not misled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .keywords import KEYWORDS, Role
from .model import Control, ParseResult, Rule, RuleError, RulesTable
from .scanner import Item, scan_entry
from .source import BLANKS, Entry, Position, split_entries

_RULE_ROLES = frozenset({Role.PATTERN, Role.ACTION})
_FORWARD_ONLY = ("FWDQ", "FWDQM", "HEADER")


@dataclass
class RuleDraft:
    line: int
    keywords: dict[str, str]
    # Where each keyword the rule holds was written.
    written: dict[str, Position] = field(default_factory=dict)


@dataclass
class TableDraft:
    """As much of a table as could be read, and what was wrong with it."""

    control: dict[str, str] = field(default_factory=dict)
    rules: list[RuleDraft] = field(default_factory=list)
    errors: list[RuleError] = field(default_factory=list)
    warnings: list[RuleError] = field(default_factory=list)

    def error(self, position: Position, message: str) -> None:
        self.errors.append(RuleError(position.line, position.column, message))

    def warn(self, position: Position, message: str) -> None:
        self.warnings.append(RuleError(position.line, position.column, message))


@dataclass
class _EntryKeywords:
    accepted: dict[str, str] = field(default_factory=dict)
    """Keywords whose values are valid: what the entry will hold."""
    written: dict[str, Item] = field(default_factory=dict)
    """The first item of each known keyword the entry may hold, valid or not."""
    complete: bool = True
    """False when part of the entry could not be understood."""


def parse(text: str) -> ParseResult:
    """The table the text describes, or every error found in it."""
    draft = read_table(text)
    if draft.errors:
        return ParseResult(table=None, errors=tuple(draft.errors))
    rules = tuple(Rule(line=rule.line, keywords=rule.keywords) for rule in draft.rules)
    table = RulesTable(control=Control(keywords=draft.control), rules=rules)
    return ParseResult(table=table, errors=())


def read_table(text: str, *, instance: str | None = None) -> TableDraft:
    """Read every entry, keeping whatever is valid even when the table is not.
    With ``instance`` (this installation's queue manager name), forwarding to
    another queue manager is warned about too."""
    entries, continuation_errors = split_entries(text)
    draft = TableDraft(errors=continuation_errors)
    for number, entry in enumerate(_with_text(entries)):
        items, syntax_errors = scan_entry(entry)
        draft.errors.extend(syntax_errors)
        readable = not syntax_errors and not entry.unfinished
        _read_entry(draft, entry, items, is_first=number == 0, readable=readable)
    if not draft.rules:
        draft.error(Position(1, 1), "the rules table contains no rules")
    _warn(draft, instance)
    draft.errors.sort(key=lambda error: (error.line, error.column))
    draft.warnings.sort(key=lambda warning: (warning.line, warning.column))
    return draft


def _with_text(entries: list[Entry]) -> list[Entry]:
    """Drop entries left empty, such as a line holding only a ``+``."""
    return [entry for entry in entries if entry.text.strip(BLANKS)]


def _read_entry(
    draft: TableDraft, entry: Entry, items: list[Item], *, is_first: bool, readable: bool
) -> None:
    """An entry is control data when all its known keywords are control
    keywords; anything else, even text that could not be read, is a rule."""
    control_items = [item for item in items if _role(item) is Role.CONTROL]
    if control_items and all(_role(item) in (Role.CONTROL, None) for item in items):
        keywords = _read_keywords(draft, items, Role.CONTROL)
        if is_first:
            draft.control = keywords.accepted
        else:
            draft.error(control_items[0].keyword_at, "control data must be the first entry")
        return
    keywords = _read_keywords(draft, items, *_RULE_ROLES)
    keywords.complete = keywords.complete and readable
    _check_rule(draft, _start(entry), keywords)
    draft.rules.append(
        RuleDraft(
            line=entry.position(0).line,
            keywords=keywords.accepted,
            written={keyword: item.keyword_at for keyword, item in keywords.written.items()},
        )
    )


def _role(item: Item) -> Role | None:
    spec = KEYWORDS.get(item.keyword)
    return None if spec is None else spec.role


def _start(entry: Entry) -> Position:
    return entry.position(len(entry.text) - len(entry.text.lstrip(BLANKS)))


def _read_keywords(draft: TableDraft, items: list[Item], *allowed: Role) -> _EntryKeywords:
    keywords = _EntryKeywords()
    for item in items:
        spec = KEYWORDS.get(item.keyword)
        if spec is None:
            draft.error(item.keyword_at, f"unknown keyword {item.keyword}")
            keywords.complete = False
        elif item.keyword in keywords.written:
            draft.error(item.keyword_at, f"duplicate keyword {item.keyword} in this entry")
        elif spec.role not in allowed:
            message = f"{item.keyword} is a control data keyword and cannot appear in a rule"
            draft.error(item.keyword_at, message)
        else:
            keywords.written[item.keyword] = item
            _accept_value(draft, item, keywords)
    return keywords


def _accept_value(draft: TableDraft, item: Item, keywords: _EntryKeywords) -> None:
    if not item.value:
        draft.error(item.value_at, f"empty value for {item.keyword}")
        return
    problem = KEYWORDS[item.keyword].check(item.keyword, item.value)
    if problem is None:
        keywords.accepted[item.keyword] = item.value
    else:
        draft.error(item.value_at, problem)


def _check_rule(draft: TableDraft, start: Position, keywords: _EntryKeywords) -> None:
    """The checks that relate a rule's keywords to each other."""
    action_item = keywords.written.get("ACTION")
    if action_item is None:
        if keywords.complete:
            draft.error(start, "missing ACTION: every rule needs one")
        return
    action = keywords.accepted.get("ACTION")
    if action == "FWD":
        if "FWDQ" not in keywords.written and keywords.complete:
            draft.error(action_item.keyword_at, "ACTION(FWD) requires FWDQ")
    elif action is not None:
        for keyword in _FORWARD_ONLY:
            item = keywords.written.get(keyword)
            if item is not None:
                draft.error(item.keyword_at, f"{keyword} is only allowed with ACTION(FWD)")


def _warn(draft: TableDraft, instance: str | None) -> None:
    """Keywords that are valid but do nothing, or cannot work, here."""
    for rule in draft.rules:
        if "PUTAUT" in rule.keywords:
            draft.warn(
                rule.written["PUTAUT"],
                f"PUTAUT({rule.keywords['PUTAUT']}) has no effect here: messages are moved "
                "by Lazaretto itself and keep the put application and user they were "
                "published with",
            )
        manager = rule.keywords.get("FWDQM")
        if manager is None or manager == "&DESTQM":  # DESTQM is always this instance
            continue
        if manager == "&REPLYQM":
            draft.warn(
                rule.written["FWDQM"],
                "FWDQM(&REPLYQM): Lazaretto forwards only to its own queues, so this FWD "
                "fails for a message whose reply-to queue manager is another one",
            )
        elif instance is not None and manager != instance:
            draft.warn(
                rule.written["FWDQM"],
                f"FWDQM({manager}) is another queue manager than this instance ({instance}): "
                "Lazaretto forwards only to its own queues, so this FWD always fails",
            )
