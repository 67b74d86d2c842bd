"""The ceiling of lead-term recovery on pymodel_recovery.py's synthetic series: Bayes-optimal leads.

For the very cases ``benchmarks/pymodel_recovery.py`` draws (its groups, its generator, its
seed), two classifiers that know the generator pick each case's lead (the highest-order factor of
every parameter) as the one of largest posterior probability:

- the **generator oracle**: the generator's exact prior over hypotheses (one-parameter groups: the
  terms, distinct, uniformly from Extra-P's 41 building blocks, as many as the group draws;
  several parameters: one factor per parameter, their product or their sum at even odds), its
  prior over coefficients (constant uniform on [1, 100], each term 1 to 100 times the constant at
  the smallest configuration, log-uniformly; widened by the generator's rounding to three
  digits), and the exact likelihood of its noise: each run is f(x)(1 + u), u ~ U(-noise, noise),
  the noise level known. A hypothesis's evidence integrates its coefficients out: the constant by
  Gauss-Legendre quadrature over the exact interval the runs allow, the term coefficients by
  quasi-Monte-Carlo importance sampling from a mixture of regions, one of which holds every
  coefficient the runs allow (the projection of the least-squares ellipsoid that contains the
  polytope of the uniform likelihood; with a box of the prior and a parallelepiped around a
  hit-and-run walk inside the polytope, started from Lawson's minimax fit). No classifier can
  do better on average: this is the ceiling for this generator.
- the **Gaussian oracle**: the same priors, but a Gaussian likelihood of the means with the
  variance of a run estimated from the repetitions (pooled over points, relative to the mean,
  as multiplicative noise calls for): what a modeler that knows a sensible prior but not the
  noise's shape could reach.

What the Gaussian oracle's edge rests on (``--oracles``): ``2-both`` forgets the number of terms
and widens the share prior to 0.001-100,000 times the constant; ``2-scale`` also forgets the
constant's absolute range (flat from 1e-9 to 1e9: scale-free, as a rule for real programs must
be); ``2-signed`` also lets coefficients take either sign; ``2-grid`` keeps them positive but
searches pymodel's whole grid, a term outside Extra-P's blocks a tenth as likely (as pymodel's
prior has it). ``2-grid`` knows nothing a rule for real programs could not.

Reports per group the cases, pymodel's rate (as the benchmark computes it) and each oracle's,
with the standard error of a rate; ``--groups`` picks groups by index (``--list``). Seeded, so
``--cases`` and ``--seed`` reproduce the benchmark's cases exactly: every group is drawn, in
order, whether or not it is scored.

    python benchmarks/pymodel_oracle.py --cases 60 --seed 1 --groups 10-17,20-27,30-37
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pymodel_recovery, beside this file

from pymodel_recovery import Group, draw, groups, pymodel_hits

from pyhpctk.model.compare import lead_factors
from pyhpctk.model.fit import FitOptions
from pyhpctk.model.pmnf import DEFAULT_LOG_EXPONENTS, DEFAULT_POLY_EXPONENTS, Factor
from pyhpctk.model.synthetic import EXTRAP_TERMS

FloatArray = npt.NDArray[np.float64]
Lead = tuple[tuple[Fraction, int], ...]

CONSTANT = (1.0, 100.0)
# A term's share of the constant at the anchor, widened by the generator's rounding of the
# constant and the coefficient to three significant digits (each at most 0.05 % off ... 0.5 %).
SHARE = (1.0 / 1.01, 100.0 * 1.01)
LOG_SHARE_WIDTH = math.log(SHARE[1] / SHARE[0])
WIDE_SHARE = (1e-3, 1e5)  # a prior that lets a term be buried under the constant, or swamp it
NOISE_FREE = 1e-7  # the noise level that stands for none (the likelihood's limit)
NODES, WEIGHTS = np.polynomial.legendre.leggauss(6)
ELEMENTS = 12_000_000  # floats per batch of (hypotheses x samples x points) temporaries
GAUSS_SPAN = 5.0  # the Gaussian oracle samples term coefficients within this many sigmas
WIDE_CONSTANT = (1e-9, 1e9)  # a flat prior of the constant that holds any run time's


@dataclass(slots=True)
class Knowledge:
    """What the Gaussian oracle knows beyond its share prior (set per oracle by ``main``): the
    constant's range, and whether term coefficients are positive (else either sign)."""

    constant: tuple[float, float] = CONSTANT
    signed: bool = False


KNOWN = Knowledge()


