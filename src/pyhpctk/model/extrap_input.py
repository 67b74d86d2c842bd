"""Extra-P's experiment inputs: its text, JSON and JSON Lines formats, read into series.

An Extra-P experiment holds, per call path and metric, the repetitions measured at each point
(a coordinate: one value per parameter). The three formats (Extra-P's documentation,
"File formats"; read, not copied, from Extra-P 4.2.5's readers):

- **text**: ``PARAMETER name`` lines, ``POINTS ( v1 v2 ) ( ... )`` lines (or ``POINTS v1 v2 ...``
  for one parameter), then ``REGION callpath`` and ``METRIC name`` lines each followed by one
  ``DATA r1 r2 ...`` line per point, in the order the points were listed; ``#`` starts a comment.
- **JSON**: either ``{"parameters": [names], "measurements": {callpath: {metric: [{"point":
  [...], "values": [...]}]}}}`` or the older form with numbered ``parameters``, ``callpaths``,
  ``metrics``, ``coordinates`` and one ``measurements`` entry per repetition.
- **JSON Lines**: one ``{"params": {name: value}, "callpath": ..., "metric": ..., "value": v or
  [v, ...]}`` per line (callpath and metric optional).

:func:`read_experiment` reads any of them (by content, not by name) into an
:class:`ExtrapExperiment`;
:func:`experiment_series` makes the :class:`~pyhpctk.model.series.Series` that pymodel models,
one per metric (and per set of points, where call paths were measured at different points).
This module reads files; it never writes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pyhpctk.model.series import MEASURES, Series, SeriesError, aggregate

CALLPATH_SEPARATOR = "->"
DEFAULT_CALLPATH = "<root>"
DEFAULT_METRIC = "<default>"

Point = tuple[float, ...]


@dataclass(slots=True)
class ExtrapExperiment:
    """Measurements of an Extra-P experiment: ``data[(callpath, metric)][point]`` holds every
    repetition at that point, in the order read; callpaths and metrics keep their file order."""

    params: tuple[str, ...]
    data: dict[tuple[str, str], dict[Point, list[float]]] = field(default_factory=dict)
    callpaths: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)

    def add(self, callpath: str, metric: str, point: Point, values: Iterable[float]) -> None:
        if callpath not in self.callpaths:
            self.callpaths.append(callpath)
        if metric not in self.metrics:
            self.metrics.append(metric)
        self.data.setdefault((callpath, metric), {}).setdefault(point, []).extend(values)


class ExtrapInputError(SeriesError):
    """A file that is not a readable Extra-P experiment (the message says where and why)."""


def read_experiment(path: str | os.PathLike[str]) -> ExtrapExperiment:
    """Read an Extra-P text, JSON or JSON Lines experiment, whichever ``path`` holds."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8-sig")
    except OSError as error:
        raise ExtrapInputError(f"{where}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        message = f"{where}: not a text file (Extra-P's CUBE files are not read)"
        raise ExtrapInputError(message) from None
    stripped = text.lstrip()
    if not stripped:
        raise ExtrapInputError(f"{where}: the file is empty")
    try:
        if stripped.startswith("{"):
            try:
                document = json.loads(text)
            except json.JSONDecodeError:
                experiment = _read_jsonlines(text, where)
            else:
                experiment = _read_json(document, where)
        else:
            experiment = _read_text(text, where)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise ExtrapInputError(f"{where}: not an Extra-P experiment ({_reason(error)})") from None
    _validate(experiment, where)
    return experiment


def _reason(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"missing {error.args[0]!r}"
    return str(error)


def _number(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a number")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def _read_text(text: str, where: Path) -> ExtrapExperiment:
    params: list[str] = []
    points: list[Point] = []
    experiment = ExtrapExperiment(())
    callpath, metric = DEFAULT_CALLPATH, DEFAULT_METRIC
    next_point = 0
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        keyword, rest = fields[0], fields[1:]
        if keyword == "PARAMETER":
            if points:
                raise ValueError(f"line {number}: PARAMETER after POINTS")
            params.extend(rest)
            experiment.params = tuple(params)
        elif keyword == "POINTS":
            points.extend(_text_points(" ".join(rest), len(params), number))
        elif keyword in ("REGION", "METRIC"):
            if not rest:
                raise ValueError(f"line {number}: {keyword} needs a name")
            if keyword == "REGION":
                callpath = " ".join(rest)
            else:
                metric = " ".join(rest)
            next_point = 0
        elif keyword == "DATA":
            if next_point >= len(points):
                raise ValueError(
                    f"line {number}: more DATA lines than the {len(points)} POINTS listed"
                )
            experiment.add(callpath, metric, points[next_point], [_number(v) for v in rest])
            next_point += 1
        else:
            raise ValueError(f"line {number}: unknown field {keyword!r}")
    return experiment


def _text_points(text: str, n_params: int, number: int) -> list[Point]:
    if n_params == 0:
        raise ValueError(f"line {number}: POINTS before any PARAMETER")
    if "(" not in text:
        if n_params != 1:
            raise ValueError(f"line {number}: points of {n_params} parameters need ( ... )")
        return [(_number(v),) for v in text.split()]
    out = []
    for group in text.replace(")", "(").split("(")[1::2]:
        values = tuple(_number(v) for v in group.split())
        if len(values) != n_params:
            raise ValueError(f"line {number}: a point of {len(values)} values, not {n_params}")
        out.append(values)
    return out


def _read_json(document: Any, where: Path) -> ExtrapExperiment:
    if not isinstance(document, dict):
        raise ValueError("a JSON object was expected")
    if "callpaths" in document:
        return _read_json_numbered(document)
    params = tuple(str(p) for p in document["parameters"])
    experiment = ExtrapExperiment(params)
    for callpath, by_metric in document["measurements"].items():
        for metric, entries in by_metric.items():
            for entry in entries:
                point = entry["point"]
                coordinates = point if isinstance(point, list) else [point]
                values = entry["values"]
                values = values if isinstance(values, list) else [values]
                experiment.add(
                    str(callpath),
                    str(metric),
                    _point(coordinates, len(params)),
                    [_number(v) for v in values],
                )
    return experiment


def _point(coordinates: list[Any], n_params: int) -> Point:
    if len(coordinates) != n_params:
        raise ValueError(f"a point of {len(coordinates)} values for {n_params} parameters")
    return tuple(_number(v) for v in coordinates)


def _by_id(entries: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(e["id"]): e for e in entries}


def _read_json_numbered(document: dict[str, Any]) -> ExtrapExperiment:
    """The older JSON form: numbered parameters, callpaths, metrics and coordinates."""
    parameters = sorted(_by_id(document["parameters"]).items())
    experiment = ExtrapExperiment(tuple(str(p["name"]) for _, p in parameters))
    position = {pid: i for i, (pid, _) in enumerate(parameters)}
    callpaths = {k: str(v["name"]) for k, v in _by_id(document["callpaths"]).items()}
    metrics = {k: str(v["name"]) for k, v in _by_id(document["metrics"]).items()}
    coordinates: dict[int, Point] = {}
    for cid, entry in sorted(_by_id(document["coordinates"]).items()):
        values = [0.0] * len(parameters)
        for pair in entry["parameter_value_pairs"]:
            values[position[int(pair["parameter_id"])]] = _number(pair["parameter_value"])
        coordinates[cid] = tuple(values)
    for name in callpaths.values():  # keep the file's order of call paths and metrics
        experiment.callpaths.append(name)
    experiment.metrics.extend(metrics.values())
    for entry in document["measurements"]:
        experiment.add(
            callpaths[int(entry["callpath_id"])],
            metrics[int(entry["metric_id"])],
            coordinates[int(entry["coordinate_id"])],
            [_number(entry["value"])],
        )
    return experiment


def _read_jsonlines(text: str, where: Path) -> ExtrapExperiment:
    experiment: ExtrapExperiment | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"line {number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"line {number}: a JSON object was expected")
        params = record["params"]
        if experiment is None:
            experiment = ExtrapExperiment(tuple(str(p) for p in params))
        if set(params) != set(experiment.params):
            raise ValueError(f"line {number}: parameters {sorted(params)} differ from line 1's")
        value = record["value"]
        values = value if isinstance(value, list) else [value]
        experiment.add(
            str(record.get("callpath", DEFAULT_CALLPATH)),
            str(record.get("metric", DEFAULT_METRIC)),
            tuple(_number(params[p]) for p in experiment.params),
            [_number(v) for v in values],
        )
    if experiment is None:
        raise ValueError("no measurements")
    return experiment


def _validate(experiment: ExtrapExperiment, where: Path) -> None:
    if not experiment.params:
        raise ExtrapInputError(f"{where}: the experiment names no parameters")
    if not experiment.data:
        raise ExtrapInputError(f"{where}: the experiment holds no measurements")
    for (callpath, metric), points in experiment.data.items():
        for point, values in points.items():
            if not values:
                raise ExtrapInputError(
                    f"{where}: {callpath} / {metric} has no values at {_show(experiment, point)}"
                )
            if min(point) <= 0:
                raise ExtrapInputError(
                    f"{where}: parameter values must be positive (models take powers and "
                    f"logarithms of them): {_show(experiment, point)}"
                )


def _show(experiment: ExtrapExperiment, point: Point) -> str:
    return ", ".join(f"{n}={v:g}" for n, v in zip(experiment.params, point, strict=True))


def experiment_series(
    experiment: ExtrapExperiment,
    title: str,
    metric: str | None = None,
    measure: str = "mean",
) -> list[Series]:
    """The series pymodel models: per metric (all, or the one named), the call paths measured
    at the same points with as many repetitions each, values summarised by ``measure``."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}")
    metrics = experiment.metrics
    if metric is not None:
        exact = [m for m in metrics if m == metric]
        loose = [m for m in metrics if m.lower().startswith(metric.lower())]
        if len(exact or loose) != 1:
            what = "no metric" if not (exact or loose) else "several metrics"
            known = ", ".join(metrics)
            raise SeriesError(f"{title}: {what} named {metric!r}; metrics are: {known}")
        metrics = exact or loose
    out = []
    for name in metrics:
        groups: dict[tuple[Point, ...], list[str]] = {}
        for callpath in experiment.callpaths:
            points = experiment.data.get((callpath, name))
            if points:
                groups.setdefault(tuple(sorted(points)), []).append(callpath)
        for key, callpaths in groups.items():
            out.append(_series(experiment, title, name, key, callpaths, measure, len(groups)))
    return out


def _series(
    experiment: ExtrapExperiment,
    title: str,
    metric: str,
    key: tuple[Point, ...],
    callpaths: list[str],
    measure: str,
    n_groups: int,
) -> Series:
    points = np.array(key, dtype=np.float64)
    runs = [[np.array(experiment.data[(c, metric)][p]) for c in callpaths] for p in key]
    counts = np.array([[len(r) for r in row] for row in runs], dtype=np.int64)
    value = np.array([[aggregate(r[:, None], measure)[0] for r in row] for row in runs])
    spread = np.array([[r.std() for r in row] for row in runs])
    even = bool((counts == counts[:, :1]).all())
    raw = [np.stack(row, axis=1) for row in runs] if even else []
    paths = [tuple(c.split(CALLPATH_SEPARATOR)) for c in callpaths]
    notes = []
    if n_groups > 1:
        notes.append(
            f"metric {metric!r}: call paths measured at different points are modelled apart; "
            f"this table holds the {len(callpaths)} measured at these {len(points)} points"
        )
    return Series(
        experiment.params,
        points,
        value,
        spread,
        counts.max(axis=1),
        paths,
        metric,
        "",
        title,
        raw,
        list(paths),
        notes,
        measure,
        None if even else counts,
    )
