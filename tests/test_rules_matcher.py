"""Matching dead-letter messages against rules (broker.rules)."""

from __future__ import annotations

import pytest

from broker.rules import Rule, matching_rules, reason_code, rule_matches
from tests.support.rules import table_of


def rule_of(text: str) -> Rule:
    [rule] = table_of(text).rules
    return rule


def test_matching_rules_lists_every_matching_rule_in_table_order_with_its_number():
    table = table_of(
        """\
DESTQ(PAYMENTS.*) REASON(MQRC_Q_FULL) ACTION(RETRY) RETRY(3)
DESTQ(ORDERS.*) ACTION(DISCARD)
DESTQ(PAYMENTS.IN) ACTION(FWD) FWDQ(PAYMENTS.HELD)
ACTION(FWD) FWDQ(REALLY.DEAD.QUEUE)
"""
    )
    message: dict[str, str | int] = {"DESTQ": "PAYMENTS.IN", "REASON": 2053}

    matches = matching_rules(table, message)

    assert [number for number, _ in matches] == [1, 3, 4]
    assert [rule.action for _, rule in matches] == ["RETRY", "FWD", "FWD"]
    assert matches[0][1] is table.rules[0]


def test_no_rule_matches_gives_an_empty_list():
    table = table_of("DESTQ(A) ACTION(DISCARD)")

    assert matching_rules(table, {"DESTQ": "B"}) == []


def test_an_action_only_rule_matches_every_message():
    rule = rule_of("ACTION(IGNORE)")

    assert rule_matches(rule, {})
    assert rule_matches(rule, {"DESTQ": "ANY.QUEUE", "REASON": 2035, "USERID": "bob"})


# A pattern, the values it matches and those it does not.
PATTERNS = [
    pytest.param(
        "DESTQ(ORDERS.*.IN*)",
        ["ORDERS..IN", "ORDERS.EU.WEST.INBOUND"],
        ["ORDERS.IN", "XORDERS.EU.IN"],
        id="a star matches any run of characters including none",
    ),
    pytest.param(
        "USERID(?OB)",
        ["BOB", "ROB"],
        ["OB", "BBOB"],
        id="a question mark matches exactly one character",
    ),
    pytest.param(
        "DESTQ('A.B+[C]')",
        ["A.B+[C]"],
        ["AXB+C"],
        id="other characters match themselves even where regular expressions would not",
    ),
    # String matching is case-sensitive, and unquoted patterns are upper case.
    pytest.param("USERID(bob)", ["BOB"], ["bob"], id="unquoted patterns are upper case"),
    pytest.param("USERID('bob')", ["bob"], ["BOB"], id="quoted patterns keep their case"),
]


@pytest.mark.parametrize(("pattern", "matched", "unmatched"), PATTERNS)
def test_a_pattern_matches_its_values_and_no_others(pattern, matched, unmatched):
    rule = rule_of(f"{pattern} ACTION(DISCARD)")
    field = pattern.split("(")[0]

    for value in matched:
        assert rule_matches(rule, {field: value})
    for value in unmatched:
        assert not rule_matches(rule, {field: value})


def test_trailing_blanks_are_ignored_on_both_sides():
    rule = rule_of("FORMAT('MQSTR   ') ACTION(DISCARD)")

    assert rule_matches(rule, {"FORMAT": "MQSTR"})
    assert rule_matches(rule, {"FORMAT": "MQSTR   "})
    assert not rule_matches(rule, {"FORMAT": " MQSTR"})


def test_a_question_mark_does_not_match_a_trailing_blank():
    rule = rule_of("USERID(BO?) ACTION(DISCARD)")

    assert not rule_matches(rule, {"USERID": "BO "})


def test_a_missing_string_field_is_empty():
    assert rule_matches(rule_of("REPLYQ(*) ACTION(DISCARD)"), {})
    assert not rule_matches(rule_of("REPLYQ(?*) ACTION(DISCARD)"), {})


def test_a_numeric_star_matches_any_number():
    rule = rule_of("REASON(*) PERSIST(*) ACTION(DISCARD)")

    assert rule_matches(rule, {"REASON": 2053, "PERSIST": 1})
    assert rule_matches(rule, {})


def test_numbers_must_be_equal_and_a_missing_number_is_zero():
    rule = rule_of("PERSIST(0) MSGTYPE(8) ACTION(DISCARD)")

    assert rule_matches(rule, {"MSGTYPE": 8})
    assert not rule_matches(rule, {"MSGTYPE": 8, "PERSIST": 1})
    assert not rule_matches(rule, {"MSGTYPE": 1})


def test_symbolic_names_match_the_numbers_they_stand_for():
    rule = rule_of("REASON(MQRC_Q_FULL) MSGTYPE(MQMT_DATAGRAM) ACTION(RETRY)")

    assert rule_matches(rule, {"REASON": 2053, "MSGTYPE": 8})
    assert not rule_matches(rule, {"REASON": 2035, "MSGTYPE": 8})


def test_every_field_of_the_pattern_must_match():
    rule = rule_of("DESTQ(A*) USERID(BOB) REASON(2035) ACTION(DISCARD)")

    assert rule_matches(rule, {"DESTQ": "AB", "USERID": "BOB", "REASON": 2035})
    assert not rule_matches(rule, {"DESTQ": "AB", "USERID": "BOB", "REASON": 2053})
    assert not rule_matches(rule, {"DESTQ": "AB", "USERID": "ROB", "REASON": 2035})
    assert not rule_matches(rule, {"DESTQ": "BA", "USERID": "BOB", "REASON": 2035})


@pytest.mark.parametrize(
    ("reason", "name"),
    [
        ("handler_error", "LZRC_HANDLER_ERROR"),
        ("crash_blacklisted", "LZRC_CRASH_BLACKLISTED"),
        ("discarded_old", "LZRC_DISCARDED_OLD"),
        ("format_error", "MQRC_FORMAT_ERROR"),
        ("max_messages_reached", "MQRC_Q_FULL"),
        ("expired", "MQFB_EXPIRATION"),
    ],
)
def test_lazaretto_reasons_match_their_symbolic_names(reason, name):
    rule = rule_of(f"REASON({name}) ACTION(DISCARD)")

    assert rule_matches(rule, {"REASON": reason_code(reason)})


def test_lazaretto_reason_codes_are_the_documented_numbers():
    assert [
        reason_code(reason)
        for reason in (
            "handler_error",
            "crash_blacklisted",
            "discarded_old",
            "format_error",
            "max_messages_reached",
            "expired",
        )
    ] == [65537, 65538, 65539, 2110, 2053, 258]


def test_an_unknown_lazaretto_reason_has_no_code():
    with pytest.raises(KeyError):
        reason_code("gremlins")