@dataclass(frozen=True, slots=True)
class Family:
    """Hypotheses of one shape: ``columns`` terms each, a sum of terms or (several parameters) a
    product of one factor per parameter, every hypothesis ``log_prior`` likely a priori."""

    table: FloatArray  # (n_params, n_blocks, n_points): each factor at the points, 1 at anchor
    index: npt.NDArray[np.int64]  # (n_hypotheses, n_factors): block of each factor
    product: bool
    log_prior: float
    leads: list[Lead]

    @property
    def columns(self) -> int:
        return 1 if self.product else self.index.shape[1]

    def basis(self, rows: slice | npt.NDArray[np.int64]) -> FloatArray:
        """The hypotheses' terms at the points, (rows, columns, n_points)."""
        index = self.index[rows]
        params = self.table.shape[0]
        picks = [self.table[k if params > 1 else 0][index[:, k]] for k in range(index.shape[1])]
        if self.product:
            return np.asarray(np.prod(picks, axis=0)[:, None, :])
        return np.stack(picks, axis=1)


def families(
    group: Group, points: FloatArray, any_size: bool = False, space: str = "extrap"
) -> list[Family]:
    """The generator's hypotheses for ``group`` (synthetic.random_model with EXTRAP_TERMS); with
    ``any_size``, one-parameter groups have one or two terms, each size half likely a priori;
    with ``space="grid"`` the terms are every pair of pymodel's exponents, a term outside
    Extra-P's blocks 1/10 as likely a priori (FitOptions.outside_prior)."""
    anchor = np.full((1, group.n_params), min(group.values))
    terms = list(EXTRAP_TERMS)
    if space == "grid":
        terms += [
            (poly, log)
            for poly in DEFAULT_POLY_EXPONENTS
            for log in DEFAULT_LOG_EXPONENTS
            if (poly or log) and (poly, log) not in EXTRAP_TERMS
        ]
    weight = np.array([1.0 if t in EXTRAP_TERMS else 0.1 for t in terms])
    table = np.array(
        [
            [
                Factor(p, poly, log).evaluate(points) / Factor(p, poly, log).evaluate(anchor)[0]
                for poly, log in terms
            ]
            for p in range(group.n_params)
        ]
    )
    blocks = len(terms)
    out = []
    if group.n_params == 1:
        shapes = [(size, False) for size in ((1, 2) if any_size else (group.n_terms,))]
    else:
        shapes = [(group.n_params, True), (group.n_params, False)]
    for size, product in shapes:
        if group.n_params == 1:
            index = np.array(list(itertools.combinations(range(blocks), size)))
        else:
            index = np.array(list(itertools.product(range(blocks), repeat=size)))
        prior = np.log(weight[index]).sum(axis=1)
        log_total = math.log(np.exp(prior).sum())
        share = math.log(2) if (any_size or group.n_params > 1) else 0.0
        for value in sorted(set(prior.tolist())):
            rows = index[prior == value]
            if group.n_params == 1:
                leads: list[Lead] = [(max(terms[i] for i in row),) for row in rows]
            else:
                leads = [tuple(terms[i] for i in row) for row in rows]
            out.append(Family(table, rows, product, value - log_total - share, leads))
    return out


