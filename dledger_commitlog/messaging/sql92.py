"""SQL92 property filters, RocketMQ's subset: a lexer, a parser and the evaluator it
compiles an expression into (a tree of closures; `messaging.filters` is the way in).

SQL92, RocketMQ's subset, by precedence from loosest: `OR`; `AND`; `NOT`; then a
predicate, or a parenthesised expression:

- `x = y`, `x <> y` (also `!=`), `x < y`, `x <= y`, `x > y`, `x >= y`: either
  side a property or a literal;
- `p [NOT] BETWEEN n AND m` (numbers, bounds included); `p [NOT] IN ('a', 'b')`
  (strings); `p IS [NOT] NULL`; `p [NOT] LIKE 'a%_' [ESCAPE '\\']` (`%` any run,
  `_` one character, the whole value), `p` a property name; `TRUE`, `FALSE`.

Literals: 'strings' ('' is a quote inside one), integers and decimals (`-5`,
`1.5`, `2e3`), TRUE and FALSE. Keywords are case-insensitive; so they are not
property names, and ESCAPE is a keyword only after a LIKE pattern. A property
name starts with a letter or `_` and goes on with letters, digits, `_` and `.`
(`a_b.c`), case-sensitive. The name `TAGS` is the message's tag (the `tags`
argument; no tag or "" is a missing value), not a property.

Evaluation. A property value is a string. Against a number, it is read as an
integer or a decimal (`[+-]digits[.digits][e[+-]digits]`, nothing around it);
a value that does not read as a number makes the comparison false. Strings and
booleans compare by `=` and `<>` only (any other operator is a FilterError);
a value equals TRUE when it is "true" in any case. Two properties compare as
strings by `=`/`<>`, as numbers by the others. A missing property makes every
predicate about it false (`IS NULL` true) — the negated forms too:
`a <> 1`, `a NOT IN ('x')`, `a NOT BETWEEN 1 AND 2` and `a NOT LIKE 'x%'` are
false without `a`.

Logic is two-valued, not SQL's three: a predicate is true or false, and `NOT`
flips it. So `NOT (a = 1)` matches a message without `a` while `a <> 1` does
not; write `a IS NULL OR a <> 1`, or `a IS NOT NULL AND NOT (...)`, to say which
is meant.

Limits: an expression is at most 4096 characters and nests parentheses and
NOTs at most 64 deep. A syntax error names its column (1-based; one past the
end for an expression that stops short) and what was expected there.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from store.errors import InvalidMessage

MAX_EXPRESSION_CHARS: Final = 4096
MAX_DEPTH: Final = 64
TAGS_NAME: Final = "TAGS"

Predicate = Callable[[str | None, Mapping[str, str]], bool]
_Getter = Callable[[str | None, Mapping[str, str]], str | None]
Number = int | float


class FilterError(InvalidMessage):
    """A filter expression that does not parse; the message names the column and what was
    expected (`column`, 1-based; None for an unknown kind or a bad TAG expression)."""

    def __init__(self, reason: str, column: int | None = None) -> None:
        super().__init__(reason)
        self.column = column


def compile_sql92(expression: str) -> Predicate:
    """`expression` compiled (FilterError naming the column if it does not parse)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise FilterError(
            f"SQL filter: expression too long at column {MAX_EXPRESSION_CHARS + 1}: "
            f"expected at most {MAX_EXPRESSION_CHARS} characters, found {len(expression)}",
            MAX_EXPRESSION_CHARS + 1,
        )
    return _Parser(expression).parse()


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "name", "keyword", "string", "number", "op", "(", ")", ",", "end"
    text: str  # as written; a keyword upper-cased
    column: int
    value: str | Number | None = None  # a string's or a number's value

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the expression"
        if self.kind == "string":
            return self.text
        if self.kind == "keyword" and self.text == "NULL":
            return "NULL (test for it with IS NULL)"
        return repr(self.text)


_KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "LIKE", "TRUE", "FALSE"}
)
_OPERATORS: Final = ("<>", "<=", ">=", "!=", "=", "<", ">")
_NUMBER_LITERAL: Final = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DIGITS: Final = frozenset("0123456789")


def _error(column: int, detail: str) -> FilterError:
    return FilterError(f"SQL filter: syntax error at column {column}: {detail}", column)


