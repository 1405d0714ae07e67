"""RocketMQ's SQL92 message selector (`MessageSelector.bySql`, expression type `SQL92`): an
expression parsed once, then evaluated against each message's properties (`TAGS`, `KEYS` and
the producer's own). No I/O: the read and pop services call `matches` on what they read.

The grammar and the answers are RocketMQ's filter module's (ActiveMQ's JMS selector, cut down),
so a subscription selects the same messages here as on a RocketMQ broker:

    or:         and (OR and)*
    and:        equality (AND equality)*
    equality:   comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
    comparison: unary ( ('>' | '>=' | '<' | '<=') unary
                      | [NOT] BETWEEN unary AND unary | [NOT] IN (string, ...)
                      | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string )*
    unary:      '+' unary | '-' unary | NOT unary | primary
    primary:    literal | property | '(' or ')'

Literals: 'text' ('' for a quote), integers (an L suffix allowed), decimals (5.5, .5, 5E3), TRUE,
FALSE, NULL; keywords in any case; `--` and `/* */` comments. A property is `[A-Za-z_$][\\w$]*`.
Note RocketMQ's precedence: NOT binds before a comparison (`NOT a = 1` is `(NOT a) = 1`, never
true): write `NOT (a = 1)`.

Values: a property is a string, or NULL when the message lacks it. Compared with a number, the
string is read as one (an integer constant reads it as Java's Integer or Long, by the
constant's range; a decimal as a Double); with TRUE or FALSE, as a boolean ('true' in any case).
`>`, `>=`, `<` and `<=` take only numbers: two properties are both read as decimals. Logic is
three-valued (true, false, unknown: a comparison with NULL); a message matches only on true. A
string that cannot be read as the number it is compared with fails the whole evaluation: the
message does not match (RocketMQ's broker logs it and skips the message).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_LENGTH = 16_384  # characters of an expression (a subscription rides in a request header)
MAX_DEPTH = 64  # nested parentheses, NOTs and signs: the parser recurses
MAX_HEIGHT = 128  # an expression's tree, root to leaf: the evaluation recurses
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
DOUBLE_MAX = 1.7976931348623157e308

KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS",
                      "STARTSWITH", "ENDSWITH"})

_TOKEN = re.compile(r"""
    (?P<skip>[ \t\n\r\f]+ | --[^\n\r]* | /\*[^*]*\*+(?:[^*/][^*]*\*+)*/)
  | (?P<float>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)? | \.[0-9]+(?:[eE][+-]?[0-9]+)? | [0-9]+[eE][+-]?[0-9]+)
  | (?P<int>(?:0|[1-9][0-9]*)[lL]?)
  | (?P<str>'(?:''|[^'])*')
  | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|>=|<=|[=<>(),+-])
""", re.VERBOSE)
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")


class SelectorError(ValueError):
    """An expression that does not parse or breaks a rule of the grammar's (a string compared by
    `>`, NULL compared by `=`, BETWEEN's bounds the wrong way round)."""


class _Unreadable(Exception):
    """A string that cannot be read as the number or boolean it is compared with."""


@dataclass(frozen=True, slots=True)
class _Expr:
    """A parsed expression: `fn(properties)` its value (str, bool, int, float or None).
    `const` and `value` for a literal; `boolean` for what RocketMQ calls a BooleanExpression
    (comparisons, logic, TRUE, FALSE, NULL); `prop` for a property's name."""
    fn: Callable[[dict], object]
    height: int = 1
    const: bool = False
    value: object = None
    boolean: bool = False
    prop: str | None = None


class Selector:
    """One compiled expression. `matches(properties)` is true only when it evaluates to true."""

    __slots__ = ("text", "_fn")

    def __init__(self, text: str, expr: _Expr):
        self.text, self._fn = text, expr.fn

    def evaluate(self, properties: dict) -> bool | None:
        """True, false or None (unknown); raises nothing for any properties."""
        try:
            return self._fn(properties)
        except _Unreadable:
            return False

    def matches(self, properties: dict) -> bool:
        return self.evaluate(properties) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """The Selector of `text`; SelectorError when it is not one. Compiled once per text."""
    if not isinstance(text, str):
        raise SelectorError("a SQL92 expression must be a string")
    if len(text) > MAX_LENGTH:
        raise SelectorError(f"a SQL92 expression holds at most {MAX_LENGTH} characters")
    return _compile(text)


