"""One term or two, and the lead, by integrated evidence (``FitOptions.terms_by="evidence"``).

For a one-parameter series the F-test keeps a second term only where it is significant against
the best of 1,540 pairs (Bonferroni), and so keeps one term in most noisy two-term functions.
Here each hypothesis of one or two terms is weighed by its marginal likelihood instead: the
Gaussian likelihood of the means (the variance of one run as the F-test estimates it), the
constant integrated out analytically under a flat prior (the same for every hypothesis, so it
cancels) — where it would fall below zero beyond its noise, a tenth as likely (given the terms'
coefficients the constant is Gaussian: ``_log_prior_of_constant`` at every node of the outer
share, and at the inner share's conditional mean) — and each term's coefficient integrated over
a proper, broad prior — its share of the constant at the smallest point (the first where the
term is not 0) log-uniform from 10^-6 to 10^5, positive (the fitted constant, taken as at least
10^-4 of the largest term there). A pair whose second term the data do not need still has the
evidence of the prior's part where that term is buried, so it pays an Occam factor, not a fixed
bar. Each size gets half the prior, shared among its hypotheses as the outside-blocks prior
weighs them. The integrals are over log-shares by Gauss-Legendre nodes placed where the Gaussian
lies, with the flat part near zero in closed form; all contexts and hypotheses at once. This
module does no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pyhpctk.model.pmnf import FloatArray, Hypothesis

SHARES = (1e-6, 1e5)  # a term's share of the constant where the parameter is smallest
_LO, _HI = math.log(SHARES[0]), math.log(SHARES[1])
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(16)
_SPAN = 7.0  # standard deviations of the Gaussian the nodes cover
_FLAT = 0.01  # below this many standard deviations a share's Gaussian is flat: closed form
_PRUNE = 40.0  # hypotheses this far (in wrss / variance) above the best (e^-20) are not integrated
_CHUNK = 20_000  # (hypothesis, context) pairs integrated at once: bounds the temporaries


def log_normal_cdf(z: FloatArray) -> FloatArray:
    """log Φ(z), the standard normal's lower tail, to a relative 1.2e-7 in either tail (erfc by
    its Chebyshev fit, W. J. Cody's form as Numerical Recipes gives it)."""
    z = np.asarray(z, dtype=np.float64)
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * x)
    poly = np.full_like(t, 0.17087277)
    for c in (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418):
        poly = c + t * poly
    for c in (0.37409196, 1.00002368, -1.26551223):
        poly = c + t * poly
    log_tail = math.log(0.5) + np.log(t) - x * x + poly  # log Φ(-|z|)
    with np.errstate(over="ignore"):
        upper = np.log1p(-np.exp(np.minimum(log_tail, 0.0)))
    return np.asarray(np.where(z < 0, log_tail, upper))


# (a, b, ε): the constant is not negative with chance Φ(a - b·u) at share u; a negative constant
# is ε as likely a priori (FitOptions.below_zero_prior)
Cut = tuple[FloatArray, FloatArray, float]


def _log_prior_of_constant(z: FloatArray, epsilon: float) -> FloatArray:
    """log(q + ε(1 - q)), q = min(1, 2Φ(z)): 0 where z >= 0 (a constant not below zero beyond
    its noise), and Φ evaluated only where it is not."""
    out = np.zeros(np.shape(z))
    below = z < 0
    if epsilon >= 1.0 or not below.any():
        return out
    log_q = math.log(2.0) + log_normal_cdf(z[below])
    out[below] = np.logaddexp(math.log(epsilon), math.log1p(-epsilon) + log_q)
    return out


