"""Comparing models with Extra-P's: its printed models read back, and out-of-sample error.

Extra-P prints a model in Python syntax (``extrap --print '{model:python}'``), e.g.
``1.37+6.69*log2(y)**(1)+0.0438*x**(3/2)*log2(x)**(2)*log2(y)**(1)``; :func:`parse_python_model`
reads that into a :class:`~pyhpctk.model.pmnf.Model` so that lead terms compare exactly, and
:func:`loo_smape` scores any hypothesis the same way for both tools: least squares on the means
(weighted as pymodel weighs the context: :func:`context_weights`), each point predicted from a
fit without it. It reads the experiment it compares; it never writes.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import numpy as np

from pyhpctk.model.analyze import AnalysisOptions, analyze
from pyhpctk.model.extrap_input import experiment_series, read_experiment
from pyhpctk.model.fit import Repetitions, auto_weightings, weights_of
from pyhpctk.model.pmnf import Factor, FloatArray, Hypothesis, Model, Term
from pyhpctk.model.series import Series

# Before each sign that starts a term: not an exponent's (1e-06, **(-1)), not a coefficient's
# own sign after the + that joins it (+-281.1).
_SPLIT = re.compile(r"(?<![eE(*+])(?=[-+])(?![^(]*\))")
_FACTOR = re.compile(
    r"(?:log2\((?P<lname>\w+)\)|(?P<name>[A-Za-z_]\w*))(?:\*\*\((?P<exp>[-\d./]+)\)|\*\*(?P<bare>[-\d./]+))?"
)


def parse_python_model(text: str, params: tuple[str, ...]) -> Model:
    """An Extra-P model printed in Python syntax, as a model of ``params``."""
    text = text.replace(" ", "")
    constant = 0.0
    terms: list[Term] = []
    coefficients: list[float] = []
    for piece in _SPLIT.split(text):
        piece = piece.removeprefix("+")
        if not piece:
            continue
        head, _, rest = piece.partition("*")
        try:
            coefficient = float(head)
        except ValueError:  # a coefficient of 1 is not printed: x**(2)
            coefficient = -1.0 if piece.startswith("-") else 1.0
            rest = piece.removeprefix("-")
        if not rest:
            constant += coefficient
            continue
        poly: dict[int, Fraction] = {}
        logs: dict[int, int] = {}
        for match in _FACTOR.finditer(rest):
            exponent = Fraction(match.group("exp") or match.group("bare") or "1")
            if match.group("lname"):
                index = params.index(match.group("lname"))
                logs[index] = logs.get(index, 0) + int(exponent)
            else:
                index = params.index(match.group("name"))
                poly[index] = poly.get(index, Fraction(0)) + exponent
        factors = tuple(
            Factor(i, poly.get(i, Fraction(0)), logs.get(i, 0))
            for i in sorted(set(poly) | set(logs))
        )
        terms.append(Term(factors))
        coefficients.append(coefficient)
    return Model(Hypothesis(tuple(terms)), (constant, *coefficients), params)


def loo_smape(
    hypothesis: Hypothesis, points: FloatArray, y: FloatArray, weights: FloatArray | None = None
) -> float:
    """Leave-one-out SMAPE (percent) of ``hypothesis`` fitted by least squares (weighted by
    ``weights``, else ordinary) to the values ``y`` at ``points`` (n_points, n_params): each
    point predicted from a fit without it."""
    design = hypothesis.design(np.asarray(points, dtype=np.float64))
    n = len(y)
    root = np.sqrt(np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64))
    errors = []
    for i in range(n):
        keep = np.arange(n) != i
        beta, *_ = np.linalg.lstsq(
            design[keep] * root[keep, None], y[keep] * root[keep], rcond=None
        )
        predicted = float(design[i] @ beta)
        total = abs(predicted) + abs(float(y[i]))
        errors.append(0.0 if total == 0 else 2 * abs(predicted - float(y[i])) / total)
    return 100.0 * float(np.mean(errors))


def context_weights(series: Series, column: int, weighting: str | None = None) -> FloatArray:
    """The least-squares weights pymodel fits context ``column`` of ``series`` with: its
    ``weighting`` (:attr:`~pyhpctk.model.analyze.ContextModel.weighting`; None: the one its runs'
    scatter calls for, :func:`~pyhpctk.model.fit.auto_weightings`) times the run counts.
    Comparing two hypotheses refitted with the same weights is comparing them, not their
    fitting."""
    y = series.mean[:, column : column + 1]
    if weighting is None:
        runs = Repetitions(series.repetitions, series.spread[:, column : column + 1])
        (weighting,) = auto_weightings(y, runs)
    return np.asarray(weights_of(y, weighting)[:, 0] * series.repetitions, dtype=np.float64)


def lead_factors(model: Model) -> tuple[tuple[Fraction, int], ...]:
    """The highest-order factor of every parameter among the model's terms."""
    best = [(Fraction(0), 0)] * len(model.params)
    for term, coefficient in zip(model.hypothesis.terms, model.coefficients[1:], strict=True):
        if coefficient:
            for factor in term.factors:
                best[factor.param] = max(best[factor.param], factor.growth())
    return tuple(best)


def compare_with_extrap(
    path: Path, name: str, extrap_models: dict[str, str]
) -> list[dict[str, object]]:
    """Per call path and metric of the Extra-P experiment ``path``: pymodel's model (as
    ``pymodel FILE`` makes it), and against Extra-P's (``extrap_models``, 'callpath@@metric' to
    its Python-syntax model): whether their lead factors agree, and each hypothesis's LOO SMAPE
    refitted alike. Rows carry ``file`` (``name``), ``key``, ``pymodel``, and where Extra-P
    modelled the key, ``extrap``, ``same_lead``, ``loo_pymodel`` and ``loo_extrap``."""
    experiment = read_experiment(path)
    rows = []
    for series in experiment_series(experiment, path.name):
        analysis = analyze(series, AnalysisOptions(threshold=0.0))
        for context in analysis.contexts:
            callpath = "->".join(context.path)
            key = f"{callpath}@@{series.metric}"
            column = series.paths.index(context.path)
            y = series.mean[:, column]
            segmentation = context.segmentation
            shown = context.model.render(4)
            if segmentation is not None:
                shown = segmentation.render(series.params[0])
            row: dict[str, object] = {"file": name, "key": key, "pymodel": shown}
            if key in extrap_models:
                theirs = parse_python_model(extrap_models[key], series.params)
                row["extrap"] = theirs.render(4)
                row["same_lead"] = lead_factors(theirs) == lead_factors(context.final)
                # Both hypotheses refitted alike: weighted as pymodel weighs this context (its
                # runs' scatter: auto_weightings, or its refit), the run counts included.
                weights = context_weights(series, column, context.weighting)
                ours = loo_smape(context.model.hypothesis, series.points, y, weights)
                if segmentation is not None:  # each segment refitted without the point
                    split = segmentation.split
                    ours = (
                        loo_smape(
                            segmentation.before.hypothesis,
                            series.points[:split],
                            y[:split],
                            weights[:split],
                        )
                        * split
                        + loo_smape(
                            segmentation.after.hypothesis,
                            series.points[split:],
                            y[split:],
                            weights[split:],
                        )
                        * (len(y) - split)
                    ) / len(y)
                row["loo_pymodel"] = ours
                row["loo_extrap"] = loo_smape(theirs.hypothesis, series.points, y, weights)
            rows.append(row)
    return rows