def _expected(what: str, found: _Token) -> FilterError:
    return _error(found.column, f"expected {what}, found {found.describe()}")


def _is_name_start(ch: str) -> bool:
    return ch == "_" or ch.isalpha()


def _is_name_part(ch: str) -> bool:
    return ch in "_." or ch in _DIGITS or ch.isalpha()


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        col = i + 1
        if ch.isspace():
            i += 1
        elif ch == "'":
            i = _string(text, i, tokens)
        elif ch in "(),":
            tokens.append(_Token(ch, ch, col))
            i += 1
        elif (op := next((o for o in _OPERATORS if text.startswith(o, i)), None)) is not None:
            tokens.append(_Token("op", op, col))
            i += len(op)
        elif (m := _NUMBER_LITERAL.match(text, i)) is not None:
            i = m.end()
            if i < n and _is_name_part(text[i]):
                raise _error(col, f"expected a number, found {text[col - 1 : i + 1]!r}")
            tokens.append(_Token("number", m.group(), col, _literal_number(m.group(), col)))
        elif _is_name_start(ch):
            j = i + 1
            while j < n and _is_name_part(text[j]):
                j += 1
            word = text[i:j]
            if word.upper() in _KEYWORDS:
                tokens.append(_Token("keyword", word.upper(), col))
            else:
                tokens.append(_Token("name", word, col))
            i = j
        else:
            raise _error(col, f"unexpected character {ch!r}")
    tokens.append(_Token("end", "", n + 1))
    return tokens


def _string(text: str, start: int, tokens: list[_Token]) -> int:
    """The string literal opening at `start` onto `tokens`; the index past it."""
    parts: list[str] = []
    j = start + 1
    while True:
        k = text.find("'", j)
        if k < 0:
            raise _error(start + 1, "expected a closing quote for the string opened here")
        parts.append(text[j:k])
        if text.startswith("''", k):
            parts.append("'")
            j = k + 2
            continue
        tokens.append(_Token("string", text[start : k + 1], start + 1, "".join(parts)))
        return k + 1


def _literal_number(text: str, column: int) -> Number:
    if not any(c in text for c in ".eE"):
        return int(text)
    value = float(text)
    if not math.isfinite(value):
        raise _error(column, f"expected a finite number, found {text!r}")
    return value


_INT_VALUE: Final = re.compile(r"[+-]?[0-9]+")
_DECIMAL_VALUE: Final = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _number(value: str | None) -> Number | None:
    """A property value read as a number; None if it is missing or is not one."""
    if value is None:
        return None
    try:
        if _INT_VALUE.fullmatch(value):
            return int(value)
        if _DECIMAL_VALUE.fullmatch(value):
            number = float(value)
            return number if math.isfinite(number) else None
    except ValueError:  # more digits than int() reads
        return None
    return None


def _getter(name: str) -> _Getter:
    if name == TAGS_NAME:
        return lambda t, _p: t or None
    return lambda _t, p: p.get(name)


def always(_t: str | None, _p: Mapping[str, str]) -> bool:
    """The predicate that takes every message."""
    return True


def _never(_t: str | None, _p: Mapping[str, str]) -> bool:
    return False


def _constant(value: bool) -> Predicate:
    return always if value else _never


def _all(parts: list[Predicate]) -> Predicate:
    return _fold(parts, absorbing=_never, neutral=always, either=False)


def _any(parts: list[Predicate]) -> Predicate:
    return _fold(parts, absorbing=always, neutral=_never, either=True)


def _fold(
    parts: list[Predicate], absorbing: Predicate, neutral: Predicate, either: bool
) -> Predicate:
    """AND (`either` False) or OR of `parts`, constants folded: one that decides the
    whole (`absorbing`) is the answer, one that changes nothing (`neutral`) is dropped."""
    if any(p is absorbing for p in parts):
        return absorbing
    rest = tuple(p for p in parts if p is not neutral)
    if not rest:
        return neutral
    if len(rest) == 1:
        return rest[0]
    if len(rest) == 2:
        first, second = rest
        if either:
            return lambda t, p: first(t, p) or second(t, p)
        return lambda t, p: first(t, p) and second(t, p)
    combine = any if either else all
    return lambda t, p: combine(part(t, p) for part in rest)


def _not(inner: Predicate) -> Predicate:
    if inner is always:
        return _never
    if inner is _never:
        return always
    return lambda t, p: not inner(t, p)


