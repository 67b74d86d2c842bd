"""Statistic generation: propagate point values up the context tree and summarise profiles.

For one profile, point values (context, metric, value) become the four scopes of formats.md
§3.2 — ``point``; ``function``, summed up through lexical edges only; ``lex_aware``; and
``execution``, summed up through every edge — using dense matrices over just the ancestors of the
contexts that hold values, filled level by level with ``np.add.at`` (no per-value Python loop).

Observed in hpcprof's output (``loops-cputime-t.d``) and reproduced here: in per-profile values
``lex_aware`` equals ``function``; in the summary profile, ``lex_aware`` of a *loop* is its point
value plus the ``function`` values of its lexical children that are not loops (nested loops are
excluded), and equals ``function`` elsewhere.

Summaries combine profiles per (context, metric id) with numpy group-bys: ``sum``, and with
``-M stats`` also ``min``, ``max``, sum of squares and count (over the profiles that have a non-zero
value), from which viewers derive mean, standard deviation and coefficient of variation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.context import ContextBuilder, LexicalType, Relation
from pyhpctk.analysis.metrics import MeasuredMetric, Partial
from pyhpctk.core.metrics import (
    N_SCOPES,
    SCOPE_EXECUTION,
    SCOPE_FUNCTION,
    SCOPE_LEX_AWARE,
    SCOPE_POINT,
    Combine,
    metric_base,
    prop_id,
    scope_of,
    stat_id,
)


@dataclass(slots=True)
class SparseValues:
    """A profile's values as profile.db stores them: sorted by context, then metric id."""

    ctx: npt.NDArray[np.int64]
    metric: npt.NDArray[np.int64]
    value: npt.NDArray[np.float64]

    @classmethod
    def empty(cls) -> SparseValues:
        return cls(
            np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        )

    def __len__(self) -> int:
        return len(self.value)

    def as_dict(self) -> dict[int, dict[int, float]]:
        """``{ctx: {metric id: value}}`` (for tests and small dumps)."""
        result: dict[int, dict[int, float]] = {}
        for c, m, v in zip(
            self.ctx.tolist(), self.metric.tolist(), self.value.tolist(), strict=True
        ):
            result.setdefault(c, {})[m] = v
        return result

    def verify(self) -> list[str]:
        """Sorted by (ctx, metric), unique, no zeros (formats.md §3.3)."""
        problems = []
        key = self.ctx * (1 << 20) + self.metric
        if len(key) > 1 and np.any(np.diff(key) <= 0):
            problems.append("values are not sorted by (context, metric) or not unique")
        if np.any(self.value == 0):
            problems.append("a zero value is stored")
        return problems


