"""Models of several parameters: Extra-P's heuristic of lines, then combinations.

For each parameter the measurements are grouped into lines along which only that parameter
varies, the single-parameter terms that fit those lines best are shortlisted, and every additive
and multiplicative arrangement of the shortlisted terms is fitted to all points and chosen as for
one parameter (:mod:`.fit`). This module does no I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from pyhpctk.model.fit import (
    FitOptions,
    FitResult,
    Repetitions,
    choose_models,
    count_weights,
    fit_results,
    fit_single_parameter,
    groups_by_weighting,
    repetitions_of_columns,
    score_hypotheses,
    single_parameter_hypotheses,
    values_matrix,
)
from pyhpctk.model.pmnf import Factor, FloatArray, Hypothesis, Model, Term


def fit_multi_parameter(
    points: FloatArray,
    y: FloatArray,
    names: tuple[str, ...],
    options: FitOptions | None = None,
    repetitions: Repetitions | None = None,
) -> FitResult:
    """Model each column of ``y`` as a function of several parameters (Extra-P's heuristic).

    ``points`` is (n_points, n_params). For each parameter, the measurements are grouped into
    lines along which only that parameter varies; the best single-term model of each line is found
    and the lead term most lines agree on is that parameter's term. The terms of all parameters
    are then combined additively and multiplicatively (every way of grouping them into products),
    each combination is fitted to all points, and the best is chosen as for one parameter.
    """
    options = options or FitOptions()
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != len(names):
        raise ValueError("points must be (n_points, n_params) with one name per parameter")
    y = values_matrix(y, points.shape[0])
    if options.weighting == "auto":
        return groups_by_weighting(
            y,
            options,
            repetitions,
            lambda yy, oo, rr: fit_multi_parameter(points, yy, names, oo, rr),
        )
    if len(names) == 1:
        return fit_single_parameter(points[:, 0], y, options, names[0], repetitions)
    counts = count_weights(repetitions, points.shape[0])
    found = [_parameter_terms(points, y, p, options, counts) for p in range(len(names))]
    # A parameter the design cannot identify contributes no factor (design_notes says so).
    per_param = [f for f in found if f is not None]
    n_contexts = y.shape[1]
    # Contexts with the same candidate factors share one hypothesis set: fit them together.
    groups: dict[tuple[tuple[Factor, ...], ...], list[int]] = {}
    for c in range(n_contexts):
        key = tuple(tuple(factors[c]) for factors in per_param)
        groups.setdefault(key, []).append(c)
    models: list[Model | None] = [None] * n_contexts
    figures = np.zeros((4, n_contexts))
    for key, members in groups.items():
        shapes: set[Hypothesis] = set()
        for choice in itertools.product(*key):
            shapes.update(_combinations(list(choice)))
        hypotheses = sorted(shapes, key=lambda h: h.complexity)
        columns = np.asarray(members)
        scores = score_hypotheses(points, y[:, columns], hypotheses, options, counts=counts)
        chosen = choose_models(
            scores, options, y[:, columns], repetitions_of_columns(repetitions, columns)
        )
        part = fit_results(points, y[:, columns], scores, chosen, names)
        for position, c in enumerate(members):
            models[c] = part.models[position]
        figures[:, columns] = np.stack([part.smape, part.cv_smape, part.adjusted_r2, part.rss])
    smape, cv_smape, adjusted_r2, rss = figures
    fitted = [m for m in models if m is not None]
    return FitResult(fitted, smape, cv_smape, adjusted_r2, rss, design_notes(points, names))


# The fewest values of a parameter along a line (the others fixed) that tell its factors apart:
# a constant and one term leave one degree of freedom at three values.
MIN_LINE_VALUES = 3


def design_lines(
    points: FloatArray, param: int, least: int = MIN_LINE_VALUES
) -> list[npt.NDArray[np.intp]]:
    """The rows of every line along which only ``param`` varies, with ``least`` or more distinct
    values of it (a full grid has one per combination of the others; a cross, one)."""
    others = np.delete(points, param, axis=1)
    keys, line_of = np.unique(others, axis=0, return_inverse=True)
    line_of = line_of.reshape(-1)
    out = []
    for line in range(len(keys)):
        rows = np.flatnonzero(line_of == line)
        if len(np.unique(points[rows, param])) >= least:
            out.append(rows)
    return out


def design_notes(points: FloatArray, names: tuple[str, ...]) -> list[str]:
    """What the measurement design cannot tell: per parameter without a line of
    ``MIN_LINE_VALUES`` values, that its term is left out; with lines of exactly that many, that
    its term rests on them."""
    notes = []
    for param, name in enumerate(names):
        lines = design_lines(points, param)
        if not lines:
            notes.append(
                f"parameter {name!r}: no {MIN_LINE_VALUES} measurements differ in {name} alone "
                f"(the others fixed), so its term cannot be identified: models leave {name} out; "
                f"measure a line of {name} to model it"
            )
        elif (
            max(len(np.unique(points[rows, param])) for rows in lines) < 5
            and len(np.unique(points[:, param])) >= 5  # else check_design has said so
        ):
            notes.append(
                f"parameter {name!r}: its term rests on lines of fewer than 5 values of {name} "
                "with the others fixed: less reliable"
            )
    return notes


def _parameter_terms(
    points: FloatArray,
    y: FloatArray,
    param: int,
    options: FitOptions,
    counts: FloatArray,
    keep: int = 3,
) -> list[list[Factor]] | None:
    """Per context, the ``keep`` best factors of parameter ``param`` over the grid's lines
    (None where no line has enough values of the parameter to tell one factor from another).

    Every single-term hypothesis of the parameter is scored on every line (the points where only
    this parameter varies), each line with its own coefficients: a product ``c0 + c·g(p)·h(n)``
    and a sum ``c0 + a·g(p) + b·h(n)`` both reduce to ``c0' + c'·g(p)`` along a line of fixed n.
    With ``f-test`` selection a hypothesis's score is its weighted residual summed over lines,
    the least-squares fit of all lines at once; with ``cv-smape`` its CV-SMAPE summed over lines,
    each line weighted by its share of the context's total value. The constant is a candidate too
    (an empty list entry is never returned: a context whose best is the constant gets its best
    non-constant factors after it). Least squares uses lines of ``MIN_LINE_VALUES`` (3) values
    or more, as Extra-P does on small designs; CV-SMAPE needs 4 to leave one out.
    """
    least_squares = options.selection != "cv-smape"
    lines = design_lines(points, param, MIN_LINE_VALUES if least_squares else 4)
    if not lines:
        return None
    single_options = replace(options, max_terms=1, refine=False)
    hypotheses = single_parameter_hypotheses(param, single_options)
    n_contexts = y.shape[1]
    total = np.zeros((len(hypotheses), n_contexts))
    magnitude = np.abs(y).sum(axis=0) + 1e-300
    if least_squares:
        # Lines only shortlist factors: a line where this parameter's term is buried under the
        # others may fit it with a negative slope, and that must not veto the factor everywhere.
        single_options = replace(single_options, allow_negative=True)
    for rows in lines:
        if least_squares:
            scores = score_hypotheses(
                points[rows], y[rows], hypotheses, single_options, False, counts[rows]
            )
            total += np.where(np.isfinite(scores.wrss), scores.wrss, 1e300)
            continue
        scores = score_hypotheses(points[rows], y[rows], hypotheses, single_options)
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
