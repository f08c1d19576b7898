"""Parsing and validating runmqdlq rules tables (broker.rules)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.rules import Control, Rule, RuleError, parse, validation_report
from tests.support.rules import table_of

TABLE = """\
* Lazaretto's dead-letter rules.
inputq(SYSTEM.DEAD.LETTER.QUEUE) INPUTQM(QM1) +
      RETRYINT(30), WAIT(no)

* A full queue may drain: retry. '+' splits the keyword REASON.
REA+
    SON(MQRC_Q_FULL) DESTQ(PAYMENTS.*) ACTION(RETRY) RETRY(5)
* '-' splits a value and keeps the next line's first column.
destq(orders.in-
coming),action(discard)
APPLIDAT('it''s a  Test'), USERID(?OB) ACTION(FWD) FWDQ(&DESTQ) +
   FWDQM(&replyqm) HEADER(no) PUTAUT(CTX)
feedback(mqfb_expiration) MSGTYPE(8) PERSIST(*) REASON( 2030 ) ACTION ( IGNORE )
ACTION(FWD) FWDQ(REALLY.DEAD.QUEUE) HEADER(YES)
"""


def errors_of(text: str) -> list[tuple[int, int, str]]:
    return [(error.line, error.column, error.message) for error in parse(text).errors]


def messages_of(text: str) -> list[str]:
    return [error.message for error in parse(text).errors]


def only_error(text: str) -> RuleError:
    errors = parse(text).errors
    assert len(errors) == 1, errors
    return errors[0]


# A valid table


def test_a_table_with_control_data_and_rules_parses_into_exactly_its_entries():
    result = parse(TABLE)

    assert result.valid
    assert result.errors == ()
    assert result.table is not None
    assert result.table.control == Control(
        keywords={
            "INPUTQ": "SYSTEM.DEAD.LETTER.QUEUE",
            "INPUTQM": "QM1",
            "RETRYINT": "30",
            "WAIT": "NO",
        }
    )
    assert [rule.keywords for rule in result.table.rules] == [
        {"REASON": "MQRC_Q_FULL", "DESTQ": "PAYMENTS.*", "ACTION": "RETRY", "RETRY": "5"},
        {"DESTQ": "ORDERS.INCOMING", "ACTION": "DISCARD"},
        {
            "APPLIDAT": "it's a  Test",
            "USERID": "?OB",
            "ACTION": "FWD",
            "FWDQ": "&DESTQ",
            "FWDQM": "&REPLYQM",
            "HEADER": "NO",
            "PUTAUT": "CTX",
        },
        {
            "FEEDBACK": "MQFB_EXPIRATION",
            "MSGTYPE": "8",
            "PERSIST": "*",
            "REASON": "2030",
            "ACTION": "IGNORE",
        },
        {"ACTION": "FWD", "FWDQ": "REALLY.DEAD.QUEUE", "HEADER": "YES"},
    ]
    assert [rule.line for rule in result.table.rules] == [6, 9, 11, 13, 14]


def test_control_data_has_typed_views():
    table = table_of(TABLE)
    control = table.control

    assert control.inputq == "SYSTEM.DEAD.LETTER.QUEUE"
    assert control.inputqm == "QM1"
    assert control.retryint == 30
    assert control.wait is False


def test_control_data_defaults_when_the_table_has_none():
    table = table_of("ACTION(IGNORE)")

    assert table.control == Control(keywords={})
    assert table.control.inputq is None
    assert table.control.inputqm is None
    assert table.control.retryint == 60
    assert table.control.wait is True


def test_wait_can_be_a_number_of_seconds():
    table = table_of("WAIT(120)\nACTION(IGNORE)")

    assert table.control.wait == 120


def test_rules_have_typed_action_views_with_defaults():
    table = table_of(TABLE)
    retry, discard, forward, ignore, catch_all = table.rules

    assert (retry.action, retry.retry, retry.header, retry.putaut) == ("RETRY", 5, True, "DEF")
    assert (discard.action, discard.retry, discard.fwdq, discard.fwdqm) == (
        "DISCARD",
        1,
        None,
        None,
    )
    assert (forward.fwdq, forward.fwdqm, forward.header, forward.putaut) == (
        "&DESTQ",
        "&REPLYQM",
        False,
        "CTX",
    )
    assert ignore.action == "IGNORE"
    assert (catch_all.action, catch_all.fwdq, catch_all.header) == (
        "FWD",
        "REALLY.DEAD.QUEUE",
        True,
    )


def test_rules_have_typed_pattern_views_with_symbolic_names_resolved():
    table = table_of(TABLE)
    retry, discard, forward, ignore, catch_all = table.rules

    assert (retry.pattern.reason, retry.pattern.destq) == (2053, "PAYMENTS.*")
    assert discard.pattern.destq == "ORDERS.INCOMING"
    assert (forward.pattern.applidat, forward.pattern.userid) == ("it's a  Test", "?OB")
    assert (ignore.pattern.feedback, ignore.pattern.msgtype) == (258, 8)
    assert (ignore.pattern.persist, ignore.pattern.reason) == (None, 2030)
    assert catch_all.pattern.destq == "*"
    assert catch_all.pattern.reason is None


def test_keywords_may_be_joined_by_a_closing_parenthesis():
    table = table_of("ACTION(FWD)FWDQ(Q)")

    assert table.rules[0].keywords == {"ACTION": "FWD", "FWDQ": "Q"}


def test_a_continuation_line_may_start_with_a_star():
    table = table_of("DESTQ(ORDERS.+\n*) ACTION(DISCARD)")

    assert table.rules[0].keywords["DESTQ"] == "ORDERS.*"


def test_blank_lines_comments_and_crlf_line_ends_are_ignored():
    text = "\r\n* comment\r\n   \r\n  * indented comment\r\nACTION(IGNORE)\r\n"

    table = table_of(text)

    assert table.rules == (Rule(line=5, keywords={"ACTION": "IGNORE"}),)


def test_rule_equality_ignores_the_line_it_was_written_on():
    assert Rule(line=1, keywords={"ACTION": "IGNORE"}) == Rule(
        line=9, keywords={"ACTION": "IGNORE"}
    )


# Reporting every error at once


def test_a_table_with_six_errors_reports_all_six_where_they_are():
    text = """\
