"""What a view is: its rows (:class:`ViewNode`), columns and options, shared by every view.

The views (:mod:`pyhpctk.present.views`) build a :class:`View`; the renderers (text, CSV, JSON,
HTML) print it. Data only: nothing here reads a database or formats text for a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import FloatArray

BoolArray = npt.NDArray[np.bool_]

Key = tuple[Any, ...]  # what groups contexts in the aggregating views
Row = tuple[str, str, str | None, int, str | None]  # label, kind, file, line, module

HOT_PATH_SHARE = 0.5  # hpcviewer's hot-path threshold: a child holding >= 50% of its parent


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One value column: a metric's inclusive (I) or exclusive (E) side."""

    metric: str
    inclusive: bool
    format: str | None = None  # printf-style display format from the taxonomy
    percent: bool = True  # show a share of the total (not for ratios such as utilisation)

    @property
    def label(self) -> str:
        return f"{self.metric} ({'I' if self.inclusive else 'E'})"


@dataclass(slots=True, eq=False)
class ViewNode:
    """One row of a view: what it is, where it is in the code, and its values.

    Compared by identity and shown without its subtree: views can be far deeper than Python's
    recursion limit, so nothing here may recurse over ``children``.
    """

    label: str
    kind: str  # root, entry, function, inlined, loop, line, instruction, module, file
    values: FloatArray
    children: list[ViewNode] = field(default_factory=list)
    ctx_id: int | None = None
    file: str | None = None
    line: int = 0
    module: str | None = None
    hot: bool = False
    hidden: int = 0  # children left out by depth / threshold

    def __repr__(self) -> str:
        return f"ViewNode({self.label!r}, {self.kind!r}, {len(self.children)} children)"

    def copy(self, children: list[ViewNode] | None = None) -> ViewNode:
        """This row alone (its values copied), with ``children`` (none when not given)."""
        return ViewNode(
            self.label,
            self.kind,
            self.values.copy(),
            [] if children is None else children,
            self.ctx_id,
            self.file,
            self.line,
            self.module,
            self.hot,
            self.hidden,
        )

    def walk(self, depth: int = 0) -> list[tuple[int, ViewNode]]:
        """Every node with its depth, pre-order."""
        out: list[tuple[int, ViewNode]] = []
        stack: list[tuple[int, ViewNode]] = [(depth, self)]
        while stack:
            d, node = stack.pop()
            out.append((d, node))
            stack.extend((d + 1, c) for c in reversed(node.children))
        return out


@dataclass(frozen=True, slots=True)
class View:
    """A finished view: its columns, the tree of rows, and which column it is sorted by."""

    kind: str
    title: str
    columns: tuple[ColumnSpec, ...]
    root: ViewNode
    sort_column: int
    notes: tuple[str, ...] = ()  # what the reader must know (e.g. where callers were cut)


@dataclass(frozen=True, slots=True)
class ViewOptions:
    """What to show: metrics (resolved names), sort metric, depth and threshold (percent)."""

    metrics: tuple[str, ...]
    sort: str | None = None
    depth: int | None = None
    threshold: float = 0.0
    show_zero: bool = False
    expand_hot: bool = True
    sort_exclusive: bool = False  # order rows by the sort metric's exclusive value
    hot_share: float = HOT_PATH_SHARE  # a child holding this share of its parent is hot

    def __post_init__(self) -> None:
        if not self.metrics:
            raise ValueError("ViewOptions needs at least one metric")
        if self.depth is not None and self.depth < 0:
            raise ValueError("depth must be >= 0")
        if not 0.0 <= self.threshold <= 100.0:
            raise ValueError("threshold is a percentage between 0 and 100")


def columns_for(catalog: MetricCatalog, options: ViewOptions) -> tuple[ColumnSpec, ...]:
    out = []
    for name in options.metrics:
        metric = catalog.get(name)
        for inc in (True, False):
            out.append(ColumnSpec(name, inc, metric.format, metric.percent))
    return tuple(out)


def sort_index(
    options: ViewOptions, columns: Sequence[ColumnSpec], inclusive: bool | None = None
) -> int:
    """The column rows are ordered by (``inclusive``: that side of the sort metric instead)."""
    sort = options.sort or options.metrics[0]
    side = not options.sort_exclusive if inclusive is None else inclusive
    for i, col in enumerate(columns):
        if col.metric == sort and col.inclusive == side:
            return i
    raise ValueError(f"sort metric {sort!r} is not among the shown metrics")


def sort_key(values: FloatArray) -> FloatArray:
    """Values to order rows by: an unknown (NaN) value last."""
    return np.where(np.isnan(values), -np.inf, values)
