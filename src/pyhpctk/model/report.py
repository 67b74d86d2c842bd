"""Write an analysis: the ranked table, JSON, Extra-P's JSON Lines input, plots.

The Extra-P export holds the measurements themselves (every repetition), one JSON object per
line: ``{"params": {...}, "callpath": "a->b", "metric": "...", "value": [...]}``, which Extra-P
reads as its JSON Lines format, so the same data can be modeled there for comparison.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

from pyhpctk.model.advise import Advice
from pyhpctk.model.analyze import ContextModel, ScalingAnalysis
from pyhpctk.model.pmnf import FloatArray, Model
from pyhpctk.model.series import Series

CALLPATH_SEPARATOR = "->"


def _short(path: tuple[str, ...], width: int) -> str:
    """The last steps of a context's display path that fit in ``width`` characters."""
    text = path[-1]
    for step in reversed(path[:-1]):
        longer = f"{step} > {text}"
        if len(longer) > width:
            break
        text = longer
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def write_table(analysis: ScalingAnalysis, out: TextIO, top: int = 20, width: int = 60) -> None:
    """The ranked table: worst asymptotic behaviour first."""
    series = analysis.series
    target = ", ".join(f"{n}={v:g}" for n, v in zip(series.params, analysis.target, strict=True))
    what = series.metric + (f" ({series.scope})" if series.scope else "")
    if series.measure != "mean":
        what += f", {series.measure} of the repetitions"
    out.write(
        f"{series.title}: {what}, {len(series.points)} configurations, "
        f"{series.mean.shape[1]} contexts\n"
    )
    for note in [*series.notes, *analysis.notes]:
        out.write(f"note: {note}\n")
    if analysis.dropped:
        out.write(f"note: {analysis.dropped} contexts below the threshold are not modeled\n")
    has_expect = any(c.expectation for c in analysis.contexts)
    header = f"{'#':>3}  {'context':<{width}}  {'model':<40} {'SMAPE%':>7} {'adjR2':>6}"
    header += f" {'at ' + target:>16}" + ("  expectation" if has_expect else "")
    out.write(header + "\n")
    for rank, context in enumerate(analysis.contexts[:top], 1):
        text, error = context.model.render(4), context.cv_smape
        r2 = f"{context.adjusted_r2:>6.3f}"
        if context.segmentation is not None:  # piecewise: in-sample error (segments are short)
            text, error = context.segmentation.render(series.params[0]), context.smape
            r2 = f"{'-':>6}"
        line = (
            f"{rank:>3}  {_short(context.label, width):<{width}}  {text:<40}"
            f" {error:>7.2f} {r2} {context.predicted:>16.4g}"
        )
        if has_expect:
            line += f"  {context.expectation}"
        out.write(line + "\n")
    if len(analysis.contexts) > top:
        out.write(f"... {len(analysis.contexts) - top} more (use --top)\n")


def write_advice(series: Series, advice: Sequence[Advice], out: TextIO) -> None:
    """The next measurements to take, best first (``pymodel --advise``)."""
    if not advice:
        out.write("advice: no parameter has a line of 3 values to extend\n")
        return
    if advice[0].spread < 1e-6:
        out.write("advice: the runs leave one model per context: no measurement would change it\n")
        return
    out.write("advice: measure next where the models the runs cannot yet reject differ most\n")
    for rank, item in enumerate(advice, 1):
        where = ", ".join(f"{n}={v:g}" for n, v in zip(series.params, item.point, strict=True))
        contexts = "; ".join(_short(c, 40) for c in item.contexts)
        out.write(
            f"{rank:>3}  {where:<24} {item.kind:<24} models differ by {item.spread:.1%} "
            f"(most: {contexts})\n"
        )


