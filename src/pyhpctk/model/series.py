"""A measurement series: the same program's databases at several parameter values.

Contexts are matched across databases by their calling-context paths (labels from the entry
point down), values are taken from each database's summary profile (the sum over threads and
ranks) for one metric and scope, and repetitions of one configuration are averaged with their
spread kept. Contexts missing from some runs count as zero there, and the series says so.
This module reads databases; it never writes.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import PyhpctkError, UsageError
from pyhpctk.formats import metadb, profiledb
from pyhpctk.formats.inspect import misplaced_input
from pyhpctk.formats.vocabulary import SCOPE_EXECUTION, SCOPE_LEX_AWARE, SCOPE_NAMES, Combine
from pyhpctk.model.pmnf import FloatArray

WHOLE_PROGRAM = "<whole program>"
SCOPES = SCOPE_NAMES
SCOPE_ALIASES = {"inclusive": SCOPE_EXECUTION.label, "exclusive": SCOPE_LEX_AWARE.label}
# How a configuration's repetitions become the one value modelled (Extra-P's measures).
MEASURES = ("mean", "median", "minimum", "maximum")


def aggregate(rows: FloatArray, measure: str) -> FloatArray:
    """One configuration's runs (runs x contexts) summarised by ``measure``, per context."""
    if measure == "median":
        return np.asarray(np.median(rows, axis=0), dtype=np.float64)
    if measure == "minimum":
        return np.asarray(rows.min(axis=0), dtype=np.float64)
    if measure == "maximum":
        return np.asarray(rows.max(axis=0), dtype=np.float64)
    if measure != "mean":
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}")
    return np.asarray(rows.mean(axis=0), dtype=np.float64)


class SeriesError(PyhpctkError):
    """The databases cannot form one series (different programs, unknown metric, ...)."""

    exit_code = 2


@dataclass(slots=True)
class Series:
    """Values of every context at every configuration.

    ``points`` (n_points, n_params) are the distinct configurations, ``mean`` / ``spread``
    (n_points, n_contexts) the ``measure`` (mean unless asked: median, minimum, maximum) and
    standard deviation over repetitions, ``repetitions``
    the per-configuration run counts; ``paths[c]`` labels context c from its entry point down.
    """

    params: tuple[str, ...]
    points: FloatArray
    mean: FloatArray
    spread: FloatArray
    repetitions: npt.NDArray[np.int64]
    paths: list[tuple[str, ...]]
    metric: str
    scope: str
    title: str
    raw: list[FloatArray] = field(default_factory=list)  # per point: (reps, n_contexts)
    labels: list[tuple[str, ...]] = field(default_factory=list)  # short display paths
    notes: list[str] = field(default_factory=list)
    measure: str = "mean"
    # Per point and context, where contexts were measured a different number of times (an
    # Extra-P experiment's call paths may be); None: every context ``repetitions`` times.
    run_counts: npt.NDArray[np.int64] | None = None


def check_design(series: Series) -> None:
    """Refuse a parameter with fewer than 3 distinct values; note one with fewer than 5."""
    for j, name in enumerate(series.params):
        distinct = len(np.unique(series.points[:, j]))
        if distinct < 3:
            raise SeriesError(
                f"parameter {name!r} has {distinct} distinct values: at least 3 are needed "
                "(5 recommended)"
            )
        if distinct < 5:
            series.notes.append(
                f"parameter {name!r} has only {distinct} distinct values: models are less "
                "reliable below 5"
            )


def parse_param(text: str, option: str = "--param") -> tuple[str, list[float]]:
    """``p=2,4,8`` → ("p", [2.0, 4.0, 8.0]); a UsageError naming the problem otherwise."""
    match = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*=\s*(.+)", text)
    if not match:
        raise UsageError(f"{option} {text!r}: expected NAME=V1,V2,... (e.g. p=2,4,8,16,32)")
    try:
        values = [float(v) for v in match.group(2).split(",")]
    except ValueError:
        raise UsageError(f"{option} {text!r}: values must be numbers separated by commas") from None
    if not all(0 < v < math.inf for v in values):  # also refuses nan
        raise UsageError(f"{option} {text!r}: parameter values must be positive and finite")
    return match.group(1), values


