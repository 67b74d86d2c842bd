"""The Performance Model Normal Form (PMNF), as Extra-P defines it.

A model of parameters x_1..x_m is ``f(x) = c_0 + Σ_k c_k · Π_l x_l^{i_kl} · log2(x_l)^{j_kl}``.
A :class:`Factor` is one ``x_l^i · log2(x_l)^j``; a :class:`Term` multiplies factors of distinct
parameters; a :class:`Hypothesis` is the set of terms (the constant is implicit); a
:class:`Model` adds coefficients. Exponents are exact fractions so that models print and compare
as Extra-P's do (``p^(3/2) * log2(p)``). This module is pure data and arithmetic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Extra-P's default search space: polynomial exponents that are simple fractions in [0, 3] ...
DEFAULT_POLY_EXPONENTS: tuple[Fraction, ...] = tuple(
    sorted({Fraction(0)} | {Fraction(n, d) for d in (1, 2, 3, 4) for n in range(1, 3 * d + 1)})
)
# ... and logarithm exponents 0, 1, 2.
DEFAULT_LOG_EXPONENTS: tuple[int, ...] = (0, 1, 2)

# The single-parameter terms of Extra-P 4.2.5's default modeler (its building blocks with
# logarithms allowed, extrap/modelers/single_parameter/basic.py) as (polynomial, logarithm)
# exponent pairs, less p^(4/5), which the exponents above do not hold. Not every pair of them:
# a logarithm goes with the simpler powers only, as in the complexities of common algorithms
# (p^(3/2)·log2(p), never p^(7/4)·log2(p)^2). The 15 pairs it leaves out are, at five or six
# measured values, near copies of their neighbours: each is one more way for noise to win, so
# pymodel holds them less likely (docs/pymodel.md, "How models are chosen").
EXTRAP_BLOCKS: tuple[tuple[Fraction, int], ...] = tuple(
    (Fraction(n, d), log)
    for n, d, log in (
        (0, 1, 1), (0, 1, 2), (1, 4, 0), (1, 3, 0), (1, 4, 1), (1, 3, 1), (1, 4, 2), (1, 3, 2),
        (1, 2, 0), (1, 2, 1), (1, 2, 2), (2, 3, 0), (3, 4, 0), (2, 3, 1), (3, 4, 1), (2, 3, 2),
        (3, 4, 2), (1, 1, 0), (1, 1, 1), (1, 1, 2), (5, 4, 0), (5, 4, 1), (4, 3, 0), (4, 3, 1),
        (3, 2, 0), (3, 2, 1), (3, 2, 2), (5, 3, 0), (7, 4, 0), (2, 1, 0), (2, 1, 1), (2, 1, 2),
        (9, 4, 0), (7, 3, 0), (5, 2, 0), (5, 2, 1), (5, 2, 2), (8, 3, 0), (11, 4, 0), (3, 1, 0),
        (3, 1, 1),
    )
)  # fmt: skip

# Search spaces of single-parameter terms: every pair of the polynomial and logarithm exponents
# (the default; terms outside Extra-P's blocks at lower prior odds: FitOptions.outside_prior),
# or Extra-P's building blocks alone.
SPACES = ("extrap", "grid")


@dataclass(frozen=True, slots=True, order=True)
class Factor:
    """``x_param^poly · log2(x_param)^log`` for one parameter (index into the parameter list);
    ``poly`` may be negative (strong scaling: ``p^-1``), ``log`` may not."""

    param: int
    poly: Fraction
    log: int

    def __post_init__(self) -> None:
        if self.log < 0:
            raise ValueError("logarithm exponents are non-negative")
        if self.poly == 0 and self.log == 0:
            raise ValueError("a factor x^0 log^0 is the constant: leave it out")

    def evaluate(self, x: FloatArray) -> FloatArray:
        """The factor at points ``x`` (shape (n_points, n_params))."""
        values = x[:, self.param]
        out = np.ones_like(values)
        if self.poly:
            out = out * np.power(values, float(self.poly))
        if self.log:
            out = out * np.power(np.log2(values), self.log)
        return out

    def growth(self) -> tuple[Fraction, int]:
        """The asymptotic order of this factor: compare polynomial first, then logarithm."""
        return (self.poly, self.log)

    def render(self, names: tuple[str, ...]) -> str:
        name = names[self.param]
        parts = []
        if self.poly:
            exp = self.poly
            if exp == 1:
                parts.append(name)
            elif exp.denominator == 1:
                parts.append(f"{name}^{exp.numerator}")
            else:
                parts.append(f"{name}^({exp.numerator}/{exp.denominator})")
        if self.log:
            parts.append(f"log2({name})" + (f"^{self.log}" if self.log > 1 else ""))
        return " * ".join(parts)


@dataclass(frozen=True, slots=True, order=True)
class Term:
    """A product of factors of distinct parameters, sorted by parameter."""

    factors: tuple[Factor, ...]

    def __post_init__(self) -> None:
        params = [f.param for f in self.factors]
        if not params:
            raise ValueError("a term needs at least one factor")
        if params != sorted(set(params)):
            raise ValueError("a term's factors must be of distinct parameters, sorted")

    def evaluate(self, x: FloatArray) -> FloatArray:
        out = self.factors[0].evaluate(x)
        for factor in self.factors[1:]:
            out = out * factor.evaluate(x)
        return out

    def growth(self) -> tuple[Fraction, int]:
        """Total order, summing exponents over parameters (all parameters growing together)."""
        return (sum((f.poly for f in self.factors), Fraction(0)), sum(f.log for f in self.factors))

    def render(self, names: tuple[str, ...]) -> str:
        return " * ".join(f.render(names) for f in self.factors)


def single(param: int, poly: Fraction | int, log: int) -> Term:
    """A one-factor term, the usual case for single-parameter models."""
    return Term((Factor(param, Fraction(poly), log),))


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """A model shape: the constant plus these terms (possibly none: the constant model)."""

    terms: tuple[Term, ...]

    def design(self, x: FloatArray) -> FloatArray:
        """The design matrix, columns ``[1, term_1(x), ...]`` (shape (n_points, 1 + n_terms))."""
        columns = [np.ones(x.shape[0])] + [term.evaluate(x) for term in self.terms]
        return np.stack(columns, axis=1)

    @property
    def complexity(self) -> tuple[int, tuple[tuple[float, int], ...]]:
        """Sort key preferring fewer terms, then lower orders (Occam's razor for ties).

        Orders in floats, rounded so that equal sums of fractions compare equal: a search sorts
        thousands of hypotheses, and comparing exact fractions took most of its time."""
        growths = (
            (round(sum(float(f.poly) for f in t.factors), 9), sum(f.log for f in t.factors))
            for t in self.terms
        )
        return (len(self.terms), tuple(sorted(growths, reverse=True)))


@dataclass(frozen=True, slots=True)
class Model:
    """A fitted hypothesis: ``coefficients[0]`` is the constant, then one per term."""

    hypothesis: Hypothesis
    coefficients: tuple[float, ...]
    params: tuple[str, ...]

    def evaluate(self, x: FloatArray) -> FloatArray:
        """The model at points ``x``: (n_points, n_params), or (n_points,) for one parameter."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, len(self.params))
        design = self.hypothesis.design(x)
        return np.asarray(design @ np.asarray(self.coefficients), dtype=np.float64)

    def lead_term(self) -> Term | None:
        """The term that dominates asymptotically (None for a constant model)."""
        live = [t for t, c in zip(self.hypothesis.terms, self.coefficients[1:], strict=True) if c]
        return max(live, key=lambda t: t.growth()) if live else None

    def render(self, digits: int = 6) -> str:
        text = _format_number(self.coefficients[0], digits)
        for term, coefficient in zip(self.hypothesis.terms, self.coefficients[1:], strict=True):
            sign = "-" if coefficient < 0 else "+"
            value = _format_number(abs(coefficient), digits)
            text += f" {sign} {value} * {term.render(self.params)}"
        return text


def _format_number(value: float, digits: int) -> str:
    return f"{value:.{digits}g}"


def search_space(
    param: int,
    poly_exponents: tuple[Fraction, ...] = DEFAULT_POLY_EXPONENTS,
    log_exponents: tuple[int, ...] = DEFAULT_LOG_EXPONENTS,
    space: str = "grid",
) -> list[Term]:
    """Every non-constant single-factor term of one parameter in the search space: each pair
    of the exponents (``grid``), or those of the pairs that are Extra-P's building blocks
    (``extrap``, :data:`EXTRAP_BLOCKS`)."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {', '.join(SPACES)}")
    blocks = set(EXTRAP_BLOCKS)
    return [
        single(param, poly, log)
        for poly in poly_exponents
        for log in log_exponents
        if (poly or log) and (space == "grid" or (poly, log) in blocks)
    ]


_EXPECT_TOKEN = re.compile(
    r"\s*(?:(?P<log>log2?\s*\(\s*(?P<lname>[A-Za-z_]\w*)\s*\))|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<num>\d+(?:\.\d+)?)|(?P<op>[*^/()]))"
)


def parse_expectation(text: str, params: tuple[str, ...]) -> Term | None:
    """Parse a user expectation such as ``p*log2(p)``, ``p^(3/2)`` or ``n^2 * p`` into a term.

    Only products of powers of parameters and their base-2 logarithms are accepted (a constant
    factor is ignored; ``1`` means a constant expectation, returned as None). Raises ValueError
    with the offending position for anything else.
    """
    poly: dict[int, Fraction] = {}
    logs: dict[int, int] = {}
    pos = 0
    last: tuple[str, int] | None = None
    expect_factor = True
    while pos < len(text):
        match = _EXPECT_TOKEN.match(text, pos)
        if not match or match.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"cannot read expectation {text!r} at column {pos + 1}")
        pos = match.end()
        if match.group("log") or match.group("name"):
            name = match.group("lname") or match.group("name")
            if name not in params:
                raise ValueError(f"unknown parameter {name!r} in expectation (known: {params})")
            index = params.index(name)
            if match.group("log"):
                logs[index] = logs.get(index, 0) + 1
                last = ("log", index)
            else:
                poly[index] = poly.get(index, Fraction(0)) + 1
                last = ("poly", index)
            expect_factor = False
        elif match.group("num"):
            last = None
            expect_factor = False
        elif match.group("op") == "*":
            expect_factor = True
        elif match.group("op") == "^":
            exponent, pos = _read_exponent(text, pos)
            if last is None:
                continue
            kind, index = last
            if kind == "poly":
                poly[index] += exponent - 1
            else:
                if exponent.denominator != 1:
                    raise ValueError("logarithm exponents must be whole numbers")
                logs[index] += int(exponent) - 1
        else:
            raise ValueError(f"operator {match.group('op')!r} not allowed in an expectation")
    if expect_factor and (poly or logs):
        raise ValueError(f"expectation {text!r} ends with an operator")
    factors = [
        Factor(i, poly.get(i, Fraction(0)), logs.get(i, 0))
        for i in sorted(set(poly) | set(logs))
        if poly.get(i, 0) or logs.get(i, 0)
    ]
    return Term(tuple(factors)) if factors else None


def _read_exponent(text: str, pos: int) -> tuple[Fraction, int]:
    match = re.compile(r"\s*(?:\(\s*(\d+)\s*/\s*(\d+)\s*\)|(\d+(?:\.\d+)?))").match(text, pos)
    if not match:
        raise ValueError(f"expected an exponent in {text!r} at column {pos + 1}")
    if match.group(1):
        return Fraction(int(match.group(1)), int(match.group(2))), match.end()
    return Fraction(match.group(3)).limit_denominator(12), match.end()


def compare_growth(model_term: Term | None, expected: Term | None) -> str:
    """``match``, ``approximate`` (within a quarter power or one log) or ``no match``."""
    got = model_term.growth() if model_term else (Fraction(0), 0)
    want = expected.growth() if expected else (Fraction(0), 0)
    if got == want:
        return "match"
    if abs(got[0] - want[0]) <= Fraction(1, 4) and abs(got[1] - want[1]) <= 1:
        return "approximate"
    return "no match"
