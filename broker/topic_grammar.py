"""Topic strings and MQTT-style topic filters (pure Python).

A topic string is levels separated by ``/``: ``orders/eu/created``. Every
level is non-empty and a publication names no wildcards. A filter may use
``+`` for exactly one level and ``#``, as the last level, for any number of
levels, including none: ``orders/#`` matches ``orders`` and
``orders/eu/created``.
"""

from __future__ import annotations

MAX_TOPIC_LENGTH = 1024
SINGLE = "+"
MULTI = "#"

# The same rules as regular expressions, for the API's schema (length
# aside): tests/test_topic_matching.py checks that they agree with the
# functions below on generated text.
_LEVEL = r"[^/#+\x00-\x1f]+"
_TOPIC = rf"{_LEVEL}(?:/{_LEVEL})*"
TOPIC_STRING_PATTERN = rf"\A{_TOPIC}\Z"
TOPIC_STRING_OR_BLANK_PATTERN = rf"\A(?:{_TOPIC})?\Z"
TOPIC_FILTER_PATTERN = rf"\A(?:#|(?:{_LEVEL}|\+)(?:/(?:{_LEVEL}|\+))*(?:/#)?)\Z"
TOPIC_RULES = (
    "Levels separated by '/', none empty, without control characters; a topic string "
    "names no wildcard, a filter uses '+' as a whole level and '#' as the whole last one."
)


class TopicError(ValueError):
    """A topic string or filter that breaks the rules above."""


def _levels(text: str, what: str) -> list[str]:
    if not text:
        raise TopicError(f"The {what} is empty.")
    if len(text) > MAX_TOPIC_LENGTH:
        raise TopicError(f"The {what} is longer than {MAX_TOPIC_LENGTH} characters.")
    if any(ord(char) < 32 for char in text):
        raise TopicError(f"The {what} contains a control character.")
    levels = text.split("/")
    if "" in levels:
        raise TopicError(
            f"The {what} {text!r} has an empty level (a leading, trailing or double '/')."
        )
    return levels


def topic_levels(topic_string: str) -> list[str]:
    """The levels of a publication's topic string; wildcards are refused."""
    levels = _levels(topic_string, "topic string")
    if any(SINGLE in level or MULTI in level for level in levels):
        raise TopicError(
            f"The topic string {topic_string!r} contains a wildcard; publish to a concrete topic."
        )
    return levels


def filter_levels(topic_filter: str) -> list[str]:
    """The levels of a subscription's filter, with wildcard placement checked."""
    levels = _levels(topic_filter, "topic filter")
    for position, level in enumerate(levels):
        if MULTI in level and (level != MULTI or position != len(levels) - 1):
            raise TopicError(f"In {topic_filter!r}, '#' must be a whole level and the last one.")
        if SINGLE in level and level != SINGLE:
            raise TopicError(f"In {topic_filter!r}, '+' must be a whole level.")
    return levels


def is_under(levels: list[str], root: list[str]) -> bool:
    """Whether ``levels`` start with the literal levels of ``root``."""
    return levels[: len(root)] == root


def topic_matches(topic_filter: str, topic_string: str) -> bool:
    """Whether a publication on ``topic_string`` reaches ``topic_filter``."""
    wanted = filter_levels(topic_filter)
    levels = topic_levels(topic_string)
    for position, level in enumerate(wanted):
        if level == MULTI:
            return True
        if position >= len(levels) or level not in (SINGLE, levels[position]):
            return False
    return len(levels) == len(wanted)