def model_json(model: Model, params: Sequence[str]) -> dict[str, object]:
    """A model as data: its text, constant and terms (coefficient, factors with parameter,
    polynomial exponent as a fraction string such as ``"3/2"``, logarithm exponent)."""
    terms = []
    for term, coefficient in zip(model.hypothesis.terms, model.coefficients[1:], strict=True):
        terms.append(
            {
                "coefficient": coefficient,
                "factors": [
                    {"param": params[f.param], "poly": str(f.poly), "log": f.log}
                    for f in term.factors
                ],
            }
        )
    return {"model": model.render(), "constant": model.coefficients[0], "terms": terms}


def context_json(
    context: ContextModel, params: Sequence[str], analysis_points: FloatArray
) -> dict[str, object]:
    """One context: its model of all points as data (:func:`model_json`), fit figures,
    prediction, lead order (of the last segment where the model is piecewise), and the
    ``piecewise`` model where behaviour changes."""
    out: dict[str, object] = {
        "path": list(context.path),
        "labels": list(context.label),
        **model_json(context.model, params),
        "smape": context.smape,
        "cv_smape": context.cv_smape,
        "adjusted_r2": context.adjusted_r2,
        "measured_at_largest": context.measured,
        "predicted_at_target": context.predicted,
        "lead_order": {"poly": str(context.growth[0]), "log": context.growth[1]},
    }
    if context.expectation is not None:
        out["expectation"] = context.expectation
    segmentation = context.segmentation
    if segmentation is not None:
        points = analysis_points[:, 0]
        out["piecewise"] = {
            "start": segmentation.start,
            "smape": segmentation.smape,
            "segments": [
                {
                    "from": float(points[0]),
                    "to": float(points[segmentation.split - 1]),
                    **model_json(segmentation.before, params),
                },
                {
                    "from": segmentation.start,
                    "to": float(points[-1]),
                    **model_json(segmentation.after, params),
                },
            ],
        }
    return out


def analysis_json(analysis: ScalingAnalysis) -> dict[str, object]:
    series = analysis.series
    return {
        "title": series.title,
        "metric": series.metric,
        "scope": series.scope,
        "measure": series.measure,
        "parameters": list(series.params),
        "points": series.points.tolist(),
        "repetitions": series.repetitions.tolist(),
        "target": list(analysis.target),
        "notes": [*series.notes, *analysis.notes],
        "contexts": [context_json(c, series.params, series.points) for c in analysis.contexts],
    }


JSON_FORMAT = "pymodel-models"
JSON_VERSION = 2


def write_json(analyses: Sequence[ScalingAnalysis], out: TextIO) -> None:
    """Every analysis (one per metric of an Extra-P experiment, one for a database series) in
    one document: ``{"format": "pymodel-models", "version": 2, "analyses": [...]}``."""
    document = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "analyses": [analysis_json(a) for a in analyses],
    }
    json.dump(document, out, indent=1)
    out.write("\n")


def write_extrap_jsonl(series: Series, out: TextIO) -> int:
    """Every measurement in Extra-P's JSON Lines input format; returns the lines written.

    Call paths are the contexts' short labels joined by ``->``; where two contexts would share
    one, the later ones get ``#2``, ``#3``... so Extra-P keeps them apart.
    """
    names: list[str] = []
    taken: dict[str, int] = {}
    for path in series.labels or series.paths:
        name = CALLPATH_SEPARATOR.join(p.replace(CALLPATH_SEPARATOR, "→") for p in path)
        taken[name] = taken.get(name, 0) + 1
        names.append(name if taken[name] == 1 else f"{name}#{taken[name]}")
    lines = 0
    for k, point in enumerate(series.points):
        params = {n: float(v) for n, v in zip(series.params, point, strict=True)}
        repetitions = series.raw[k] if series.raw else series.mean[k : k + 1]
        for c, name in enumerate(names):
            record = {
                "params": params,
                "callpath": name,
                "metric": series.metric,
                "value": [float(v) for v in repetitions[:, c]],
            }
            out.write(json.dumps(record) + "\n")
            lines += 1
    return lines