def _least_squares(
    basis: FloatArray, weights: FloatArray, target: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Weighted fit of ``target`` by a constant and ``basis`` (h, k, n), weights (n,) or (h, n),
    equilibrated: the coefficients (h, k+1), their covariance M⁻¹ (h, k+1, k+1), log det M, the
    residual (h,)."""
    design = np.concatenate([np.ones_like(basis[:, :1]), basis], axis=1)  # (h, k+1, n)
    weights = np.broadcast_to(weights, (len(basis), len(target)))
    scale = 1.0 / np.sqrt(np.einsum("hkn,hn->hk", design**2, weights))
    scaled = design * scale[:, :, None]
    normal = np.einsum("hkn,hjn,hn->hkj", scaled, scaled, weights)
    inverse = np.linalg.inv(normal)
    coefficients = np.einsum("hkj,hjn,hn->hk", inverse, scaled, weights * target) * scale
    covariance = inverse * scale[:, :, None] * scale[:, None, :]
    residual = np.einsum(
        "hn,hn->h", weights, (target - np.einsum("hk,hkn->hn", coefficients, design)) ** 2
    )
    log_det = np.linalg.slogdet(normal)[1] - 2.0 * np.log(scale).sum(axis=1)
    return coefficients, covariance, log_det, residual


def _kronecker(count: int, dims: int, rng: np.random.Generator) -> FloatArray:
    """``count`` quasi-random points in [0, 1)^dims: Roberts' R_d sequence, randomly shifted."""
    phi = 2.0
    for _ in range(40):
        phi = (1.0 + phi) ** (1.0 / (dims + 1))
    step = phi ** -np.arange(1.0, dims + 1)
    return np.asarray((rng.random(dims) + np.arange(1, count + 1)[:, None] * step) % 1.0)


@dataclass(frozen=True, slots=True)
class Region:
    """A parallelepiped of term coefficients per hypothesis: ``center + frame @ v``, |v|∞ <= 1."""

    center: FloatArray  # (h, k)
    frame: FloatArray  # (h, k, k)

    @staticmethod
    def box(low: FloatArray, high: FloatArray) -> Region:
        half = (high - low) / 2
        return Region((low + high) / 2, half[:, :, None] * np.eye(low.shape[1]))

    def log_volume(self) -> FloatArray:
        k = self.center.shape[1]
        return np.asarray(k * math.log(2.0) + np.linalg.slogdet(self.frame)[1])

    def take(self, rows: npt.NDArray[np.bool_]) -> Region:
        return Region(self.center[rows], self.frame[rows])

    def inside(self, beta: FloatArray) -> npt.NDArray[np.bool_]:
        v = np.einsum("hkj,hsj->hsk", np.linalg.inv(self.frame), beta - self.center[:, None])
        return np.asarray(np.abs(v).max(axis=2) <= 1.0)


Integrand = Callable[[FloatArray], FloatArray]  # coefficients (h, s, k) -> log value (h, s)


def _sample(
    integrand: Integrand,
    regions: list[tuple[Region, float]],
    points: FloatArray,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Importance sampling from a fixed mixture of uniform regions (the deterministic-mixture
    estimator, unbiased wherever some region holds the integrand's support): the log integral
    (h,), the samples (h, s, k) and their log integrand (h, s)."""
    total = len(points)
    counts = [round(share * total) for _, share in regions]
    counts[-1] = total - sum(counts[:-1])
    betas, start = [], 0
    for (region, _), count in zip(regions, counts, strict=True):
        v = 2.0 * points[start : start + count] - 1.0
        betas.append(region.center[:, None] + np.einsum("hkj,sj->hsk", region.frame, v))
        start += count
    beta = np.concatenate(betas, axis=1)
    log_q = np.full(beta.shape[:2], -np.inf)
    for region, share in regions:
        density = math.log(share) - region.log_volume()[:, None]
        log_q = np.logaddexp(log_q, np.where(region.inside(beta), density, -np.inf))
    log_g = integrand(beta)
    ratio = np.where(np.isfinite(log_g), log_g - log_q, -np.inf)
    top = ratio.max(axis=1)
    safe = np.where(np.isfinite(top), top, 0.0)
    log_sum = safe + np.log(np.exp(ratio - safe[:, None]).sum(axis=1))
    return np.where(np.isfinite(top), log_sum - math.log(total), -np.inf), beta, log_g


def _refined(beta: FloatArray, log_g: FloatArray, box: Region) -> Region:
    """A box around the samples where the integrand is within e^-20 of its largest, a quarter
    of its extent wider each side, inside ``box``; ``box`` itself where no sample counts."""
    top = log_g.max(axis=1, keepdims=True)
    good = np.isfinite(log_g) & (log_g >= top - 20.0)
    low = np.where(good[..., None], beta, np.inf).min(axis=1)
    high = np.where(good[..., None], beta, -np.inf).max(axis=1)
    box_low, box_high = box.center - np.abs(box.frame).sum(2), box.center + np.abs(box.frame).sum(2)
    cell = (box_high - box_low) / beta.shape[1] ** (1.0 / beta.shape[2])
    margin = 0.25 * (high - low) + cell
    found = good.any(axis=1)[:, None]
    low = np.where(found, np.maximum(low - margin, box_low), box_low)
    high = np.where(found, np.minimum(high + margin, box_high), box_high)
    return Region.box(low, high)


def _two_stages(
    integrand: Integrand, wide: Region, box: Region, samples: int, rng: np.random.Generator
) -> FloatArray:
    """Sample ``wide`` and ``box`` (each holds the support); then again, mostly in a box around
    what the first pass found. The second pass's estimate."""
    k = wide.center.shape[1]
    _, beta, log_g = _sample(integrand, [(wide, 0.5), (box, 0.5)], _kronecker(samples, k, rng))
    refined = _refined(beta, log_g, box)
    regions = [(wide, 0.2), (box, 0.2), (refined, 0.6)]
    return _sample(integrand, regions, _kronecker(samples, k, rng))[0]


def _coefficient_prior(beta: FloatArray, share: tuple[float, float]) -> FloatArray:
    """log of the term coefficients' prior density, less the constant's share constraint
    (``KNOWN.signed``: a term's size log-uniform, its sign either at even odds)."""
    k = beta.shape[2]
    size = np.abs(beta) if KNOWN.signed else beta
    positive = (size > 0).all(axis=2)
    logs = np.log(np.where(size > 0, size, 1.0)).sum(axis=2)
    constant = KNOWN.constant
    value = (
        -logs - k * math.log(math.log(share[1] / share[0])) - math.log(constant[1] - constant[0])
    )
    if KNOWN.signed:
        value = value - k * math.log(2.0)
    return np.where(positive, value, -np.inf)


def _constant_range(beta: FloatArray, share: tuple[float, float]) -> tuple[FloatArray, FloatArray]:
    """The constants the prior allows with these term coefficients (each term's share)."""
    size = np.abs(beta) if KNOWN.signed else beta
    low = np.maximum(KNOWN.constant[0], size.max(axis=2) / share[1])
    high = np.minimum(KNOWN.constant[1], size.min(axis=2) / share[0])
    return low, high


def uniform_evidence(
    basis: FloatArray,
    low: FloatArray,
    high: FloatArray,
    runs: int,
    samples: int,
    rng: np.random.Generator,
    share: tuple[float, float] = SHARE,
) -> FloatArray:
    """log evidence (less a constant shared by all hypotheses) of each hypothesis under uniform
    multiplicative noise: each point's true value must lie in [low, high] (its runs over
    1 ± noise), and its ``runs`` runs are each 1/(2·noise·f) likely."""
    h, _k, n = basis.shape
    half = (high - low) / 2
    coefficients, covariance, _, residual = _least_squares(basis, 1.0 / half**2, (low + high) / 2)
    out = np.full(h, -np.inf)
    # The values the runs allow, |f - mid| <= half at every point, lie inside the ellipsoid
    # Σ ((f - mid) / half)² <= n: around the least-squares fit, radius² n - residual.
    radius = np.sqrt(np.maximum(n - residual, 0.0))
    sd = np.sqrt(np.einsum("hkk->hk", covariance))
    alpha_low = np.maximum(CONSTANT[0], coefficients[:, 0] - radius * sd[:, 0])
    alpha_high = np.minimum(CONSTANT[1], coefficients[:, 0] + radius * sd[:, 0])
    beta, beta_sd = coefficients[:, 1:], sd[:, 1:]
    box_low = np.maximum(beta - radius[:, None] * beta_sd, share[0] * alpha_low[:, None])
    box_high = np.minimum(beta + radius[:, None] * beta_sd, share[1] * alpha_high[:, None])
    live = np.flatnonzero((residual < n) & (alpha_low < alpha_high) & (box_low < box_high).all(1))
    if not len(live):
        return out
    chol = np.linalg.cholesky(covariance[live][:, 1:, 1:])
    wide = Region(beta[live], radius[live, None, None] * chol)
    box = Region.box(box_low[live], box_high[live])

    def integrand_of(terms: FloatArray) -> Integrand:
        return lambda b: _uniform_integrand(b, terms, low, high, runs, share)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        walked, found = _walk(basis[live], low, high, share, covariance[live], rng)
        regions = [(wide, 0.1), (box, 0.1), (_spanning(walked, box), 0.8)]
        points = _kronecker(samples, wide.center.shape[1], rng)
        out[live] = _sample(integrand_of(basis[live]), regions, points)[0]
        if not found.all():  # no start that fits: two passes of the first two regions instead
            lost = ~found
            out[live[lost]] = _two_stages(
                integrand_of(basis[live][lost]), wide.take(lost), box.take(lost), samples, rng
            )
    return out


def _uniform_integrand(
    b: FloatArray,
    terms: FloatArray,
    low: FloatArray,
    high: FloatArray,
    runs: int,
    share: tuple[float, float],
) -> FloatArray:
    """log of the uniform likelihood times the prior, the constant integrated out by
    Gauss-Legendre over the interval the runs and the prior allow, at term coefficients ``b``."""
    c = np.einsum("hsk,hkn->hsn", b, terms)
    a_low, a_high = _constant_range(b, share)
    a_low = np.maximum(a_low, (low - c).max(axis=2))
    a_high = np.minimum(a_high, (high - c).min(axis=2))
    width = a_high - a_low
    ok = width > 0
    width = np.where(ok, width, 1.0)
    alpha = a_low[..., None] + (NODES + 1) / 2 * width[..., None]
    values = alpha[..., None] + c[:, :, None, :]
    log_f = -runs * np.log(np.maximum(values, 1e-300)).sum(axis=3) + np.log(WEIGHTS / 2)
    top = log_f.max(axis=2)
    inner = top + np.log(np.exp(log_f - top[..., None]).sum(axis=2))
    return np.where(ok, inner + np.log(width) + _coefficient_prior(b, share), -np.inf)


def _constraints(
    basis: FloatArray, low: FloatArray, high: FloatArray, share: tuple[float, float]
) -> tuple[FloatArray, FloatArray]:
    """G, b with G θ <= b (h, m, k+1), (h, m): the runs' windows and the coefficient prior."""
    h, k, _ = basis.shape
    design = np.concatenate([np.ones_like(basis[:, :1]), basis], axis=1).transpose(0, 2, 1)
    prior = [np.eye(k + 1)[0], -np.eye(k + 1)[0]]
    bounds = [CONSTANT[1], -CONSTANT[0]]
    for j in range(1, k + 1):
        prior += [np.eye(k + 1)[j] - share[1] * np.eye(k + 1)[0]]
        prior += [share[0] * np.eye(k + 1)[0] - np.eye(k + 1)[j]]
        bounds += [0.0, 0.0]
    rows = np.broadcast_to(np.array(prior), (h, len(prior), k + 1))
    g = np.concatenate([design, -design, rows], axis=1)
    b = np.concatenate(
        [
            np.broadcast_to(high, (h, len(high))),
            np.broadcast_to(-low, (h, len(low))),
            np.broadcast_to(np.array(bounds), (h, len(bounds))),
        ],
        axis=1,
    )
    return g, b


def _walk(
    basis: FloatArray,
    low: FloatArray,
    high: FloatArray,
    share: tuple[float, float],
    covariance: FloatArray,
    rng: np.random.Generator,
    steps: int = 200,
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Term coefficients spread over each hypothesis's allowed region (h, steps, k): a start
    inside it (the minimax fit, by Lawson's reweighted least squares), then hit-and-run (each
    step to a uniform point of the chord through the region along a random direction shaped
    by the least-squares covariance); and whether a start was found."""
    g, b = _constraints(basis, low, high, share)
    mid, half = (low + high) / 2, (high - low) / 2
    h = len(basis)
    weights = np.full((h, len(mid)), 1.0 / len(mid))
    theta = np.zeros((h, basis.shape[1] + 1))
    found = np.zeros(h, dtype=bool)
    for _ in range(60):
        todo = np.flatnonzero(~found)
        if not len(todo):
            break
        theta[todo] = _least_squares(basis[todo], weights[todo] / half**2, mid)[0]
        inside = (np.einsum("hmk,hk->hm", g, theta) <= b).all(axis=1)
        found |= inside
        design = np.concatenate([np.ones_like(basis[:, :1]), basis], axis=1)
        error = np.abs(np.einsum("hk,hkn->hn", theta, design) - mid) / half
        weights = np.where(found[:, None], weights, weights * (error + 1e-3))
        weights = np.maximum(weights / weights.sum(axis=1, keepdims=True), 1e-6 / len(mid))
    chol = np.linalg.cholesky(covariance)
    out = np.empty((h, steps, basis.shape[1]))
    for step in range(steps):
        direction = np.einsum("hkj,hj->hk", chol, rng.standard_normal(theta.shape))
        rate = np.einsum("hmk,hk->hm", g, direction)
        slack = np.maximum(b - np.einsum("hmk,hk->hm", g, theta), 0.0)
        with np.errstate(divide="ignore"):
            reach = slack / rate
        t_high = np.where(rate > 0, reach, np.inf).min(axis=1)
        t_low = np.where(rate < 0, reach, -np.inf).max(axis=1)
        t = t_low + rng.random(h) * (t_high - t_low)
        theta = theta + np.where(found & np.isfinite(t), t, 0.0)[:, None] * direction
        out[:, step] = theta[:, 1:]
    return out, found


def _spanning(walked: FloatArray, box: Region) -> Region:
    """A parallelepiped along the walked points' principal axes that holds them with room to
    spare (half as wide again); ``box`` where the points do not span a region."""
    center = walked.mean(axis=1)
    spread = walked - center[:, None]
    covariance = np.einsum("hsk,hsj->hkj", spread, spread) / walked.shape[1]
    k = walked.shape[2]
    scale = np.einsum("hkk->hk", covariance)
    ok = (scale > 0).all(axis=1)
    covariance = covariance + 1e-12 * np.where(ok[:, None], scale, 1.0)[:, :, None] * np.eye(k)
    covariance = np.where(ok[:, None, None], covariance, np.eye(k))
    chol = np.linalg.cholesky(covariance)
    reach = np.abs(np.einsum("hkj,hsj->hsk", np.linalg.inv(chol), spread)).max(axis=(1, 2))
    frame = chol * (1.5 * reach)[:, None, None]
    good = ok & (reach > 0) & np.isfinite(reach)
    return Region(
        np.where(good[:, None], center, box.center),
        np.where(good[:, None, None], frame, box.frame),
    )


def _log_upper_tail(z: FloatArray) -> FloatArray:
    """log(1 − Φ(z)) for z >= 0, to a relative 1.2e-7 (erfc's Chebyshev fit, Numerical Recipes)."""
    x = z / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * x)
    poly: FloatArray = np.full_like(t, 0.17087277)
    for c in (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418):
        poly = c + t * poly
    for c in (0.37409196, 1.00002368, -1.26551223):
        poly = c + t * poly
    return np.asarray(math.log(0.5) + np.log(t) - x * x + poly)


def _log_gauss_interval(low: FloatArray, high: FloatArray) -> FloatArray:
    """log(Φ(high) − Φ(low)), accurate in either tail; -inf where low >= high."""
    flip = low + high < 0
    a, b = np.where(flip, -high, low), np.where(flip, -low, high)  # now b >= |a|
    tail_a, tail_b = _log_upper_tail(np.abs(a)), _log_upper_tail(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        right = tail_a + np.log1p(-np.exp(np.minimum(tail_b - tail_a, 0.0)))
        middle = np.log1p(-np.minimum(np.exp(tail_a) + np.exp(tail_b), 1.0))
    return np.where(low < high, np.where(a >= 0, right, middle), -np.inf)


def gaussian_evidence(
    basis: FloatArray,
    mean: FloatArray,
    weights: FloatArray,
    samples: int,
    rng: np.random.Generator,
    share: tuple[float, float] = SHARE,
) -> FloatArray:
    """log evidence of each hypothesis for means ``mean`` of Gaussian noise, each of variance
    1 / ``weights``, under the generator's coefficient prior."""
    h, k, _n = basis.shape
    coefficients, covariance, log_det, residual = _least_squares(basis, weights, mean)
    out = np.full(h, -np.inf)
    live = np.flatnonzero(residual <= residual.min() + 100.0)
    coefficients, covariance, residual = coefficients[live], covariance[live], residual[live]
    beta_hat = coefficients[:, 1:]
    cov_bb = covariance[:, 1:, 1:]
    chol = np.linalg.cholesky(cov_bb)
    chol_inverse = np.linalg.inv(chol)
    # The constant given the term coefficients: Gaussian, mean linear in them.
    gain = np.linalg.solve(cov_bb, covariance[:, 1:, :1])[..., 0]  # (h, k)
    alpha_sd = np.sqrt(covariance[:, 0, 0] - np.einsum("hk,hk->h", gain, covariance[:, 1:, 0]))
    log_norm = -0.5 * k * math.log(2 * math.pi) - np.log(np.einsum("hkk->hk", chol)).sum(axis=1)

    def integrand(b: FloatArray) -> FloatArray:
        d = b - beta_hat[:, None]
        z = np.einsum("hkj,hsj->hsk", chol_inverse, d)
        density = log_norm[:, None] - 0.5 * (z**2).sum(axis=2)
        mu = coefficients[:, None, 0] + np.einsum("hk,hsk->hs", gain, d)
        a_low, a_high = _constant_range(b, share)
        s = alpha_sd[:, None]
        inside = _log_gauss_interval((a_low - mu) / s, (a_high - mu) / s)
        return np.asarray(density + inside + _coefficient_prior(b, share))

    wide = Region(beta_hat, np.asarray(GAUSS_SPAN * chol, dtype=np.float64))
    reach = np.abs(wide.frame).sum(axis=2)
    constant = KNOWN.constant
    if KNOWN.signed:
        box_low = np.maximum(beta_hat - reach, -share[1] * constant[1])
    else:
        box_low = np.maximum(beta_hat - reach, share[0] * constant[0])
    box_high = np.minimum(beta_hat + reach, share[1] * constant[1])
    ok = (box_low < box_high).all(axis=1)
    box_low, box_high = np.where(ok[:, None], box_low, 0.0), np.where(ok[:, None], box_high, 1.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        integral = _two_stages(integrand, wide, Region.box(box_low, box_high), samples, rng)
    log_gauss = 0.5 * (k + 1) * math.log(2 * math.pi) - 0.5 * log_det[live] - residual / 2
    out[live] = np.where(ok, integral + log_gauss, -np.inf)
    return out


ORACLES = ("uniform", "gaussian")  # likelihoods


def _likelihood(
    repetitions: FloatArray,
    noise: float,
    oracle: str,
    samples: int,
    rng: np.random.Generator,
    share: tuple[float, float],
) -> tuple[FloatArray, FloatArray, Callable[[FloatArray], FloatArray]]:
    """The least-squares target and weights that screen hypotheses, and the evidence of a batch
    of hypotheses' terms (h, k, n), for one case's runs (n_points, runs) under ``oracle``."""
    runs = repetitions.shape[1]
    if oracle == "uniform":
        width = max(noise, NOISE_FREE)
        low = repetitions.max(axis=1) / (1 + width)
        high = repetitions.min(axis=1) / (1 - width)

        def uniform(basis: FloatArray) -> FloatArray:
            return uniform_evidence(basis, low, high, runs, samples, rng, share)

        return (low + high) / 2, 4.0 / (high - low) ** 2, uniform
    mean = repetitions.mean(axis=1)
    relative = float(np.mean(repetitions.var(axis=1, ddof=1 if runs > 1 else 0) / mean**2))
    weights = runs / (max(relative, NOISE_FREE**2) * mean**2)

    def gaussian(basis: FloatArray) -> FloatArray:
        return gaussian_evidence(basis, mean, weights, samples, rng, share)

    return mean, weights, gaussian


def _residuals(family: Family, weights: FloatArray, target: FloatArray) -> FloatArray:
    rows = len(family.index)
    batch = max(1, ELEMENTS // (8 * len(target) * (family.columns + 1)))
    return np.concatenate(
        [
            _least_squares(family.basis(slice(s, s + batch)), weights, target)[3]
            for s in range(0, rows, batch)
        ]
    )


def lead_posterior(
    fams: list[Family],
    repetitions: FloatArray,
    noise: float,
    oracle: str = "uniform",
    samples: int = 1024,
    seed: int = 0,
    share: tuple[float, float] = SHARE,
) -> dict[Lead, float]:
    """The posterior probability of each lead the hypotheses of ``fams`` may have (a dict over
    the leads of positive probability). Hypotheses are screened by their least-squares residual
    first: under uniform noise one whose residual exceeds the number of points cannot fit
    (every point's scaled error is at most 1); under Gaussian noise one 100 above the best is
    e^-50 as likely."""
    rng = np.random.default_rng(seed)
    n = repetitions.shape[0]
    target, weights, evidence = _likelihood(repetitions, noise, oracle, samples, rng, share)
    residuals = [_residuals(f, weights, target) for f in fams]
    bar = n if oracle == "uniform" else min(float(r.min()) for r in residuals) + 100.0
    logs = []
    for family, residual in zip(fams, residuals, strict=True):
        values = np.full(len(residual), -np.inf)
        rows = np.flatnonzero(residual < bar)
        batch = max(1, ELEMENTS // (samples * n * len(NODES)))
        for s in range(0, len(rows), batch):
            values[rows[s : s + batch]] = evidence(family.basis(rows[s : s + batch]))
        logs.append(values + family.log_prior)
    top = max(float(v.max()) for v in logs)
    if not np.isfinite(top):
        return {}
    out: dict[Lead, float] = {}
    for family, values in zip(fams, logs, strict=True):
        for row in np.flatnonzero(np.isfinite(values)):
            lead = family.leads[row]
            out[lead] = out.get(lead, 0.0) + math.exp(values[row] - top)
    total = sum(out.values())
    return {lead: p / total for lead, p in out.items() if p > 0}


def pick(posterior: dict[Lead, float]) -> Lead | None:
    return max(posterior, key=posterior.__getitem__) if posterior else None


def _selected(text: str, count: int) -> list[int]:
    """Group indices from '1,3,10-17' (all when empty)."""
    if not text:
        return list(range(count))
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def _rate(hits: int, cases: int) -> str:
    p = hits / cases
    return f"{p:6.1%} ±{math.sqrt(p * (1 - p) / cases):4.1%}"


@dataclass(frozen=True, slots=True)
class Oracle:
    """A classifier: its likelihood, the prior of each term's share, and whether it knows the
    number of terms of a one-parameter group (else one or two, at even odds)."""

    likelihood: str
    share: tuple[float, float] = SHARE
    any_size: bool = False
    constant: tuple[float, float] = CONSTANT
    signed: bool = False
    space: str = "extrap"  # the hypotheses' terms: Extra-P's blocks or pymodel's grid (1/10)


# The two oracles, then what the Gaussian one loses without the group's number of terms, the
# generator's term-share prior, the constant's range, positivity, and Extra-P's blocks alone
# (--oracles picks among them; the module docstring says what each knows).
VARIANTS = {
    "1": Oracle("uniform"),
    "2": Oracle("gaussian"),
    "2-sizes": Oracle("gaussian", any_size=True),
    "2-wide": Oracle("gaussian", share=WIDE_SHARE),
    "2-both": Oracle("gaussian", share=WIDE_SHARE, any_size=True),
    "1-sizes": Oracle("uniform", any_size=True),
    "2-scale": Oracle("gaussian", share=WIDE_SHARE, any_size=True, constant=WIDE_CONSTANT),
    "2-signed": Oracle(
        "gaussian", share=WIDE_SHARE, any_size=True, constant=WIDE_CONSTANT, signed=True
    ),
    "2-grid": Oracle(
        "gaussian", share=WIDE_SHARE, any_size=True, constant=WIDE_CONSTANT, space="grid"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=60, help="functions per group")
    parser.add_argument("--seed", type=int, default=1, help="the recovery benchmark's seed")
    parser.add_argument("--runs", type=int, default=5, help="repetitions per point")
    parser.add_argument("--groups", default="", help="indices to score, e.g. 10-17,20 (all)")
    parser.add_argument("--list", action="store_true", help="list the groups' indices and stop")
    parser.add_argument("--samples", type=int, default=1024, help="per hypothesis and pass")
    parser.add_argument(
        "--oracles", default="1,2", help=f"which, comma-separated: {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--check",
        type=int,
        default=0,
        help="also score the first N cases of each group with twice the samples and another "
        "quasi-random shift, and count the oracles' leads that change",
    )
    arguments = parser.parse_args()
    every = groups()
    if arguments.list:
        for i, group in enumerate(every):
            print(f"{i:3d} {group.label()}")
        return
    names = arguments.oracles.split(",")
    chosen = set(_selected(arguments.groups, len(every)))
    rng = np.random.default_rng(arguments.seed)
    totals = np.zeros(2 + len(names), dtype=np.int64)  # cases, pymodel, each oracle
    changed = checked = 0
    header = "".join(f" {'oracle ' + name:>14}" for name in names)
    print(f"{'group':<40} {'cases':>5} {'pymodel':>13}{header}")
    for i, group in enumerate(every):
        cases = draw(group, arguments.cases, rng, EXTRAP_TERMS, arguments.runs)
        if i not in chosen:
            continue
        start = time.perf_counter()
        row = np.zeros_like(totals)
        row[:2] = len(cases), sum(pymodel_hits(cases, FitOptions(weighting="auto")))
        for j, name in enumerate(names):
            oracle = VARIANTS[name]
            KNOWN.constant, KNOWN.signed = oracle.constant, oracle.signed
            fams = families(group, cases[0].points, oracle.any_size, oracle.space)
            for n, case in enumerate(cases):
                args = (fams, case.repetitions, group.noise, oracle.likelihood)
                post = lead_posterior(*args, arguments.samples, n, oracle.share)
                row[2 + j] += pick(post) == lead_factors(case.truth)
                if n < arguments.check:
                    again = lead_posterior(*args, 2 * arguments.samples, n + 1000, oracle.share)
                    changed += pick(again) != pick(post)
                    checked += 1
        totals += row
        rates = "".join(f" {_rate(int(hits), len(cases))}" for hits in row[1:])
        elapsed = time.perf_counter() - start
        print(f"{group.label():<40} {len(cases):5d}{rates}  ({elapsed:.0f} s)", flush=True)
    rates = "".join(f" {_rate(int(hits), int(totals[0]))}" for hits in totals[1:])
    print(f"{'all scored':<40} {totals[0]:5d}{rates}")
    if checked:
        print(f"check: {changed} of {checked} oracle leads change with twice the samples")


if __name__ == "__main__":
    main()
