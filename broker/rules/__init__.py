"""IBM MQ's ``runmqdlq`` rules-table language: parse, validate, export, match.

A rules table says what to do with dead-letter messages: each rule pairs a
pattern over the message's dead-letter header and descriptor with an action
(discard, ignore, retry or forward). This package only reads, writes and
matches tables; acting on messages is up to its callers.

It depends on the standard library alone and imports its own modules
relatively, so it can be shipped on its own to processes that never load
Django (Spark executors, for one).

Modules, in the order text flows through them: ``source`` (lines, comments,
continuations), ``scanner`` (``KEYWORD(value)`` items), ``keywords`` and
``symbols`` (what each keyword accepts), ``parser`` (entries, cross-keyword
checks), ``model`` (the parsed table), ``pattern`` and ``matcher``
(matching), ``routing`` (what a table does with a message), ``export`` and ``report`` (text and JSON-ready output).
"""

from __future__ import annotations

from .export import export
from .matcher import matching_rules, rule_matches
from .model import Control, ParseResult, Rule, RuleError, RulesTable
from .parser import parse
from .pattern import Message, Pattern
from .report import validation_report
from .routing import (
    Destination,
    Route,
    applicable_rule,
    destination,
    message_attributes,
    mq_format,
    replay_route,
    route_rows,
)
from .symbols import LAZARETTO_REASONS, SYMBOLIC_NAMES, reason_code

__all__ = [
    "LAZARETTO_REASONS",
    "SYMBOLIC_NAMES",
    "Control",
    "Destination",
    "Message",
    "ParseResult",
    "Pattern",
    "Route",
    "Rule",
    "RuleError",
    "RulesTable",
    "applicable_rule",
    "destination",
    "export",
    "matching_rules",
    "message_attributes",
    "mq_format",
    "parse",
    "reason_code",
    "replay_route",
    "route_rows",
    "rule_matches",
    "validation_report",
]
