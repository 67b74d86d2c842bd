"""Model every context of a series and rank them by how badly they will scale.

Ranking puts the worst asymptotic behaviour first: contexts are ordered by the growth of their
model's lead-order term (polynomial exponent, then logarithm exponent, summed over parameters),
then deepest first (an inclusive cost grows like its worst descendant, which is where the
behaviour originates), then by the value predicted at the target scale. Contexts too small to
matter (below
``threshold`` of the whole program at the largest measured configuration) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import UsageError
from pyhpctk.model.fit import (
    FitOptions,
    FitResult,
    Repetitions,
    auto_weightings,
    fit_single_parameter,
)
from pyhpctk.model.multi import design_lines, fit_multi_parameter
from pyhpctk.model.pmnf import Model, Term, compare_growth, parse_expectation
from pyhpctk.model.segments import Segmentation, detect_segments
from pyhpctk.model.series import Series

# Percent: a model whose symmetric mean absolute percentage error on its own measurements is
# above this does not describe them (a context present in a few configurations only, or seen
# in a handful of samples); it is ranked after the models that fit.
UNTRUSTED_SMAPE = 50.0
# Percent: a model whose leave-one-out SMAPE is above this predicts the points left out poorly
# (the data are not of its form, or their noise misleads the choice); such a context is also
# fitted under ordinary least squares and, with several parameters, with terms that subtract,
# and the model that predicts its left-out points best is kept (fit_series).
REFIT_CV_SMAPE = 10.0
# ... and above this many times the runs' own scatter (the median over points of their standard
# deviation over their mean): at 10 % noise a model of the right form misses left-out points by
# more than 10 % too.
REFIT_SCATTER = 5.0
#: An inclusive context whose children hold this share of its cost is ranked by their growth
#: where its own fitted growth is faster (:func:`rank`).
CHILDREN_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    # Per context, the weighting its repetitions' scatter calls for; with one run per
    # configuration, ordinary least squares (profile values carry additive sampling error, a
    # sample's worth at each phase boundary: docs/pymodel.md, "Weighting").
    fit: FitOptions = field(default_factory=lambda: FitOptions(weighting="auto"))
    target: tuple[float, ...] | None = None  # one value per parameter; None: 8x the largest
    expect: str | None = None  # e.g. "p*log2(p)"
    threshold: float = 0.001  # fraction of the whole program at the largest configuration
    negative_exponents: str = "auto"  # auto (contexts that fall as a parameter grows), always
    segments: bool = True


@dataclass(slots=True)
class ContextModel:
    """One context's model and what it predicts."""

    path: tuple[str, ...]
    label: tuple[str, ...]  # the same path, in short display labels
    model: Model  # of all points (a piecewise model's segments: ``segmentation``)
    smape: float  # in-sample, percent: of the piecewise model where there is one
    cv_smape: float  # leave-one-out, of ``model``
    adjusted_r2: float
    measured: float  # mean value at the largest configuration
    predicted: float  # model value at the target configuration
    growth: tuple[Fraction, int]
    expectation: str | None = None  # match / approximate / no match
    segmentation: Segmentation | None = None  # a piecewise model, where behaviour changes
    weighting: str = "absolute"  # the least-squares weighting of its fit (fit_series)

    @property
    def final(self) -> Model:
        """The model of the largest scales: the last segment's where behaviour changes."""
        return self.segmentation.after if self.segmentation is not None else self.model


@dataclass(slots=True)
class ScalingAnalysis:
    series: Series
    target: tuple[float, ...]
    contexts: list[ContextModel] = field(default_factory=list)  # ranked
    dropped: int = 0
    notes: list[str] = field(default_factory=list)  # what the fits found (design, ...)


def _growth(model: Model) -> tuple[Fraction, int]:
    term = model.lead_term()
    return term.growth() if term else (Fraction(0), 0)


