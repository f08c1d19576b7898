"""Topic strings and MQTT-style topic filters: which filter matches which topic."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.topic_grammar import (
    TOPIC_FILTER_PATTERN,
    TOPIC_STRING_PATTERN,
    TopicError,
    filter_levels,
    topic_levels,
    topic_matches,
)

# A filter, the topic strings it matches and those it does not.
FILTERS = {
    "orders/+/created": (["orders/eu/created"], ["orders/eu/paid", "orders/eu/x/created"]),
    "orders/#": (["orders", "orders/eu/created"], ["ordersX/eu"]),
    "orders/eu/#": ([], ["orders/us/created"]),
    "+/+": (["a/b"], ["a"]),
    "orders": (["orders"], ["orders/eu"]),
    "#": (["anything/at/all"], []),
}


@pytest.mark.parametrize(
    ("topic_filter", "topic_string", "matches"),
    [
        (topic_filter, topic_string, matches)
        for topic_filter, (matched, unmatched) in FILTERS.items()
        for matches, topic_strings in ((True, matched), (False, unmatched))
        for topic_string in topic_strings
    ],
)
def test_mqtt_style_matching(topic_filter, topic_string, matches):
    assert topic_matches(topic_filter, topic_string) is matches


@pytest.mark.parametrize(
    "topic_string", ["", "orders//created", "/orders", "orders/", "orders/+/x", "orders/#", "a/b#"]
)
def test_a_publication_needs_concrete_non_empty_levels(topic_string):
    with pytest.raises(TopicError):
        topic_levels(topic_string)


@pytest.mark.parametrize(
    "topic_filter", ["orders/#/created", "orders/a#", "orders/+x", "orders//x", "#/orders", ""]
)
def test_wildcards_must_be_whole_levels_and_hash_last(topic_filter):
    with pytest.raises(TopicError):
        filter_levels(topic_filter)


def _accepts(check, text: str) -> bool:
    try:
        check(text)
    except TopicError:
        return False
    return True


# Text drawn mostly from the characters the rules are about.
TOPIC_TEXT = st.text(alphabet=st.sampled_from("ab /#+\x00\x1f\x7fé"), max_size=12)


@given(TOPIC_TEXT)
def test_the_schema_patterns_accept_exactly_what_the_grammar_accepts(text):
    """The API's schema states the grammar as patterns; a client that
    follows them is never refused, and nothing they refuse is taken."""
    assert bool(re.fullmatch(TOPIC_STRING_PATTERN, text)) is _accepts(topic_levels, text)
    assert bool(re.fullmatch(TOPIC_FILTER_PATTERN, text)) is _accepts(filter_levels, text)
