"""Segmented behaviour of one parameter: one model up to a split, another after it.

A context changes behaviour when two single-term models, one on each side of a split, fit far
better than one model of all points (Extra-P's segmented modeler asks the same question). This
module does no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from pyhpctk.model.fit import (
    FitOptions,
    FitResult,
    Repetitions,
    auto_weightings,
    choose_models,
    fit_results,
    fit_single_parameter,
    score_hypotheses,
    single_parameter_hypotheses,
    values_matrix,
)
from pyhpctk.model.pmnf import FloatArray, Model


@dataclass(frozen=True, slots=True)
class Segmentation:
    """A change of behaviour between ``values[split - 1]`` and ``values[split]``: a piecewise
    model, ``before`` up to ``values[split - 1]`` and ``after`` from ``start = values[split]``
    (Extra-P's segmented modeler calls ``start`` the changing point)."""

    split: int
    before: Model
    after: Model
    improvement: float  # the single model's SMAPE divided by the segments' weighted SMAPE
    start: float = 0.0
    smape: float = 0.0  # the segments' in-sample SMAPE, weighted by their number of points

    def render(self, name: str, digits: int = 4) -> str:
        """``<model> for p < 16; <model> from p = 16``."""
        return (
            f"{self.before.render(digits)} for {name}<{self.start:g}; "
            f"{self.after.render(digits)} from {name}={self.start:g}"
        )


def detect_segments(
    values: Sequence[float] | FloatArray,
    y: FloatArray,
    options: FitOptions | None = None,
    name: str = "p",
    min_points: int = 3,
    threshold: float = 3.0,
    repetitions: Repetitions | None = None,
) -> list[Segmentation | None]:
    """Per context, a segmentation when two models fit far better than one (else None).

    Each split leaving ``min_points`` on both sides is tried; a context is segmented when the
    best split's weighted in-sample SMAPE beats the single model's by ``threshold`` times and the
    single model's error is at least 2 %. Needs at least ``2 * min_points`` points. Under
    ``weighting="auto"`` each context is examined with the weighting its repetitions call for
    (:func:`~pyhpctk.model.fit.auto_weightings`), as its model is fitted.
    """
    options = options or FitOptions()
    x = np.asarray(values, dtype=np.float64)
    y = values_matrix(y, len(x))
    n_points, n_contexts = y.shape
    if n_points < 2 * min_points:
        return [None] * n_contexts
    one = replace(options, max_terms=1, refine=False)
    if one.weighting != "auto":
        return _segments(x, y, one, name, min_points, threshold)
    chosen = auto_weightings(y, repetitions)
    out: list[Segmentation | None] = [None] * n_contexts
    for weighting in sorted(set(chosen)):
        columns = [c for c, w in enumerate(chosen) if w == weighting]
        part = _segments(
            x, y[:, columns], replace(one, weighting=weighting), name, min_points, threshold
        )
        for c, segmentation in zip(columns, part, strict=True):
            out[c] = segmentation
    return out


def _segments(
    x: FloatArray,
    y: FloatArray,
    one: FitOptions,
    name: str,
    min_points: int,
    threshold: float,
) -> list[Segmentation | None]:
    n_points, n_contexts = y.shape
    whole = fit_single_parameter(x, y, one, name)
    best: list[Segmentation | None] = [None] * n_contexts
    best_error = np.full(n_contexts, np.inf)
    for split in range(min_points, n_points - min_points + 1):
        before = _fit_in_sample(x[:split], y[:split], one, name)
        after = _fit_in_sample(x[split:], y[split:], one, name)
        error = (before.smape * split + after.smape * (n_points - split)) / n_points
        # A point both segments fit exactly (noise-free data, where the pieces meet) stays in
        # the first segment, as Extra-P's segmented modeler keeps it: ties go to later splits.
        for c in np.flatnonzero(error <= best_error * (1 + 1e-9) + 1e-9):
            best_error[c] = error[c]
            ratio = whole.smape[c] / max(error[c], 1e-12)
            best[c] = Segmentation(
                split,
                before.models[c],
                after.models[c],
                float(ratio),
                float(x[split]),
                float(error[c]),
            )
    return [
        s if s is not None and s.improvement >= threshold and whole.smape[c] >= 2.0 else None
        for c, s in enumerate(best)
    ]


def _fit_in_sample(x: FloatArray, y: FloatArray, options: FitOptions, name: str) -> FitResult:
    """Fit by in-sample SMAPE (segments are too short for cross-validation)."""
    xs = x.reshape(-1, 1)
    hypotheses = [h for h in single_parameter_hypotheses(0, options) if len(h.terms) + 1 < len(x)]
    in_sample = replace(options, selection="cv-smape")
    scores = score_hypotheses(xs, y, hypotheses, in_sample, cross_validate=False)
    return fit_results(xs, y, scores, choose_models(scores, in_sample, y), (name,))
