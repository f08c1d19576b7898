"""Exported rules tables parse back to the same table (broker.rules)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.rules import SYMBOLIC_NAMES, Control, Rule, RulesTable, export, parse
from tests.support.rules import table_of

# Lower case, blanks, quotes, commas and parentheses all force quoting.
NAME_CHARACTERS = "ABQZ09._%az"
PATTERN_CHARACTERS = NAME_CHARACTERS + "*? ',()"

TEXT_FIELDS = {
    "APPLIDAT": 32,
    "APPLNAME": 28,
    "DESTQ": 48,
    "DESTQM": 48,
    "FORMAT": 8,
    "REPLYQ": 48,
    "REPLYQM": 48,
    "USERID": 12,
}


def names(max_size: int = 48) -> st.SearchStrategy[str]:
    return st.text(NAME_CHARACTERS, min_size=1, max_size=max_size)


def numbers(maximum: int = 2_147_483_647) -> st.SearchStrategy[str]:
    return st.integers(0, maximum).map(str)


def numeric_pattern(keyword: str) -> st.SearchStrategy[str]:
    return st.one_of(st.just("*"), numbers(), st.sampled_from(sorted(SYMBOLIC_NAMES[keyword])))


def pattern_keywords() -> st.SearchStrategy[dict[str, str]]:
    fields = {
        keyword: st.text(PATTERN_CHARACTERS, min_size=1, max_size=limit)
        for keyword, limit in TEXT_FIELDS.items()
    }
    fields |= {keyword: numeric_pattern(keyword) for keyword in SYMBOLIC_NAMES}
    return st.fixed_dictionaries({}, optional=fields)


@st.composite
def action_keywords(draw: st.DrawFn) -> dict[str, str]:
    action = draw(st.sampled_from(["DISCARD", "IGNORE", "RETRY", "FWD"]))
    optional = {
        "PUTAUT": st.sampled_from(["DEF", "CTX"]),
        "RETRY": numbers(999_999_999).filter(lambda retry: retry != "0"),
    }
    required = {"ACTION": st.just(action)}
    if action == "FWD":
        required["FWDQ"] = st.one_of(names(), st.sampled_from(["&DESTQ", "&REPLYQ"]))
        optional["FWDQM"] = st.one_of(names(), st.sampled_from(["&DESTQM", "&REPLYQM"]))
        optional["HEADER"] = st.sampled_from(["YES", "NO"])
    return draw(st.fixed_dictionaries(required, optional=optional))


@st.composite
def rules(draw: st.DrawFn) -> Rule:
    return Rule(line=0, keywords=draw(pattern_keywords()) | draw(action_keywords()))


def controls() -> st.SearchStrategy[Control]:
    optional = {
        "INPUTQ": names(),
        "INPUTQM": names(),
        "RETRYINT": numbers(),
        "WAIT": st.one_of(st.sampled_from(["YES", "NO"]), numbers()),
    }
    return st.fixed_dictionaries({}, optional=optional).map(lambda keywords: Control(keywords))


def tables() -> st.SearchStrategy[RulesTable]:
    return st.builds(
        RulesTable,
        control=controls(),
        rules=st.lists(rules(), min_size=1, max_size=5).map(tuple),
    )


@settings(max_examples=200, deadline=None)
@given(tables())
def test_an_exported_table_parses_back_to_the_same_table(table):
    result = parse(export(table))

    assert result.errors == ()
    assert result.table == table


HAND_WRITTEN = """\
* Control data, continued.
inputq(dlq) +
   WAIT(30)
REASON(mqrc_q_full) destq(pay-
ments.*) ACTION(RETRY) retry(3)
APPLIDAT('it''s (a), test  ') ACTION(FWD) FWDQ(&DESTQ) FWDQM(&REPLYQM) HEADER(no)
FEEDBACK(MQFB_COA) PERSIST(*) ACTION(DISCARD)
ACTION(FWD) FWDQ(REALLY.DEAD.QUEUE) HEADER(YES)
"""


def test_exporting_a_parsed_table_gives_canonical_text():
    table = table_of(HAND_WRITTEN)

    assert export(table) == (
        "INPUTQ(DLQ) WAIT(30)\n"
        "DESTQ(PAYMENTS.*) REASON(MQRC_Q_FULL) ACTION(RETRY) RETRY(3)\n"
        "APPLIDAT('it''s (a), test  ') ACTION(FWD) FWDQ(&DESTQ) FWDQM(&REPLYQM) HEADER(NO)\n"
        "FEEDBACK(MQFB_COA) PERSIST(*) ACTION(DISCARD)\n"
        "ACTION(FWD) FWDQ(REALLY.DEAD.QUEUE) HEADER(YES)\n"
    )


def test_export_of_a_parsed_table_is_stable():
    table = table_of(HAND_WRITTEN)
    exported = export(table)

    again = table_of(exported)
    assert again == table
    assert export(again) == exported


def test_a_table_without_control_data_exports_only_its_rules():
    table = RulesTable(control=Control(), rules=(Rule(line=0, keywords={"ACTION": "IGNORE"}),))

    assert export(table) == "ACTION(IGNORE)\n"