@functools.lru_cache(maxsize=1024)
def _compile(text: str) -> Selector:
    parser = _Parser(_tokens(text))
    expr = parser.as_boolean(parser.or_expr())
    if parser.peek() is not None:
        raise SelectorError(f"unexpected {parser.peek()[1]!r} at the end of {text!r}")
    return Selector(text, expr)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if m is None:
            raise SelectorError(f"cannot read {text[at:at + 20]!r} (at {at})")
        at = m.end()
        kind = m.lastgroup
        if kind == "id" and m.group().upper() in KEYWORDS:
            out.append(("kw", m.group().upper()))
        elif kind != "skip":
            out.append((kind, m.group()))
    return out


class _Parser:
    """Recursive descent over the tokens, one method per rule of the module's grammar."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.at, self.depth = tokens, 0, 0

    def peek(self, ahead: int = 0) -> tuple[str, str] | None:
        i = self.at + ahead
        return self.tokens[i] if i < len(self.tokens) else None

    def take(self, *texts: str) -> str | None:
        """The next token's text if it is one of `texts` (keywords and operators), consumed."""
        token = self.peek()
        if token is not None and token[0] in ("kw", "op") and token[1] in texts:
            self.at += 1
            return token[1]
        return None

    def expect(self, text: str) -> None:
        if self.take(text) is None:
            token = self.peek()
            raise SelectorError(f"expected {text!r}, found {token[1] if token else 'the end'!r}")

    def or_expr(self) -> _Expr:
        items = [self.and_expr()]
        while self.take("OR"):
            items.append(self.and_expr())
        return items[0] if len(items) == 1 else _or([self.as_boolean(e) for e in items])

    def and_expr(self) -> _Expr:
        items = [self.equality()]
        while self.take("AND"):
            items.append(self.equality())
        return items[0] if len(items) == 1 else _and([self.as_boolean(e) for e in items])

    def equality(self) -> _Expr:
        left = self.comparison()
        while True:
            if self.take("="):
                left = _equal(left, self.comparison())
            elif self.take("<>"):
                left = _not(_equal(left, self.comparison()))
            elif self.take("IS"):
                negated = self.take("NOT") is not None
                self.expect("NULL")
                left = _not(_is_null(left)) if negated else _is_null(left)
            else:
                return left

    def comparison(self) -> _Expr:
        left = self.unary()
        while True:
            op = self.take(">", ">=", "<", "<=", "BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH")
            negated = False
            if op is None and self.peek() == ("kw", "NOT") and self.peek(1) in _NEGATABLE:
                self.at += 1
                op, negated = self.take("BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH"), True
            if op is None:
                return left
            left = self._comparison(op, negated, left)

    def _comparison(self, op: str, negated: bool, left: _Expr) -> _Expr:
        if op in _RELATIONS:
            return _relation(op, left, self.unary())
        if op == "BETWEEN":
            low = self.unary()
            self.expect("AND")
            return _between(left, low, self.unary(), negated)
        if op == "IN":
            return _in(left, self.string_list(), negated)
        return _text_test(op, left, self.string(), negated)

    def unary(self) -> _Expr:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SelectorError(f"nested deeper than {MAX_DEPTH}")
        try:
            if self.take("+"):
                return self.unary()
            if self.take("-"):
                return _negate(self.unary())
            if self.take("NOT"):
                return _not(self.as_boolean(self.unary()))
            return self.primary()
        finally:
            self.depth -= 1

    def primary(self) -> _Expr:
        token = self.peek()
        if token is None:
            raise SelectorError("the expression ends where a value should be")
        kind, text = token
        if self.take("("):
            inner = self.or_expr()
            self.expect(")")
            return inner
        self.at += 1
        if kind == "id":
            return _Expr(lambda p, name=text: p.get(name), prop=text)
        if kind in ("str", "int", "float") or (kind == "kw" and text in ("TRUE", "FALSE", "NULL")):
            return _literal(kind, text)
        raise SelectorError(f"unexpected {text!r}")

    def string(self) -> str:
        token = self.peek()
        if token is None or token[0] != "str":
            raise SelectorError(f"expected a 'string', found {token[1] if token else 'the end'!r}")
        self.at += 1
        return token[1][1:-1].replace("''", "'")

    def string_list(self) -> list[str]:
        self.expect("(")
        items = [self.string()]
        while self.take(","):
            items.append(self.string())
        self.expect(")")
        return items

    @staticmethod
    def as_boolean(expr: _Expr) -> _Expr:
        """RocketMQ's asBooleanExpression: a property is read as a boolean (a string never is
        one: false, or unknown when missing); a literal number or string is refused."""
        if expr.boolean:
            return expr
        if expr.prop is not None:
            return _Expr(lambda p: _boolean_cast(expr.fn(p)), _height(expr), boolean=True)
        raise SelectorError("the expression does not give a true or false value")


