"""Synthetic measurement series from known PMNF functions, to test and benchmark the modelers.

A :class:`Case` holds the true function and the (noisy, repeated) measurements drawn from it.
Noise is multiplicative and uniform: each repetition is ``f(x) * (1 + u)``, ``u ~ U(-noise,
noise)``, as in Extra-P's evaluations. Everything is drawn from a seeded generator.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from pyhpctk.model.pmnf import (
    DEFAULT_LOG_EXPONENTS,
    DEFAULT_POLY_EXPONENTS,
    Factor,
    FloatArray,
    Hypothesis,
    Model,
    Term,
)

DEFAULT_VALUES: tuple[float, ...] = (4.0, 8.0, 16.0, 32.0, 64.0)


@dataclass(frozen=True, slots=True)
class Case:
    """One synthetic context: the true model, the points and the repeated measurements."""

    truth: Model
    points: FloatArray  # (n_points, n_params)
    repetitions: FloatArray  # (n_points, n_repetitions)

    @property
    def mean(self) -> FloatArray:
        return np.asarray(self.repetitions.mean(axis=1), dtype=np.float64)


def _round(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}")


def random_factor(rng: np.random.Generator, param: int) -> Factor:
    polys = [p for p in DEFAULT_POLY_EXPONENTS if p > 0]
    while True:
        poly = polys[rng.integers(len(polys))] if rng.random() < 0.9 else Fraction(0)
        log = int(DEFAULT_LOG_EXPONENTS[rng.integers(len(DEFAULT_LOG_EXPONENTS))])
        if poly or log:
            return Factor(param, poly, log)


def random_model(
    rng: np.random.Generator,
    params: tuple[str, ...],
    n_terms: int = 1,
    values: tuple[float, ...] = DEFAULT_VALUES,
) -> Model:
    """A random PMNF function: for one parameter ``n_terms`` distinct terms; for two, a product
    or a sum of one factor per parameter."""
    if len(params) == 1:
        terms: set[Term] = set()
        while len(terms) < n_terms:
            terms.add(Term((random_factor(rng, 0),)))
        hypothesis = Hypothesis(tuple(sorted(terms)))
    else:
        factors = [random_factor(rng, p) for p in range(len(params))]
        if rng.random() < 0.5:
            hypothesis = Hypothesis((Term(tuple(factors)),))
        else:
            hypothesis = Hypothesis(tuple(sorted(Term((f,)) for f in factors)))
    # Each term is measurable: at the largest point it is 1 to 100 times the constant (drawn
    # log-uniformly), so the behaviour the model must find is not drowned by the constant.
    constant = _round(float(rng.uniform(1.0, 100.0)))
    top = np.full((1, len(params)), max(values))
    coefficients = [constant]
    for term in hypothesis.terms:
        share = float(np.exp(rng.uniform(0.0, np.log(100.0))))
        coefficients.append(_round(constant * share / float(term.evaluate(top)[0])))
    return Model(hypothesis, tuple(coefficients), params)


def make_case(
    rng: np.random.Generator,
    truth: Model,
    noise: float,
    repetitions: int = 5,
    values: tuple[float, ...] = DEFAULT_VALUES,
) -> Case:
    """Measure ``truth`` on the full grid of ``values`` per parameter, with noise."""
    grid = np.array(list(itertools.product(values, repeat=len(truth.params))), dtype=np.float64)
    exact = truth.evaluate(grid)
    factors = 1.0 + rng.uniform(-noise, noise, size=(len(grid), repetitions))
    return Case(truth, grid, exact[:, None] * factors)