def _log_gauss_in_log(mean: FloatArray, var: FloatArray, cut: Cut) -> FloatArray:
    """log ∫ exp(-(e^l - mean)² / 2 var) q(a - b e^l) dl over the prior's log-shares,
    elementwise (``cut``: a, b and ε; q(z) = Φ(z) + ε(1 - Φ(z)), Φ the chance that the constant,
    given the share, is not negative)."""
    a, b, epsilon = cut
    sd = np.sqrt(var)
    with np.errstate(divide="ignore", invalid="ignore"):
        upper = np.minimum(_HI, np.log(np.maximum(mean, 0.0) + _SPAN * sd))
        flat_end = np.log(_FLAT * sd)
        lower = np.maximum(_LO, flat_end)
        lower = np.maximum(lower, np.where(mean > _SPAN * sd, np.log(mean - _SPAN * sd), -np.inf))
        length = np.clip(np.minimum(flat_end, upper) - _LO, 0.0, None)
        flat = -(mean**2) / (2.0 * var) + np.log(length) + _log_prior_of_constant(a, epsilon)
        width = upper - lower
        ok = width > 0
        half = np.where(ok, width / 2.0, 0.0)
        nodes = lower[..., None] + half[..., None] * (_NODES + 1.0)
        u = np.exp(nodes)
        exponent = -((u - mean[..., None]) ** 2) / (2.0 * var[..., None])
        exponent = exponent + _log_prior_of_constant(a[..., None] - b[..., None] * u, epsilon)
        top = exponent.max(axis=-1)
        top = np.where(np.isfinite(top), top, 0.0)
        total = (np.exp(exponent - top[..., None]) * _WEIGHTS).sum(axis=-1)
        peaked = np.where(ok, top + np.log(half * total), -np.inf)
    return np.asarray(np.logaddexp(flat, peaked))


def _log_outer(
    lower: FloatArray,
    upper: FloatArray,
    m1: FloatArray,
    m2: FloatArray,
    marginal: FloatArray,
    slope: FloatArray,
    var2: FloatArray,
    cut: tuple[FloatArray, FloatArray, FloatArray, float],
) -> FloatArray:
    """The outer integral over the first log-share from ``lower`` to ``upper`` (Gauss-Legendre),
    the second integrated inside given the first."""
    width = upper - lower
    ok = width > 0
    half = np.where(ok, width / 2.0, 0.0)
    nodes = lower[:, None] + half[:, None] * (_NODES + 1.0)  # (N, G)
    u1 = np.exp(nodes)
    conditional = m2[:, None] - slope[:, None] * (u1 - m1[:, None])
    a, b1, b2, epsilon = cut
    inner = _log_gauss_in_log(
        conditional,
        np.broadcast_to(var2[:, None], u1.shape),
        (np.zeros_like(u1), np.zeros_like(u1), 1.0),
    )
    inner = inner + _log_prior_of_constant(
        a[:, None] - b1[:, None] * u1 - b2[:, None] * np.maximum(conditional, 0.0), epsilon
    )
    exponent = -marginal[:, None] * (u1 - m1[:, None]) ** 2 / 2.0 + inner
    top = exponent.max(axis=1)
    top = np.where(np.isfinite(top), top, 0.0)
    total = (np.exp(exponent - top[:, None]) * _WEIGHTS).sum(axis=1)
    return np.asarray(np.where(ok, top + np.log(half * total), -np.inf))


def _log_integral_two(
    mean: FloatArray, precision: FloatArray, cut: tuple[FloatArray, FloatArray, FloatArray, float]
) -> FloatArray:
    """log ∫∫ exp(-(u - mean)ᵀ P (u - mean) / 2) q(a - b1 u1 - b2 u2) over both log-shares;
    mean (N, 2), P (N, 2, 2), ``cut`` (a, b1, b2, ε), q as in :func:`_log_gauss_in_log`."""
    a11, a12, a22 = precision[:, 0, 0], precision[:, 0, 1], precision[:, 1, 1]
    marginal = a11 - a12 * a12 / a22  # precision of the first share, the second integrated out
    m1, m2 = mean[:, 0], mean[:, 1]
    var1, var2 = 1.0 / marginal, 1.0 / a22
    sd = np.sqrt(var1)
    with np.errstate(divide="ignore", invalid="ignore"):
        upper = np.minimum(_HI, np.log(np.maximum(m1, 0.0) + _SPAN * sd))
        edge, edge_sd = m1 + a12 * m2 / a11, 1.0 / np.sqrt(a11)
        flat_end = np.log(_FLAT * edge_sd)  # below it, the first share is as good as 0
        lower = np.maximum(
            np.maximum(_LO, flat_end), np.where(m1 > _SPAN * sd, np.log(m1 - _SPAN * sd), -np.inf)
        )
        length = np.clip(np.minimum(flat_end, upper) - _LO, 0.0, None)
        inner_at_zero = _log_gauss_in_log(m2 + a12 / a22 * m1, var2, (cut[0], cut[2], cut[3]))
        flat = -marginal * m1**2 / 2.0 + inner_at_zero + np.log(length)
        # Where the second share is buried (near 0) the first is pinned far more tightly than
        # its marginal says: a piece of nodes of its own around the mode on that edge.
        low_edge = np.where(edge > _SPAN * edge_sd, np.log(edge - _SPAN * edge_sd), -np.inf)
        high_edge = np.log(np.maximum(edge, 0.0) + _SPAN * edge_sd)
        cuts = [lower, np.clip(low_edge, lower, upper), np.clip(high_edge, lower, upper), upper]
        peaked = np.full(m1.shape, -np.inf)
        for start, end in itertools.pairwise(cuts):
            peaked = np.logaddexp(
                peaked, _log_outer(start, end, m1, m2, marginal, a12 / a22, var2, cut)
            )
    return np.asarray(np.logaddexp(flat, peaked))