def fit_series(
    series: Series, options: FitOptions, negative: str = "never", refit: bool = True
) -> FitResult:
    """Fit every context of ``series``: its means, weighted by their run counts, with the runs'
    spread as the pure error model choice measures gains against. Contexts measured a different
    number of times (an Extra-P experiment may) are fitted in groups of equal counts.

    ``negative`` says which contexts may have negative exponents (``p^-1``): ``always``,
    ``never``, or ``auto``: those whose values fall as a parameter grows (:func:`falling`), for
    which a model of non-negative exponents and coefficients cannot but be flat; with several
    parameters their terms may also have negative coefficients.

    With ``refit``, a context whose model's leave-one-out SMAPE is above ``REFIT_CV_SMAPE`` is
    fitted again (:func:`_refit_misses`); ``FitResult.weightings`` says how each was weighted.
    """
    result = _fit_series(series, options, negative)
    result.weightings = _weightings(series, options)
    if refit and options.weighting == "auto":
        _refit_misses(series, options, negative, result)
    return result


def _weightings(series: Series, options: FitOptions) -> list[str]:
    """The weighting each context of ``series`` is fitted with (``auto``: its runs' call)."""
    if options.weighting != "auto":
        return [options.weighting] * series.mean.shape[1]
    out = [""] * series.mean.shape[1]
    for counts, group in count_groups(series):
        runs = Repetitions(counts, series.spread[:, group])
        chosen = auto_weightings(series.mean[:, group], runs)
        for c, weighting in zip(group.tolist(), chosen, strict=True):
            out[c] = weighting
    return out


