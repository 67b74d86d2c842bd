"""Derived-metric formulas: a small, safe expression language evaluated on numpy columns.

Users write ``--derive 'util = gker / gpuop'``; HPCToolkit writes formulas such as ``#43/#61``,
``100*(#46/#47)`` or ``min(100, max(0, 100*#27/#26))`` (formats.md §1.6). This module parses them
with a hand-written tokenizer and precedence-climbing parser into a tiny tree (never ``eval``), and
evaluates the tree over whole columns at once.

Grammar (``^`` binds tightest and is right-associative; unary minus binds looser than ``^``)::

    expr    := term (('+' | '-') term)*
    term    := unary (('*' | '/') unary)*
    unary   := '-' unary | power
    power   := atom ('^' unary)?
    atom    := NUMBER | REF | NAME '(' expr (',' expr)* ')' | '(' expr ')'
    REF     := identifier (letters, digits, '_', ':', '.', '@')   e.g. gker, GKER:COUNT
             | '"' any text '"' | '{' any text '}'               e.g. "CPUTIME (sec)"
             | '#' digits | '$' digits                           metric by position

Functions: ``min``, ``max`` (one or more arguments), ``abs``, ``sqrt``. Division by zero and
``0/0`` give NaN, which the views show as an empty cell, as hpcviewer does.

The parser and the evaluator recurse, so a formula may nest at most :data:`MAX_NESTING`
parentheses, calls, signs or powers, and its tree may be at most :data:`MAX_DEPTH` operations
deep (``a + b + ...`` chains): anything deeper is a :class:`FormulaError`, never a
RecursionError.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pyhpctk.errors import UsageError
from pyhpctk.present.model import FloatArray

MAX_NESTING = 64  # parentheses, calls, unary signs and powers inside one another
MAX_DEPTH = 256  # operations from the root of a formula's tree to its deepest leaf
_SHOWN = 60  # characters of a formula an error message repeats


class FormulaError(UsageError):
    """A formula that cannot be parsed or evaluated; the message points at the problem."""

    def __init__(self, formula: str, problem: str, column: int | None = None) -> None:
        where = f" at column {column + 1}" if column is not None else ""
        shown = formula if len(formula) <= _SHOWN else formula[:_SHOWN] + "..."
        super().__init__(f"formula {shown!r}: {problem}{where}")
        self.formula = formula
        self.problem = problem
        self.column = column


@dataclass(frozen=True, slots=True)
class Num:
    value: float


@dataclass(frozen=True, slots=True)
class Ref:
    name: str  # a metric name, pattern, or "#N" / "$N"


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str  # one of + - * / ^
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Call:
    function: str
    args: tuple[Expr, ...]


Expr = Num | Ref | Neg | BinOp | Call

FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "min": (1, None),
    "max": (1, None),
    "abs": (1, 1),
    "sqrt": (1, 1),
}

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
      | (?P<pos>[#$]\d+)
      | (?P<name>[A-Za-z_][\w:.@]*)
      | (?P<quoted>"[^"]*"|\{[^}]*\})
      | (?P<op>[-+*/^(),])
    )""",
    re.VERBOSE,
)


_BLANK_END = re.compile(r"\s*\Z")


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    column: int


