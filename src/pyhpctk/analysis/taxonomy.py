"""``metrics/default.yaml``: the metric taxonomy hpcviewer reads, written as hpcprof writes it.

The file (formats.md §0.2; reference: ``dbase/*/metrics/default.yaml``) has two parts:

* ``inputs``: one anchored entry per (stored metric, summary partial, scope) the formulas use —
  the execution, lex_aware and function scopes (the point scope is never shown);
* ``roots``: one entry per metric of the ``.hpcrun`` table in table order, except invisible ones
  (``show`` = 4): a stored metric has a ``Sum`` variant whose inclusive formula is its execution
  input and whose exclusive formula is its lex_aware (``custom``) and function (``standard``)
  inputs; a derived metric (``.hpcrun`` formula) has a ``""`` variant whose formulas are the
  formula's expression tree (``{/: [a, b]}``) over those inputs. ``show`` = 0 adds
  ``visible by default: false``; 2 and 3 keep only the inclusive or exclusive formula.

With ``-M stats`` each stored metric also gets Mean / Min / Max / StdDev / CfVar variants built
from the summary partials. Anchor names escape every byte outside ``[A-Za-z0-9_-]`` as
``x<hex>_``, as hpcprof does. The writer only formats text; it never reads databases.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pyhpctk.analysis.metrics import PARTIALS_STATS, MeasuredMetric, Partial
from pyhpctk.core.metrics import Combine
from pyhpctk.errors import PyhpctkError

_SHOWN_SCOPES = ("execution", "lex_aware", "function")
SHOW_HIDE, SHOW_INCLUSIVE, SHOW_EXCLUSIVE, SHOW_INVISIBLE = 0, 2, 3, 4


class TaxonomyFormulaError(PyhpctkError, ValueError):
    """A derived metric's formula (from a measurement's metric table) cannot be parsed."""


# The parser and render() recurse: formulas nesting deeper, or with longer operator chains,
# are refused instead of exhausting Python's stack (hpcrun's own formulas nest a few levels).
MAX_NESTING = 64
MAX_DEPTH = 256


_ANCHOR_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def escape(text: str) -> str:
    """hpcprof's anchor escaping (``sanitize``): ``CPUTIME (sec)`` -> ``CPUTIMEx20_x28_secx29_``.

    ASCII letters, digits, ``-`` and ``_`` stay (``perf::cpu-clock`` -> ``perfx3a_x3a_cpu-clock``);
    every other byte of the UTF-8 name becomes ``x<hex>_`` of that byte as a C ``char``, which is
    signed on x86-64, so ``é`` (bytes C3 A9) is ``xffffffc3_xffffffa9_``.
    """
    out = []
    for byte in text.encode("utf-8", "surrogateescape"):
        if byte in _ANCHOR_SAFE:
            out.append(chr(byte))
        else:
            out.append(f"x{byte if byte < 0x80 else byte | 0xFFFFFF00:x}_")
    return "".join(out)


def anchor(metric: str, partial_index: int, partial: Partial, scope: str) -> str:
    """The anchor of one input: ``NAME-sum-[0x0]-execution``, escaped."""
    combine = partial.combine.name.lower()
    return f"{escape(metric)}-{combine}-{escape(f'[{partial_index:#x}]')}-{scope}"


_PLAIN = re.compile(r"^[A-Za-z0-9_($][^\"'#]*$")


def scalar(text: str) -> str:
    """A YAML scalar, plain when that is unambiguous, otherwise double-quoted."""
    if text and _PLAIN.match(text) and ": " not in text and not text.endswith((":", " ")):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# --------------------------------------------------------------------------------------------
# Formulas: #N references, numbers, + - * / ^, unary -, parentheses, min(...), max(...)

Expr = tuple[str, tuple["Expr", ...]] | int | float | str


@dataclass(slots=True)
class _Parser:
    tokens: list[str]
    pos: int = 0
    nesting: int = 0

    def nest(self, step: int) -> None:
        self.nesting += step
        if self.nesting > MAX_NESTING:
            raise TaxonomyFormulaError(f"nested more than {MAX_NESTING} levels deep")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise TaxonomyFormulaError(f"expected {expected or 'more'}, got {token!r}")
        self.pos += 1
        return token

    def expression(self) -> Expr:
        left = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            left = (op, (left, self.term()))
        return left

    def term(self) -> Expr:
        left = self.power()
        while self.peek() in ("*", "/"):
            op = self.take()
            left = (op, (left, self.power()))
        return left

    def power(self) -> Expr:
        self.nest(1)  # "(", "^" and arguments all come through here
        try:
            base = self.unary()
            if self.peek() == "^":
                self.take()
                return ("^", (base, self.power()))  # right-associative
            return base
        finally:
            self.nest(-1)

    def unary(self) -> Expr:
        if self.peek() == "-":
            self.take()
            self.nest(1)
            try:
                return ("-", (self.unary(),))
            finally:
                self.nest(-1)
        return self.atom()

    def atom(self) -> Expr:
        token = self.take()
        if token == "(":
            inner = self.expression()
            self.take(")")
            return inner
        if token in ("min", "max"):
            self.take("(")
            args = [self.expression()]
            while self.peek() == ",":
                self.take()
                args.append(self.expression())
            self.take(")")
            return (token, tuple(args))
        if token.startswith("#"):
            return token
        try:
            number = float(token)
        except ValueError:
            raise TaxonomyFormulaError(f"unexpected {token!r}") from None
        return int(number) if number.is_integer() and "." not in token else number


_TOKEN = re.compile(r"\s*(#\{[^}]*\}|#\d+|\d+\.?\d*(?:[eE][-+]?\d+)?|min|max|[-+*/^(),])")


def parse_formula(formula: str) -> Expr:
    """Parse a ``.hpcrun`` formula whose ``#N`` were replaced by ``#{metric name}``."""
    shown = formula if len(formula) <= 60 else formula[:60] + "..."
    tokens: list[str] = []
    pos = 0
    text = formula.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise TaxonomyFormulaError(f"formula {shown!r}: cannot parse it at column {pos + 1}")
        tokens.append(match.group(1))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    parser = _Parser(tokens)
    try:
        expr = parser.expression()
        if parser.peek() is not None:
            raise TaxonomyFormulaError(f"trailing {parser.peek()!r}")
    except TaxonomyFormulaError as error:
        raise TaxonomyFormulaError(f"formula {shown!r}: {error}") from None
    if _depth(expr) > MAX_DEPTH:
        raise TaxonomyFormulaError(f"formula {shown!r}: more than {MAX_DEPTH} operations deep")
    return expr


