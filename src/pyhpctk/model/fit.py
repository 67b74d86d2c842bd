"""Batched PMNF model search: every context of a series is modeled at once.

For a fixed set of measurement points the design matrix of a hypothesis is the same for every
context, so one pseudo-inverse per hypothesis fits all contexts together (``pinv(X) @ Y`` with one
column of ``Y`` per context), and the hypotheses of one size are stacked into a single batched
``pinv``. Model choice follows Extra-P: the hypothesis with the smallest leave-one-out
cross-validated SMAPE wins, and among hypotheses within ``tie_tolerance`` of the best the simplest
is taken (fewest terms, then lowest order) — so the constant model is the fallback when nothing
explains the data better. This module does no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from pyhpctk.model.pmnf import (
    DEFAULT_LOG_EXPONENTS,
    DEFAULT_POLY_EXPONENTS,
    Factor,
    FloatArray,
    Hypothesis,
    Model,
    Term,
    search_space,
    single,
)

# Contexts fitted per batch: bounds the (hypotheses x points x contexts) temporaries.
_CHUNK_ELEMENTS = 8_000_000


WEIGHTINGS = ("relative", "poisson", "absolute")


@dataclass(frozen=True, slots=True)
class FitOptions:
    """How to search. ``max_terms`` counts non-constant terms of single-parameter hypotheses."""

    max_terms: int = 1
    poly_exponents: tuple[Fraction, ...] = DEFAULT_POLY_EXPONENTS
    log_exponents: tuple[int, ...] = DEFAULT_LOG_EXPONENTS
    tie_tolerance: float = 1e-4  # SMAPE percentage points within which simpler models win
    term_ratio: float = 1.5  # an extra term must cut the CV-SMAPE below best * this to count
    refine: bool = False  # iterative refinement of single-term exponents (mediant search)
    weighting: str = "relative"  # relative (1/y²), poisson (1/y) or absolute (1): see _weights
    allow_negative: bool = False  # accept negative term coefficients (Extra-P rejects them)

    def __post_init__(self) -> None:
        if not 0 <= self.max_terms <= 3:
            raise ValueError("max_terms must be between 0 and 3")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}")


@dataclass(slots=True)
class FitResult:
    """The chosen model of every context, with its quality figures (arrays over contexts)."""

    models: list[Model]
    smape: FloatArray  # in-sample SMAPE, percent
    cv_smape: FloatArray  # leave-one-out SMAPE, percent
    adjusted_r2: FloatArray
    rss: FloatArray
    notes: list[str] = field(default_factory=list)


def smape(actual: FloatArray, predicted: FloatArray, axis: int = 0) -> FloatArray:
    """Symmetric mean absolute percentage error along ``axis``; 0/0 counts as a perfect fit."""
    denominator = (np.abs(actual) + np.abs(predicted)) / 2.0
    error = np.abs(actual - predicted)
    ratio = np.divide(error, denominator, out=np.zeros_like(error), where=denominator > 0)
    return np.asarray(100.0 * ratio.mean(axis=axis), dtype=np.float64)


def single_parameter_hypotheses(param: int, options: FitOptions) -> list[Hypothesis]:
    """The constant, then every combination of up to ``max_terms`` distinct terms."""
    terms = search_space(param, options.poly_exponents, options.log_exponents)
    hypotheses = [Hypothesis(())]
    for count in range(1, options.max_terms + 1):
        hypotheses.extend(Hypothesis(combo) for combo in itertools.combinations(terms, count))
    return hypotheses


@dataclass(slots=True)
class _Scores:
    hypotheses: list[Hypothesis]
    coefficients: list[FloatArray]  # per hypothesis: (1 + terms, contexts)
    smape: FloatArray  # (hypotheses, contexts)
    cv_smape: FloatArray
    rss: FloatArray


def _weights(y: FloatArray, weighting: str) -> FloatArray:
    """Least-squares weights per point and context.

    ``relative`` (1/y²) fits relative errors, right for multiplicative noise; ``poisson`` (1/y)
    suits sampled profiles, whose counts have a variance that grows like their value;
    ``absolute`` (1) is ordinary least squares. Floored so that zeros get no infinite weight.
    """
    if weighting == "absolute":
        return np.ones_like(y)
    magnitude = np.abs(y)
    floor = np.maximum(magnitude.max(axis=0, keepdims=True) * 1e-9, 1e-300)
    power = 2.0 if weighting == "relative" else 1.0
    return np.asarray(1.0 / np.maximum(magnitude, floor) ** power, dtype=np.float64)


def _solve(normal: FloatArray, rhs: FloatArray) -> FloatArray:
    """Solve stacked normal equations, with a whisper of ridge so exact fits never go singular."""
    size = normal.shape[-1]
    trace = np.trace(normal, axis1=-2, axis2=-1)[..., None, None]
    ridge = np.eye(size) * (trace * 1e-14 / size + 1e-300)
    return np.asarray(np.linalg.solve(normal + ridge, rhs[..., None])[..., 0], dtype=np.float64)


def _score(
    x: FloatArray,
    y: FloatArray,
    hypotheses: Sequence[Hypothesis],
    options: FitOptions,
    cross_validate: bool = True,
) -> _Scores:
    """Fit every hypothesis to every column of ``y`` (points x contexts) and score it.

    Weighted least squares through the normal equations, batched over hypotheses of one size and
    over contexts; leaving point i out is a rank-one downdate of the same equations, so the
    leave-one-out scores cost little more than the fit. Without ``cross_validate`` (segments too
    short for it) the CV score is the in-sample one. Hypotheses whose term coefficients come out
    negative are not eligible unless ``options.allow_negative``.
    """
    n_points, n_contexts = y.shape
    weights = _weights(y, options.weighting)
    by_size: dict[int, list[int]] = {}
    for index, hypothesis in enumerate(hypotheses):
        by_size.setdefault(len(hypothesis.terms), []).append(index)
    total = len(hypotheses)
    fit = np.full((total, n_contexts), np.inf)
    cv = np.full((total, n_contexts), np.inf)
    rss = np.full((total, n_contexts), np.inf)
    coefficients: list[FloatArray] = [np.zeros(0)] * total
    for size, indices in by_size.items():
        if n_points < size + (2 if cross_validate else 1):
            continue  # leave-one-out needs at least as many points as coefficients
        design = np.stack([hypotheses[i].design(x) for i in indices])  # (H, n, k)
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
        for position, index in enumerate(indices):
            coefficients[index] = group_coefficients[position]
    return _Scores(list(hypotheses), coefficients, fit, cv, rss)


def _choose(scores: _Scores, options: FitOptions) -> npt.NDArray[np.intp]:
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
    order = sorted(range(len(scores.hypotheses)), key=lambda i: scores.hypotheses[i].complexity)
    rank = np.empty(len(order), dtype=np.float64)
    rank[order] = np.arange(len(order))
    in_size = sizes[:, None] == chosen_size[None, :]
    cv = np.where(in_size, scores.cv_smape, np.inf)
    size_min = cv.min(axis=0)
    eligible = cv <= size_min[None, :] * (1 + 1e-9) + options.tie_tolerance * 1e-3
    return np.asarray(np.argmin(np.where(eligible, rank[:, None], np.inf), axis=0))


def _results(
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
) -> FitResult:
    """Model every column of ``y`` (points x contexts) as a function of one parameter."""
    x = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    y = _as_matrix(y, x.shape[0])
    hypotheses = single_parameter_hypotheses(0, options)
    scores = _score(x, y, hypotheses, options)
    result = _results(x, y, scores, _choose(scores, options), (name,))
    if options.refine:
        result = refine(x, y, result, options)
    return result


def _as_matrix(y: FloatArray, n_points: int) -> FloatArray:
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 1:
        y = y.reshape(-1, 1)
    if y.shape[0] != n_points:
        raise ValueError(f"{y.shape[0]} measurements for {n_points} parameter values")
    if n_points < 3:
        raise ValueError("at least 3 points are needed to model anything (5 recommended)")
    return y


# --- iterative refinement (mediant search over simple fractions) -------------------------------


def refine(x: FloatArray, y: FloatArray, result: FitResult, options: FitOptions) -> FitResult:
    """Refine the polynomial exponent of single-term models by mediant (Stern-Brocot) search.

    Starting from the chosen exponent a, its neighbours in the search space bound an interval; each
    step tries the mediants between a and both bounds and keeps the best exponent while the
    cross-validated SMAPE improves by more than 1 % relative, up to denominators of 16. All contexts
    step together: one batched pseudo-inverse per step.
    """
    grid = sorted(set(options.poly_exponents))
    n_contexts = y.shape[1]
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
            scores = _score(x, y[:, c : c + 1], hyps, options)
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


# --- several parameters ---------------------------------------------------------------------------


def fit_multi_parameter(
    points: FloatArray,
    y: FloatArray,
    names: tuple[str, ...],
    options: FitOptions = FitOptions(),
) -> FitResult:
    """Model each column of ``y`` as a function of several parameters (Extra-P's heuristic).

    ``points`` is (n_points, n_params). For each parameter, the measurements are grouped into
    lines along which only that parameter varies; the best single-term model of each line is found
    and the lead term most lines agree on is that parameter's term. The terms of all parameters
    are then combined additively and multiplicatively (every way of grouping them into products),
    each combination is fitted to all points, and the best is chosen as for one parameter.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != len(names):
        raise ValueError("points must be (n_points, n_params) with one name per parameter")
    y = _as_matrix(y, points.shape[0])
    if len(names) == 1:
        return fit_single_parameter(points[:, 0], y, options, names[0])
    per_param = [_parameter_terms(points, y, p, options) for p in range(len(names))]
    n_contexts = y.shape[1]
    # Contexts with the same candidate factors share one hypothesis set: fit them together.
    groups: dict[tuple[tuple[Factor, ...], ...], list[int]] = {}
    for c in range(n_contexts):
        key = tuple(tuple(per_param[p][c]) for p in range(len(names)))
        groups.setdefault(key, []).append(c)
    models: list[Model | None] = [None] * n_contexts
    figures = np.zeros((4, n_contexts))
    for key, members in groups.items():
        shapes: set[Hypothesis] = set()
        for choice in itertools.product(*key):
            shapes.update(_combinations(list(choice)))
        hypotheses = sorted(shapes, key=lambda h: h.complexity)
        columns = np.asarray(members)
        scores = _score(points, y[:, columns], hypotheses, options)
        part = _results(points, y[:, columns], scores, _choose(scores, options), names)
        for position, c in enumerate(members):
            models[c] = part.models[position]
        figures[:, columns] = np.stack([part.smape, part.cv_smape, part.adjusted_r2, part.rss])
    return FitResult([m for m in models if m is not None], *figures)


def _parameter_terms(
    points: FloatArray, y: FloatArray, param: int, options: FitOptions, keep: int = 2
) -> list[list[Factor]]:
    """Per context, the ``keep`` best factors of parameter ``param`` over the grid's lines.

    Every single-term hypothesis of the parameter is scored on every line (the points where only
    this parameter varies); a hypothesis's score is its CV-SMAPE summed over lines, each line
    weighted by its share of the context's total value, since lines with larger values carry the
    asymptotic behaviour. The constant is a candidate too (an empty list entry is never returned:
    a context whose best is the constant gets its best non-constant factors after it).
    """
    others = np.delete(points, param, axis=1)
    keys, line_of = np.unique(others, axis=0, return_inverse=True)
    line_of = line_of.reshape(-1)
    single_options = replace(options, max_terms=1, refine=False)
    hypotheses = single_parameter_hypotheses(param, single_options)
    n_contexts = y.shape[1]
    total = np.zeros((len(hypotheses), n_contexts))
    magnitude = np.abs(y).sum(axis=0) + 1e-300
    for line in range(len(keys)):
        rows = np.flatnonzero(line_of == line)
        if len(np.unique(points[rows, param])) < 4:
            continue
        scores = _score(points[rows], y[rows], hypotheses, single_options)
        weight = np.abs(y[rows]).sum(axis=0) / magnitude
        total += np.where(np.isfinite(scores.cv_smape), scores.cv_smape, 1e6) * weight[None, :]
    order = np.argsort(total, axis=0, kind="stable")
    out: list[list[Factor]] = []
    for c in range(n_contexts):
        factors = [
            hypotheses[h].terms[0].factors[0] for h in order[: keep + 1, c] if hypotheses[h].terms
        ]
        out.append(factors[:keep])
    return out


def _combinations(factors: list[Factor]) -> list[Hypothesis]:
    """Every additive / multiplicative arrangement of one factor per parameter."""
    shapes = {Hypothesis(())}
    for count in range(1, len(factors) + 1):
        for subset in itertools.combinations(factors, count):
            for partition in _partitions(list(subset)):
                terms = tuple(sorted(Term(tuple(sorted(group))) for group in partition))
                shapes.add(Hypothesis(terms))
    # Also a product term next to its own factors, e.g. c0 + c1*p*n + c2*p (Extra-P's mixed form).
    if len(factors) >= 2:
        product = Term(tuple(sorted(factors)))
        for factor in factors:
            shapes.add(Hypothesis(tuple(sorted((product, Term((factor,)))))))
    return sorted(shapes, key=lambda h: h.complexity)


def _partitions(items: list[Factor]) -> list[list[list[Factor]]]:
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out: list[list[list[Factor]]] = []
    for partition in _partitions(rest):
        out.append([[first], *partition])
        for i in range(len(partition)):
            out.append([*partition[:i], [first, *partition[i]], *partition[i + 1 :]])
    return out


# --- segmented behaviour --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segmentation:
    """A change of behaviour between ``values[split - 1]`` and ``values[split]``."""

    split: int
    before: Model
    after: Model
    improvement: float  # global CV-SMAPE divided by the segments' weighted CV-SMAPE


def detect_segments(
    values: Sequence[float] | FloatArray,
    y: FloatArray,
    options: FitOptions = FitOptions(max_terms=1),
    name: str = "p",
    min_points: int = 3,
    threshold: float = 3.0,
) -> list[Segmentation | None]:
    """Per context, a segmentation when two models fit far better than one (else None).

    Each split leaving ``min_points`` on both sides is tried; a context is segmented when the
    best split's weighted in-sample SMAPE beats the single model's by ``threshold`` times and the
    single model's error is at least 2 %. Needs at least ``2 * min_points`` points.
    """
    x = np.asarray(values, dtype=np.float64)
    y = _as_matrix(y, len(x))
    n_points, n_contexts = y.shape
    if n_points < 2 * min_points:
        return [None] * n_contexts
    one = replace(options, max_terms=1, refine=False)
    whole = fit_single_parameter(x, y, one, name)
    best: list[Segmentation | None] = [None] * n_contexts
    best_error = np.full(n_contexts, np.inf)
    for split in range(min_points, n_points - min_points + 1):
        before = _fit_in_sample(x[:split], y[:split], one, name)
        after = _fit_in_sample(x[split:], y[split:], one, name)
        error = (before.smape * split + after.smape * (n_points - split)) / n_points
        for c in np.flatnonzero(error < best_error):
            best_error[c] = error[c]
            ratio = whole.smape[c] / max(error[c], 1e-12)
            best[c] = Segmentation(split, before.models[c], after.models[c], float(ratio))
    return [
        s if s is not None and s.improvement >= threshold and whole.smape[c] >= 2.0 else None
        for c, s in enumerate(best)
    ]


def _fit_in_sample(x: FloatArray, y: FloatArray, options: FitOptions, name: str) -> FitResult:
    """Fit by in-sample SMAPE (segments are too short for cross-validation)."""
    xs = x.reshape(-1, 1)
    hypotheses = [h for h in single_parameter_hypotheses(0, options) if len(h.terms) + 1 < len(x)]
    scores = _score(xs, y, hypotheses, options, cross_validate=False)
    return _results(xs, y, scores, _choose(scores, options), (name,))
