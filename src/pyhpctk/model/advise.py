"""Which measurement to take next: the point where the models the data cannot yet tell apart
disagree most.

Extra-P 4.3's measurement-point advisor proposes the next configurations to run so that the
model improves most for the cost; this one asks the same question of pymodel's own search. For
every parameter and context, the single-term hypotheses of that parameter are fitted along each
line where only it varies (as model search shortlists factors, :mod:`.multi`), and the
*committee* is every hypothesis whose weighted residual is within the F-test's reach of the best
one — hypotheses the measurements so far cannot reject. Each candidate value of the parameter
(the next step beyond the largest measured value, the step before the smallest, and the
geometric middle of each gap) is scored by how far the committee's predictions there spread, as
a fraction of their median, weighted by the context's share of the whole at the largest
configuration; a measurement there rejects the most of the committee. This module does no I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from pyhpctk.model.fdist import f_critical
from pyhpctk.model.fit import (
    FitOptions,
    auto_weightings,
    score_hypotheses,
    single_parameter_hypotheses,
)
from pyhpctk.model.fit import Repetitions as Runs
from pyhpctk.model.multi import design_lines
from pyhpctk.model.pmnf import FloatArray
from pyhpctk.model.series import Series


@dataclass(frozen=True, slots=True)
class Advice:
    """Measure at ``point`` (one value per parameter): the unrejected models of the contexts in
    ``contexts`` (display paths, largest disagreement first) spread by ``spread`` there (a
    fraction of their median prediction, weighted by each context's share)."""

    point: tuple[float, ...]
    param: int
    kind: str  # "beyond the largest", "below the smallest", "between measured values"
    spread: float
    contexts: tuple[tuple[str, ...], ...]


def candidates(values: FloatArray) -> list[tuple[float, str]]:
    """Candidate values of one parameter: a step beyond each end (by the ratio of the two
    values there) and the geometric middle of each gap between measured values."""
    v = np.unique(values)
    out = [(float(v[-1] * v[-1] / v[-2]), "beyond the largest")]
    if v[0] * v[0] / v[1] >= 1:  # parameters below 1 make logarithms negative: not proposed
        out.append((float(v[0] * v[0] / v[1]), "below the smallest"))
    out += [(float(np.sqrt(a * b)), "between measured values") for a, b in itertools.pairwise(v)]
    return out


def advise(series: Series, options: FitOptions | None = None, count: int = 3) -> list[Advice]:
    """The ``count`` most informative next measurements of ``series``, best first."""
    options = replace(options or FitOptions(), max_terms=1, refine=False, allow_negative=True)
    largest = int(np.argmax(series.points.prod(axis=1)))
    share = np.abs(series.mean[largest])
    share = share / max(float(share.sum()), 1e-300)
    weighting = auto_weightings(series.mean, Runs(series.repetitions, series.spread))
    advice: list[Advice] = []
    for param in range(len(series.params)):
        lines = design_lines(series.points, param)
        if not lines:
            continue
        rows = max(lines, key=lambda r: float(series.points[r].prod(axis=1).max()))
        base = series.points[rows[0]].copy()
        for value, kind in candidates(series.points[rows, param]):
            point = base.copy()
            point[param] = value
            spread = _committee_spread(series, rows, param, point, options, weighting)
            order = np.argsort(-spread * share)
            advice.append(
                Advice(
                    tuple(float(v) for v in point),
                    param,
                    kind,
                    float((spread * share).sum()),
                    tuple(
                        series.labels[c] if series.labels else series.paths[c] for c in order[:3]
                    ),
                )
            )
    advice.sort(key=lambda a: -a.spread)
    return advice[:count]


def _committee_spread(
    series: Series,
    rows: npt.NDArray[np.intp],
    param: int,
    point: FloatArray,
    options: FitOptions,
    weighting: list[str],
) -> FloatArray:
    """Per context: the spread of the unrejected hypotheses' predictions at ``point`` (their
    range over their median, absolute), fitted along the line ``rows``."""
    x = series.points[rows]
    n = len(rows)
    hypotheses = single_parameter_hypotheses(param, options)
    spread = np.zeros(series.mean.shape[1])
    for chosen in sorted(set(weighting)):
        columns = np.array([c for c, w in enumerate(weighting) if w == chosen])
        y = series.mean[np.ix_(rows, columns)]
        counts = series.repetitions[rows].astype(np.float64)
        scores = score_hypotheses(
            x, y, hypotheses, replace(options, weighting=chosen), False, counts
        )
        wrss = np.where(np.isfinite(scores.wrss), scores.wrss, np.inf)
        best = wrss.min(axis=0)
        dof = max(n - 2, 1)
        # Unrejected: no worse than the best by more than the F-test's margin at 5 %.
        allowed = best * (1 + f_critical(1, dof, 0.05) / dof) + 1e-12 * np.abs(y).sum(axis=0) ** 2
        predictions = np.stack(
            [h.design(point[None, :])[0] @ scores.coefficients[i] for i, h in enumerate(hypotheses)]
        )  # (hypotheses, columns)
        member = wrss <= allowed[None, :]
        high = np.where(member, predictions, -np.inf).max(axis=0)
        low = np.where(member, predictions, np.inf).min(axis=0)
        middle = np.array([np.median(predictions[member[:, k], k]) for k in range(len(columns))])
        spread[columns] = (high - low) / np.maximum(np.abs(middle), 1e-300)
    return spread