def _depth(expr: Expr) -> int:
    deepest = 0
    stack = [(expr, 0)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(node, tuple):
            stack.extend((arg, d + 1) for arg in node[1])
    return deepest


def render(expr: Expr, scope: str, partial_index: int = 0, partial: Partial | None = None) -> str:
    """An expression tree as hpcprof's flow-style YAML, inputs taken at ``scope``."""
    partial = partial or PARTIALS_STATS[0]
    if isinstance(expr, str):
        name = expr[2:-1] if expr.startswith("#{") else expr
        return "*" + anchor(name, partial_index, partial, scope)
    if isinstance(expr, int | float):
        return repr(expr)
    op, args = expr
    key = '"*"' if op == "*" else op
    return (
        "{" + f"{key}: [" + ", ".join(render(a, scope, partial_index, partial) for a in args) + "]}"
    )


# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DerivedRoot:
    """A derived metric of the taxonomy only (no ``.hpcrun`` table entry): ``#{name}`` refs."""

    name: str
    description: str
    formula: str
    format: str = "%6.2f %%"
    needs: tuple[str, ...] = ()  # stored metrics it reads: written only when all are present


#: Issue #7, item 5: warp issue rate = (samples - stalled samples) / samples, from PC sampling
#: (GINS = samples x period, GINS:STL_ANY = stalled samples x period). GPU utilization
#: (``GSAMP:UTIL``) and theoretical occupancy (``GKER:OCC_THR``) are hpcrun's own derived
#: metrics and come with the ``.hpcrun`` table; hpcprof writes no issue rate, so this root is
#: opt-in (``default_yaml(..., extra=...)``): the reference databases stay byte-identical.
WARP_ISSUE_RATE = DerivedRoot(
    "GINS:ISSUE (%)",
    "GPU warp issue rate: samples of issuing warps over all samples (PC sampling)",
    "100*(#{GINS} - #{GINS:STL_ANY})/#{GINS}",
    needs=("GINS", "GINS:STL_ANY"),
)
#: What ``pyprof --derived`` adds to hpcprof's taxonomy (each only where its inputs exist).
EXTRA_ROOTS: tuple[DerivedRoot, ...] = (WARP_ISSUE_RATE,)


def default_yaml(
    metrics: Sequence[MeasuredMetric],
    formulas: dict[str, str],
    partials: Sequence[Partial],
    extra: Sequence[DerivedRoot] = (),
) -> str:
    """The whole ``metrics/default.yaml`` text (no trailing newline, like hpcprof's).

    ``extra``: derived roots appended after the table's, each only when the stored metrics it
    ``needs`` are in the table.
    """
    stored = [m for m in metrics if not m.is_derived]
    lines = ["version: 0", "inputs:"]
    for metric in stored:
        for index, partial in enumerate(partials):
            for scope in _SHOWN_SCOPES:
                lines += [
                    f"  - &{anchor(metric.name, index, partial, scope)}",
                    f"    metric: {scalar(metric.name)}",
                    f"    scope: {scope}",
                    f"    formula: {scalar(partial.formula)}",
                    f"    combine: {partial.combine.name.lower()}",
                ]
    lines.append("roots:")
    for metric in metrics:
        if metric.show == SHOW_INVISIBLE:
            continue
        lines.append(f"  - name: {scalar(metric.name)}")
        lines.append(f"    description: {scalar(metric.description or metric.name)}")
        if metric.show == SHOW_HIDE:
            lines.append("    visible by default: false")
        if metric.is_derived and metric.format:
            lines.append(f"    format: {scalar(metric.format)}")
        lines.append("    variants:")
        render_list = "[number, percent]" if metric.show_percent else "[number]"
        if metric.is_derived:
            try:
                expr = parse_formula(formulas.get(metric.name, metric.formula))
            except TaxonomyFormulaError as error:
                raise TaxonomyFormulaError(f"derived metric {metric.name!r}: {error}") from None
            lines += _variant(
                '""', render_list, metric.show, {s: render(expr, s) for s in _SHOWN_SCOPES}
            )
        else:
            for index, (title, statistic) in enumerate(_variants(partials)):
                lines += _variant(
                    title,
                    render_list if index == 0 else "[number]",
                    metric.show,
                    {s: _stat_formula(metric.name, s, statistic, partials) for s in _SHOWN_SCOPES},
                )
    names = {m.name for m in stored}
    for root in extra:
        if not set(root.needs) <= names:
            continue
        lines.append(f"  - name: {scalar(root.name)}")
        lines.append(f"    description: {scalar(root.description)}")
        lines.append(f"    format: {scalar(root.format)}")
        lines.append("    variants:")
        expr = parse_formula(root.formula)
        lines += _variant('""', "[number]", 1, {s: render(expr, s) for s in _SHOWN_SCOPES})
    return "\n".join(lines)


def _variants(partials: Sequence[Partial]) -> list[tuple[str, str]]:
    if len(partials) == 1:
        return [("Sum", "sum")]
    return [
        ("Sum", "sum"),
        ("Mean", "mean"),
        ("Min", "min"),
        ("Max", "max"),
        ("StdDev", "stddev"),
        ("CfVar", "cfvar"),
    ]


def _stat_formula(metric: str, scope: str, statistic: str, partials: Sequence[Partial]) -> str:
    def ref(combine: Combine, formula: str) -> str:
        for index, partial in enumerate(partials):
            if partial.combine is combine and partial.formula == formula:
                return "*" + anchor(metric, index, partial, scope)
        raise KeyError(formula)

    total = ref(Combine.SUM, "$$")
    if statistic == "sum":
        return total
    count = ref(Combine.SUM, "1")
    mean = f"{{/: [{total}, {count}]}}"
    if statistic == "mean":
        return mean
    if statistic == "min":
        return ref(Combine.MIN, "$$")
    if statistic == "max":
        return ref(Combine.MAX, "$$")
    squares = ref(Combine.SUM, "$$^2")
    variance = f"{{-: [{{/: [{squares}, {count}]}}, {{^: [{mean}, 2]}}]}}"
    stddev = f"{{^: [{variance}, 0.5]}}"
    if statistic == "stddev":
        return stddev
    return f"{{/: [{stddev}, {mean}]}}"


def _variant(title: str, render_list: str, show: int, formula: dict[str, str]) -> list[str]:
    """One variant block; ``formula`` maps a scope name to its rendered expression."""
    lines = [f"      {title}:", f"        render: {render_list}", "        formula:"]
    if show != SHOW_EXCLUSIVE:
        lines += ["          inclusive:", f"            standard: {formula['execution']}"]
    if show != SHOW_INCLUSIVE:
        lines += [
            "          exclusive:",
            f"            custom: {formula['lex_aware']}",
            f"            standard: {formula['function']}",
        ]
    return lines
