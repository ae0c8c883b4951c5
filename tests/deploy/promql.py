"""A checker for the PromQL our Grafana dashboard writes: the selectors an expression reads, and the labels
its result carries, so a test can say "this metric does not exist", "it has no such label" or "these two
sides share no labels, so the division matches nothing" without a Prometheus server.

It knows the subset the dashboard uses (selectors, ranges, aggregations with `by`/`without`, the functions
below, arithmetic, comparisons and set operators); anything else (`on`, `ignoring`, `group_left`, `offset`,
subqueries, string arguments) is refused with a ParseError, so an expression it cannot judge fails the test
instead of passing unchecked. Grafana's interval variables are accepted where a range's duration goes, and
any `$variable` inside a matcher's string.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<range>\[[^\]]*\])
    | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){},])
    )""",
    re.VERBOSE,
)
DURATION = re.compile(r"^(?:\d+(?:ms|[smhdwy]))+$|^\$__(?:rate_interval|interval|range)$")

AGGREGATORS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "group", "topk", "bottomk", "quantile"}
# Functions over a range vector, giving an instant vector with the same labels.
RANGE_FUNCTIONS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets"} | {
    f"{kind}_over_time" for kind in ("avg", "min", "max", "sum", "count", "last", "stddev", "stdvar")
}
# Functions of an instant vector (and maybe scalars after it) keeping its labels.
VECTOR_FUNCTIONS = {"abs", "ceil", "floor", "round", "sqrt", "exp", "ln", "log2", "log10", "clamp", "clamp_min"} | {
    "clamp_max"
}
BINARY_PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    "==": 3,
    "!=": 3,
    "<": 3,
    ">": 3,
    "<=": 3,
    ">=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "atan2": 5,
    "^": 6,
}
SET_OPERATORS = {"or", "and", "unless"}
UNSUPPORTED = {"on", "ignoring", "group_left", "group_right", "offset", "@", "count_values", "label_replace"}


class ParseError(ValueError):
    """The expression is not PromQL, or not the subset this checker can judge."""


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value as written, quotes off)
    range: str | None


@dataclass(frozen=True)
class Vector:
    labels: frozenset[str]
    is_range: bool = False


class Scalar:
    pass


Value = Vector | Scalar