def _anchors(columns: FloatArray) -> FloatArray:
    """Each term's size at the smallest point where it is not 0 (columns: (..., n) sorted by x)."""
    magnitude = np.abs(columns)
    first = np.argmax(magnitude > 0, axis=-1)
    value = np.take_along_axis(magnitude, first[..., None], axis=-1)[..., 0]
    return np.asarray(np.where(value > 0, value, 1.0))


def _log_integral(
    cols: FloatArray,
    w: FloatArray,
    total_weight: FloatArray,
    anchor: FloatArray,
    beta: FloatArray,
    variance: FloatArray,
    epsilon: float,
) -> FloatArray:
    """log of the Gaussian of the term coefficients (the constant integrated out) over the
    prior's log-shares, per (hypothesis, context) pair: terms ``cols`` (N, k, n), weights ``w``
    (N, n) and their sums, anchors (N, k), least-squares coefficients ``beta`` (N, 1 + k)."""
    cross = np.einsum("an,akn,aln->akl", w, cols, cols)
    with_constant = np.einsum("an,akn->ak", w, cols)
    schur = (
        cross - with_constant[:, :, None] * with_constant[:, None, :] / total_weight[:, None, None]
    )
    terms = beta[:, 1:]
    scale = anchor * np.abs(terms)
    reference = np.maximum(np.maximum(beta[:, 0], 1e-4 * scale.max(axis=1)), 1e-300)
    to_share = anchor / reference[:, None]  # a share u is b * to_share
    mean = terms * to_share
    inverse = 1.0 / to_share
    precision = schur * inverse[:, :, None] * inverse[:, None, :] / variance[:, None, None]
    # The constant given the terms is Gaussian, mean alpha + sum g (b_hat - b) with g the terms'
    # cross weights over the total weight, sd sqrt(variance / total weight): positive with
    # chance Φ(a - sum b_j u_j).
    gain = with_constant / total_weight[:, None]
    spread = np.sqrt(variance / total_weight)
    a = (beta[:, 0] + (gain * terms).sum(axis=1)) / spread
    b = gain * inverse / spread[:, None]
    if cols.shape[1] == 1:
        ok = np.isfinite(precision[:, 0, 0]) & (precision[:, 0, 0] > 0)
        fine = np.where(ok, precision[:, 0, 0], 1.0)
        return np.where(
            ok, _log_gauss_in_log(mean[:, 0], 1.0 / fine, (a, b[:, 0], epsilon)), -np.inf
        )
    det = precision[:, 0, 0] * precision[:, 1, 1] - precision[:, 0, 1] ** 2
    ok = np.isfinite(det) & (det > 0) & (precision[:, 1, 1] > 0) & np.isfinite(mean).all(axis=1)
    fine = np.where(ok[:, None, None], precision, np.eye(2))
    cut = (a, b[:, 0], b[:, 1], epsilon)
    return np.where(ok, _log_integral_two(np.where(ok[:, None], mean, 1.0), fine, cut), -np.inf)


