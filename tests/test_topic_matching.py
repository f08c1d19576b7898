"""Topic strings and MQTT-style topic filters: which filter matches which topic."""

import pytest

from broker.topic_grammar import TopicError, filter_levels, topic_levels, topic_matches


@pytest.mark.parametrize(
    ("topic_filter", "topic_string", "matches"),
    [
        ("orders/+/created", "orders/eu/created", True),
        ("orders/+/created", "orders/eu/paid", False),
        ("orders/+/created", "orders/eu/x/created", False),
        ("orders/#", "orders", True),
        ("orders/#", "orders/eu/created", True),
        ("orders/#", "ordersX/eu", False),
        ("orders/eu/#", "orders/us/created", False),
        ("+/+", "a/b", True),
        ("+/+", "a", False),
        ("orders", "orders", True),
        ("orders", "orders/eu", False),
        ("#", "anything/at/all", True),
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