@dataclass
class Checked:
    """What an expression reads and what it gives: each problem found is a sentence in `problems`."""

    result: Value
    selectors: list[Selector] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def tokenize(expr: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    expr = expr.rstrip()
    while position < len(expr):
        match = TOKEN.match(expr, position)
        if match is None or match.end() == position:
            raise ParseError(f"cannot read {expr[position : position + 20]!r} at {position}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match[kind]))
        position = match.end()
    return tokens


class Parser:
    """Recursive descent over the tokens; `labels_of(name)` gives a selector's labels (KeyError: no such metric)."""

    def __init__(self, expr: str, labels_of: Callable[[str], frozenset[str]]):
        self.tokens = tokenize(expr)
        self.index = 0
        self.labels_of = labels_of
        self.selectors: list[Selector] = []
        self.problems: list[str] = []

    def peek(self, offset: int = 0) -> tuple[str, str]:
        at = self.index + offset
        return self.tokens[at] if at < len(self.tokens) else ("end", "")

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        token_kind, token = self.peek()
        if (value is not None and token != value) or (kind is not None and token_kind != kind):
            raise ParseError(f"expected {value or kind}, found {token or 'the end'!r}")
        self.index += 1
        return token

    def parse(self) -> Value:
        value = self.expression(0)
        if self.peek()[0] != "end":
            raise ParseError(f"unexpected {self.peek()[1]!r} after a complete expression")
        return value

    def expression(self, least: int) -> Value:
        left = self.unary()
        while True:
            kind, token = self.peek()
            if token in UNSUPPORTED:
                raise ParseError(f"{token!r} is beyond what this checker knows")
            precedence = BINARY_PRECEDENCE.get(token)
            if kind not in ("op", "ident") or precedence is None or precedence < least:
                return left
            self.index += 1
            if self.peek()[1] == "bool":
                self.index += 1
            if self.peek()[1] in UNSUPPORTED:
                raise ParseError(f"{self.peek()[1]!r} is beyond what this checker knows")
            right = self.expression(precedence if token == "^" else precedence + 1)
            left = self.combine(token, left, right)

    def combine(self, operator: str, left: Value, right: Value) -> Value:
        for side in (left, right):
            if isinstance(side, Vector) and side.is_range:
                raise ParseError(f"a range vector cannot be an operand of {operator!r}")
        if isinstance(left, Scalar) and isinstance(right, Scalar):
            return left
        if isinstance(left, Scalar) or isinstance(right, Scalar):
            if operator in SET_OPERATORS:
                raise ParseError(f"{operator!r} takes two vectors")
            return right if isinstance(left, Scalar) else left
        assert isinstance(left, Vector) and isinstance(right, Vector)
        if operator == "or":
            return Vector(left.labels | right.labels)
        if operator not in SET_OPERATORS and left.labels != right.labels:
            self.problems.append(
                f"{operator!r} matches series on all their labels, and its sides have {sorted(left.labels)} and "
                f"{sorted(right.labels)}: no series would match"
            )
        return left

    def unary(self) -> Value:
        if self.peek()[1] in ("-", "+"):
            self.index += 1
            return self.unary()
        return self.primary()

    def primary(self) -> Value:
        kind, token = self.peek()
        if token == "(":
            self.index += 1
            value = self.expression(0)
            self.take(")")
            return value
        if kind == "number":
            self.index += 1
            return Scalar()
        if kind != "ident":
            raise ParseError(f"unexpected {token or 'end'!r}")
        if token in UNSUPPORTED:
            raise ParseError(f"{token!r} is beyond what this checker knows")
        if token in AGGREGATORS and (self.peek(1)[1] in ("(", "by", "without")):
            return self.aggregation()
        if self.peek(1)[1] == "(":
            return self.function()
        return self.selector()

    def label_list(self) -> list[str]:
        self.take("(")
        labels: list[str] = []
        while self.peek()[1] != ")":
            labels.append(self.take(kind="ident"))
            if self.peek()[1] == ",":
                self.index += 1
        self.take(")")
        return labels

    def aggregation(self) -> Value:
        operator = self.take()
        grouping: tuple[str, list[str]] | None = None
        if self.peek()[1] in ("by", "without"):
            grouping = (self.take(), self.label_list())
        self.take("(")
        if operator in ("topk", "bottomk", "quantile"):
            if not isinstance(self.expression(0), Scalar):
                raise ParseError(f"{operator}'s first argument is a scalar")
            self.take(",")
        argument = self.expression(0)
        self.take(")")
        if self.peek()[1] in ("by", "without"):
            if grouping is not None:
                raise ParseError(f"{operator} has two groupings")
            grouping = (self.take(), self.label_list())
        if not isinstance(argument, Vector) or argument.is_range:
            raise ParseError(f"{operator} aggregates an instant vector")
        if grouping is None:
            return Vector(argument.labels if operator in ("topk", "bottomk") else frozenset())
        how, labels = grouping
        for label in labels:
            if label not in argument.labels:
                self.problems.append(f"{operator} {how} ({label}): its argument has no {label!r} label")
        if how == "by":
            return Vector(frozenset(labels))
        return Vector(argument.labels - frozenset(labels))

    def function(self) -> Value:
        name = self.take()
        self.take("(")
        arguments: list[Value] = []
        while self.peek()[1] != ")":
            if self.peek()[0] == "string":
                raise ParseError(f"{name}: string arguments are beyond what this checker knows")
            arguments.append(self.expression(0))
            if self.peek()[1] == ",":
                self.index += 1
        self.take(")")
        first = arguments[0] if arguments else None
        if name in RANGE_FUNCTIONS:
            if len(arguments) != 1 or not isinstance(first, Vector) or not first.is_range:
                raise ParseError(f"{name} takes one range vector")
            return Vector(first.labels)
        if name == "histogram_quantile":
            if len(arguments) != 2 or not isinstance(first, Scalar):
                raise ParseError("histogram_quantile takes a scalar and a vector")
            buckets = arguments[1]
            if not isinstance(buckets, Vector) or buckets.is_range:
                raise ParseError("histogram_quantile takes an instant vector of buckets")
            if "le" not in buckets.labels:
                self.problems.append("histogram_quantile: its buckets have no 'le' label (kept by the aggregation?)")
            return Vector(buckets.labels - {"le"})
        if name in VECTOR_FUNCTIONS:
            if not isinstance(first, Vector) or first.is_range:
                raise ParseError(f"{name} takes an instant vector first")
            return Vector(first.labels)
        if name == "vector":
            return Vector(frozenset())
        if name == "scalar":
            return Scalar()
        if name == "time":
            return Scalar()
        raise ParseError(f"function {name!r} is beyond what this checker knows")

    def selector(self) -> Value:
        name = self.take(kind="ident")
        matchers: list[tuple[str, str, str]] = []
        if self.peek()[1] == "{":
            self.index += 1
            while self.peek()[1] != "}":
                label = self.take(kind="ident")
                operator = self.take()
                if operator not in ("=", "!=", "=~", "!~"):
                    raise ParseError(f"{name}: {operator!r} is not a label matcher")
                value = self.take(kind="string")[1:-1]
                matchers.append((label, operator, value))
                if self.peek()[1] == ",":
                    self.index += 1
            self.take("}")
        duration = None
        if self.peek()[0] == "range":
            duration = self.take()[1:-1].strip()
            if not DURATION.match(duration):
                raise ParseError(f"{name}[{duration}]: not a duration (subqueries are beyond this checker)")
        self.selectors.append(Selector(name, tuple(matchers), duration))
        try:
            labels = self.labels_of(name)
        except KeyError:
            self.problems.append(f"{name}: no such metric")
            labels = frozenset(label for label, _, _ in matchers)
        for label, _, _ in matchers:
            if label not in labels:
                self.problems.append(f"{name}{{{label}...}}: {name} has no {label!r} label")
        return Vector(labels, is_range=duration is not None)


def check(expr: str, labels_of: Callable[[str], frozenset[str]]) -> Checked:
    """The selectors `expr` reads, the labels its result carries, and every problem found on the way."""
    parser = Parser(expr, labels_of)
    result = parser.parse()
    return Checked(result, parser.selectors, parser.problems)