def read_param_csv(path: str | os.PathLike[str]) -> tuple[list[Path], dict[str, list[float]]]:
    """A CSV with a ``database`` column and one column per parameter (header row required)."""
    try:
        # utf-8-sig: spreadsheets save CSV with a byte-order mark before the header.
        with open(path, newline="", encoding="utf-8-sig") as stream:
            rows = list(csv.DictReader(stream))
    except OSError as error:
        raise UsageError(f"{path}: {error.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as error:
        raise UsageError(f"{path}: not a CSV text file ({error})") from None
    if not rows or "database" not in rows[0]:
        raise UsageError(f"{path}: needs a header with a 'database' column and parameter columns")
    names = [k for k in rows[0] if k != "database"]
    if not names:
        raise UsageError(f"{path}: no parameter columns besides 'database'")
    base = Path(path).parent
    databases = [base / row["database"] for row in rows]
    try:
        values = {n: [float(row[n]) for row in rows] for n in names}
    except (TypeError, ValueError):
        raise UsageError(f"{path}: every parameter cell must be a number") from None
    if not all(0 < v < math.inf for column in values.values() for v in column):
        raise UsageError(f"{path}: parameter values must be positive and finite")
    return databases, values


def params_from_titles(titles: Sequence[str], names: Sequence[str]) -> dict[str, list[float]]:
    """Read ``name=value`` / ``name<value>`` pairs from database titles (e.g. ``app.p16.n1024``)."""
    out: dict[str, list[float]] = {n: [] for n in names}
    for title in titles:
        for name in names:
            match = re.search(rf"(?:^|[^A-Za-z]){re.escape(name)}[=_.-]?(\d+(?:\.\d+)?)", title)
            if not match:
                raise UsageError(f"database title {title!r} names no value for parameter {name!r}")
            out[name].append(float(match.group(1)))
    return out


def _label(meta: metadb.MetaDB, node: metadb.Context) -> str:
    """A short label for one context, as a table shows it: ``solve``, ``loop at a.py:12``,
    ``a.py:14``, ``libm.so+0x1a2b``."""
    where = ""
    if node.file is not None:
        where = f"{os.path.basename(meta.files[node.file].path)}:{node.line}"
    if node.lexical_type == metadb.LexicalType.FUNCTION:
        function = meta.functions[node.function] if node.function is not None else None
        return (function.name if function and function.name else None) or "<unknown function>"
    if node.lexical_type == metadb.LexicalType.LOOP:
        return f"loop at {where}"
    if node.lexical_type == metadb.LexicalType.LINE:
        return where
    module = os.path.basename(meta.modules[node.module].path) if node.module is not None else "?"
    return f"{module}+{node.offset:#x}"


def _context_paths(
    meta: metadb.MetaDB,
) -> tuple[npt.NDArray[np.uint32], list[tuple[str, ...]], list[tuple[str, ...]]]:
    """ctxIds, their identifying paths (full descriptions) and their display paths."""
    index = meta.index()
    keys: list[tuple[str, ...]] = []
    labels: list[tuple[str, ...]] = []
    for row, node in enumerate(index.nodes):
        if isinstance(node, metadb.Entry):
            key = label = node.pretty_name
        else:
            key, label = metadb.describe(meta, node), _label(meta, node)
        parent = int(index.parent_row[row])
        keys.append((*keys[parent], key) if parent >= 0 else (key,))
        labels.append((*labels[parent], label) if parent >= 0 else (label,))
    # ctxId 0, the implicit global context, carries the whole program's values (§3.7).
    ids = np.concatenate([[0], np.asarray(index.table["ctx_id"], dtype=np.uint32)])
    return ids.astype(np.uint32), [(WHOLE_PROGRAM,), *keys], [(WHOLE_PROGRAM,), *labels]


def _stat_metric_id(
    meta: metadb.MetaDB, metric: str | None, scope: str, where: Path
) -> tuple[int, str]:
    if not meta.metrics:
        raise SeriesError(f"{where}: the database has no metrics")
    chosen = meta.metrics[0] if metric is None else None
    if metric is not None:
        exact = [m for m in meta.metrics if m.name == metric]
        loose = [m for m in meta.metrics if m.name.lower().startswith(metric.lower())]
        candidates = exact or loose
        if len(candidates) != 1:
            names = ", ".join(m.name for m in meta.metrics)
            what = "no metric" if not candidates else "several metrics"
            raise SeriesError(f"{where}: {what} named {metric!r}; metrics are: {names}")
        chosen = candidates[0]
    assert chosen is not None
    scope_index = (
        [s.name for s in meta.scopes].index(scope) if scope in [s.name for s in meta.scopes] else -1
    )
    for summary in chosen.summaries:
        if (
            summary.scope == scope_index
            and summary.formula == "$$"
            and summary.combine == Combine.SUM
        ):
            return summary.stat_metric_id, chosen.name
    raise SeriesError(f"{where}: metric {chosen.name!r} has no sum over the {scope!r} scope")


def load_series(
    databases: Sequence[str | os.PathLike[str]],
    params: dict[str, list[float]],
    metric: str | None = None,
    scope: str = "execution",
    allow_mixed: bool = False,
    measure: str = "mean",
) -> Series:
    """Read a series of databases and the parameter values of each (one value per database)."""
    scope = SCOPE_ALIASES.get(scope, scope)
    if scope not in SCOPES:
        raise UsageError(
            f"unknown scope {scope!r}: choose from {', '.join(SCOPES)}, inclusive, exclusive"
        )
    names = tuple(params)
    if not names:
        raise UsageError("give at least one parameter (--param p=2,4,8,16,32)")
    for name, values in params.items():
        if len(values) != len(databases):
            raise UsageError(
                f"parameter {name!r} has {len(values)} values for {len(databases)} databases"
            )
    notes: list[str] = []
    per_db: list[dict[tuple[str, ...], float]] = []
    display: dict[tuple[str, ...], tuple[str, ...]] = {}
    titles: list[str] = []
    metric_name = ""
    for path in map(Path, databases):
        if not (path / "meta.db").is_file() or not (path / "profile.db").is_file():
            advice = misplaced_input(path)
            if advice is None or advice.startswith("this is a database"):
                raise SeriesError(f"{path}: not a database (needs meta.db and profile.db)")
            raise SeriesError(f"{path}: not a database: {advice}")
        meta = metadb.read(path / "meta.db")
        profiles = profiledb.read(path / "profile.db")
        stat_id, metric_name = _stat_metric_id(meta, metric, scope, path)
        summary = np.flatnonzero(profiles.is_summary()).tolist()
        if not summary:
            raise SeriesError(f"{path}: profile.db has no summary profile")
        block = profiles.block(summary[0])
        ctx_ids, paths, shown = _context_paths(meta)
        display.update(zip(paths, shown, strict=True))
        chosen = block.values["metric_id"] == stat_id
        ids = block.value_ctx_ids()[chosen]  # ascending: contexts ascend in a block (§3.3)
        found = np.asarray(block.values["value"][chosen], dtype=np.float64)
        ctx_values = np.zeros(len(ctx_ids))
        if len(ids):
            pos = np.minimum(np.searchsorted(ids, ctx_ids), len(ids) - 1)
            ctx_values = np.where(ids[pos] == ctx_ids, found[pos], 0.0)
        mapping: dict[tuple[str, ...], float] = {}
        for p, v in zip(paths, ctx_values.tolist(), strict=True):
            mapping[p] = mapping.get(p, 0.0) + v
        per_db.append(mapping)
        titles.append(meta.title)
    if len(set(titles)) > 1 and not allow_mixed:
        raise SeriesError(
            "the databases come from different programs ("
            + ", ".join(sorted(set(titles)))
            + "); pass --allow-mixed to model them anyway"
        )
    all_paths = sorted(set().union(*per_db))
    matrix = np.array([[m.get(p, 0.0) for p in all_paths] for m in per_db])
    missing = sum(1 for p in all_paths if any(p not in m for m in per_db))
    if missing:
        notes.append(
            f"{missing} of {len(all_paths)} contexts are missing from some databases: "
            "counted as zero there"
        )
    coords = np.array([[params[n][i] for n in names] for i in range(len(databases))])
    points, inverse = np.unique(coords, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    reps = np.bincount(inverse, minlength=len(points)).astype(np.int64)
    mean = np.zeros((len(points), len(all_paths)))
    spread = np.zeros_like(mean)
    raw: list[FloatArray] = []
    for k in range(len(points)):
        rows = matrix[inverse == k]
        raw.append(rows)
        mean[k] = aggregate(rows, measure)
        spread[k] = rows.std(axis=0)
    series = Series(
        names,
        points,
        mean,
        spread,
        reps,
        [tuple(p) for p in all_paths],
        metric_name,
        scope,
        titles[0] if titles else "",
        raw,
        [display[p] for p in all_paths],
        notes,
        measure,
    )
    check_design(series)
    return series