def _tokenize(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if _BLANK_END.match(text, pos):
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.lastgroup is None:
            column = pos + (len(text[pos:]) - len(text[pos:].lstrip()))
            raise FormulaError(text, f"unexpected character {text[column]!r}", column)
        kind = m.lastgroup
        tokens.append(_Tok(kind, m.group(kind), m.start(kind)))
        pos = m.end()
    tokens.append(_Tok("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.nesting = 0

    def peek(self) -> _Tok:
        return self.tokens[self.i]

    def take(self) -> _Tok:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def fail(self, tok: _Tok, expected: str) -> FormulaError:
        found = "end of formula" if tok.kind == "end" else repr(tok.text)
        return FormulaError(self.text, f"expected {expected}, found {found}", tok.column)

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text or tok.kind != "op":
            raise self.fail(tok, repr(text))

    def parse(self) -> Expr:
        if self.peek().kind == "end":
            raise FormulaError(self.text, "empty formula")
        node = self.expr()
        if self.peek().kind != "end":
            raise self.fail(self.peek(), "an operator")
        return node

    def expr(self) -> Expr:
        node = self.term()
        while self.peek().kind == "op" and self.peek().text in "+-":
            op = self.take().text
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Expr:
        node = self.unary()
        while self.peek().kind == "op" and self.peek().text in "*/":
            op = self.take().text
            node = BinOp(op, node, self.unary())
        return node

    def unary(self) -> Expr:
        # Every nested construct ("(", a call's arguments, a sign, "^") comes back through
        # here, each within five frames: counting here bounds the parser's recursion.
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise FormulaError(
                self.text, f"nested more than {MAX_NESTING} levels deep", self.peek().column
            )
        try:
            if self.peek().kind == "op" and self.peek().text == "-":
                self.take()
                return Neg(self.unary())
            if self.peek().kind == "op" and self.peek().text == "+":
                self.take()
                return self.unary()
            return self.power()
        finally:
            self.nesting -= 1

    def power(self) -> Expr:
        base = self.atom()
        if self.peek().kind == "op" and self.peek().text == "^":
            self.take()
            return BinOp("^", base, self.unary())
        return base

    def atom(self) -> Expr:
        tok = self.take()
        if tok.kind == "num":
            return Num(float(tok.text))
        if tok.kind == "pos":
            return Ref(tok.text)
        if tok.kind == "quoted":
            name = tok.text[1:-1].strip()
            if not name:
                raise FormulaError(self.text, "empty metric name", tok.column)
            return Ref(name)
        if tok.kind == "name":
            if self.peek().kind == "op" and self.peek().text == "(":
                return self.call(tok)
            return Ref(tok.text)
        if tok.kind == "op" and tok.text == "(":
            node = self.expr()
            self.expect(")")
            return node
        raise self.fail(tok, "a number, a metric or '('")

    def call(self, name: _Tok) -> Expr:
        function = name.text.lower()
        if function not in FUNCTIONS:
            known = ", ".join(sorted(FUNCTIONS))
            raise FormulaError(
                self.text, f"unknown function {name.text!r} (known: {known})", name.column
            )
        self.expect("(")
        args = [self.expr()]
        while self.peek().kind == "op" and self.peek().text == ",":
            self.take()
            args.append(self.expr())
        self.expect(")")
        low, high = FUNCTIONS[function]
        if len(args) < low or (high is not None and len(args) > high):
            raise FormulaError(
                self.text, f"{function}() takes {low if high == low else 'one or more'} argument(s)"
            )
        return Call(function, tuple(args))


def parse(text: str) -> Expr:
    """Parse a formula into an expression tree; raises :class:`FormulaError`."""
    node = _Parser(text).parse()
    check_depth(node, text)
    return node


def depth(node: Expr) -> int:
    """Operations from the root to the deepest leaf (0 for a number or a reference)."""
    deepest = 0
    stack = [(node, 0)]
    while stack:
        current, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in _children(current))
    return deepest


def check_depth(node: Expr, text: str) -> None:
    """A :class:`FormulaError` when the tree is deeper than :data:`MAX_DEPTH`."""
    if depth(node) > MAX_DEPTH:
        raise FormulaError(text, f"more than {MAX_DEPTH} operations deep")


def _children(node: Expr) -> tuple[Expr, ...]:
    if isinstance(node, Neg):
        return (node.operand,)
    if isinstance(node, BinOp):
        return (node.left, node.right)
    if isinstance(node, Call):
        return node.args
    return ()


def parse_definition(text: str) -> tuple[str, Expr]:
    """Parse ``NAME = FORMULA`` (the ``--derive`` option)."""
    name, sep, formula = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise FormulaError(text, "expected NAME = FORMULA")
    if not formula.strip():
        raise FormulaError(text, "empty formula after '='")
    return name, parse(formula.strip())


def references(node: Expr) -> list[str]:
    """Every metric reference in the tree, in order of appearance."""
    if isinstance(node, Ref):
        return [node.name]
    if isinstance(node, Neg):
        return references(node.operand)
    if isinstance(node, BinOp):
        return references(node.left) + references(node.right)
    if isinstance(node, Call):
        return [name for arg in node.args for name in references(arg)]
    return []


def evaluate(node: Expr, resolve: Callable[[str], FloatArray], size: int) -> FloatArray:
    """Evaluate over columns of ``size`` values; ``resolve`` maps a reference to its column."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.asarray(_eval(node, resolve, size), dtype=np.float64)


def _eval(node: Expr, resolve: Callable[[str], FloatArray], size: int) -> FloatArray:
    if isinstance(node, Num):
        return np.full(size, node.value)
    if isinstance(node, Ref):
        return np.asarray(resolve(node.name), dtype=np.float64)
    if isinstance(node, Neg):
        return -_eval(node.operand, resolve, size)
    if isinstance(node, BinOp):
        left = _eval(node.left, resolve, size)
        right = _eval(node.right, resolve, size)
        if node.op == "+":
            return left + right
        if node.op == "-":
            return left - right
        if node.op == "*":
            return left * right
        if node.op == "/":
            out = np.full(size, np.nan)
            np.divide(left, right, out=out, where=right != 0)
            return out
        return np.power(left, right)
    args = [_eval(arg, resolve, size) for arg in node.args]
    if node.function == "min":
        return np.minimum.reduce(args) if len(args) > 1 else args[0]
    if node.function == "max":
        return np.maximum.reduce(args) if len(args) > 1 else args[0]
    if node.function == "abs":
        return np.abs(args[0])
    return np.sqrt(args[0])


def to_text(node: Expr) -> str:
    """Render a tree back as a formula (fully parenthesised where it matters)."""
    if isinstance(node, Num):
        return repr(node.value).removesuffix(".0")
    if isinstance(node, Ref):
        simple = re.fullmatch(r"[A-Za-z_][\w:.@]*|[#$]\d+", node.name)
        return node.name if simple else '"' + node.name + '"'
    if isinstance(node, Neg):
        return f"(-({to_text(node.operand)}))"  # outer parentheses: "^" binds tighter than "-"
    if isinstance(node, BinOp):
        return f"({to_text(node.left)} {node.op} {to_text(node.right)})"
    return f"{node.function}({', '.join(to_text(a) for a in node.args)})"