_ORDER: Final[dict[str, Callable[[Number, Number], bool]]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MIRROR: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True, slots=True)
class _Operand:
    kind: str  # "property", "string", "number", "boolean"
    value: str | Number | bool
    token: _Token


def _compare(left: _Operand, op_token: _Token, right: _Operand) -> Predicate:
    op = "<>" if op_token.text == "!=" else op_token.text
    if left.kind != "property" and right.kind == "property":
        left, right, op = right, left, _MIRROR[op]
    for side in (right, left):
        if side.kind in ("string", "boolean") and op not in ("=", "<>"):
            detail = f"expected = or <> to compare with a {side.kind}, found {op_token.text!r}"
            raise _error(op_token.column, detail)
    if left.kind != "property":  # two literals: decided here
        if left.kind != right.kind:
            raise _error(
                op_token.column,
                f"expected values of one type around {op_token.text!r}, found a {left.kind} "
                f"and a {right.kind}",
            )
        if isinstance(left.value, str | bool):
            return _constant((left.value == right.value) == (op == "="))
        assert not isinstance(right.value, str)
        return _constant(_ORDER[op](left.value, right.value))
    get = _getter(str(left.value))
    order = _ORDER[op]
    if right.kind == "number":
        bound = right.value
        assert isinstance(bound, int | float)

        def versus_number(t: str | None, p: Mapping[str, str]) -> bool:
            n = _number(get(t, p))
            return n is not None and order(n, bound)

        return versus_number
    if right.kind == "property":
        other = _getter(str(right.value))
        if op in ("=", "<>"):
            equal = op == "="

            def versus_property(t: str | None, p: Mapping[str, str]) -> bool:
                a, b = get(t, p), other(t, p)
                return a is not None and b is not None and (a == b) == equal

            return versus_property

        def versus_property_number(t: str | None, p: Mapping[str, str]) -> bool:
            a, b = _number(get(t, p)), _number(other(t, p))
            return a is not None and b is not None and order(a, b)

        return versus_property_number
    if right.kind == "boolean":
        text = "true" if right.value else "false"
        equal = op == "="
        return lambda t, p: (v := get(t, p)) is not None and (v.lower() == text) == equal
    literal = right.value
    if op == "=":
        return lambda t, p: get(t, p) == literal
    return lambda t, p: (v := get(t, p)) is not None and v != literal


def _between(get: _Getter, low: Number, high: Number, negated: bool) -> Predicate:
    def between(t: str | None, p: Mapping[str, str]) -> bool:
        n = _number(get(t, p))
        return n is not None and (low <= n <= high) != negated

    return between


def _in(get: _Getter, values: frozenset[str], negated: bool) -> Predicate:
    if negated:
        return lambda t, p: (v := get(t, p)) is not None and v not in values
    return lambda t, p: get(t, p) in values


def _like(get: _Getter, pattern: re.Pattern[str], negated: bool) -> Predicate:
    def like(t: str | None, p: Mapping[str, str]) -> bool:
        v = get(t, p)
        return v is not None and (pattern.fullmatch(v) is None) == negated

    return like


