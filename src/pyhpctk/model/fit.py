"""Batched PMNF model search: every context of a series is modeled at once.

For a fixed set of measurement points the design matrix of a hypothesis is the same for every
context, so the weighted normal equations of all hypotheses of one size and all contexts are
stacked and solved together. Fitting the means with each point weighted by its number of runs is
fitting every run (the means are sufficient), and the runs' spread around their means is the
pure error that model choice measures improvements against:

- ``f-test`` (default): within a number of terms the hypothesis with the smallest weighted
  residual sum of squares wins (least squares is the maximum-likelihood choice among models with
  as many coefficients); a larger number of terms is kept only when it cuts that sum by more than
  the noise explains (the extra-sum-of-squares F-test at ``significance``, with the variance
  estimated from the repetitions' pure error plus the larger model's residual).
- ``cv-smape``: Extra-P's criterion, the smallest leave-one-out cross-validated SMAPE.

Exact ties go to the simplest hypothesis (fewest terms, then lowest order), so the constant model
is the fallback when nothing explains the data better. This module does no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from pyhpctk.model.evidence import evidence_choice, log_evidence, log_normal_cdf
from pyhpctk.model.fdist import f_critical
from pyhpctk.model.pmnf import (
    DEFAULT_LOG_EXPONENTS,
    DEFAULT_POLY_EXPONENTS,
    EXTRAP_BLOCKS,
    SPACES,
    FloatArray,
    Hypothesis,
    Model,
    Term,
    search_space,
    single,
)

# Contexts fitted per batch: bounds the (hypotheses x points x contexts) temporaries.
_CHUNK_ELEMENTS = 8_000_000


WEIGHTINGS = ("relative", "poisson", "absolute", "auto")
SELECTIONS = ("f-test", "cv-smape", "loo")
TERMS_BY = ("f-test", "evidence")

# Relative size below which residuals are rounding, not noise: noise-free data then still tells
# a true model (residual ~1e-15) from a wrong one.
_ROUNDING = 1e-9


@dataclass(frozen=True, slots=True)
class FitOptions:
    """How to search. ``max_terms`` counts non-constant terms of single-parameter hypotheses."""

    max_terms: int = 2
    poly_exponents: tuple[Fraction, ...] = DEFAULT_POLY_EXPONENTS
    log_exponents: tuple[int, ...] = DEFAULT_LOG_EXPONENTS
    space: str = "grid"  # grid: every pair of those exponents; extrap: Extra-P's building blocks
    # f-test: prior weight of a term outside Extra-P's building blocks against one inside, in the
    # likeliest lead (1: none; Extra-P's own space is 0)
    outside_prior: float = 0.1
    # f-test: prior weight, in the likeliest lead and the evidence, of a model whose constant is
    # below zero beyond its noise (no fixed cost is negative; _constant_not_negative; 1: none)
    below_zero_prior: float = 0.1
    selection: str = "f-test"  # f-test or cv-smape: see the module docstring; loo: the lowest
    # leave-one-out SMAPE of any size (the refit of a model that misses: analyze.fit_series)
    significance: float = 0.05  # f-test: chance that noise alone earns an extra term
    tie_tolerance: float = 1e-4  # cv-smape: SMAPE percentage points within which simpler wins
    term_ratio: float = 1.5  # cv-smape: an extra term must cut the CV-SMAPE below best * this
    refine: bool = False  # iterative refinement of single-term exponents (mediant search)
    weighting: str = "relative"  # relative (1/y²), poisson (1/y), absolute (1), or auto:
    # per context, the one its repetitions' scatter calls for (auto_weightings)
    allow_negative: bool = False  # accept negative term coefficients (Extra-P 4.2.5 does)
    negative_exponents: bool = False  # also p^-i: strong scaling, c0 + c1 * p^-1
    lead_average: bool = True  # f-test: the likeliest lead over its hypotheses (_likeliest_lead)
    # f-test, one parameter: one term or two (and the lead) by the F-test, or by their
    # integrated evidence under a broad prior of the terms' shares (model.evidence)
    terms_by: str = "evidence"

    def __post_init__(self) -> None:
        if not 0 <= self.max_terms <= 3:
            raise ValueError("max_terms must be between 0 and 3")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}")
        if self.space not in SPACES:
            raise ValueError(f"space must be one of {', '.join(SPACES)}")
        if not 0 < self.outside_prior <= 1:
            raise ValueError("outside_prior must be in (0, 1]")
        if not 0 < self.below_zero_prior <= 1:
            raise ValueError("below_zero_prior must be in (0, 1]")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}")
        if self.terms_by not in TERMS_BY:
            raise ValueError(f"terms_by must be one of {', '.join(TERMS_BY)}")
        if not 0 < self.significance < 1:
            raise ValueError("significance must be between 0 and 1")


@dataclass(frozen=True, slots=True)
class Repetitions:
    """The runs behind each point's mean: how many (``counts``, per point) and their standard
    deviation around the mean (``spread``, points x contexts, population: divided by the count),
    as :class:`~pyhpctk.model.series.Series` keeps them."""

    counts: npt.NDArray[np.int64]
    spread: FloatArray

    def __post_init__(self) -> None:
        if self.counts.ndim != 1 or (self.counts < 1).any():
            raise ValueError("counts must be one positive run count per point")
        if self.spread.ndim != 2 or self.spread.shape[0] != self.counts.shape[0]:
            raise ValueError("spread must be (points, contexts), one row per count")

    @classmethod
    def of(cls, runs: Sequence[FloatArray]) -> Repetitions:
        """From the runs of every point: ``runs[i]`` is (runs at point i, contexts)."""
        counts = np.array([len(r) for r in runs], dtype=np.int64)
        spread = np.stack([np.asarray(r, dtype=np.float64).std(axis=0) for r in runs])
        return cls(counts, spread)


@dataclass(slots=True)
class FitResult:
    """The chosen model of every context, with its quality figures (arrays over contexts)."""

    models: list[Model]
    smape: FloatArray  # in-sample SMAPE, percent
    cv_smape: FloatArray  # leave-one-out SMAPE, percent
    adjusted_r2: FloatArray
    rss: FloatArray
    notes: list[str] = field(default_factory=list)
    weightings: list[str] = field(default_factory=list)  # per context, where told (fit_series)


def smape(actual: FloatArray, predicted: FloatArray, axis: int = 0) -> FloatArray:
    """Symmetric mean absolute percentage error along ``axis``; 0/0 counts as a perfect fit."""
    denominator = (np.abs(actual) + np.abs(predicted)) / 2.0
    error = np.abs(actual - predicted)
    ratio = np.divide(error, denominator, out=np.zeros_like(error), where=denominator > 0)
    return np.asarray(100.0 * ratio.mean(axis=axis), dtype=np.float64)


def single_parameter_hypotheses(param: int, options: FitOptions) -> list[Hypothesis]:
    """The constant, then every combination of up to ``max_terms`` distinct terms of the
    search space (``options.space``; with ``negative_exponents``, also the term ``p^-i`` of
    every positive ``i`` of the search space, as Extra-P's option of the same name adds)."""
    terms = search_space(param, options.poly_exponents, options.log_exponents, options.space)
    if options.negative_exponents:
        terms += [single(param, -poly, 0) for poly in options.poly_exponents if poly > 0]
    hypotheses = [Hypothesis(())]
    for count in range(1, options.max_terms + 1):
        hypotheses.extend(Hypothesis(combo) for combo in itertools.combinations(terms, count))
    return hypotheses


@dataclass(slots=True)
class _Scores:
    hypotheses: list[Hypothesis]
    coefficients: list[FloatArray]  # per hypothesis: (1 + terms, contexts)
    smape: FloatArray  # (hypotheses, contexts)
    cv_smape: FloatArray  # inf where the hypothesis is not eligible
    rss: FloatArray  # unweighted, of the means
    wrss: FloatArray  # weighted and run-counted: the least-squares objective; inf if not eligible
    free_wrss: FloatArray | None = None  # the same whatever the coefficients' signs
    constant_spread: FloatArray | None = None  # (M⁻¹)₀₀: the constant's variance per unit
    x: FloatArray | None = None  # the points (n, params)


def auto_weightings(y: FloatArray, repetitions: Repetitions | None) -> list[str]:
    """Per context (column of ``y``, the means), the weighting its runs' scatter calls for.

    Least squares weighs a point by one over its variance. The runs' standard deviation at each
    point against the mean, on log scales, has slope b when the deviation grows like ``y**b``:
    b near 1 is multiplicative noise (``relative``, 1/y²), near 1/2 counting noise (``poisson``,
    1/y), near 0 additive noise (``absolute``). Without repetitions (one run per point, a
    sampled profile's additive error) or where the mean varies less than twofold or fewer than
    three points scatter (the weights would barely differ): ``absolute``.
    """
    n_contexts = y.shape[1]
    if repetitions is None or (repetitions.counts < 2).all():
        return ["absolute"] * n_contexts
    spread = repetitions.spread
    usable = (spread > 0) & (np.abs(y) > 0)
    log_y = np.log(np.where(usable, np.abs(y), 1.0))
    log_s = np.log(np.where(usable, spread, 1.0))
    n = usable.sum(axis=0)
    safe = np.maximum(n, 1)
    mean_y = (log_y * usable).sum(axis=0) / safe
    mean_s = (log_s * usable).sum(axis=0) / safe
    dy = (log_y - mean_y) * usable
    variance = (dy**2).sum(axis=0)
    slope = (dy * (log_s - mean_s)).sum(axis=0) / np.maximum(variance, 1e-300)
    low = np.where(usable, log_y, np.inf).min(axis=0)
    high = np.where(usable, log_y, -np.inf).max(axis=0)
    decided = (n >= 3) & (high - low >= np.log(2.0))
    names = np.where(slope >= 0.75, "relative", np.where(slope >= 0.25, "poisson", "absolute"))
    return [
        str(w) if ok else "absolute" for w, ok in zip(names.tolist(), decided.tolist(), strict=True)
    ]


def groups_by_weighting(
    y: FloatArray,
    options: FitOptions,
    repetitions: Repetitions | None,
    fit: Callable[[FloatArray, FitOptions, Repetitions | None], FitResult],
) -> FitResult:
    """``weighting="auto"``: each context fitted with its own weighting, results in order."""
    chosen = np.array(auto_weightings(y, repetitions))
    n_contexts = y.shape[1]
    models: list[Model | None] = [None] * n_contexts
    figures = np.zeros((4, n_contexts))
    notes: list[str] = []
    for weighting in sorted(set(chosen.tolist())):
        columns = np.flatnonzero(chosen == weighting)
        part = fit(
            y[:, columns],
            replace(options, weighting=weighting),
            repetitions_of_columns(repetitions, columns),
        )
        for position, c in enumerate(columns.tolist()):
            models[c] = part.models[position]
        figures[:, columns] = np.stack([part.smape, part.cv_smape, part.adjusted_r2, part.rss])
        notes.extend(note for note in part.notes if note not in notes)
    smape_, cv_smape, adjusted_r2, rss = figures
    return FitResult(
        [m for m in models if m is not None], smape_, cv_smape, adjusted_r2, rss, notes
    )


def weights_of(y: FloatArray, weighting: str) -> FloatArray:
    """Least-squares weights per point and context.

    ``relative`` (1/y²) fits relative errors, right for multiplicative noise; ``poisson`` (1/y)
    suits sampled profiles, whose counts have a variance that grows like their value;
    ``absolute`` (1) is ordinary least squares. Floored so that zeros get no infinite weight.
    (``auto`` is resolved per context before any fit: :func:`auto_weightings`.)
    """
    if weighting == "auto":
        raise ValueError("weighting auto is resolved per context before fitting")
    if weighting == "absolute":
        return np.ones_like(y)
    magnitude = np.abs(y)
    largest = magnitude.max(axis=0, keepdims=True)
    # a context that is zero everywhere has no scale to be relative to: unit weights (before,
    # 1/(1e-300)**2 overflowed, and its normal equations filled with NaN)
    floor = np.where(largest > 0, np.maximum(largest * 1e-9, 1e-150), 1.0)
    power = 2.0 if weighting == "relative" else 1.0
    return np.asarray(1.0 / np.maximum(magnitude, floor) ** power, dtype=np.float64)


def _solve(normal: FloatArray, rhs: FloatArray) -> FloatArray:
    """Solve stacked normal equations, with a whisper of ridge so exact fits never go singular.

    The equations are equilibrated first (unit diagonal): relative weights make a steep term's
    column and the constant's differ by many orders of magnitude, and unscaled normal equations
    would lose the constant to rounding.
    """
    size = normal.shape[-1]
    diagonal = np.sqrt(np.maximum(np.diagonal(normal, axis1=-2, axis2=-1), 1e-300))  # (..., k)
    right = rhs / diagonal
    one = 1.0 + 1e-14  # the unit diagonal with its ridge
    if size == 1:
        solved = right / one
    elif size == 2:  # the usual case, constant + one term: Cramer's rule beats a batched LAPACK
        rho = normal[..., 0, 1] / (diagonal[..., 0] * diagonal[..., 1])
        determinant = one * one - rho * rho
        first = (one * right[..., 0] - rho * right[..., 1]) / determinant
        second = (one * right[..., 1] - rho * right[..., 0]) / determinant
        solved = np.stack([first, second], axis=-1)
    else:
        unit = normal / (diagonal[..., :, None] * diagonal[..., None, :])
        unit = unit + np.eye(size) * 1e-14
        solved = np.linalg.solve(unit, right[..., None])[..., 0]
    return np.asarray(solved / diagonal, dtype=np.float64)


def count_weights(repetitions: Repetitions | None, n_points: int) -> FloatArray:
    if repetitions is None:
        return np.ones(n_points)
    if repetitions.counts.shape[0] != n_points:
        raise ValueError(f"{repetitions.counts.shape[0]} run counts for {n_points} points")
    return repetitions.counts.astype(np.float64)


def repetitions_of_columns(
    repetitions: Repetitions | None, columns: npt.NDArray[np.intp]
) -> Repetitions | None:
    if repetitions is None:
        return None
    return Repetitions(repetitions.counts, repetitions.spread[:, columns])


def _designs(
    x: FloatArray, hypotheses: Sequence[Hypothesis], known: dict[Term, FloatArray]
) -> FloatArray:
    """The design matrices of hypotheses of one size, stacked (H, n, 1 + terms): each term's
    column is evaluated once (``known`` keeps them across sizes), a search has thousands of
    hypotheses of a few dozen terms."""
    for hypothesis in hypotheses:
        for term in hypothesis.terms:
            if term not in known:
                known[term] = term.evaluate(x)
    size = len(hypotheses[0].terms)
    design = np.ones((len(hypotheses), x.shape[0], 1 + size))
    if size:
        table = list(known)
        position = {term: i for i, term in enumerate(table)}
        index = np.array([[position[t] for t in h.terms] for h in hypotheses], dtype=np.intp)
        values = np.stack([known[t] for t in table])  # (terms, n)
        design[:, :, 1:] = values[index].transpose(0, 2, 1)
    return design


def score_hypotheses(
    x: FloatArray,
    y: FloatArray,
    hypotheses: Sequence[Hypothesis],
    options: FitOptions,
    cross_validate: bool = True,
    counts: FloatArray | None = None,
) -> _Scores:
    """Fit every hypothesis to every column of ``y`` (points x contexts) and score it.

    Weighted least squares through the normal equations, batched over hypotheses of one size and
    over contexts; each point's weight is multiplied by its run count (``counts``), which makes
    the fit of the means the fit of every run. Leaving point i out is a rank-one downdate of the
    same equations, so the leave-one-out scores cost little more than the fit. Without
    ``cross_validate`` (segments too short for it) the CV score is the in-sample one. Hypotheses
    whose term coefficients come out negative are not eligible unless ``options.allow_negative``.
    """
    n_points, n_contexts = y.shape
    weights = weights_of(y, options.weighting)
    if counts is not None:
        weights = weights * counts[:, None]
    by_size: dict[int, list[int]] = {}
    for index, hypothesis in enumerate(hypotheses):
        by_size.setdefault(len(hypothesis.terms), []).append(index)
    total = len(hypotheses)
    fit = np.full((total, n_contexts), np.inf)
    cv = np.full((total, n_contexts), np.inf)
    rss = np.full((total, n_contexts), np.inf)
    wrss = np.full((total, n_contexts), np.inf)
    free_wrss = np.full((total, n_contexts), np.inf)
    constant_spread = np.full((total, n_contexts), np.inf)
    coefficients: list[FloatArray] = [np.zeros(0)] * total
    columns: dict[Term, FloatArray] = {}  # each term's design column, evaluated once
    for size, indices in by_size.items():
        if n_points < size + (2 if cross_validate else 1):
            continue  # leave-one-out needs at least as many points as coefficients
        design = _designs(x, [hypotheses[i] for i in indices], columns)  # (H, n, k)
        scale = np.abs(design).max(axis=1, keepdims=True)
        scale[scale == 0] = 1.0
        scaled = design / scale
        outer = np.einsum("hnk,hnl->hnkl", scaled, scaled)  # (H, n, k, k)
        chunk = max(1, _CHUNK_ELEMENTS // (len(indices) * (size + 1) ** 2 * n_points))
        group_coefficients = np.empty((len(indices), size + 1, n_contexts))
        for start in range(0, n_contexts, chunk):
            part = slice(start, min(start + chunk, n_contexts))
            y_part, w_part = y[:, part], weights[:, part]
            normal = np.einsum("hnkl,nc->hckl", outer, w_part)  # (H, C, k, k)
            rhs = np.einsum("hnk,nc->hck", scaled, w_part * y_part)  # (H, C, k)
            beta = _solve(normal, rhs)
            predicted = np.einsum("hnk,hck->hnc", scaled, beta)
            residual = predicted - y_part[None]
            fit[indices, part] = smape(y_part[None], predicted, axis=1)
            rss[indices, part] = (residual**2).sum(axis=1)
            wrss[indices, part] = (w_part[None] * residual**2).sum(axis=1)
            free_wrss[indices, part] = wrss[indices, part]
            unit = np.zeros_like(rhs)
            unit[..., 0] = 1.0
            constant_spread[indices, part] = _solve(normal, unit)[..., 0]
            group_coefficients[:, :, part] = (beta / scale).transpose(0, 2, 1)
            if cross_validate:
                loo = np.empty_like(predicted)
                for i in range(n_points):
                    w_i = w_part[i][None, :, None]
                    normal_i = normal - w_i[..., None] * outer[:, i][:, None]
                    rhs_i = rhs - (w_i * y_part[i][None, :, None]) * scaled[:, i][:, None]
                    beta_i = _solve(normal_i, rhs_i)
                    loo[:, i, :] = np.einsum("hk,hck->hc", scaled[:, i], beta_i)
                cv[indices, part] = smape(y_part[None], loo, axis=1)
            else:
                cv[indices, part] = fit[indices, part]
            if not options.allow_negative and size:
                negative = (beta[:, :, 1:] < 0).any(axis=2)  # (H, C)
                cv[indices, part] = np.where(negative, np.inf, cv[indices, part])
                wrss[indices, part] = np.where(negative, np.inf, wrss[indices, part])
        for position, index in enumerate(indices):
            coefficients[index] = group_coefficients[position]
    return _Scores(
        list(hypotheses), coefficients, fit, cv, rss, wrss, free_wrss, constant_spread, x
    )


def choose_models(
    scores: _Scores,
    options: FitOptions,
    y: FloatArray,
    repetitions: Repetitions | None = None,
) -> npt.NDArray[np.intp]:
    """The chosen hypothesis of every context (an index into ``scores.hypotheses``)."""
    if options.selection == "cv-smape":
        return _choose_cv_smape(scores, options)
    if options.selection == "loo":
        return _choose_cv_smape(scores, replace(options, term_ratio=1.0))
    return _choose_f_test(scores, options, y, repetitions)


def _complexity_rank(hypotheses: Sequence[Hypothesis]) -> FloatArray:
    order = sorted(range(len(hypotheses)), key=lambda i: hypotheses[i].complexity)
    rank = np.empty(len(order), dtype=np.float64)
    rank[order] = np.arange(len(order))
    return rank


def _choose_f_test(
    scores: _Scores,
    options: FitOptions,
    y: FloatArray,
    repetitions: Repetitions | None,
) -> npt.NDArray[np.intp]:
    """Per context: the fewest terms that no larger number of terms beats significantly, then
    the least-squares best hypothesis of that size, near-ties going to the lowest order.

    A larger size beats a smaller one when its best hypothesis cuts the weighted residual by more
    than the F-test allows at ``significance`` divided by the number of hypotheses of the larger
    size (the best of many is not one test: Bonferroni). The yardstick is the variance of one run
    (:func:`_run_variance`), from the repetitions' pure error where they have any, so the test no
    longer rests on the two or three residual degrees of freedom that five means leave. A floor
    at rounding level keeps noise-free data deciding for the exact model.
    """
    n_points, n_contexts = y.shape
    counts = count_weights(repetitions, n_points)
    weights = weights_of(y, options.weighting) * counts[:, None]
    runs = float(counts.sum())
    pure = np.zeros(n_contexts)
    if repetitions is not None:
        pure = (weights * repetitions.spread**2).sum(axis=0)
    floor = _ROUNDING**2 * (weights * y**2).sum(axis=0) / runs + 1e-300
    sizes = np.array([len(h.terms) for h in scores.hypotheses])
    present = sorted(set(sizes.tolist()))
    best = {s: scores.wrss[sizes == s].min(axis=0) for s in present}
    chosen = np.full(n_contexts, -1)
    pure_dof = runs - n_points
    for small in present:
        beaten = ~np.isfinite(best[small])
        for large in (s for s in present if s > small):
            variance, dof = _run_variance(best[large], pure, n_points, pure_dof, large + 1, options)
            # The larger size's best is the best of many hypotheses: Bonferroni keeps the chance
            # that noise alone makes any of them pass at ``significance``.
            alpha = options.significance / int((sizes == large).sum())
            critical = np.full(n_contexts, np.inf)
            for value in np.unique(dof[dof >= 1]):
                level = f_critical(large - small, float(value), alpha)
                critical = np.where(dof == value, level, critical)
            finite = np.isfinite(best[large]) & (dof >= 1)
            gain = np.where(finite, best[small] - np.where(finite, best[large], 0.0), 0.0)
            yardstick = np.where(finite, critical * np.maximum(variance, floor), np.inf)
            beaten |= finite & (gain / (large - small) > yardstick)
        chosen = np.where((chosen < 0) & ~beaten, small, chosen)
    chosen = np.where(chosen < 0, present[-1], chosen)
    in_size = sizes[:, None] == chosen[None, :]
    wrss = np.where(in_size, scores.wrss, np.inf)
    if options.lead_average:  # the best fit among the hypotheses of the likeliest lead
        variance = np.zeros(n_contexts)
        for size in present:
            var, _ = _run_variance(best[size], pure, n_points, pure_dof, size + 1, options)
            variance = np.where(chosen == size, var, variance)
        prior = np.array([options.outside_prior ** _outside_blocks(h) for h in scores.hypotheses])
        ok = _constant_not_negative(scores, np.maximum(variance, floor))
        prior = (ok + options.below_zero_prior * (1.0 - ok)) * prior[:, None]
        likeliest = _likeliest_lead(scores.hypotheses, wrss, np.maximum(variance, floor), prior)
        wrss = np.where(likeliest, wrss, np.inf)
        if options.terms_by == "evidence" and _one_parameter(scores.hypotheses) and 2 in best:
            apply = chosen >= 1
            among = _by_evidence(scores, weights, np.maximum(variance, floor), apply, options)
            wrss = np.where(among.any(axis=0), np.where(among, scores.wrss, np.inf), wrss)
    size_min = wrss.min(axis=0)
    eligible = np.isfinite(wrss) & (wrss <= size_min * (1 + 1e-9) + floor)
    rank = _complexity_rank(scores.hypotheses)
    return np.asarray(np.argmin(np.where(eligible, rank[:, None], np.inf), axis=0))


def _constant_not_negative(scores: _Scores, variance: FloatArray) -> FloatArray:
    """Per hypothesis and context, how plausible its constant is as a fixed cost, which is
    never negative: 1 where the fitted constant c is not negative, else the chance 2Φ(c / sd)
    that noise alone puts a constant of 0 that far below zero (sd: the variance of one run times
    the constant's entry of the inverse normal matrix). At five noisy values two terms often buy
    a closer fit with a constant far below zero (``-203 + 194·p^(1/2) + 14.2·n^(11/4)`` for
    ``1.29 + 56.9·p^(1/3)·log2(p) + 14.2·n^(11/4)``); a constant of 0 (``13·p`` exactly) is not
    held against its model, nor a negative one within its noise."""
    if scores.constant_spread is None:
        return np.ones_like(scores.wrss)
    n_contexts = scores.wrss.shape[1]
    constant = np.stack([c[0] if len(c) else np.zeros(n_contexts) for c in scores.coefficients])
    spread = np.sqrt(variance[None, :] * scores.constant_spread)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(spread > 0, constant / spread, np.where(constant < 0, -np.inf, np.inf))
    return np.minimum(2.0 * np.exp(log_normal_cdf(np.nan_to_num(z, nan=np.inf))), 1.0)


def _one_parameter(hypotheses: Sequence[Hypothesis]) -> bool:
    return all(len(t.factors) == 1 for h in hypotheses for t in h.terms) and all(
        len(h.terms) <= 2 for h in hypotheses
    )


def _by_evidence(
    scores: _Scores,
    weights: FloatArray,
    variance: FloatArray,
    apply: npt.NDArray[np.bool_],
    options: FitOptions,
) -> npt.NDArray[np.bool_]:
    """Where ``apply``, the hypotheses the model is chosen among by their integrated evidence
    (:mod:`pyhpctk.model.evidence`): the likeliest lead's, of its likelier size; none elsewhere."""
    if scores.free_wrss is None or scores.x is None:
        return np.zeros(scores.wrss.shape, dtype=np.bool_)
    log_ev = log_evidence(
        scores.hypotheses,
        scores.coefficients,
        scores.free_wrss,
        scores.x,
        weights,
        variance,
        apply,
        options.below_zero_prior,
    )
    outside = np.array([options.outside_prior ** _outside_blocks(h) for h in scores.hypotheses])
    among = evidence_choice(scores.hypotheses, log_ev, outside, np.isfinite(scores.wrss))
    decided = (
        apply & np.isfinite(log_ev).any(axis=0) & (among & np.isfinite(scores.wrss)).any(axis=0)
    )
    return np.asarray(among & decided[None, :])


def _outside_blocks(hypothesis: Hypothesis) -> int:
    """How many of the hypothesis's factors of non-negative exponents are not among Extra-P's
    building blocks (``p^(7/4)·log2(p)``: a logarithm with a power no common algorithm has)."""
    return sum(
        factor.poly >= 0 and (factor.poly, factor.log) not in _BLOCKS
        for term in hypothesis.terms
        for factor in term.factors
    )


_BLOCKS = frozenset(EXTRAP_BLOCKS)


def _likeliest_lead(
    hypotheses: Sequence[Hypothesis], wrss: FloatArray, variance: FloatArray, prior: FloatArray
) -> npt.NDArray[np.bool_]:
    """Per context, the hypotheses whose lead factors (the highest-order factor of every
    parameter) are the likeliest: each hypothesis weighs its likelihood relative to the best,
    ``exp(-(wrss - min) / (2 variance))``, times its ``prior`` (hypotheses x contexts), and each
    lead gets the sum over the hypotheses that have it (averaging over the terms below it, which
    the data may not pin down)."""
    keys: dict[tuple[tuple[int, float, int], ...], int] = {}
    lead = np.empty(len(hypotheses), dtype=np.intp)
    for index, hypothesis in enumerate(hypotheses):
        best: dict[int, tuple[float, int]] = {}  # exponents of a search space differ by > 1e-3
        for term in hypothesis.terms:
            for factor in term.factors:
                growth = (float(factor.poly), factor.log)
                best[factor.param] = max(best.get(factor.param, (-99.0, 0)), growth)
        key = tuple((param, *growth) for param, growth in sorted(best.items()))
        lead[index] = keys.setdefault(key, len(keys))
    finite = np.isfinite(wrss)
    excess = np.where(finite, wrss - np.where(finite, wrss, np.inf).min(axis=0), np.inf)
    weight = np.exp(-excess / (2.0 * variance[None, :])) * prior
    totals = np.zeros((len(keys), wrss.shape[1]))
    np.add.at(totals, lead, weight)
    return np.asarray(lead[:, None] == np.argmax(totals, axis=0)[None, :])


def _run_variance(
    residual: FloatArray,
    pure: FloatArray,
    n_points: int,
    pure_dof: float,
    n_coefficients: int,
    options: FitOptions,
) -> tuple[FloatArray, FloatArray]:
    """The variance of one run under a model with ``n_coefficients`` and weighted residual
    ``residual``, and its degrees of freedom, per context.

    Where the model explains the means to within their runs' scatter (the lack-of-fit F-test
    passes), pure error and residual are pooled over every run. Where it does not, the runs
    agree more closely than the model and the means do — behaviour between configurations that
    repetitions cannot see (one run's warm cache, a sampled phase boundary) — and only the
    residual of the means is a fair yardstick, with its few degrees of freedom.
    """
    lack_dof = n_points - n_coefficients
    pooled_dof = lack_dof + pure_dof
    if pooled_dof < 1:
        return np.zeros_like(residual), np.zeros_like(residual)
    pooled = (pure + residual) / pooled_dof
    if lack_dof < 1 or pure_dof < 1:
        return pooled, np.full_like(residual, pooled_dof)
    critical = f_critical(lack_dof, pure_dof, options.significance)
    adequate = residual / lack_dof <= critical * pure / pure_dof
    variance = np.where(adequate, pooled, residual / lack_dof)
    return variance, np.where(adequate, float(pooled_dof), float(lack_dof))


def _choose_cv_smape(scores: _Scores, options: FitOptions) -> npt.NDArray[np.intp]:
    """Per context: first the fewest terms whose best CV-SMAPE is within ``term_ratio`` of the
    overall best (an extra term must earn its place), then the best hypothesis of that size,
    exact ties going to the lowest order."""
    sizes = np.array([len(h.terms) for h in scores.hypotheses])
    best = scores.cv_smape.min(axis=0)
    allowed = best * options.term_ratio + options.tie_tolerance
    chosen_size = np.full(best.shape, sizes.max(initial=0))
    for size in sorted(set(sizes.tolist()), reverse=True):
        size_best = scores.cv_smape[sizes == size].min(axis=0)
        chosen_size = np.where(size_best <= allowed, size, chosen_size)
    rank = _complexity_rank(scores.hypotheses)
    in_size = sizes[:, None] == chosen_size[None, :]
    cv = np.where(in_size, scores.cv_smape, np.inf)
    size_min = cv.min(axis=0)
    eligible = cv <= size_min[None, :] * (1 + 1e-9) + options.tie_tolerance * 1e-3
    return np.asarray(np.argmin(np.where(eligible, rank[:, None], np.inf), axis=0))


def fit_results(
    x: FloatArray,
    y: FloatArray,
    scores: _Scores,
    choice: npt.NDArray[np.intp],
    params: tuple[str, ...],
) -> FitResult:
    n_points, n_contexts = y.shape
    columns = np.arange(n_contexts)
    models = [
        Model(
            scores.hypotheses[h],
            tuple(float(v) for v in scores.coefficients[h][:, c]),
            params,
        )
        for c, h in enumerate(choice)
    ]
    rss = scores.rss[choice, columns]
    k = np.array([len(scores.hypotheses[h].terms) for h in choice], dtype=np.float64)
    tss = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    dof = np.maximum(n_points - k - 1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        adjusted = 1.0 - (rss / dof) / (tss / max(n_points - 1, 1))
    adjusted = np.where(tss > 0, adjusted, 1.0)
    return FitResult(
        models, scores.smape[choice, columns], scores.cv_smape[choice, columns], adjusted, rss
    )


def fit_single_parameter(
    values: Sequence[float] | FloatArray,
    y: FloatArray,
    options: FitOptions = FitOptions(),
    name: str = "p",
    repetitions: Repetitions | None = None,
) -> FitResult:
    """Model every column of ``y`` (points x contexts) as a function of one parameter.

    ``y`` holds each point's mean; ``repetitions``, when given, the runs behind the means (their
    counts weight the fit, their spread is the pure error the F-test measures gains against).
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    y = values_matrix(y, x.shape[0])
    if options.weighting == "auto":
        return groups_by_weighting(
            y,
            options,
            repetitions,
            lambda yy, oo, rr: fit_single_parameter(values, yy, oo, name, rr),
        )
    hypotheses = single_parameter_hypotheses(0, options)
    scores = score_hypotheses(
        x, y, hypotheses, options, counts=count_weights(repetitions, x.shape[0])
    )
    result = fit_results(x, y, scores, choose_models(scores, options, y, repetitions), (name,))
    if options.refine:
        result = refine(x, y, result, options, repetitions)
    return result


def values_matrix(y: FloatArray, n_points: int) -> FloatArray:
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 1:
        y = y.reshape(-1, 1)
    if y.shape[0] != n_points:
        raise ValueError(f"{y.shape[0]} measurements for {n_points} parameter values")
    if n_points < 3:
        raise ValueError("at least 3 points are needed to model anything (5 recommended)")
    return y


# --- iterative refinement (mediant search over simple fractions) -------------------------------


def refine(
    x: FloatArray,
    y: FloatArray,
    result: FitResult,
    options: FitOptions,
    repetitions: Repetitions | None = None,
) -> FitResult:
    """Refine the polynomial exponent of single-term models by mediant (Stern-Brocot) search.

    Starting from the chosen exponent a, its neighbours in the search space bound an interval; each
    step tries the mediants between a and both bounds and keeps the best exponent while the
    cross-validated SMAPE improves by more than 1 % relative, up to denominators of 16. All contexts
    step together: one batched pseudo-inverse per step.
    """
    grid = sorted(set(options.poly_exponents))
    n_contexts = y.shape[1]
    counts = count_weights(repetitions, y.shape[0])
    models = list(result.models)
    cv = result.cv_smape.copy()
    for c in range(n_contexts):
        model = models[c]
        if len(model.hypothesis.terms) != 1 or len(model.hypothesis.terms[0].factors) != 1:
            continue
        factor = model.hypothesis.terms[0].factors[0]
        position = grid.index(factor.poly) if factor.poly in grid else None
        if position is None:
            continue
        low = grid[position - 1] if position > 0 else Fraction(0)
        high = grid[position + 1] if position + 1 < len(grid) else factor.poly + 1
        best = factor.poly
        for _ in range(6):
            candidates = [_mediant(low, best), _mediant(best, high)]
            candidates = [f for f in candidates if f.denominator <= 16 and f > 0]
            if not candidates:
                break
            hyps = [Hypothesis((single(0, f, factor.log),)) for f in candidates]
            scores = score_hypotheses(x, y[:, c : c + 1], hyps, options, counts=counts)
            which = int(np.argmin(scores.cv_smape[:, 0]))
            if scores.cv_smape[which, 0] >= cv[c] * 0.99:
                break
            chosen = candidates[which]
            if chosen < best:
                high = best
            else:
                low = best
            best = chosen
            cv[c] = scores.cv_smape[which, 0]
            coefficients = tuple(float(v) for v in scores.coefficients[which][:, 0])
            models[c] = Model(hyps[which], coefficients, model.params)
    if cv is result.cv_smape:
        return result
    return FitResult(models, result.smape, cv, result.adjusted_r2, result.rss, result.notes)


def _mediant(a: Fraction, b: Fraction) -> Fraction:
    return Fraction(a.numerator + b.numerator, a.denominator + b.denominator)
