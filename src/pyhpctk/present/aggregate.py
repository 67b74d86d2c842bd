"""What the aggregating views share: metric inputs summed over groups of contexts, then each
metric's formula applied, and the grouped sums turned into a sorted, pruned tree of rows.

The bottom-up (:mod:`pyhpctk.present.callers`), flat (:mod:`pyhpctk.present.flat`) and folded
top-down (:mod:`pyhpctk.present.elide`) views group contexts each their own way and build
their rows here, so derived ratios stay ratios of sums in all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.formats.vocabulary import Combine, Relation
from pyhpctk.present import formula as fx
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import ContextTree, FloatArray, IntArray
from pyhpctk.present.viewmodel import (
    ColumnSpec,
    Row,
    View,
    ViewNode,
    ViewOptions,
    sort_index,
    sort_key,
)


@dataclass
class Aggregator:
    """Sums metric inputs over groups of contexts, then applies the metric formulas."""

    catalog: MetricCatalog
    options: ViewOptions
    columns: tuple[ColumnSpec, ...]
    inclusive_inputs: list[tuple[str, str]] = field(default_factory=list)
    exclusive_inputs: list[tuple[str, str]] = field(default_factory=list)
    inc: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    self_cost: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    fn_cost: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))

    def __post_init__(self) -> None:
        tree = self.catalog.experiment.tree
        inc_cols: list[FloatArray] = []
        fn_cols: list[FloatArray] = []
        for name in self.options.metrics:
            metric = self.catalog.get(name)
            for side, store, cols in (
                (metric.inclusive, self.inclusive_inputs, inc_cols),
                (metric.exclusive, self.exclusive_inputs, fn_cols),
            ):
                if side is None:
                    continue
                for ref in fx.references(side):
                    inp = metric.inputs[ref]
                    if cols is fn_cols:
                        inp = self.catalog.exclusive_input(inp)
                    store.append((name, ref))
                    column = self.catalog.input_column(inp)
                    if inp.combine != Combine.SUM.label:
                        # A min or max over profiles cannot be summed over contexts: unknown.
                        column = np.full(tree.size, np.nan)
                    cols.append(column)
        n = tree.size
        self.inc = np.vstack(inc_cols) if inc_cols else np.zeros((0, n))
        self.fn_cost = np.vstack(fn_cols) if fn_cols else np.zeros((0, n))
        # self(x) = function(x) - sum of function(y) over lexical children y (function scope is
        # transitive over lexical edges, formats.md §3.7); hidden (elided) contexts stay in x.
        self.self_cost = self.fn_cost.copy()
        lexical = np.flatnonzero(tree.relation == Relation.LEXICAL)
        lexical = lexical[lexical > 0]
        if len(lexical):
            np.subtract.at(self.self_cost.T, tree.parent[lexical], self.fn_cost.T[lexical])

    def evaluate(self, inc_sums: FloatArray, exc_sums: FloatArray) -> FloatArray:
        """Column values for groups, given summed inputs (inputs x groups)."""
        groups = inc_sums.shape[1] if inc_sums.size else exc_sums.shape[1]
        out = np.full((len(self.columns), groups), np.nan)
        for ci, col in enumerate(self.columns):
            metric = self.catalog.get(col.metric)
            expr = metric.inclusive if col.inclusive else metric.exclusive
            if expr is None:
                continue
            names = self.inclusive_inputs if col.inclusive else self.exclusive_inputs
            sums = inc_sums if col.inclusive else exc_sums
            table = {ref: sums[i] for i, (m, ref) in enumerate(names) if m == col.metric}
            out[ci] = fx.evaluate(expr, table.__getitem__, groups)
        return out


def finish_view(
    agg: Aggregator,
    labels: list[Row],
    parents: list[int],
    inc_sums: FloatArray,
    exc_sums: FloatArray,
    title: str,
    kind: str,
    cut: dict[int, int] | None = None,
    ctx_ids: Sequence[int] | None = None,
    hot_path: bool = False,
) -> View:
    """Turn grouped sums into a sorted, pruned view tree (group 0 is the root).

    ``cut``: groups whose children were not built, and how many there would be (shown as
    hidden). ``ctx_ids``: the context each group stands for (a tree of contexts). ``hot_path``:
    mark the hot path as :func:`top_down` does, and keep it below the depth limit.
    """
    options = agg.options
    values = agg.evaluate(inc_sums, exc_sums)
    sort = sort_index(options, agg.columns)
    key = sort_key(values[sort_index(options, agg.columns, inclusive=True)])
    order_key = sort_key(values[sort])
    total = float(key[0]) if np.isfinite(key[0]) else 0.0
    cutoff = abs(total) * options.threshold / 100.0
    nonzero = np.any(np.nan_to_num(values) != 0, axis=0)
    kids: list[list[int]] = [[] for _ in parents]
    for g, p in enumerate(parents):
        if p >= 0:
            kids[p].append(g)
    nodes: list[ViewNode] = []
    for g, (label, k, file, line, module) in enumerate(labels):
        ctx = None if ctx_ids is None else int(ctx_ids[g])
        nodes.append(
            ViewNode(label, k, values[:, g].copy(), ctx_id=ctx, file=file, line=line, module=module)
        )
    for g, count in (cut or {}).items():
        nodes[g].hidden += count
    nodes[0].hot = hot_path
    stack = [(0, 0)]
    while stack:
        g, depth = stack.pop()
        order = sorted(kids[g], key=lambda c: -order_key[c])
        hot_child = -1
        if nodes[g].hot and order and options.expand_hot:
            biggest = max(order, key=lambda c: key[c])
            if key[biggest] > 0 and key[biggest] >= options.hot_share * key[g]:
                hot_child = biggest
        for c in order:
            keep = (options.show_zero or nonzero[c]) and (key[c] >= cutoff or c == hot_child)
            if keep and (options.depth is None or depth < options.depth or c == hot_child):
                nodes[c].hot = c == hot_child
                nodes[g].children.append(nodes[c])
                stack.append((c, depth + 1))
            elif options.show_zero or nonzero[c]:
                nodes[g].hidden += 1
    return View(kind, title, agg.columns, nodes[0], sort)


def preorder_bounds(tree: ContextTree) -> tuple[IntArray, IntArray]:
    """Pre-order rank of every node, and one past the last rank of its subtree.

    ``y`` lies inside ``x``'s subtree exactly when ``start[x] <= start[y] < end[x]``. Two
    passes over the parent array (parents come first), no recursion.
    """
    parent: list[int] = tree.parent.tolist()
    n = len(parent)
    size = [1] * n
    for i in range(n - 1, 0, -1):
        size[parent[i]] += size[i]
    start = [0] * n
    free = [1] * n  # the rank the next child of node i gets
    for i in range(1, n):
        p = parent[i]
        start[i] = free[p]
        free[p] += size[i]
        free[i] = start[i] + 1
    first = np.array(start, dtype=np.int64)
    return first, first + np.array(size, dtype=np.int64)


def outermost_members(
    group: IntArray, member: IntArray, start: IntArray, end: IntArray
) -> FloatArray:
    """1.0 for members no other member of their group contains (recursion counted once)."""
    if len(member) == 0:
        return np.zeros(0)
    order = np.lexsort((start[member], group))
    span = int(end.max()) + 1
    # Groups ascend in ``order``, so adding group * span keeps every group's ranks above the
    # previous group's: one running maximum serves all groups at once.
    shift = group[order] * span
    reach = np.maximum.accumulate(end[member][order] + shift)
    before = np.concatenate(([-1], reach[:-1]))
    counted = np.empty(len(member))
    counted[order] = start[member][order] + shift >= before
    return counted