def _refit_misses(series: Series, options: FitOptions, negative: str, result: FitResult) -> None:
    """Where a model predicts its left-out points worse than ``REFIT_CV_SMAPE``, fit the
    context again under ordinary least squares and, with several parameters, letting terms
    subtract (as Extra-P's may) and choosing the hypothesis of the lowest leave-one-out SMAPE
    (``selection="loo"``, on the F-test's shortlist of factors), and keep the model of the
    lowest leave-one-out SMAPE (ties to the first fit), updating ``result`` in place.

    Multiplicative noise calls for relative weighting, but where the data are not of any model's
    form a point of value 1 beside points of 500 then decides the fit alone; and a behaviour
    that changes across a grid may be a difference of terms. Series the models describe (left-out
    points within 10 %, or within five times the runs' own scatter) are not refitted.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.where(series.mean != 0, series.spread / np.abs(series.mean), 0.0)
    scatter = 100.0 * np.median(relative, axis=0)
    misses = np.flatnonzero(
        (result.cv_smape > REFIT_CV_SMAPE) & (result.cv_smape > REFIT_SCATTER * scatter)
    )
    if not len(misses):
        return
    sub = _columns(series, misses)
    changed = np.zeros(len(result.models), dtype=bool)
    several = len(series.params) > 1
    # With one parameter, choosing by leave-one-out SMAPE cost 1 to 8 of 2400 synthetic series
    # on every seed tried (docs/pymodel.md); with several it changed none and closed three gaps.
    variants = [
        (replace(options, weighting=weighting, selection=selection), subtract)
        for selection in (("f-test", "loo") if several else ("f-test",))
        for weighting in ("auto", "absolute")
        for subtract in ((False, True) if several else (False,))
    ][1:]  # not the first fit again
    for these, subtract in variants:
        again = _fit_series(sub, these, negative, subtract)
        weightings = _weightings(sub, these)
        for position, c in enumerate(misses.tolist()):
            if not again.cv_smape[position] < result.cv_smape[c]:
                continue
            result.models[c] = again.models[position]
            for name in ("smape", "cv_smape", "adjusted_r2", "rss"):
                getattr(result, name)[c] = getattr(again, name)[position]
            changed[c] = True
            result.weightings[c] = weightings[position]
    if changed.any():
        result.notes.append(
            f"{int(changed.sum())} of {len(misses)} contexts whose model predicted its left-out "
            f"points worse than {REFIT_CV_SMAPE:g} % (leave-one-out SMAPE) got one that predicts "
            "them better (ordinary least squares, terms that subtract, or with several parameters "
            "the hypothesis of the lowest leave-one-out SMAPE)"
        )


def _columns(series: Series, columns: npt.NDArray[np.intp]) -> Series:
    """The contexts ``columns`` of ``series``, as a series of their own."""
    return Series(
        series.params,
        series.points,
        series.mean[:, columns],
        series.spread[:, columns],
        series.repetitions,
        [series.paths[i] for i in columns],
        series.metric,
        series.scope,
        series.title,
        labels=[series.labels[i] for i in columns] if series.labels else [],
        run_counts=None if series.run_counts is None else series.run_counts[:, columns],
    )


def _fit_series(
    series: Series, options: FitOptions, negative: str, subtract: bool = False
) -> FitResult:
    n_contexts = series.mean.shape[1]
    models: list[Model | None] = [None] * n_contexts
    figures = np.zeros((4, n_contexts))
    notes: list[str] = []
    falls = falling(series) if negative == "auto" else np.full(n_contexts, negative == "always")
    for counts, group in count_groups(series):
        for fall in (False, True):
            columns = group[falls[group] == fall]
            if not len(columns):
                continue
            runs = Repetitions(counts, series.spread[:, columns])
            y = series.mean[:, columns]
            # With several parameters a falling context may also subtract a term, as Extra-P's
            # models do: time that falls along x towards zero at a finite x while it grows
            # along y (strong_scaling/two_parameter_1.txt) has no model of positive terms. With
            # one parameter p^-i suffices, and a subtracted term gave a rising lead.
            several = len(series.params) > 1
            these = replace(
                options, negative_exponents=fall, allow_negative=(fall or subtract) and several
            )
            if len(series.params) == 1:
                part = fit_single_parameter(series.points[:, 0], y, these, series.params[0], runs)
            else:
                part = fit_multi_parameter(series.points, y, series.params, these, runs)
            for position, c in enumerate(columns.tolist()):
                models[c] = part.models[position]
            figures[:, columns] = np.stack([part.smape, part.cv_smape, part.adjusted_r2, part.rss])
            notes.extend(n for n in part.notes if n not in notes)
    if negative == "auto" and falls.any():
        notes.append(
            f"{int(falls.sum())} of {n_contexts} contexts fall as a parameter grows (strong "
            "scaling): their models may have negative exponents (c0 + c1 * p^-1)"
        )
    smape, cv_smape, adjusted_r2, rss = figures
    fitted = [m for m in models if m is not None]
    return FitResult(fitted, smape, cv_smape, adjusted_r2, rss, notes)


def falling(series: Series) -> npt.NDArray[np.bool_]:
    """Per context: do its values fall as some parameter grows (strong scaling)?

    Along every line where only that parameter varies (all of a one-parameter series), at least
    three quarters of the steps from one value of the parameter to the next go down, and the
    last value is below nine tenths of the first.
    """
    n_contexts = series.mean.shape[1]
    out = np.zeros(n_contexts, dtype=bool)
    for param in range(len(series.params)):
        lines = design_lines(series.points, param)
        if not lines:
            continue
        votes = np.zeros(n_contexts)
        for rows in lines:
            ordered = rows[np.argsort(series.points[rows, param], kind="stable")]
            y = series.mean[ordered]
            down = (np.diff(y, axis=0) < 0).mean(axis=0)
            votes += (down >= 0.75) & (y[-1] < 0.9 * y[0])
        out |= votes > len(lines) / 2
    return out


def count_groups(series: Series) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]]:
    """The run counts per point and the contexts (columns) measured that many times."""
    n_contexts = series.mean.shape[1]
    if series.run_counts is None:
        return [(series.repetitions, np.arange(n_contexts))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for c in range(n_contexts):
        groups.setdefault(tuple(series.run_counts[:, c].tolist()), []).append(c)
    return [
        (np.array(key, dtype=np.int64), np.array(columns, dtype=np.intp))
        for key, columns in groups.items()
    ]


def _segments(series: Series, options: FitOptions) -> list[Segmentation | None]:
    out: list[Segmentation | None] = [None] * series.mean.shape[1]
    for counts, columns in count_groups(series):
        found = detect_segments(
            series.points[:, 0],
            series.mean[:, columns],
            options,
            series.params[0],
            repetitions=Repetitions(counts, series.spread[:, columns]),
        )
        for c, segmentation in zip(columns.tolist(), found, strict=True):
            out[c] = segmentation
    return out


def analyze(series: Series, options: AnalysisOptions = AnalysisOptions()) -> ScalingAnalysis:
    """Fit, predict, compare with the expectation and rank every context of ``series``."""
    n_params = len(series.params)
    target = options.target or tuple(float(v) * 8 for v in series.points.max(axis=0))
    if len(target) != n_params:
        raise UsageError(f"--target needs {n_params} value(s), one per parameter")
    expected: Term | None = None
    if options.expect:
        try:
            expected = parse_expectation(options.expect, series.params)
        except ValueError as error:
            raise UsageError(f"--expect: {error}") from None
    largest = int(np.argmax(series.points.prod(axis=1)))
    measured = series.mean[largest]
    scale = float(np.abs(measured).max()) if measured.size else 0.0
    if options.threshold == 0:
        keep = np.arange(series.mean.shape[1])
    elif scale:
        keep = np.flatnonzero(np.abs(measured) >= options.threshold * scale)
    else:
        keep = np.arange(0)
    analysis = ScalingAnalysis(series, target, dropped=series.mean.shape[1] - len(keep))
    if not len(keep):
        return analysis
    sub = _columns(series, keep)
    result = fit_series(sub, options.fit, options.negative_exponents)
    analysis.notes.extend(result.notes)
    segments = (
        _segments(sub, options.fit) if options.segments and n_params == 1 else [None] * len(keep)
    )
    point = np.array([target], dtype=np.float64)
    runs = _weightings(sub, options.fit)
    for position, model in enumerate(result.models):
        segmentation = segments[position]
        # Beyond the measurements, a piecewise model continues as its last segment.
        final = segmentation.after if segmentation is not None else model
        analysis.contexts.append(
            ContextModel(
                path=sub.paths[position],
                label=sub.labels[position] if sub.labels else sub.paths[position],
                model=model,
                smape=float(result.smape[position] if segmentation is None else segmentation.smape),
                cv_smape=float(result.cv_smape[position]),
                adjusted_r2=float(result.adjusted_r2[position]),
                measured=float(sub.mean[largest, position]),
                predicted=float(final.evaluate(point)[0]),
                growth=_growth(final),
                expectation=compare_growth(final.lead_term(), expected) if options.expect else None,
                segmentation=segmentation,
                # A piecewise model's segments are fitted as the runs' scatter calls for.
                weighting=result.weightings[position] if segmentation is None else runs[position],
            )
        )
    rank(analysis.contexts)
    return analysis


def rank(contexts: list[ContextModel]) -> None:
    """Sort ``contexts`` (in place): worst growth first; among contexts that grow alike, the
    deepest first: an inclusive cost grows like its worst descendant, and the descendant is
    where the behaviour originates.

    A context whose direct children (models that fit) hold at least :data:`CHILDREN_SHARE` of
    its cost at the largest configuration is ranked by its fastest-growing child's growth when
    its own is faster: a sum grows like its fastest part, and a faster lead fitted to the sum
    alone is its few noisy points (``step`` of examples/scaling_demo.py, ``0.0008·p² + 0.006·p +
    0.02·log2 p + c``, came out as ``p^(9/4)`` on a loaded machine and was ranked above its
    own ``all_to_all``, the ``p²`` it sums). Its model is shown as fitted. A model that misses
    its own measurements (SMAPE above UNTRUSTED_SMAPE: a context seen in a few configurations
    only, a handful of samples) is ranked after every model that fits, whatever growth it
    claims."""
    children: dict[tuple[str, ...], list[ContextModel]] = {}
    for context in contexts:
        if context.path and context.smape <= UNTRUSTED_SMAPE:
            children.setdefault(context.path[:-1], []).append(context)
    growth: dict[int, tuple[Fraction, int]] = {}
    for context in sorted(contexts, key=lambda c: len(c.path), reverse=True):  # deepest first
        own = context.growth
        below = children.get(context.path, [])
        held = sum(child.measured for child in below)
        if below and context.measured > 0 and held >= CHILDREN_SHARE * context.measured:
            own = min(own, max(growth[id(child)] for child in below))
        growth[id(context)] = own
    contexts.sort(
        key=lambda c: (c.smape <= UNTRUSTED_SMAPE, growth[id(c)], len(c.path), c.predicted),
        reverse=True,
    )