_RELATIONS = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}
_NEGATABLE = {("kw", "BETWEEN"), ("kw", "IN"), ("kw", "CONTAINS"), ("kw", "STARTSWITH"), ("kw", "ENDSWITH")}


# -- literals ----------------------------------------------------------------------------------


def _literal(kind: str, text: str) -> _Expr:
    if kind == "str":
        value = text[1:-1].replace("''", "'")
        return _Expr(lambda p: value, const=True, value=value)
    if kind == "int":
        value = int(text.rstrip("lL"))
        if not LONG_MIN <= value <= LONG_MAX:
            raise SelectorError(f"{text} is out of a long's range")
        return _Expr(lambda p: value, const=True, value=value)
    if kind == "float":
        value = float(text)
        if value > DOUBLE_MAX:
            raise SelectorError(f"{text} is greater than a double's largest value")
        return _Expr(lambda p: value, const=True, value=value)
    value = {"TRUE": True, "FALSE": False, "NULL": None}[text]
    return _Expr(lambda p: value, const=True, value=value, boolean=True)


# -- comparisons -------------------------------------------------------------------------------


def _equal(left: _Expr, right: _Expr) -> _Expr:
    for side in (left, right):
        if side.const and side.value is None:
            raise SelectorError("NULL cannot be compared with '=': write IS NULL")
    if left.const and right.const and left.boolean and not right.boolean:
        raise SelectorError(f"{left.value!r} cannot be compared with {right.value!r}")
    lf, rf = left.fn, right.fn

    def equal(p):
        lv, rv = lf(p), rf(p)
        if lv is None or rv is None:
            return None if lv is None else False
        if type(lv) is type(rv) and lv == rv:
            return True
        return _compare(lv, rv) == 0
    return _Expr(equal, _height(left, right), boolean=True)


def _is_null(left: _Expr) -> _Expr:
    lf = left.fn
    return _Expr(lambda p: lf(p) is None, _height(left), boolean=True)


def _relation(op: str, left: _Expr, right: _Expr) -> _Expr:
    for side in (left, right):
        if side.const and (isinstance(side.value, bool) or not isinstance(side.value, (int, float))):
            raise SelectorError(f"{side.value!r} cannot be compared with {op!r}: only numbers can")
        if side.boolean and not side.const:
            raise SelectorError(f"a true or false value cannot be compared with {op!r}")
    lf, rf, holds = left.fn, right.fn, _RELATIONS[op]

    def relation(p):
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:  # two properties: both read as decimals
            lv, rv = _read_number(lv, 0.0), _read_number(rv, 0.0)
        return holds(_compare(lv, rv))
    return _Expr(relation, _height(left, right), boolean=True)


