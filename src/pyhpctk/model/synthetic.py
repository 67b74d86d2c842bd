"""Synthetic measurement series from known PMNF functions, to test and benchmark the modelers.

A :class:`Case` holds the true function and the (noisy, repeated) measurements drawn from it.
Noise is multiplicative and uniform: each repetition is ``f(x) * (1 + u)``, ``u ~ U(-noise,
noise)``. (Extra-P's own training-data generator, ``extrap/modelers/single_parameter/adaptive/
data_generator.py``, calls the width of that interval the noise level: our 5 % is its 10 %.)
Everything is drawn from a seeded generator; docs/pymodel.md ("Accuracy on synthetic data") says
why the defaults are what they are.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from pyhpctk.model.pmnf import (
    DEFAULT_LOG_EXPONENTS,
    DEFAULT_POLY_EXPONENTS,
    EXTRAP_BLOCKS,
    Factor,
    FloatArray,
    Hypothesis,
    Model,
    Term,
)

# The scales of the project's own series (README, examples/scaling_demo.py): five doublings from 2,
# so that log2(p) runs from 1 to 5 and a logarithm bends visibly where a power does not.
DEFAULT_VALUES: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0, 32.0)

# Where a term's size is set against the constant: at the smallest configuration (the term is at
# least the constant at every measured point) or at the largest (the term may be buried under the
# constant at all but the last points: the harder, older generator).
ANCHORS = ("smallest", "largest")


@dataclass(frozen=True, slots=True)
class Case:
    """One synthetic context: the true model, the points and the repeated measurements."""

    truth: Model
    points: FloatArray  # (n_points, n_params)
    repetitions: FloatArray  # (n_points, n_repetitions)

    @property
    def mean(self) -> FloatArray:
        return np.asarray(self.repetitions.mean(axis=1), dtype=np.float64)

    @property
    def spread(self) -> FloatArray:
        """Standard deviation of the repetitions at each point (population, as a Series keeps)."""
        return np.asarray(self.repetitions.std(axis=1), dtype=np.float64)


def _round(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}")


# The single-parameter terms both Extra-P's default modeler and pymodel can express: Extra-P's
# building blocks (pmnf.EXTRAP_BLOCKS). pymodel's search space holds every combination of its 18
# polynomial and 3 logarithm exponents; Extra-P's leaves out 15 of them (p^(8/3)*log2(p)^2, ...).
EXTRAP_TERMS: tuple[tuple[Fraction, int], ...] = EXTRAP_BLOCKS


def random_factor(
    rng: np.random.Generator,
    param: int,
    terms: tuple[tuple[Fraction, int], ...] | None = None,
) -> Factor:
    """A random factor: from ``terms`` ((polynomial, logarithm) exponent pairs, uniformly) when
    given, else a polynomial exponent of the default space (none one time in ten) and a
    logarithm exponent, uniformly."""
    if terms is not None:
        poly, log = terms[rng.integers(len(terms))]
        return Factor(param, poly, log)
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
    anchor: str = "smallest",
    terms: tuple[tuple[Fraction, int], ...] | None = None,
) -> Model:
    """A random PMNF function: for one parameter ``n_terms`` distinct terms; for two, a product
    or a sum of one factor per parameter.

    Exponents are drawn uniformly from Extra-P's default search space (a pure logarithm one time
    in ten), the constant uniformly from [1, 100], and each term's coefficient so that the term
    is 1 to 100 times the constant (log-uniformly) at the ``anchor`` configuration: the smallest
    (every parameter at its smallest value) or the largest. ``terms`` restricts the exponents to
    those pairs (:data:`EXTRAP_TERMS`: the terms Extra-P's default modeler can express).
    """
    if anchor not in ANCHORS:
        raise ValueError(f"anchor must be one of {', '.join(ANCHORS)}")
    if len(params) == 1:
        chosen: set[Term] = set()
        while len(chosen) < n_terms:
            chosen.add(Term((random_factor(rng, 0, terms),)))
        hypothesis = Hypothesis(tuple(sorted(chosen)))
    else:
        factors = [random_factor(rng, p, terms) for p in range(len(params))]
        if rng.random() < 0.5:
            hypothesis = Hypothesis((Term(tuple(factors)),))
        else:
            hypothesis = Hypothesis(tuple(sorted(Term((f,)) for f in factors)))
    # Each term is measurable: at the anchor it is 1 to 100 times the constant, so the behaviour
    # the model must find is not drowned by the constant.
    constant = _round(float(rng.uniform(1.0, 100.0)))
    at = min(values) if anchor == "smallest" else max(values)
    anchor_point = np.full((1, len(params)), at)
    coefficients = [constant]
    for term in hypothesis.terms:
        share = float(np.exp(rng.uniform(0.0, np.log(100.0))))
        size = float(term.evaluate(anchor_point)[0])
        if size <= 0:  # log2(1) = 0: a logarithm vanishes at 1
            raise ValueError(f"term {term.render(params)} is zero at {at:g}: anchor elsewhere")
        coefficients.append(_round(constant * share / size))
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
