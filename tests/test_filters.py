"""Message filters (dledger_commitlog/messaging/filters.py): TAG expressions, the SQL92 subset
(RocketMQ's examples, precedence, every predicate, what a missing or non-numeric property
does), the syntax errors and the column each names, the limits, and a model: random
expressions rendered with the fewest parentheses evaluate as a reference evaluator says.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger_commitlog.messaging.filters import FilterError, MessageFilter, compile_filter
from dledger_commitlog.messaging.sql92 import MAX_DEPTH, MAX_EXPRESSION_CHARS
from store.errors import InvalidMessage


def sql(expression: str) -> MessageFilter:
    return compile_filter("SQL92", expression)


def match(expression: str, props: Mapping[str, str], tags: str | None = None) -> bool:
    return sql(expression).matches(tags, props)


# ---------------------------------------------------------------- TAG


@pytest.mark.parametrize("kind", ["TAG", "tag", "Tag", "", "  tag "])
def test_tag_kind_is_case_insensitive_and_empty_means_tag(kind: str) -> None:
    f = compile_filter(kind, "A || B")
    assert f.kind == "TAG"
    assert f.matches("A", {}) and f.matches("B", {})
    assert not f.matches("C", {}) and not f.matches(None, {}) and not f.matches("", {})
    assert not f.accepts_all


@pytest.mark.parametrize("expression", ["*", "", "  ", " * "])
def test_tag_everything(expression: str) -> None:
    f = compile_filter("TAG", expression)
    assert f.accepts_all
    assert f.matches(None, {}) and f.matches("X", {"a": "1"})


def test_tag_matches_the_whole_tag_only() -> None:
    f = compile_filter("TAG", "TagA")
    assert f.matches("TagA", {})
    assert not f.matches("TagAB", {}) and not f.matches("taga", {})


@pytest.mark.parametrize("expression", ["A ||", "|| B", "A || || B", "A B", "Tag*"])
def test_bad_tag_expression(expression: str) -> None:
    with pytest.raises(FilterError, match="TAG filter: bad tag expression") as err:
        compile_filter("TAG", expression)
    assert err.value.column is None


@pytest.mark.parametrize("kind", ["SQL", "sql9", "EXPRESSION", "TAG,SQL92"])
def test_unknown_kind(kind: str) -> None:
    with pytest.raises(FilterError, match=r"unknown filter kind .* use TAG or SQL92"):
        compile_filter(kind, "a = 1")


# ---------------------------------------------------------------- the filter object


def test_filter_object() -> None:
    f = compile_filter("sql92", "a > 1")
    assert f.kind == "SQL92" and f.expression == "a > 1"
    assert f == MessageFilter("SQL92", "a > 1") == MessageFilter("sql92", "a > 1")
    assert hash(f) == hash(MessageFilter("SQL92", "a > 1"))
    assert f != MessageFilter("SQL92", "a > 2")
    assert "SQL92" in repr(f) and "_predicate" not in repr(f)
    assert compile_filter("sql92", "a > 1") is f  # compiled once
    copy = pickle.loads(pickle.dumps(f))
    assert copy == f and copy.matches(None, {"a": "2"}) and not copy.matches(None, {"a": "1"})
    with pytest.raises(AttributeError):
        f.expression = "a > 2"  # type: ignore[misc]


def test_direct_construction_checks_too() -> None:
    with pytest.raises(FilterError):
        MessageFilter("SQL92", "a >")
    with pytest.raises(FilterError):
        MessageFilter("XML", "a")


def test_filter_error_is_the_clients_fault() -> None:
    with pytest.raises(InvalidMessage) as err:
        sql("a >")
    assert isinstance(err.value, FilterError)
    assert str(err.value).startswith("invalid message: SQL filter: syntax error at column 4")
    assert err.value.reason.startswith("SQL filter:")


# ---------------------------------------------------------------- SQL92 examples

EXAMPLES: list[tuple[str, dict[str, str], str | None, bool]] = [
    # RocketMQ's documentation
    ("a > 5 AND region IN ('eu','us')", {"a": "6", "region": "eu"}, None, True),
    ("a > 5 AND region IN ('eu','us')", {"a": "6", "region": "us"}, None, True),
    ("a > 5 AND region IN ('eu','us')", {"a": "5", "region": "eu"}, None, False),
    ("a > 5 AND region IN ('eu','us')", {"a": "6", "region": "cn"}, None, False),
    ("a > 5 AND region IN ('eu','us')", {"a": "6"}, None, False),
    ("a BETWEEN 1 AND 3", {"a": "1"}, None, True),
    ("a BETWEEN 1 AND 3", {"a": "3"}, None, True),
    ("a BETWEEN 1 AND 3", {"a": "2.5"}, None, True),
    ("a BETWEEN 1 AND 3", {"a": "3.01"}, None, False),
    ("a BETWEEN 1 AND 3", {"a": "0"}, None, False),
    ("a BETWEEN 3 AND 1", {"a": "2"}, None, False),
    ("a NOT BETWEEN 1 AND 3", {"a": "4"}, None, True),
    ("a NOT BETWEEN 1 AND 3", {"a": "2"}, None, False),
    ("b IS NULL", {}, None, True),
    ("b IS NULL", {"b": ""}, None, False),
    ("b IS NOT NULL", {"b": ""}, None, True),
    ("b IS NOT NULL", {"a": "1"}, None, False),
    ("NOT (c = 'x')", {"c": "y"}, None, True),
    ("NOT (c = 'x')", {"c": "x"}, None, False),
    ("NOT c = 'x'", {"c": "x"}, None, False),
    # comparisons, both ways round
    ("a = 1", {"a": "1"}, None, True),
    ("a = 1", {"a": "1.0"}, None, True),
    ("a = 1", {"a": "+1"}, None, True),
    ("a = 1.5", {"a": "1.50"}, None, True),
    ("a <> 1", {"a": "2"}, None, True),
    ("a != 1", {"a": "1"}, None, False),
    ("a < 10", {"a": "9"}, None, True),
    ("a < 10", {"a": "10"}, None, False),
    ("a <= 10", {"a": "10"}, None, True),
    ("a >= -2", {"a": "-2"}, None, True),
    ("a > -2", {"a": "-3"}, None, False),
    ("a > 1e3", {"a": "1001"}, None, True),
    ("a < .5", {"a": "0.25"}, None, True),
    ("10 > a", {"a": "9"}, None, True),
    ("10 < a", {"a": "9"}, None, False),
    ("'x' = c", {"c": "x"}, None, True),
    ("a > 99999999999999999999", {"a": "100000000000000000000"}, None, True),
    # strings
    ("c = 'x'", {"c": "x"}, None, True),
    ("c = 'x'", {"c": "X"}, None, False),
    ("c <> 'x'", {"c": "y"}, None, True),
    ("c = 'it''s'", {"c": "it's"}, None, True),
    ("c = ''", {"c": ""}, None, True),
    ("c = '1'", {"c": "1.0"}, None, False),  # a string literal compares as a string
    ("c IN ('a')", {"c": "a"}, None, True),
    ("c NOT IN ('a', 'b')", {"c": "c"}, None, True),
    ("c NOT IN ('a', 'b')", {"c": "b"}, None, False),
    # booleans
    ("TRUE", {}, None, True),
    ("FALSE", {}, None, False),
    ("flag = TRUE", {"flag": "true"}, None, True),
    ("flag = TRUE", {"flag": "TRUE"}, None, True),
    ("flag = true", {"flag": "1"}, None, False),
    ("flag <> TRUE", {"flag": "false"}, None, True),
    ("flag = FALSE", {"flag": "False"}, None, True),
    ("TRUE = flag", {"flag": "true"}, None, True),
    ("TRUE AND a = 1", {"a": "1"}, None, True),
    ("FALSE OR a = 1", {"a": "1"}, None, True),
    # two properties
    ("a = b", {"a": "x", "b": "x"}, None, True),
    ("a = b", {"a": "1", "b": "1.0"}, None, False),
    ("a <> b", {"a": "x", "b": "y"}, None, True),
    ("a <> b", {"a": "x"}, None, False),
    ("a < b", {"a": "2", "b": "10"}, None, True),
    ("a < b", {"a": "2", "b": "x"}, None, False),
    # names
    ("a_b.c = 1", {"a_b.c": "1"}, None, True),
    ("_x1 = 1", {"_x1": "1"}, None, True),
    ("A = 1", {"a": "1"}, None, False),  # names are case-sensitive
    ("été = 'oui'", {"été": "oui"}, None, True),
    # keywords in any case, any white space
    ("a>5\tand\nregion in('eu')", {"a": "6", "region": "eu"}, None, True),
    ("not a Between 1 aNd 3", {"a": "7"}, None, True),
    ("b is not null", {"b": "1"}, None, True),
    # TAGS is the message's tag
    ("TAGS = 'TagA'", {}, "TagA", True),
    ("TAGS = 'TagA'", {"TAGS": "TagA"}, "TagB", False),
    ("TAGS IN ('TagA', 'TagB') AND a = 1", {"a": "1"}, "TagB", True),
    ("TAGS IS NULL", {}, None, True),
    ("TAGS IS NULL", {}, "", True),
    ("TAGS IS NOT NULL", {}, "T", True),
    ("tags = 'T'", {"tags": "T"}, None, True),  # only TAGS, in capitals, is the tag
    # LIKE
    ("c LIKE 'ab%'", {"c": "abc"}, None, True),
    ("c LIKE 'ab%'", {"c": "ab"}, None, True),
    ("c LIKE 'ab%'", {"c": "xab"}, None, False),
    ("c LIKE 'a_c'", {"c": "abc"}, None, True),
    ("c LIKE 'a_c'", {"c": "ac"}, None, False),
    ("c LIKE '%.%'", {"c": "a.b"}, None, True),
    ("c LIKE '%.%'", {"c": "ab"}, None, False),  # '.' is not a regex
    ("c LIKE 'a%'", {"c": "a\nb"}, None, True),
    ("c NOT LIKE 'a%'", {"c": "ba"}, None, True),
    ("c LIKE '10!%' ESCAPE '!'", {"c": "10%"}, None, True),
    ("c LIKE '10!%' ESCAPE '!'", {"c": "100"}, None, False),
    ("c LIKE 'a!_b' escape '!'", {"c": "a_b"}, None, True),
    ("c LIKE 'x' AND escape = 1", {"c": "x", "escape": "1"}, None, True),
]


@pytest.mark.parametrize(("expression", "props", "tags", "expected"), EXAMPLES)
def test_examples(expression: str, props: dict[str, str], tags: str | None, expected: bool) -> None:
    assert match(expression, props, tags) is expected


@pytest.mark.parametrize(
    ("a", "b", "c", "expected"),
    [("1", "0", "0", True), ("0", "2", "3", True), ("0", "2", "0", False), ("1", "2", "0", True)],
)
def test_and_binds_tighter_than_or(a: str, b: str, c: str, expected: bool) -> None:
    props = {"a": a, "b": b, "c": c}
    assert match("a = 1 OR b = 2 AND c = 3", props) is expected
    assert match("a = 1 OR (b = 2 AND c = 3)", props) is expected
    assert match("b = 2 AND c = 3 OR a = 1", props) is expected


def test_not_binds_tighter_than_and_but_looser_than_a_comparison() -> None:
    props = {"a": "1", "b": "1"}
    assert match("NOT a = 2 AND b = 1", props)  # (NOT a = 2) AND b = 1
    assert not match("NOT a = 2 AND b = 1", {"a": "1", "b": "2"})  # not NOT (a = 2 AND b = 1)
    assert not match("NOT (a = 2 OR b = 1)", props)
    assert match("NOT NOT a = 1", props)


@pytest.mark.parametrize(
    "predicate",
    [
        "a = 1",
        "a <> 1",
        "a < 1",
        "a >= 1",
        "1 <> a",
        "a = 'x'",
        "a <> 'x'",
        "a = TRUE",
        "a <> FALSE",
        "a BETWEEN 0 AND 9",
        "a NOT BETWEEN 0 AND 9",
        "a IN ('x')",
        "a NOT IN ('x')",
        "a LIKE '%'",
        "a NOT LIKE 'x'",
        "a IS NOT NULL",
        "a = b",
        "a <> b",
        "b <> a",
        "a < b",
    ],
)
def test_a_missing_property_makes_every_predicate_false(predicate: str) -> None:
    assert not match(predicate, {"b": "1"})
    assert match(f"NOT ({predicate})", {"b": "1"})  # two-valued: NOT flips it
    assert match("a IS NULL", {"b": "1"})


NOT_NUMBERS = ["x", "", " 1", "1 ", "1_000", "0x10", "1,5", "NaN", "inf", "-inf", "1e999", "٣"]
NUMERIC = ["a = 1", "a <> 1", "a < 1", "a > 1", "a BETWEEN -9 AND 9", "a NOT BETWEEN 0 AND 0"]


@pytest.mark.parametrize("value", NOT_NUMBERS)
@pytest.mark.parametrize("predicate", NUMERIC)
def test_a_value_that_is_not_a_number_makes_a_numeric_predicate_false(
    value: str, predicate: str
) -> None:
    assert not match(predicate, {"a": value})


def test_a_number_with_too_many_digits_for_int_is_not_a_number() -> None:
    assert not match("a > 0", {"a": "9" * 5000})
    assert match("a > 0", {"a": "9" * 4000})


def test_two_literals_are_compared_once() -> None:
    assert sql("1 < 2").accepts_all
    assert sql("'a' = 'a' AND 2.5 >= 2").accepts_all
    assert not sql("'a' <> 'a'").matches(None, {})
    assert sql("TRUE <> FALSE").accepts_all
    assert not sql("1 = 2 AND a = 1").matches(None, {"a": "1"})
    assert sql("NOT FALSE").accepts_all
    assert not sql("a = 1").accepts_all


def test_long_flat_chains_do_not_recurse() -> None:
    terms = [f"p{i}=1" for i in range(300)]
    props = {f"p{i}": "1" for i in range(300)}
    assert match(" AND ".join(terms), props)
    assert not match(" AND ".join(terms), {**props, "p299": "0"})
    assert match(" OR ".join(terms), {"p150": "1"})
    assert not match(" OR ".join(terms), {})


# ---------------------------------------------------------------- errors

ERRORS: list[tuple[str, int, str]] = [
    ("a >", 4, "expected a value after '>', found the end of the expression"),
    ("price > AND b = 1", 9, "expected a value after '>', found 'AND'"),
    ("a = = 1", 5, "expected a value after '='"),
    ("", 1, "expected a condition"),
    ("   ", 4, "expected a condition"),
    ("a", 2, "expected a comparison after 'a'"),
    ("a b", 3, "expected a comparison after 'a', found 'b'"),
    ("5", 2, "expected a comparison after '5'"),
    ("a = 1 b = 2", 7, "expected AND, OR or the end of the expression, found 'b'"),
    ("a = 1 AND", 10, "expected a condition"),
    ("a = 1 OR OR b = 1", 10, "expected a condition"),
    ("AND a = 1", 1, "expected a condition"),
    ("(a = 1", 7, "expected ')'"),
    ("a = 1)", 6, "expected AND, OR or the end of the expression, found ')'"),
    ("()", 2, "expected a condition"),
    ("a = 'x", 5, "expected a closing quote"),
    ("a = 'it''s", 5, "expected a closing quote"),
    ('a = "x"', 5, "unexpected character '\"'"),
    ("a == 1", 4, "expected a value after '='"),
    ("a ! 1", 3, "unexpected character '!'"),
    ("a = - 1", 5, "unexpected character '-'"),
    ("a-b = 1", 2, "unexpected character '-'"),
    ("a = 1 + 2", 7, "unexpected character '+'"),
    ("a = 5x", 5, "expected a number, found '5x'"),
    ("a = 1.5.3", 5, "expected a number, found '1.5.'"),
    ("a = 1e999", 5, "expected a finite number"),
    ("1a = 1", 1, "expected a number, found '1a'"),
    ("a = NULL", 5, "found NULL (test for it with IS NULL)"),
    ("a IS 1", 6, "expected NULL or NOT NULL after IS, found '1'"),
    ("a IS NOT 1", 10, "expected NULL after IS NOT"),
    ("a IS", 5, "expected NULL or NOT NULL after IS"),
    ("a NOT IS NULL", 7, "expected BETWEEN, IN or LIKE after NOT, found 'IS'"),
    ("a NOT = 1", 7, "expected BETWEEN, IN or LIKE after NOT"),
    ("a BETWEEN 1", 12, "expected AND after BETWEEN's lower bound"),
    ("a BETWEEN 1 OR 3", 13, "expected AND after BETWEEN's lower bound, found 'OR'"),
    ("a BETWEEN 'x' AND 'y'", 11, "expected a number after BETWEEN, found 'x'"),
    ("a BETWEEN 1 AND b", 17, "expected a number after BETWEEN ... AND, found 'b'"),
    ("a IN 'x'", 6, "expected '(' after IN"),
    ("a IN ()", 7, "expected a string in IN's list, found ')'"),
    ("a IN (1, 2)", 7, "expected a string in IN's list, found '1'"),
    ("a IN ('x' 'y')", 11, "expected ',' or ')' in IN's list"),
    ("a IN ('x',)", 11, "expected a string in IN's list"),
    ("a IN ('x'", 10, "expected ',' or ')' in IN's list, found the end"),
    ("a LIKE 1", 8, "expected a string pattern after LIKE"),
    ("a LIKE 'x' ESCAPE 'ab'", 19, "expected a one-character string after ESCAPE"),
    ("a LIKE 'x!' ESCAPE '!'", 8, "expected a character after the escape"),
    ("a < 'x'", 3, "expected = or <> to compare with a string, found '<'"),
    ("'x' >= a", 5, "expected = or <> to compare with a string, found '>='"),
    ("a > TRUE", 3, "expected = or <> to compare with a boolean"),
    ("1 = 'x'", 3, "expected values of one type around '=', found a number and a string"),
    ("TRUE = 1", 6, "expected values of one type"),
    ("'x' IN ('x')", 1, "expected a property name before IN, found 'x'"),
    ("1 BETWEEN 0 AND 2", 1, "expected a property name before BETWEEN"),
    ("NOT", 4, "expected a condition"),
    ("in = 1", 1, "expected a condition"),  # keywords are not names
    ("a = 1 AND null = 1", 11, "expected a condition"),
    ("a = 1,", 6, "expected AND, OR or the end of the expression, found ','"),
]


@pytest.mark.parametrize(("expression", "column", "detail"), ERRORS)
def test_syntax_errors_name_the_column(expression: str, column: int, detail: str) -> None:
    with pytest.raises(FilterError) as err:
        sql(expression)
    assert err.value.column == column
    prefix = f"SQL filter: syntax error at column {column}: "
    assert err.value.reason.startswith(prefix)
    assert err.value.reason[len(prefix) :].startswith(("expected", "unexpected character"))
    assert detail in err.value.reason


def test_expression_length_limit() -> None:
    pad = "a = 1" + " " * (MAX_EXPRESSION_CHARS - 5)
    assert len(pad) == MAX_EXPRESSION_CHARS
    assert match(pad, {"a": "1"})
    with pytest.raises(FilterError, match="too long at column 4097") as err:
        sql(pad + " ")
    assert err.value.column == MAX_EXPRESSION_CHARS + 1


def test_nesting_limit() -> None:
    deep = "(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH
    assert match(deep, {"a": "1"})
    with pytest.raises(FilterError, match="at most 64 levels of nesting") as err:
        sql("(" + deep + ")")
    assert err.value.column == MAX_DEPTH + 1
    nots = "NOT " * MAX_DEPTH + "a = 1"
    assert match(nots, {"a": "1"})  # an even number of NOTs
    with pytest.raises(FilterError, match="nesting") as err:
        sql("NOT " + nots)
    assert err.value.column == 4 * MAX_DEPTH + 1
    mixed = "NOT (" * (MAX_DEPTH // 2) + "a = 1" + ")" * (MAX_DEPTH // 2)
    assert match(mixed, {"a": "1"})  # 32 NOTs
    with pytest.raises(FilterError, match="nesting"):
        sql("(" + mixed + ")")
    side_by_side = " AND ".join(["(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH] * 3)
    assert match(side_by_side, {"a": "1"})  # depth, not count


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_compiles_or_raises_filter_error(text: str) -> None:
    try:
        f = sql(text)
    except FilterError as exc:
        assert exc.column is not None and 1 <= exc.column <= len(text) + 1
        assert f"column {exc.column}:" in exc.reason
    else:
        f.matches(None, {})
        f.matches("t", {"a": "1", "b": "x"})


TOKENS = st.sampled_from(
    [
        "a",
        "b",
        "TAGS",
        "=",
        "<>",
        "<",
        ">=",
        "(",
        ")",
        ",",
        "AND",
        "OR",
        "NOT",
        "IN",
        "IS",
        "NULL",
        "BETWEEN",
        "LIKE",
        "TRUE",
        "1",
        "-2.5",
        "'x'",
        "'%'",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(TOKENS, max_size=12))
def test_token_soup_compiles_or_raises_filter_error(tokens: list[str]) -> None:
    text = " ".join(tokens)
    try:
        sql(text).matches("t", {"a": "1"})
    except FilterError as exc:
        assert exc.column is not None and 1 <= exc.column <= len(text) + 1


# ---------------------------------------------------------------- model

VALUES = ["1", "2", "-1", "2.5", "x", "eu", "", "true"]
NAMES = ["a", "b", "c"]


@dataclass(frozen=True)
class Cmp:
    name: str
    op: str
    literal: int | float | str


@dataclass(frozen=True)
class Between:
    name: str
    low: int
    high: int
    negated: bool


@dataclass(frozen=True)
class In:
    name: str
    values: tuple[str, ...]
    negated: bool


@dataclass(frozen=True)
class IsNull:
    name: str
    negated: bool


@dataclass(frozen=True)
class Not:
    inner: Node


@dataclass(frozen=True)
class Bin:
    op: str  # "AND" or "OR"
    left: Node
    right: Node


Node = Cmp | Between | In | IsNull | Not | Bin


def reference_number(value: str) -> float | None:
    return float(value) if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", value) else None


def evaluate(node: Node, props: Mapping[str, str]) -> bool:  # the documented semantics
    if isinstance(node, Bin):
        left, right = evaluate(node.left, props), evaluate(node.right, props)
        return (left and right) if node.op == "AND" else (left or right)
    if isinstance(node, Not):
        return not evaluate(node.inner, props)
    value = props.get(node.name)
    if isinstance(node, IsNull):
        return (value is None) != node.negated
    if value is None:
        return False
    if isinstance(node, In):
        return (value in node.values) != node.negated
    if isinstance(node, Cmp) and isinstance(node.literal, str):
        return (value == node.literal) == (node.op == "=")
    n = reference_number(value)
    if n is None:
        return False
    if isinstance(node, Between):
        return (node.low <= n <= node.high) != node.negated
    lit = node.literal
    assert not isinstance(lit, str)
    ops = {"=": n == lit, "<>": n != lit, "<": n < lit, "<=": n <= lit, ">": n > lit}
    return ops.get(node.op, n >= lit)


names = st.sampled_from(NAMES)
numeric_ops = st.sampled_from(["=", "<>", "<", "<=", ">", ">="])
value_lists = st.lists(st.sampled_from(VALUES), min_size=1, max_size=3).map(tuple)
leaves = st.one_of(
    st.builds(Cmp, names, numeric_ops, st.sampled_from([0, 1, 2, -1, 2.5])),
    st.builds(Cmp, names, st.sampled_from(["=", "<>"]), st.sampled_from(["x", "eu", "", "1"])),
    st.builds(Between, names, st.integers(-2, 2), st.integers(-2, 3), st.booleans()),
    st.builds(In, names, value_lists, st.booleans()),
    st.builds(IsNull, names, st.booleans()),
)
trees = st.recursive(
    leaves,
    lambda sub: st.one_of(
        st.builds(Not, sub), st.builds(Bin, st.sampled_from(["AND", "OR"]), sub, sub)
    ),
    max_leaves=12,
)
PRECEDENCE = {"OR": 1, "AND": 2}


def literal(value: int | float | str) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else str(value)


def render(node: Node, draw_parens: st.DrawFn) -> str:
    """SQL text with only the parentheses precedence needs, and some that it does not."""
    if isinstance(node, Bin):
        parts = []
        for child in (node.left, node.right):
            text = render(child, draw_parens)
            if isinstance(child, Bin) and PRECEDENCE[child.op] < PRECEDENCE[node.op]:
                text = f"({text})"
            parts.append(text)
        text = f"{parts[0]} {draw_parens(st.sampled_from([node.op, node.op.lower()]))} {parts[1]}"
    elif isinstance(node, Not):
        inner = render(node.inner, draw_parens)
        text = f"NOT ({inner})" if isinstance(node.inner, Bin) else f"NOT {inner}"
    elif isinstance(node, Cmp):
        text = f"{node.name} {node.op} {literal(node.literal)}"
    elif isinstance(node, Between):
        text = f"{node.name} {'NOT ' * node.negated}BETWEEN {node.low} AND {node.high}"
    elif isinstance(node, In):
        text = f"{node.name} {'NOT ' * node.negated}IN ({', '.join(map(literal, node.values))})"
    else:
        text = f"{node.name} IS {'NOT ' * node.negated}NULL"
    return f"({text})" if draw_parens(st.integers(0, 5)) == 0 else text


messages = st.fixed_dictionaries({}, optional={n: st.sampled_from(VALUES) for n in NAMES})


@st.composite
def rendered(draw: st.DrawFn) -> tuple[Node, str]:
    node = draw(trees)
    return node, render(node, draw)


@settings(max_examples=400, deadline=None)
@given(rendered(), st.lists(messages, min_size=1, max_size=6))
def test_model(case: tuple[Node, str], messages: list[dict[str, str]]) -> None:
    node, text = case
    f = sql(text)
    for props in messages:
        assert f.matches(None, props) == evaluate(node, props), (text, props)
