"""node.sql92: RocketMQ's SQL92 selector, its grammar's rules and its answers, case by case as
RocketMQ's filter module gives them (ExpressionTest, ParserTest), and fuzzed: any text either
compiles or is refused with SelectorError, and evaluating never raises."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.sql92 import MAX_DEPTH, MAX_LENGTH, SelectorError, compile_selector

MESSAGE = {"a": "10", "b": "abc", "TAGS": "TagA", "f": "3.5", "flag": "TRUE", "big": "3000000000", "neg": "-4",
           "q": "it's"}


@pytest.mark.parametrize("text, matches", [
    ("a > 5", True), ("a >= 10", True), ("a < 10", False), ("a <= 9", False), ("a = 10", True), ("a <> 10", False),
    ("a = '10'", True), ("b = 'abc'", True), ("b <> 'abd'", True), ("a > 5 AND b = 'abc'", True),
    ("a > 50 OR b = 'abc'", True), ("a > 50 OR b = 'x'", False),
    ("TAGS IN ('TagA', 'TagB')", True), ("TAGS NOT IN ('TagA')", False), ("TAGS in ('taga')", False),
    ("missing IS NULL", True), ("a IS NOT NULL", True), ("a IS NULL", False),
    ("a BETWEEN 0 AND 10", True), ("a BETWEEN 11 AND 20", False), ("a NOT BETWEEN 11 AND 20", True),
    ("f > 3", False),  # 3.5 read as Integer.valueOf fails: the evaluation fails, no match
    ("f > 3.0", True), ("f < 3.6", True), ("neg < -3", True), ("neg > -3", False), ("a > +5", True),
    ("flag = TRUE", True), ("flag = FALSE", False), ("flag", False),  # a property is a string, never a boolean
    ("big > 5", False),  # an int-range constant reads the property as Integer: 3000000000 is not one
    ("big > 2147483648", True), ("big > 2000000000L", False),  # (2000000000L fits an int: Integer again)
    ("b CONTAINS 'bc'", True), ("b NOT CONTAINS 'bc'", False), ("b STARTSWITH 'ab'", True),
    ("b ENDSWITH 'ab'", False), ("b NOT ENDSWITH 'ab'", True), ("b CONTAINS ''", False),
    ("missing CONTAINS 'x'", False), ("missing NOT CONTAINS 'x'", False),
    ("q = 'it''s'", True), ("TRUE", True), ("FALSE", False), ("NULL", False),
    ("missing = 'x'", False), ("NOT (missing = 'x')", False), ("missing = 'x' OR a = 10", True),
    ("missing = 'x' AND a = 99", False),
    ("NOT a = 10", False),  # RocketMQ's precedence: (NOT a) = 10
    ("NOT (a = 10)", False), ("NOT (a = 11)", True),
    ("b = 10", False), ("b = 'abc' OR b = 10", True), ("b = 10 OR b = 'abc'", False),  # a failed read ends it
    ("a > 1 -- a comment\n AND b = 'abc'", True), ("/* a comment */ a > 1", True),
    ("(TAGS IS NOT NULL AND TAGS IN ('TagA', 'TagB')) AND (a IS NOT NULL AND a BETWEEN 0 AND 30)", True),
    ("a > f", True), ("b > a", False),  # two properties: both read as decimals ('abc' cannot be)
    ("a = 1e1", True), ("a = .5", False), ("a in ('10') and TAGS iN ('TagA')", True),
    ("TaGs IN ('TagA')", False),  # keywords in any case, property names as written
])
def test_a_selector_matches_as_rocketmq_matches(text, matches):
    assert compile_selector(text).matches(MESSAGE) is matches


@pytest.mark.parametrize("text", [
    "a = NULL", "NULL = a", "a > 'x'", "a > TRUE", "a > NULL", "(a > 1) > 2", "a BETWEEN 5 AND 1", "5", "'x'", "a >",
    "a IN (1)", "'x' IN ('x')", "(a > 1", "a > 1)", "a ! b", "a != 1", "TRUE = 1", "99999999999999999999 > a", "a LIKE 'x'",
    "", "   ", "a = 1 b", "NOT 5", "-a", "a IS 5", "a NOT > 1", "007 = a", "a = 'unclosed",
])
def test_what_rocketmq_refuses_is_refused(text):
    with pytest.raises(SelectorError):
        compile_selector(text)


def test_limits_on_length_and_nesting():
    with pytest.raises(SelectorError, match="characters"):
        compile_selector("a = '" + "x" * MAX_LENGTH + "'")
    with pytest.raises(SelectorError, match="nested"):
        compile_selector("(" * (MAX_DEPTH + 1) + "a > 1" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(SelectorError, match="nests"):
        compile_selector("a = " + " = ".join(["1"] * 300))
    many = compile_selector(" OR ".join(f"a = {i}" for i in range(500)))  # long flat chains are one level
    assert many.matches({"a": "499"}) and not many.matches({"a": "500"})
    with pytest.raises(SelectorError):
        compile_selector(5)


_PIECES = ["a", "b", "TAGS", "f", "missing", "1", "-2", "3.5", ".5", "1e3", "9223372036854775807", "'x'", "'10'",
           "''", "TRUE", "FALSE", "NULL", "AND", "OR", "NOT", "IS", "IN", "BETWEEN", "CONTAINS", "STARTSWITH",
           "ENDSWITH", "=", "<>", ">", ">=", "<", "<=", "(", ")", ",", "+", "-", "--", "/*", "*/", "'", "$x", "\n"]


@settings(max_examples=800, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(_PIECES), max_size=14),
       st.dictionaries(st.sampled_from(["a", "b", "TAGS", "f"]),
                       st.sampled_from(["1", "10", "-3", "3.5", "abc", "", "true", "1e400", "NaN", " 7"])))
def test_any_text_compiles_or_is_refused_and_evaluation_never_raises(pieces, properties):
    try:
        selector = compile_selector(" ".join(pieces))
    except SelectorError:
        return
    assert selector.evaluate(properties) in (True, False, None)
