"""The Bayes-optimal lead of benchmarks/pymodel_oracle.py on cases whose answer is known.

Noise-free runs of a generated function leave one hypothesis that fits, so the oracle must name
the truth's lead with all the posterior; runs that lie between two one-term models, with noise
wide enough for both, must leave the posterior split between their leads, as a brute-force
integral over a dense grid of the generator's own coordinates (constant, log of the term's
share) splits it.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.model.compare import lead_factors
from pyhpctk.model.pmnf import Hypothesis, Model, single
from pyhpctk.model.synthetic import EXTRAP_TERMS, make_case, random_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import pymodel_oracle
from pymodel_recovery import Group


@pytest.mark.parametrize("oracle", pymodel_oracle.ORACLES)
def test_noise_free_runs_give_the_truth_all_the_posterior(oracle: str) -> None:
    group = Group(n_params=1, n_values=5, n_terms=2, noise=0.0)
    rng = np.random.default_rng(11)
    cases = [
        make_case(
            rng,
            random_model(rng, ("p",), 2, group.values, terms=EXTRAP_TERMS),
            0.0,
            5,
            group.values,
        )
        for _ in range(4)
    ]
    # The generator rounds the constant and then the coefficient to three digits: 10 and
    # 10 / 2^(1/3) = 7.937 rounded to 7.93 leave the term 0.9991 times the constant at p = 2,
    # just below the share of 1 it was drawn at, and the oracle must still hold it possible.
    rounded = Model(Hypothesis((single(0, Fraction(1, 3), 0),)), (10.0, 7.93), ("p",))
    cases.append(make_case(rng, rounded, 0.0, 5, group.values))
    families = pymodel_oracle.families(group, cases[0].points)
    for case in cases:
        if len(case.truth.hypothesis.terms) != group.n_terms:
            families = pymodel_oracle.families(replace(group, n_terms=1), case.points)
        posterior = pymodel_oracle.lead_posterior(
            families, case.repetitions, 0.0, oracle, samples=256
        )
        truth = lead_factors(case.truth)
        assert pymodel_oracle.pick(posterior) == truth, case.truth.render()
        assert posterior[truth] > 0.999


def _brute_force(table: np.ndarray, runs: np.ndarray, noise: float, grid: int = 600) -> np.ndarray:
    """Each one-term hypothesis's posterior (rows of ``table``: the term at the points, 1 at the
    smallest) under uniform noise, by a midpoint grid over the constant and the log-share."""
    low, high = runs.max(axis=1) / (1 + noise), runs.min(axis=1) / (1 - noise)
    constant = (np.arange(grid)[:, None] + 0.5) / grid * 99 + 1
    share = np.exp(
        np.log(pymodel_oracle.SHARE[0])
        + (np.arange(grid) + 0.5) / grid * pymodel_oracle.LOG_SHARE_WIDTH
    )
    logs = []
    for term in table:
        total, fits = np.zeros((grid, grid)), np.ones((grid, grid), dtype=bool)
        for i, t in enumerate(term):
            f = constant * (1 + share[None, :] * t)
            fits &= (f >= low[i]) & (f <= high[i])
            total -= runs.shape[1] * np.log(f)
        values = total[fits]
        logs.append(
            values.max() + math.log(np.exp(values - values.max()).sum()) if values.size else -np.inf
        )
    weights = np.exp(np.array(logs) - max(logs))
    return weights / weights.sum()


def test_runs_between_two_models_split_the_posterior() -> None:
    # 30 + 30·p^(1/4) and 30 + 24·p^(1/3) at 2 ... 32 differ by at most 8 %; runs of their mean,
    # all alike, fit both within 10 % noise, and no other term fits.
    group = Group(n_params=1, n_values=5, n_terms=1, noise=0.10)
    p = np.array(group.values)
    mean = 30 + (30 * p**0.25 + 24 * p ** (1 / 3)) / 2
    runs = np.repeat(mean[:, None], 5, axis=1)
    families = pymodel_oracle.families(group, p[:, None])
    posterior = pymodel_oracle.lead_posterior(families, runs, 0.10, "uniform", samples=256)
    quarter, third = ((Fraction(1, 4), 0),), ((Fraction(1, 3), 0),)
    assert set(posterior) == {quarter, third}
    assert 0.05 < posterior[third] < posterior[quarter] < 0.9
    truth = _brute_force(families[0].table[0], runs, 0.10)
    for lead, expected in zip(families[0].leads, truth, strict=True):
        assert posterior.get(lead, 0.0) == pytest.approx(expected, abs=0.01)