def _like_pattern(pattern: _Token, escape: str | None) -> re.Pattern[str]:
    text = str(pattern.value)
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if escape is not None and ch == escape:
            if i + 1 == len(text):
                raise _error(pattern.column, "expected a character after the escape, found the end")
            out.append(re.escape(text[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


class _Parser:
    """Recursive descent over the tokens, building the predicate as it goes."""

    def __init__(self, text: str) -> None:
        self._tokens = _tokenize(text)
        self._pos = 0
        self._depth = 0

    def parse(self) -> Predicate:
        predicate = self._or()
        tok = self._peek()
        if tok.kind != "end":
            raise _expected("AND, OR or the end of the expression", tok)
        return predicate

    def _peek(self) -> _Token:
        return self._tokens[self._pos]

    def _take(self) -> _Token:
        tok = self._tokens[self._pos]
        if tok.kind != "end":
            self._pos += 1
        return tok

    def _keyword(self, *words: str) -> _Token | None:
        tok = self._peek()
        if tok.kind == "keyword" and tok.text in words:
            return self._take()
        return None

    def _nest(self, tok: _Token) -> None:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _error(tok.column, f"expected at most {MAX_DEPTH} levels of nesting, found more")

    def _or(self) -> Predicate:
        parts = [self._and()]
        while self._keyword("OR"):
            parts.append(self._and())
        return _any(parts)

    def _and(self) -> Predicate:
        parts = [self._unary()]
        while self._keyword("AND"):
            parts.append(self._unary())
        return _all(parts)

    def _unary(self) -> Predicate:
        tok = self._peek()
        if tok.kind == "keyword" and tok.text == "NOT":
            self._take()
            self._nest(tok)
            inner = _not(self._unary())
            self._depth -= 1
            return inner
        if tok.kind == "(":
            self._take()
            self._nest(tok)
            inner = self._or()
            close = self._take()
            if close.kind != ")":
                raise _expected("')' or an operator (AND, OR)", close)
            self._depth -= 1
            return inner
        return self._predicate()

    def _operand(self, what: str) -> _Operand:
        tok = self._take()
        if tok.kind == "name":
            return _Operand("property", tok.text, tok)
        if tok.kind == "string":
            assert isinstance(tok.value, str)
            return _Operand("string", tok.value, tok)
        if tok.kind == "number":
            assert isinstance(tok.value, int | float)
            return _Operand("number", tok.value, tok)
        if tok.kind == "keyword" and tok.text in ("TRUE", "FALSE"):
            return _Operand("boolean", tok.text == "TRUE", tok)
        raise _expected(what, tok)

    def _predicate(self) -> Predicate:
        left = self._operand("a condition (a property, a value, NOT or '(')")
        tok = self._peek()
        if tok.kind == "op":
            self._take()
            right = self._operand(f"a value after {tok.text!r}")
            return _compare(left, tok, right)
        if tok.kind != "keyword" or tok.text not in ("NOT", "BETWEEN", "IN", "LIKE", "IS"):
            if left.kind == "boolean":
                return _constant(bool(left.value))
            raise _expected(f"a comparison after {left.token.describe()}", tok)
        if left.kind != "property":
            raise _error(
                left.token.column,
                f"expected a property name before {tok.text}, found {left.token.describe()}",
            )
        get = _getter(str(left.value))
        negated = self._keyword("NOT") is not None
        tok = self._take()
        if tok.kind == "keyword" and tok.text == "BETWEEN":
            low = self._number("a number after BETWEEN")
            if not self._keyword("AND"):
                raise _expected("AND after BETWEEN's lower bound", self._peek())
            high = self._number("a number after BETWEEN ... AND")
            return _between(get, low, high, negated)
        if tok.kind == "keyword" and tok.text == "IN":
            return _in(get, self._string_list(), negated)
        if tok.kind == "keyword" and tok.text == "LIKE":
            pattern = self._take()
            if pattern.kind != "string":
                raise _expected("a string pattern after LIKE", pattern)
            escape: str | None = None
            word = self._peek()
            if word.kind == "name" and word.text.upper() == "ESCAPE":
                self._take()
                esc = self._take()
                if esc.kind != "string" or len(str(esc.value)) != 1:
                    raise _expected("a one-character string after ESCAPE", esc)
                escape = str(esc.value)
            return _like(get, _like_pattern(pattern, escape), negated)
        if negated:
            raise _expected("BETWEEN, IN or LIKE after NOT", tok)
        # IS: the one left
        is_not = self._keyword("NOT") is not None
        null = self._take()
        if null.kind != "keyword" or null.text != "NULL":
            raise _expected("NULL after IS NOT" if is_not else "NULL or NOT NULL after IS", null)
        if is_not:
            return lambda t, p: get(t, p) is not None
        return lambda t, p: get(t, p) is None

    def _number(self, what: str) -> Number:
        tok = self._take()
        if tok.kind != "number":
            raise _expected(what, tok)
        assert isinstance(tok.value, int | float)
        return tok.value

    def _string_list(self) -> frozenset[str]:
        opening = self._take()
        if opening.kind != "(":
            raise _expected("'(' after IN", opening)
        values: list[str] = []
        while True:
            tok = self._take()
            if tok.kind != "string":
                raise _expected("a string in IN's list", tok)
            assert isinstance(tok.value, str)
            values.append(tok.value)
            sep = self._take()
            if sep.kind == ")":
                return frozenset(values)
            if sep.kind != ",":
                raise _expected("',' or ')' in IN's list", sep)