@dataclass(frozen=True, slots=True)
class TreeShape:
    """The arrays propagation needs, computed once per final context tree."""

    parent: npt.NDArray[np.int64]
    depth: npt.NDArray[np.int64]
    lexical: npt.NDArray[np.bool_]
    loop: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, tree: ContextBuilder) -> TreeShape:
        parent = tree.parent_array()
        return cls(
            parent=parent,
            depth=tree.depth_array(),
            lexical=tree.relation_array() == int(Relation.LEXICAL),
            loop=tree.lexical_type_array() == int(LexicalType.LOOP),
        )

    def __len__(self) -> int:
        return len(self.parent)

    def closure(self, contexts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``contexts`` and all their ancestors, sorted (ancestors have smaller ids)."""
        mark = np.zeros(len(self.parent), dtype=bool)
        frontier = np.asarray(contexts, dtype=np.int64)
        while len(frontier):
            frontier = frontier[~mark[frontier]]  # repeats are marked twice: harmless
            mark[frontier] = True
            frontier = self.parent[frontier]
            frontier = frontier[frontier >= 0]
            frontier = frontier[~mark[frontier]]
        result: npt.NDArray[np.int64] = np.nonzero(mark)[0].astype(np.int64)
        return result


@dataclass(slots=True)
class Propagated:
    """One profile's scopes as dense matrices over ``nodes`` × ``metrics`` (global indices)."""

    nodes: npt.NDArray[np.int64]
    metrics: npt.NDArray[np.int64]
    point: npt.NDArray[np.float64]
    function: npt.NDArray[np.float64]
    execution: npt.NDArray[np.float64]


def _present(small: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The distinct values of an array of small non-negative integers, sorted."""
    if not len(small):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.bincount(small)).astype(np.int64)


SCOPE_BUDGET = 1 << 22
"""Cells (contexts × metrics) of one profile's dense scope planes, at most: past it, they are
built a group of metrics at a time (:func:`profile_scopes`)."""


def scope_planes(
    shape: TreeShape,
    ctx: npt.NDArray[np.int64],
    metric: npt.NDArray[np.int64],
    value: npt.NDArray[np.float64],
    nodes: npt.NDArray[np.int64] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """One profile's four scopes of its point values: ``(nodes, metrics, planes)`` with
    ``planes[row, column, scope]`` the value of metric ``metrics[column]`` (global index) at
    context ``nodes[row]`` in ``scope`` (formats.md §3.2), ``nodes`` sorted.

    ``nodes`` may give ``shape.closure(ctx)`` when the caller has it already. Inclusive values
    (``execution``, through every edge; ``function``, through lexical edges) are summed up a
    depth level at a time in place, in the planes the scopes are stored in.
    """
    metrics = _present(metric)
    if nodes is None:
        nodes = shape.closure(ctx)
    # Each context's row: only entries at ``nodes`` are written, and only those (a context with
    # values, a parent of a node) are read, so the map needs no filling.
    local = np.empty(len(shape), dtype=np.intp)
    local[nodes] = np.arange(len(nodes))
    # Point values summed per (row, column) in the order they come (bincount adds in input
    # order, from 0.0), straight into a dense plane: no sort to group them.
    n, m = len(nodes), len(metrics)
    cell = local[ctx]
    cell *= m
    if m > 1:
        column = np.zeros(int(metrics[-1]) + 1, dtype=np.intp)
        column[metrics] = np.arange(m)
        cell += column[metric]
    point = np.bincount(cell, weights=value, minlength=n * m).reshape(n, m)
    del cell
    planes = np.empty((n, m, N_SCOPES), dtype=np.float64)
    for scope in (SCOPE_POINT, SCOPE_FUNCTION, SCOPE_EXECUTION):
        planes[:, :, scope] = point
    del point
    if len(nodes):
        execution = planes[:, :, SCOPE_EXECUTION]
        function = planes[:, :, SCOPE_FUNCTION]
        depth = shape.depth[nodes]
        # The rows of each level, ascending (as np.nonzero gives them), from one stable sort.
        # (16-bit keys take numpy's radix sort.)
        small = depth.astype(np.int16) if int(depth.max()) < 1 << 15 else depth
        by_depth = np.argsort(small, kind="stable")
        cuts = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
        parent_row = local[shape.parent[nodes]]  # the roots' (from local[-1]) are never read
        lexical = shape.lexical[nodes]
        for level in range(int(depth.max()), 0, -1):
            rows = by_depth[cuts[level] : cuts[level + 1]]
            parents = parent_row[rows]
            np.add.at(execution, parents, execution[rows])
            up = lexical[rows]
            np.add.at(function, parents[up], function[rows[up]])
    planes[:, :, SCOPE_LEX_AWARE] = planes[:, :, SCOPE_FUNCTION]  # in per-profile values
    return nodes, metrics, planes


def propagate(
    shape: TreeShape,
    ctx: npt.NDArray[np.int64],
    metric: npt.NDArray[np.int64],
    value: npt.NDArray[np.float64],
    nodes: npt.NDArray[np.int64] | None = None,
) -> Propagated:
    """Inclusive (execution) and function-scope values of one profile's point values
    (:func:`scope_planes`, as separate matrices)."""
    nodes, metrics, planes = scope_planes(shape, ctx, metric, value, nodes)
    return Propagated(
        nodes,
        metrics,
        planes[:, :, SCOPE_POINT],
        planes[:, :, SCOPE_FUNCTION],
        planes[:, :, SCOPE_EXECUTION],
    )


def stored_values(
    metrics: npt.NDArray[np.int64], planes: npt.NDArray[np.float64], bases: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.integer[Any]], npt.NDArray[np.float64]]:
    """The non-zero values of :func:`scope_planes`' planes as profile.db stores them, sorted by
    row then ``propMetricId = base + scope``: (values per row, the id of each, each value).

    Ids come as 16-bit integers, profile.db's, when they fit (a fifth of the bytes)."""
    n = len(planes)
    ids = prop_id(bases[metrics][:, None], np.arange(N_SCOPES)[None, :]).reshape(-1)
    flat = planes.reshape(n, len(ids))
    if len(ids) > 1 and bool(np.any(ids[1:] <= ids[:-1])):
        order = np.argsort(ids, kind="stable")
        ids, flat = ids[order], flat[:, order]
    stored = flat != 0
    per_row = np.count_nonzero(stored, axis=1)
    narrow = ids.astype(np.uint16) if int(ids.max(initial=0)) < 1 << 16 else ids
    return per_row, np.broadcast_to(narrow, flat.shape)[stored], flat[stored]


def profile_scopes(
    shape: TreeShape,
    ctx: npt.NDArray[np.int64],
    metric: npt.NDArray[np.int64],
    value: npt.NDArray[np.float64],
    bases: npt.NDArray[np.int64],
    budget: int = SCOPE_BUDGET,
) -> SparseValues:
    """:func:`scope_planes` then the stored values, a group of metrics at a time.

    The dense blocks hold (contexts touched) × (metrics in the group) values; groups are sized so
    a block stays under ``budget`` cells, which bounds memory on profiles with many contexts
    and many metrics.
    """
    metrics = _present(metric)
    if not len(metrics):
        return SparseValues.empty()
    nodes = shape.closure(ctx)
    touched = len(nodes)
    per_group = max(1, budget // max(touched, 1))
    if per_group >= len(metrics):
        nodes, metrics, planes = scope_planes(shape, ctx, metric, value, nodes)
        per_row, ids, stored = stored_values(metrics, planes, bases)
        return SparseValues(np.repeat(nodes, per_row), ids.astype(np.int64), stored)
    parts = []
    for start in range(0, len(metrics), per_group):
        group = metrics[start : start + per_group]
        keep = np.isin(metric, group)
        parts.append(profile_values(propagate(shape, ctx[keep], metric[keep], value[keep]), bases))
    all_ctx = np.concatenate([p.ctx for p in parts])
    all_metric = np.concatenate([p.metric for p in parts])
    order = np.lexsort((all_metric, all_ctx))
    return SparseValues(
        all_ctx[order], all_metric[order], np.concatenate([p.value for p in parts])[order]
    )


def _sparse(
    nodes: npt.NDArray[np.int64], ids: npt.NDArray[np.int64], planes: npt.NDArray[np.float64]
) -> SparseValues:
    """Non-zeros of ``planes[node, column]`` with metric id ``ids[column]``, in sorted order."""
    order = np.argsort(ids, kind="stable")
    planes = planes[:, order]
    rows, columns = np.nonzero(planes)
    return SparseValues(
        nodes[rows].astype(np.int64), ids[order][columns].astype(np.int64), planes[rows, columns]
    )


def profile_values(prop: Propagated, bases: npt.NDArray[np.int64]) -> SparseValues:
    """A profile's stored values: four scopes per metric, ``propMetricId = base + scope``."""
    n, m = prop.point.shape
    planes = np.empty((n, m, N_SCOPES), dtype=np.float64)
    planes[:, :, SCOPE_POINT] = prop.point
    planes[:, :, SCOPE_FUNCTION] = prop.function
    planes[:, :, SCOPE_LEX_AWARE] = prop.function
    planes[:, :, SCOPE_EXECUTION] = prop.execution
    ids = prop_id(bases[prop.metrics][:, None], np.arange(N_SCOPES)[None, :]).reshape(-1)
    return _sparse(prop.nodes, ids, planes.reshape(n, m * N_SCOPES))


def metric_bases(
    metrics: list[MeasuredMetric], partials: tuple[Partial, ...]
) -> tuple[dict[str, int], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """(base id by stored metric name, base per global metric index or -1, move-to-proc flags)."""
    stored = [m for m in metrics if not m.is_derived]
    bases_by_name = {m.name: metric_base(i, len(partials)) for i, m in enumerate(stored)}
    global_base = np.asarray(
        [bases_by_name.get(m.name, -1) for m in metrics] or [0], dtype=np.int64
    )
    move = np.asarray([m.move_to_proc for m in metrics] or [False], dtype=bool)
    return bases_by_name, global_base, move


def summarize(
    shape: TreeShape,
    profiles: list[SparseValues],
    partials: tuple[Partial, ...],
) -> SparseValues:
    """The summary profile: each partial of each (context, prop metric id) across ``profiles``.

    The result uses stat metric ids: ``base + 4 * partial + scope`` where ``base + scope`` is the
    prop id (formats.md §3.2); bases must leave room for ``4 * len(partials)`` ids.
    """
    if not profiles or sum(len(p) for p in profiles) == 0:
        return SparseValues.empty()
    ctx = np.concatenate([p.ctx for p in profiles])
    metric = np.concatenate([p.metric for p in profiles])
    value = np.concatenate([p.value for p in profiles])
    stride = int(metric.max()) + 1
    keys = ctx * stride + metric
    if len(keys) > 1 and bool(np.any(keys[1:] < keys[:-1])):
        order = np.argsort(keys, kind="stable")
        keys, value = keys[order], value[order]
    # Sorted now: the groups start where the key changes.
    change = np.ones(len(keys), dtype=bool)
    change[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(change)
    unique_keys = keys[starts]
    return summarize_groups(
        shape, unique_keys // stride, unique_keys % stride, starts, value, partials
    )


def summarize_groups(
    shape: TreeShape,
    u_ctx: npt.NDArray[np.int64],
    u_metric: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    value: npt.NDArray[np.float64],
    partials: tuple[Partial, ...],
    children: SparseValues | None = None,
) -> SparseValues:
    """:func:`summarize` of values already grouped: group ``g`` is (``u_ctx[g]``,
    ``u_metric[g]``), sorted and unique, and holds ``value[starts[g]:starts[g + 1]]`` in profile
    order (so sums add in the order serial pyprof adds them).

    ``children``: summed ``function`` values of loops' lexical children whose own values are
    summarised elsewhere (another rank's contexts); they count in their loops' ``lex_aware``
    only and yield no row themselves.
    """
    if not len(starts):
        return SparseValues.empty()
    stride = int(u_metric.max(initial=0)) + 1
    if children is not None and len(children):
        stride = max(stride, int(children.metric.max()) + 1)
    unique_keys = u_ctx * stride + u_metric
    scope = scope_of(u_metric)
    base = u_metric - scope
    sums = np.add.reduceat(value, starts)

    # lex_aware of loops in the summary: point + function of lexical non-loop children.
    if children is not None and len(children):
        keys = np.concatenate([unique_keys, children.ctx * stride + children.metric])
        order = np.argsort(keys, kind="stable")
        merged = _summary_lex_aware(
            shape, keys[order], stride, np.concatenate([sums, children.value])[order]
        )
        lex_sum = np.empty(len(keys))
        lex_sum[order] = merged
        lex_sum = lex_sum[: len(unique_keys)]
    else:
        lex_sum = _summary_lex_aware(shape, unique_keys, stride, sums)

    out_ctx: list[npt.NDArray[np.int64]] = []
    out_id: list[npt.NDArray[np.int64]] = []
    out_val: list[npt.NDArray[np.float64]] = []
    for index, partial in enumerate(partials):
        if partial.combine is Combine.MIN:
            column = np.minimum.reduceat(value, starts)
        elif partial.combine is Combine.MAX:
            column = np.maximum.reduceat(value, starts)
        elif partial.formula == "$$^2":
            column = np.add.reduceat(value * value, starts)
        elif partial.formula == "1":
            column = np.diff(np.append(starts, len(value))).astype(np.float64)
        else:
            column = sums.copy()
            lex = scope == SCOPE_LEX_AWARE
            column[lex] = lex_sum[lex]
        out_ctx.append(u_ctx)
        out_id.append(stat_id(base, index, scope))
        out_val.append(column)
    # Loops whose summary lex_aware is non-zero although no profile stored one cannot occur:
    # per-profile lex_aware = function, which is non-zero wherever lex_aware could be.
    all_ctx = np.concatenate(out_ctx)
    all_id = np.concatenate(out_id)
    all_val = np.concatenate(out_val)
    keep = all_val != 0
    all_ctx, all_id, all_val = all_ctx[keep], all_id[keep], all_val[keep]
    order = np.lexsort((all_id, all_ctx))
    return SparseValues(all_ctx[order], all_id[order], all_val[order])


def _summary_lex_aware(
    shape: TreeShape,
    unique_keys: npt.NDArray[np.int64],
    stride: int,
    sums: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Summed lex_aware per (ctx, id) row: loops recomputed from their children, vectorised.

    ``unique_keys`` are the sorted ``ctx * stride + prop id`` keys the rows of ``sums`` belong to.
    """
    u_ctx, u_metric = unique_keys // stride, unique_keys % stride
    scope = scope_of(u_metric)
    result = sums.copy()
    loops = np.nonzero((scope == SCOPE_LEX_AWARE) & shape.loop[u_ctx])[0]
    if not len(loops):
        return result
    base = u_metric - scope
    new = np.zeros(len(loops), dtype=np.float64)
    # The loop's own point value.
    wanted = u_ctx[loops] * stride + base[loops] + SCOPE_POINT
    at = np.minimum(np.searchsorted(unique_keys, wanted), len(unique_keys) - 1)
    found = unique_keys[at] == wanted
    new[found] += sums[at[found]]
    # The function values of its lexical children that are not loops.
    rows = np.nonzero(scope == SCOPE_FUNCTION)[0]
    child = u_ctx[rows]
    parent = shape.parent[child]
    eligible = shape.lexical[child] & ~shape.loop[child] & (parent >= 0)
    eligible &= shape.loop[np.maximum(parent, 0)]
    rows, parent = rows[eligible], parent[eligible]
    target = parent * stride + base[rows] + SCOPE_LEX_AWARE
    loop_keys = unique_keys[loops]
    at = np.minimum(np.searchsorted(loop_keys, target), len(loop_keys) - 1)
    found = loop_keys[at] == target
    np.add.at(new, at[found], sums[rows[found]])
    result[loops] = new
    return result