def _between(value: _Expr, low: _Expr, high: _Expr, negated: bool) -> _Expr:
    if low.const and high.const:
        if low.value is None or high.value is None:
            raise SelectorError("BETWEEN's bounds cannot be NULL")
        if _numbers(low.value, high.value) and high.value < low.value:
            raise SelectorError(f"BETWEEN {low.value} AND {high.value}: the first bound must not exceed the second")
    if negated:
        return _or([_relation("<", value, low), _relation(">", value, high)])
    return _and([_relation(">=", value, low), _relation("<=", value, high)])


def _in(left: _Expr, items: list[str], negated: bool) -> _Expr:
    if left.prop is None:
        raise SelectorError("IN takes a property on its left")
    members, lf = frozenset(items), left.fn

    def within(p):
        v = lf(p)
        if type(v) is not str:
            return None
        return (v in members) != negated
    return _Expr(within, _height(left), boolean=True)


def _text_test(op: str, left: _Expr, search: str, negated: bool) -> _Expr:
    test = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}[op]
    lf = left.fn

    def text_test(p):
        v = lf(p)
        if not search or type(v) is not str:
            return False
        return test(v, search) != negated
    return _Expr(text_test, _height(left), boolean=True)


def _compare(lv, rv) -> int:
    """Java's ComparisonExpression.__compare with string conversion on: values of two types are
    brought to one (numbers to the wider; a string to the other's number or boolean); pairs
    that cannot be (a boolean and a number) compare as "less"."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is str:
            if rt is bool:
                lv = lv.lower() == "true"
            elif rt in (int, float):
                lv = _read_number(lv, rv)
            else:
                return -1
        elif lt in (int, float) and rt in (int, float):
            pass
        elif lt in (int, float) and rt is str:
            rv = _read_number(rv, lv)
        elif lt is bool and rt is str:
            raise _Unreadable  # (Java: a ClassCastException, the evaluation fails)
        else:
            return -1
    return (lv > rv) - (lv < rv)


def _read_number(text: str, like: int | float) -> int | float:
    """`text` as Java reads it to compare with `like`: Integer.valueOf for an int-range
    integer, Long.valueOf for a larger one, Double.valueOf for a decimal."""
    if type(like) is float:
        trimmed = text.strip()
        if not _JAVA_DOUBLE.fullmatch(trimmed):
            raise _Unreadable
        return float(trimmed.rstrip("fFdD").replace("Infinity", "inf"))
    if not _JAVA_INT.fullmatch(text):
        raise _Unreadable
    value = int(text)
    low, high = (INT_MIN, INT_MAX) if INT_MIN <= like <= INT_MAX else (LONG_MIN, LONG_MAX)
    if not low <= value <= high:
        raise _Unreadable
    return value


def _numbers(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


# -- logic -------------------------------------------------------------------------------------


def _and(items: list[_Expr]) -> _Expr:
    """RocketMQ's AND, left to right: false at the first false; else unknown if any was."""
    return _logic(items, decisive=False)


def _or(items: list[_Expr]) -> _Expr:
    """RocketMQ's OR, left to right: true at the first true; else unknown if any was."""
    return _logic(items, decisive=True)


def _logic(items: list[_Expr], decisive: bool) -> _Expr:
    fns = [e.fn for e in items]

    def combined(p):
        unknown = False
        for f in fns:
            v = f(p)
            if v is decisive:
                return decisive
            unknown = unknown or v is None
        return None if unknown else not decisive
    return _Expr(combined, _height(*items), boolean=True)


def _not(inner: _Expr) -> _Expr:
    f = inner.fn

    def negation(p):
        v = f(p)
        return None if v is None else not v
    return _Expr(negation, _height(inner), boolean=True)


def _negate(inner: _Expr) -> _Expr:
    f = inner.fn

    def negative(p):
        v = f(p)
        return -v if type(v) in (int, float) else None
    return _Expr(negative, _height(inner))  # (not a literal: RocketMQ checks no bounds through a sign)


def _height(*children: _Expr) -> int:
    height = 1 + max(c.height for c in children)
    if height > MAX_HEIGHT:
        raise SelectorError(f"the expression nests deeper than {MAX_HEIGHT}")
    return height


def _boolean_cast(value) -> bool | None:
    if value is None:
        return None
    return value if type(value) is bool else False