ACTION(FWD) HEADER(YES)
* The next rule uses a wildcard in a number.
DESTQ(A*) REASON(20*) ACTION(DISCARD)
ACTION(IGNORE) HEADER(NO)
INPUTQ(X) ACTION(DISCARD)
DESTQ(B) ACTION(DISCARD) FOO(BAR) +
   ACTION(IGNORE)
"""

    assert errors_of(text) == [
        (1, 1, "ACTION(FWD) requires FWDQ"),
        (3, 18, "wildcards in REASON are allowed only as a lone '*'"),
        (4, 16, "HEADER is only allowed with ACTION(FWD)"),
        (5, 1, "INPUTQ is a control data keyword and cannot appear in a rule"),
        (6, 26, "unknown keyword FOO"),
        (7, 4, "duplicate keyword ACTION in this entry"),
    ]
    assert parse(text).table is None
    assert not parse(text).valid


def test_errors_inside_continued_entries_point_at_the_original_line_and_column():
    text = "DESTQ(A) +\n     REASON(2*) ACTION(DIS-\nCARDX)"

    assert errors_of(text) == [
        (2, 13, "wildcards in REASON are allowed only as a lone '*'"),
        (2, 24, "invalid ACTION value 'DISCARDX': expected DISCARD, IGNORE, RETRY or FWD"),
    ]


# One test per kind of error


# Texts with one error each, and the error: line, column and message.
ONE_ERROR = {
    "ACTION(IGNORE) DESTQUEUE(X)": (1, 16, "unknown keyword DESTQUEUE"),
    "DESTQ(A) ACTION(IGNORE) destq(B)": (1, 25, "duplicate keyword DESTQ in this entry"),
    "* comment\n  DESTQ(A)": (2, 3, "missing ACTION: every rule needs one"),
    "DESTQ(A) ACTION(FWD) FWDQM(QM2)": (1, 10, "ACTION(FWD) requires FWDQ"),
    "ACTION(DISCARD) HEADER(YES)": (1, 17, "HEADER is only allowed with ACTION(FWD)"),
    "ACTION(DELETE)": (
        1,
        8,
        "invalid ACTION value 'DELETE': expected DISCARD, IGNORE, RETRY or FWD",
    ),
    "ACTION(IGNORE)\nDESTQ(A) WAIT(NO) ACTION(DISCARD)": (
        2,
        10,
        "WAIT is a control data keyword and cannot appear in a rule",
    ),
    "ACTION(IGNORE)\n  INPUTQ(DLQ) RETRYINT(5)": (2, 3, "control data must be the first entry"),
    "ACTION(IGNORE) DESTQ(A": (1, 21, "unbalanced parentheses: '(' without a matching ')'"),
    "ACTION(IGNORE)) DESTQ(A)": (1, 15, "unbalanced parentheses: ')' without a matching '('"),
    "ACTION(IGNORE) APPLIDAT('it''s open)": (
        1,
        25,
        "unterminated quoted value: the closing quote is missing",
    ),
    "ACTION(IGNORE) DESTQ(A B)": (
        1,
        23,
        "unexpected blank in the value of DESTQ; "
        "quote values that contain blanks, commas, quotes or parentheses",
    ),
    "ACTION(FWD) FWDQ(Q) +\n": (
        1,
        21,
        "the last line ends with a continuation character but no line follows",
    ),
}


@pytest.mark.parametrize(
    ("text", "line", "column", "message"), [(text, *error) for text, error in ONE_ERROR.items()]
)
def test_an_error_is_reported_once_at_its_line_and_column(text, line, column, message):
    assert only_error(text) == RuleError(line, column, message)


def test_a_misspelt_action_is_not_also_reported_as_missing():
    assert messages_of("ACTON(IGNORE)") == ["unknown keyword ACTON"]


def test_fwdq_and_fwdqm_on_a_rule_that_does_not_forward_are_errors():
    assert messages_of("ACTION(RETRY) FWDQ(Q) FWDQM(QM)") == [
        "FWDQ is only allowed with ACTION(FWD)",
        "FWDQM is only allowed with ACTION(FWD)",
    ]


@pytest.mark.parametrize("keyword", ["APPLTYPE", "FEEDBACK", "MSGTYPE", "PERSIST", "REASON"])
@pytest.mark.parametrize("value", ["20*", "?", "**", "MQRC_*"])
def test_a_wildcard_in_a_numeric_value_is_an_error(keyword, value):
    assert only_error(f"{keyword}({value}) ACTION(IGNORE)") == RuleError(
        1, len(keyword) + 2, f"wildcards in {keyword} are allowed only as a lone '*'"
    )


@pytest.mark.parametrize(
    "rule",
    [
        "ACTION(FW*)",
        "ACTION(FWD) FWDQ(DEAD.*)",
        "ACTION(FWD) FWDQ(Q) FWDQM(QM?)",
        "ACTION(FWD) FWDQ(Q) HEADER(*)",
        "ACTION(FWD) FWDQ(Q) PUTAUT(*)",
        "ACTION(RETRY) RETRY(1*)",
    ],
)
def test_a_wildcard_in_an_action_value_is_an_error(rule):
    [message] = messages_of(rule)

    assert message.startswith("wildcards are not allowed in ")


@pytest.mark.parametrize(("value", "column"), [("()", 22), ("('')", 22), ("( )", 23)])
def test_an_empty_value_is_an_error(value, column):
    assert only_error(f"ACTION(IGNORE) DESTQ{value}") == RuleError(
        1, column, "empty value for DESTQ"
    )


@pytest.mark.parametrize(
    ("keyword", "name"),
    [
        ("REASON", "MQMT_REPLY"),
        ("REASON", "MQRC_NO_SUCH_REASON"),
        ("FEEDBACK", "MQRC_Q_FULL"),
        ("MSGTYPE", "MQPER_PERSISTENT"),
        ("PERSIST", "MQMT_DATAGRAM"),
        ("APPLTYPE", "MQFB_NONE"),
    ],
)
def test_a_symbolic_name_unknown_for_its_keyword_is_an_error(keyword, name):
    assert messages_of(f"{keyword}({name}) ACTION(IGNORE)") == [
        f"unknown symbolic name {name} for {keyword}"
    ]


def test_feedback_codes_and_lazaretto_reasons_are_valid_reasons():
    text = "REASON(MQFB_EXPIRATION) ACTION(IGNORE)\nREASON(LZRC_HANDLER_ERROR) ACTION(DISCARD)"

    assert parse(text).valid


def test_a_negative_application_type_is_allowed_only_as_a_symbol():
    assert parse("APPLTYPE(MQAT_UNKNOWN) ACTION(IGNORE)").valid
    assert messages_of("APPLTYPE(-1) ACTION(IGNORE)") == [
        "invalid APPLTYPE value '-1': expected a non-negative integer, a symbolic name or '*'"
    ]


@pytest.mark.parametrize(
    ("keyword", "limit"),
    [
        ("APPLIDAT", 32),
        ("APPLNAME", 28),
        ("DESTQ", 48),
        ("DESTQM", 48),
        ("FORMAT", 8),
        ("REPLYQ", 48),
        ("REPLYQM", 48),
        ("USERID", 12),
    ],
)
def test_a_value_longer_than_its_field_is_an_error(keyword, limit):
    assert parse(f"{keyword}({'A' * limit}) ACTION(IGNORE)").valid
    assert messages_of(f"{keyword}({'A' * (limit + 1)}) ACTION(IGNORE)") == [
        f"{keyword} value is {limit + 1} characters long; at most {limit} are allowed"
    ]


def test_long_forward_and_control_names_are_errors():
    name = "Q" * 49

    assert messages_of(
        f"INPUTQ({name}) INPUTQM({name})\nACTION(FWD) FWDQ({name}) FWDQM({name})"
    ) == [
        f"{keyword} value is 49 characters long; at most 48 are allowed"
        for keyword in ("INPUTQ", "INPUTQM", "FWDQ", "FWDQM")
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ACTION(FWD) FWDQ(Q) HEADER(MAYBE)", "invalid HEADER value 'MAYBE': expected YES or NO"),
        ("ACTION(FWD) FWDQ(Q) PUTAUT(ALT)", "invalid PUTAUT value 'ALT': expected DEF or CTX"),
        (
            "WAIT(SOMETIMES)\nACTION(IGNORE)",
            "invalid WAIT value 'SOMETIMES': expected YES, NO or a non-negative number of seconds",
        ),
    ],
)
def test_invalid_header_putaut_and_wait_values_are_errors(text, message):
    assert messages_of(text) == [message]


def test_forward_references_must_suit_their_keyword():
    assert messages_of("ACTION(FWD) FWDQ(&DESTQM) FWDQM(&REPLYQ)") == [
        "invalid FWDQ value '&DESTQM': the only references allowed are &DESTQ or &REPLYQ",
        "invalid FWDQM value '&REPLYQ': the only references allowed are &DESTQM or &REPLYQM",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "ACTION(RETRY) RETRY(often)",
            "invalid RETRY value 'OFTEN': expected an integer from 1 to 999999999",
        ),
        ("ACTION(RETRY) RETRY(0)", "RETRY value 0 is out of range (1 to 999999999)"),
        (
            "ACTION(RETRY) RETRY(1000000000)",
            "RETRY value 1000000000 is out of range (1 to 999999999)",
        ),
        (
            "RETRYINT(1m)\nACTION(IGNORE)",
            "invalid RETRYINT value '1M': expected a non-negative number of seconds",
        ),
    ],
)
def test_non_numeric_or_out_of_range_retry_and_retryint_are_errors(text, message):
    assert messages_of(text) == [message]


def test_a_first_entry_mixing_control_and_rule_keywords_is_a_rule_with_an_error():
    result = validation_report("INPUTQ(DLQ) ACTION(IGNORE)")

    assert result["errors"] == [
        {
            "line": 1,
            "column": 1,
            "message": "INPUTQ is a control data keyword and cannot appear in a rule",
        }
    ]
    assert result["control"] == {}
    assert result["rules"] == [{"line": 1, "keywords": {"ACTION": "IGNORE"}}]


def test_an_unclosed_parenthesis_is_an_error_and_the_next_keyword_is_still_read():
    assert errors_of("DESTQ(A ACTION(DISCARD) HEADER(NO)") == [
        (1, 6, "unbalanced parentheses: '(' without a matching ')'"),
        (1, 25, "HEADER is only allowed with ACTION(FWD)"),
    ]


def test_unreadable_text_is_not_also_reported_as_a_missing_keyword():
    assert messages_of("DESTQ(A ACTION(FWD)") == [
        "unbalanced parentheses: '(' without a matching ')'"
    ]


def test_text_outside_keyword_value_pairs_is_an_error():
    assert errors_of("ACTION(FWD) FWDQ(Q) forward it 'now'\nACTION IGNORE") == [
        (1, 21, "unexpected text \"forward it 'now'\"; expected KEYWORD(value)"),
        (2, 1, "unexpected text 'ACTION IGNORE'; expected KEYWORD(value)"),
    ]


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "* only a comment\n", "INPUTQ(DLQ) WAIT(NO)\n* no rules follow\n"],
)
def test_a_table_with_no_rule_is_an_error(text):
    assert only_error(text) == RuleError(1, 1, "the rules table contains no rules")


def test_each_bad_value_is_reported_once_and_the_rest_of_the_entry_is_still_checked():
    text = "DESTQ(A B) REASON(MQ?) PERSIST(MQPER_MAYBE) ACTION(DISCARD) HEADER(NO)"

    assert [column for _, column, _ in errors_of(text)] == [8, 19, 32, 61]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["ACTION(", "FWDQ(", "REASON(", "WAIT(", "FWD", "Q*", "MQRC_Q_FULL"])
        | st.sampled_from(list("()'*?+-, \n&az9")),
        max_size=30,
    ).map("".join)
)
def test_any_text_gives_a_table_or_errors_that_point_into_the_text(text):
    result = parse(text)
    line_count = max(1, len(text.splitlines()))

    assert (result.table is None) == bool(result.errors)
    assert all(1 <= error.line <= line_count and error.column >= 1 for error in result.errors)


# The validation report


def test_the_validation_report_of_a_valid_table_has_the_documented_shape():
    report = validation_report("WAIT(NO)\nREASON(mqrc_q_full) ACTION(RETRY)\n")

    assert report == {
        "valid": True,
        "control": {"WAIT": "NO"},
        "rules": [{"line": 2, "keywords": {"REASON": "MQRC_Q_FULL", "ACTION": "RETRY"}}],
        "errors": [],
        "warnings": [],
    }


def test_the_validation_report_keeps_what_could_be_read_of_an_invalid_table():
    report = validation_report(
        "INPUTQ(DLQ) RETRYINT(x)\n* comment\nDESTQ(A) ACTION(FWD) FWDQ(Q*)\nACTION(IGNORE)"
    )

    assert report == {
        "valid": False,
        "control": {"INPUTQ": "DLQ"},
        "rules": [
            {"line": 3, "keywords": {"DESTQ": "A", "ACTION": "FWD"}},
            {"line": 4, "keywords": {"ACTION": "IGNORE"}},
        ],
        "errors": [
            {
                "line": 1,
                "column": 22,
                "message": "invalid RETRYINT value 'X': expected a non-negative number of seconds",
            },
            {"line": 3, "column": 27, "message": "wildcards are not allowed in FWDQ"},
        ],
        "warnings": [],
    }


def test_putaut_is_reported_as_having_no_effect_and_the_table_stays_valid():
    report = validation_report("ACTION(FWD) FWDQ(PARKED) PUTAUT(CTX)\n")

    assert report["valid"] is True
    [warning] = report["warnings"]
    assert (warning["line"], warning["column"]) == (1, 26)
    assert warning["message"].startswith("PUTAUT(CTX) has no effect here")


def test_a_forward_to_another_queue_manager_is_reported_as_one_that_always_fails():
    text = (
        "ACTION(FWD) FWDQ(A) FWDQM(OTHER.QM)\n"
        "ACTION(FWD) FWDQ(B) FWDQM(HERE)\n"
        "ACTION(FWD) FWDQ(C) FWDQM(&DESTQM)\n"
        "ACTION(FWD) FWDQ(D) FWDQM(&REPLYQM)\n"
    )

    report = validation_report(text, instance="HERE")

    assert report["valid"] is True
    assert [(w["line"], w["column"]) for w in report["warnings"]] == [(1, 21), (4, 21)]
    assert (
        "OTHER.QM) is another queue manager than this instance (HERE)"
        in (report["warnings"][0]["message"])
    )
    assert "reply-to queue manager" in report["warnings"][1]["message"]


def test_without_an_instance_name_only_a_reply_to_queue_manager_is_questioned():
    report = validation_report("ACTION(FWD) FWDQ(A) FWDQM(OTHER.QM)\n")

    assert report["warnings"] == []


# Packaging


@pytest.mark.slow
def test_the_rules_package_imports_nothing_else_from_the_project_nor_django():
    code = (
        "import sys, broker.rules\n"
        "outside = sorted(name for name in sys.modules if name.split('.')[0] in "
        "('django', 'console', 'workers') or (name.startswith('broker.') "
        "and not name.startswith('broker.rules')))\n"
        "assert not outside, outside\n"
    )
    root = Path(__file__).resolve().parents[1]

    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
