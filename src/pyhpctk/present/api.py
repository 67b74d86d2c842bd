"""pyview's Python API: open a database and get its tree, values and views as plain objects.

    >>> from pyhpctk.present import open_database
    >>> db = open_database("hpctoolkit-app-database")
    >>> db.metric_names
    ['CPUTIME (sec)']
    >>> arrays = db.arrays(["CPUTIME (sec)"])      # dict of numpy arrays, one row per context
    >>> view = db.view("bottom-up", depth=2)       # a View: nested ViewNode objects
    >>> rows = db.records(view)                     # list of plain dicts, ready for csv/json
    >>> frame = db.to_pandas(view)                  # only if pandas is installed

Everything returned is built from numpy arrays, dataclasses, lists and dicts: no pandas needed.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from pyhpctk.errors import UsageError
from pyhpctk.present import frames, imbalance, overlap, traces, waits, warps
from pyhpctk.present.elide import internal_frames
from pyhpctk.present.labels import context_label
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import Experiment
from pyhpctk.present.ranges import ranges_view
from pyhpctk.present.render import view_to_dict
from pyhpctk.present.source import open_experiment
from pyhpctk.present.viewmodel import HOT_PATH_SHARE, View, ViewOptions
from pyhpctk.present.views import build_view


class Database:
    """An opened database with its metric catalog (plain and derived metrics)."""

    def __init__(self, experiment: Experiment) -> None:
        self.experiment = experiment
        self.catalog = MetricCatalog(experiment)
        self._internal: np.ndarray[Any, np.dtype[np.bool_]] | None = None

    @property
    def metric_names(self) -> list[str]:
        return self.catalog.names

    def derive(self, definition: str) -> str:
        """Add a derived metric ``NAME = FORMULA``; returns its name."""
        return self.catalog.derive(definition)

    def _metrics(self, metrics: Sequence[str] | None) -> tuple[str, ...]:
        if metrics is None:
            return tuple(self.catalog.default_selection())
        return tuple(self.catalog.select(metrics))

    def arrays(self, metrics: Sequence[str] | None = None) -> dict[str, np.ndarray[Any, Any]]:
        """The calling context tree as columns, one row per context (row 0: the whole program).

        Keys: ``ctx_id``, ``parent`` (row index, -1 for row 0), ``depth``, ``label``, ``kind``,
        and ``"<metric> (I)"`` / ``"<metric> (E)"`` for each metric.
        """
        tree = self.experiment.tree
        labels = [context_label(tree, i) for i in range(tree.size)]
        out: dict[str, np.ndarray[Any, Any]] = {
            "ctx_id": tree.ctx_id.copy(),
            "parent": tree.parent.copy(),
            "depth": tree.depth(),
            "label": np.array([lab for lab, _ in labels], dtype=object),
            "kind": np.array([kind for _, kind in labels], dtype=object),
        }
        for name in self._metrics(metrics):
            out[f"{name} (I)"] = self.catalog.column(name, inclusive=True)
            out[f"{name} (E)"] = self.catalog.column(name, inclusive=False)
        return out

    def view(
        self,
        kind: str = "top-down",
        metrics: Sequence[str] | None = None,
        sort: str | None = None,
        depth: int | None = None,
        threshold: float = 0.0,
        show_zero: bool = False,
        exclusive: bool = False,
        show_internal: bool = False,
        hot_share: float = HOT_PATH_SHARE,
        ranges: bool = False,
    ) -> View:
        """Build a view (``top-down``, ``bottom-up`` or ``flat``).

        ``exclusive``: order rows by the sort metric's exclusive value. Interpreter frames (the
        import system, runpy) are left out, their cost kept in their callers
        (:mod:`pyhpctk.present.elide`), unless ``show_internal``. ``hot_share``: the share of
        its parent a child holds to be on the hot path. ``ranges``: the tree folded to the
        ranges ``pyrun --ranges`` measured (:mod:`pyhpctk.present.ranges`).
        """
        names = self._metrics(metrics)
        sort_name = self.catalog.resolve(sort) if sort else None
        if sort_name is not None and sort_name not in names:
            names = (sort_name, *names)
        try:
            options = ViewOptions(
                names,
                sort_name,
                depth,
                threshold,
                show_zero,
                sort_exclusive=exclusive,
                hot_share=hot_share,
            )
        except ValueError as error:
            raise UsageError(str(error)) from None
        if ranges:
            return ranges_view(kind, self.catalog, options)
        elided = None if show_internal else self.internal_frames()
        return build_view(kind, self.catalog, options, elided)

    def internal_frames(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Which contexts are interpreter frames (:func:`pyhpctk.present.elide.internal_frames`)."""
        if self._internal is None:
            self._internal = internal_frames(self.experiment.tree)
        return self._internal

    def tree_dict(self, view: View) -> dict[str, Any]:
        """A view as nested plain dicts (what ``--json`` writes)."""
        return view_to_dict(view)

    def records(self, view: View) -> list[dict[str, Any]]:
        """A view as a flat list of dicts (pre-order), with ``id``/``parent``/``depth`` keys."""
        rows: list[dict[str, Any]] = []
        stack = [(view.root, -1, 0)]
        while stack:
            node, parent, depth = stack.pop()
            me = len(rows)
            row: dict[str, Any] = {
                "id": me,
                "parent": parent,
                "depth": depth,
                "scope": node.label,
                "kind": node.kind,
                "ctx_id": node.ctx_id,
                "file": node.file,
                "line": node.line,
                "module": node.module,
            }
            for col, value in zip(view.columns, node.values, strict=True):
                row[col.label] = None if math.isnan(value) else float(value)
            rows.append(row)
            stack.extend((c, me, depth + 1) for c in reversed(node.children))
        return rows

    def to_pandas(self, view: View | None = None) -> Any:
        """A pandas DataFrame of a view's records (or of :meth:`arrays`); needs pandas."""
        try:
            pandas = importlib.import_module("pandas")
        except ImportError:
            raise UsageError("to_pandas() needs pandas: pip install pandas") from None
        if view is None:
            return pandas.DataFrame(self.arrays())
        return pandas.DataFrame(self.records(view))

    def profile_tables(
        self, metrics: Sequence[str] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every context of every profile (thread, rank, GPU stream) with its values, and the
        profiles' identifiers, as columns (:func:`pyhpctk.present.frames.profile_tables`)."""
        names = self._metrics(metrics)
        try:
            return frames.profile_tables(self.catalog, names)
        except ValueError as error:
            raise UsageError(str(error)) from None

    def to_thicket(self, metrics: Sequence[str] | None = None) -> tuple[Any, Any]:
        """(performance, metadata) pandas DataFrames in thicket's layout: the first indexed by
        ``(node, profile)`` with a column per metric, the second by ``profile``; every thread
        is there, where hatchet's reader sees only the main thread. Needs pandas."""
        try:
            pandas = importlib.import_module("pandas")
        except ImportError:
            raise UsageError("to_thicket() needs pandas: pip install pandas") from None
        performance, metadata = self.profile_tables(metrics)
        return (
            pandas.DataFrame(performance).set_index(["node", "profile"]),
            pandas.DataFrame(metadata).set_index("profile"),
        )

    def spread(self, ctx_id: int, metric: str, profiles: str = "all") -> imbalance.ContextSpread:
        """Per-thread values of a metric at one context, with min/mean/max/CV."""
        chosen = imbalance.select_profiles(self.experiment, profiles)
        return imbalance.spread(self.catalog, ctx_id, self.catalog.resolve(metric), True, chosen)

    def most_imbalanced(
        self, metric: str, count: int = 10, profiles: str = "all"
    ) -> list[imbalance.ContextSpread]:
        chosen = imbalance.select_profiles(self.experiment, profiles)
        return imbalance.most_imbalanced(
            self.catalog, self.catalog.resolve(metric), count, profiles=chosen
        )

    def trace_summary(self) -> list[traces.LineSummary]:
        return traces.summarize(self.experiment)

    def warp_summary(self) -> list[warps.KernelWarps]:
        """Traced kernels' warps: time per block and line, imbalance, the longest warp (#34)."""
        return warps.warp_summary(self.experiment)

    def perfetto(self) -> dict[str, Any]:
        return traces.to_perfetto(self.experiment)

    def gpu_idle_blame(self) -> traces.Blame:
        return traces.gpu_idle_blame(self.experiment)

    def overlap_report(self) -> list[overlap.RankShare]:
        """Per rank and GPU stream: compute, communication, both, copies, idle (issue #22)."""
        return overlap.overlap_report(self.experiment)

    def collective_waits(self) -> waits.Waits:
        """Which rank's work made the others wait in collectives (issue #22)."""
        return waits.collective_waits(self.experiment)


def open_database(path: str | os.PathLike[str]) -> Database:
    """Open a database directory lazily (memory maps)."""
    return Database(open_experiment(path))