def log_evidence(
    hypotheses: Sequence[Hypothesis],
    coefficients: Sequence[FloatArray],
    free_wrss: FloatArray,
    x: FloatArray,
    weights: FloatArray,
    variance: FloatArray,
    apply: npt.NDArray[np.bool_],
    negative_prior: float = 1.0,
) -> FloatArray:
    """Per hypothesis of one or two terms and context where ``apply``: the log marginal
    likelihood (up to a constant per context), -inf elsewhere. ``coefficients`` and
    ``free_wrss`` are the least-squares fits without the sign constraint, ``weights`` the
    least-squares weights times run counts (points x contexts), ``variance`` that of one run."""
    out = np.full(free_wrss.shape, -np.inf)
    sizes = np.array([len(h.terms) for h in hypotheses])
    order = np.argsort(x[:, 0], kind="stable")
    candidate = (sizes >= 1)[:, None] & apply[None, :] & np.isfinite(free_wrss)
    best = np.where(candidate, free_wrss, np.inf).min(axis=0)
    near = candidate & (free_wrss <= best + _PRUNE * variance)
    total_weight = weights.sum(axis=0)  # (C,)
    for size in (1, 2):
        rows = np.flatnonzero(sizes == size)
        if not len(rows):
            continue
        design = np.stack(
            [np.stack([t.evaluate(x) for t in hypotheses[int(r)].terms]) for r in rows]
        )  # (H, k, n)
        anchor = _anchors(design[:, :, order])  # (H, k)
        beta = np.stack([coefficients[int(r)] for r in rows])  # (H, 1 + k, C)
        h_all, c_all = np.nonzero(near[rows])
        for start in range(0, len(h_all), _CHUNK):
            h_index, c_index = h_all[start : start + _CHUNK], c_all[start : start + _CHUNK]
            log_integral = _log_integral(
                design[h_index],
                weights[:, c_index].T,
                total_weight[c_index],
                anchor[h_index],
                beta[h_index, :, c_index],
                variance[c_index],
                negative_prior,
            )
            out[rows[h_index], c_index] = np.nan_to_num(
                -free_wrss[rows[h_index], c_index] / (2.0 * variance[c_index])
                + log_integral
                - size * math.log(_HI - _LO),
                nan=-np.inf,
            )
    return out


def evidence_choice(
    hypotheses: Sequence[Hypothesis],
    log_evidence_: FloatArray,
    outside: FloatArray,
    eligible: npt.NDArray[np.bool_],
) -> npt.NDArray[np.bool_]:
    """The hypotheses (x contexts) the model is chosen among: those of the lead of largest
    posterior, summed over its hypotheses of both sizes, and of that lead's likelier size (the
    other where none of it is ``eligible``). Each size has half of the prior, shared among its
    hypotheses as ``outside`` (per hypothesis) weighs them; ``below`` (hypotheses x contexts)
    multiplies it (the prior of a model below zero at 1)."""
    sizes = np.array([len(h.terms) for h in hypotheses])
    keys: dict[tuple[float, int], int] = {}
    lead = np.zeros(len(hypotheses), dtype=np.intp)
    for index, hypothesis in enumerate(hypotheses):
        if hypothesis.terms:
            top = max((float(f.poly), f.log) for t in hypothesis.terms for f in t.factors)
            lead[index] = keys.setdefault(top, len(keys))
    log_post = np.array(log_evidence_)
    for size in (1, 2):
        in_size = sizes == size
        share = float(outside[in_size].sum())
        if share > 0:
            log_post[in_size] += np.log(outside[in_size] / share)[:, None] + math.log(0.5)
    top = log_post.max(axis=0)
    weight = np.exp(log_post - np.where(np.isfinite(top), top, 0.0))
    weight = np.where(np.isfinite(log_post), weight, 0.0)
    by_lead_size = np.zeros((len(keys), 2, log_post.shape[1]))
    in_two = np.clip(sizes - 1, 0, 1)
    np.add.at(by_lead_size, (lead, in_two), weight * (sizes >= 1)[:, None])
    chosen_lead = np.argmax(by_lead_size.sum(axis=1), axis=0)  # (C,)
    columns = np.arange(log_post.shape[1])
    two_likelier = by_lead_size[chosen_lead, 1, columns] > by_lead_size[chosen_lead, 0, columns]
    of_lead = (lead[:, None] == chosen_lead[None, :]) & (sizes >= 1)[:, None]
    of_size = of_lead & ((sizes == 2)[:, None] == two_likelier[None, :])
    usable = (of_size & eligible).any(axis=0)
    return np.asarray(np.where(usable[None, :], of_size, of_lead))
