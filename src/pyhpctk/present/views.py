"""The three views of a profile, as HPCToolkit's viewer shows them.

* **top-down** — the calling context tree itself: entry points, functions reached by calls,
  inlined functions (``[I] name``), loops (``loop at file: line``), lines (``file: line``) and,
  without structure information, raw instructions (``module+0xoffset``); values straight from the
  database (inclusive = ``execution``, exclusive = ``lex_aware``, formats.md §3.2).
* **bottom-up** (callers) — every function with its total cost, expandable into the chains of
  callers that cost came through; recursion is counted once (the outermost instance).
* **flat** — static structure: load module → file → function → inlined function / loop → line,
  each context's cost gathered where it sits in the code.

The aggregating views sum the metric *inputs* (summary statistics) and then apply each metric's
formula, so derived ratios stay ratios. The result is a small tree of :class:`ViewNode` that the
renderers (text, CSV, JSON, HTML) print; nothing here formats text for a terminal.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pyhpctk.present import formula as fx
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import (
    LEX_ENTRY,
    LEX_FUNCTION,
    LEX_INSTRUCTION,
    LEX_LINE,
    LEX_LOOP,
    LEX_ROOT,
    REL_CALL,
    REL_INLINED,
    REL_LEXICAL,
    ContextTree,
    FloatArray,
    IntArray,
)

BoolArray = npt.NDArray[np.bool_]

Key = tuple[Any, ...]  # what groups contexts in the aggregating views
Row = tuple[str, str, str | None, int, str | None]  # label, kind, file, line, module

VIEW_KINDS = ("top-down", "bottom-up", "flat")
HOT_PATH_SHARE = 0.5  # hpcviewer's hot-path threshold: a child holding >= 50% of its parent
# The callers view of a chain of D calls has D levels for each of D functions: quadratic. It
# stops adding levels before passing this many rows per context (plus a floor for small trees).
CALLER_ROWS_PER_CONTEXT = 4
CALLER_ROWS_FLOOR = 100_000


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


def _sort_index(options: ViewOptions, columns: Sequence[ColumnSpec]) -> int:
    sort = options.sort or options.metrics[0]
    for i, col in enumerate(columns):
        if col.metric == sort and col.inclusive:
            return i
    raise ValueError(f"sort metric {sort!r} is not among the shown metrics")


# -- labels ------------------------------------------------------------------------------------
def _base(path: str | None) -> str:
    return os.path.basename(path) if path else "<unknown file>"


def _file(tree: ContextTree, node: int) -> str:
    """The shown name of a context's file (:mod:`pyhpctk.present.names`)."""
    return tree.shown_file(int(tree.file[node])) or "<unknown file>"


def is_module_code(tree: ContextTree, node: int) -> bool:
    """Python module-level code: a ``-call> [line]`` context (formats.md §3.8)."""
    return int(tree.lexical_type[node]) == LEX_LINE and int(tree.relation[node]) == REL_CALL


def function_label(tree: ContextTree, node: int) -> str:
    """A function as the aggregating views name it: name and where it is defined
    (``__init__ (torch/nn/modules/conv.py: 454)``), so that functions that share a name can be
    told apart; Python module-level code is ``<module> (app.py)``."""
    if is_module_code(tree, node):
        return f"<module> ({_file(tree, node)})"
    f = int(tree.function[node])
    if f < 0:
        return "<unknown function>"
    info = tree.functions[f]
    if info.file < 0:
        return info.name
    where = tree.shown_file(info.file)
    return f"{info.name} ({where}: {info.line})" if info.line else f"{info.name} ({where})"


def context_label(tree: ContextTree, node: int) -> tuple[str, str]:
    """(label, kind) of a context, in hpcviewer's words."""
    lex = int(tree.lexical_type[node])
    if lex == LEX_ROOT:
        return "<root>", "root"
    if lex == LEX_ENTRY:
        return tree.names[node] or "<entry>", "entry"
    if lex == LEX_FUNCTION:
        name = tree.function_name(node) or "<unknown function>"
        if int(tree.relation[node]) == REL_INLINED:
            return f"[I] {name}", "inlined"
        return name, "function"
    if lex == LEX_LOOP:
        return f"loop at {_file(tree, node)}: {int(tree.line[node])}", "loop"
    if lex == LEX_LINE:
        return f"{_file(tree, node)}: {int(tree.line[node])}", "line"
    module = tree.module_name(node)
    return f"{_base(module) if module else '<unknown module>'}+0x{int(tree.offset[node]):x}", (
        "instruction"
    )


def _where(tree: ContextTree, node: int) -> tuple[str | None, int, str | None]:
    f = int(tree.function[node])
    file, line, module = tree.file_name(node), int(tree.line[node]), tree.module_name(node)
    if f >= 0:
        info = tree.functions[f]
        if file is None and info.file >= 0:
            file, line = tree.files[info.file], info.line
        if module is None and info.module >= 0:
            module = tree.modules[info.module]
    return file, line, module


# -- top-down ----------------------------------------------------------------------------------
def _key(values: FloatArray) -> FloatArray:
    return np.where(np.isnan(values), -np.inf, values)


def top_down(catalog: MetricCatalog, options: ViewOptions) -> View:
    """The calling context tree, children sorted by the sort metric, hot path expanded."""
    exp = catalog.experiment
    tree = exp.tree
    columns = columns_for(catalog, options)
    sort = _sort_index(options, columns)
    matrix = np.vstack([catalog.column(c.metric, c.inclusive) for c in columns])
    key = _key(matrix[sort])
    total = float(key[0]) if np.isfinite(key[0]) else 0.0
    cutoff = abs(total) * options.threshold / 100.0
    nonzero = np.any(np.nan_to_num(matrix) != 0, axis=0)

    def make(node: int) -> ViewNode:
        label, kind = context_label(tree, node)
        file, line, module = _where(tree, node)
        return ViewNode(
            label,
            kind,
            matrix[:, node].copy(),
            ctx_id=int(tree.ctx_id[node]),
            file=file,
            line=line,
            module=module,
        )

    root = make(0)
    root.label = exp.title or "<root>"
    root.hot = True
    stack: list[tuple[int, ViewNode, int, bool]] = [(0, root, 0, True)]
    while stack:
        node, view, depth, hot = stack.pop()
        kids = tree.children(node)
        if len(kids) == 0:
            continue
        order = kids[np.argsort(-key[kids], kind="stable")]
        hot_child = -1
        top = key[order[0]]
        if hot and options.expand_hot and top > 0 and top >= HOT_PATH_SHARE * key[node]:
            hot_child = int(order[0])
        deeper_ok = options.depth is None or depth < options.depth
        for child in order.tolist():
            is_hot = child == hot_child
            keep = (options.show_zero or nonzero[child]) and (key[child] >= cutoff or is_hot)
            if keep and (deeper_ok or is_hot):
                cv = make(child)
                cv.hot = is_hot
                view.children.append(cv)
                stack.append((child, cv, depth + 1, is_hot))
            elif options.show_zero or nonzero[child]:
                view.hidden += 1
    return View("top-down", exp.title, columns, root, sort)


# -- aggregating views (bottom-up, flat) -------------------------------------------------------
@dataclass
class _Aggregator:
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
                    if inp.combine != "sum":
                        # A min or max over profiles cannot be summed over contexts: unknown.
                        column = np.full(tree.size, np.nan)
                    cols.append(column)
        n = tree.size
        self.inc = np.vstack(inc_cols) if inc_cols else np.zeros((0, n))
        self.fn_cost = np.vstack(fn_cols) if fn_cols else np.zeros((0, n))
        # self(x) = function(x) - sum of function(y) over lexical children y (function scope is
        # transitive over lexical edges, formats.md §3.7); hidden (elided) contexts stay in x.
        self.self_cost = self.fn_cost.copy()
        lexical = np.flatnonzero(tree.relation == REL_LEXICAL)
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


def _finish(
    agg: _Aggregator,
    labels: list[Row],
    parents: list[int],
    inc_sums: FloatArray,
    exc_sums: FloatArray,
    title: str,
    kind: str,
    cut: dict[int, int] | None = None,
) -> View:
    """Turn grouped sums into a sorted, pruned view tree (group 0 is the root).

    ``cut``: groups whose children were not built, and how many there would be (shown as
    hidden).
    """
    values = agg.evaluate(inc_sums, exc_sums)
    sort = _sort_index(agg.options, agg.columns)
    key = _key(values[sort])
    total = float(key[0]) if np.isfinite(key[0]) else 0.0
    cutoff = abs(total) * agg.options.threshold / 100.0
    nonzero = np.any(np.nan_to_num(values) != 0, axis=0)
    kids: list[list[int]] = [[] for _ in parents]
    for g, p in enumerate(parents):
        if p >= 0:
            kids[p].append(g)
    nodes: list[ViewNode] = []
    for g, (label, k, file, line, module) in enumerate(labels):
        nodes.append(ViewNode(label, k, values[:, g].copy(), file=file, line=line, module=module))
    for g, count in (cut or {}).items():
        nodes[g].hidden += count
    stack = [(0, 0)]
    while stack:
        g, depth = stack.pop()
        order = sorted(kids[g], key=lambda c: -key[c])
        for c in order:
            keep = (agg.options.show_zero or nonzero[c]) and key[c] >= cutoff
            if keep and (agg.options.depth is None or depth < agg.options.depth):
                nodes[g].children.append(nodes[c])
                stack.append((c, depth + 1))
            elif agg.options.show_zero or nonzero[c]:
                nodes[g].hidden += 1
    return View(kind, title, agg.columns, nodes[0], sort)


def _instance_key(tree: ContextTree, node: int) -> Key | None:
    """What makes a context a function instance for the callers view, or None."""
    lex = int(tree.lexical_type[node])
    if lex == LEX_FUNCTION:
        f = int(tree.function[node])
        if f < 0:
            return ("function", "<unknown function>", -1)
        info = tree.functions[f]
        # By name and where it is defined, not by name alone (issue #21 item 2): every
        # __init__ of a program is its own function.
        return ("function", info.name, info.module, info.file, info.line)
    if is_module_code(tree, node):
        return ("module code", int(tree.file[node]))
    if lex == LEX_INSTRUCTION and int(tree.relation[node]) == REL_CALL:
        return ("instruction", int(tree.module[node]), int(tree.offset[node]))
    if lex == LEX_ENTRY:
        return ("entry", tree.names[node])
    return None


def _preorder_bounds(tree: ContextTree) -> tuple[IntArray, IntArray]:
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


def _outermost_members(
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


@dataclass
class _Callers:
    """The callers view being built level by level: groups, their rows and summed inputs."""

    tree: ContextTree
    agg: _Aggregator
    labels: list[Row] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    inc_parts: list[FloatArray] = field(default_factory=list)
    exc_parts: list[FloatArray] = field(default_factory=list)

    def add_level(
        self,
        parent_of_group: IntArray,
        representative: IntArray,
        group: IntArray,
        instance: IntArray,
        counted: FloatArray,
    ) -> int:
        """Add one level's groups; returns the global id of its first group."""
        first = len(self.labels)
        for parent, node in zip(parent_of_group.tolist(), representative.tolist(), strict=True):
            label, kind = context_label(self.tree, node)
            file, line, module = _where(self.tree, node)
            if kind in ("function", "inlined") or is_module_code(self.tree, node):
                label, kind = function_label(self.tree, node), "function"
            self.labels.append((label, kind, file, line, module))
            self.parents.append(parent)
        groups = len(representative)
        agg = self.agg
        self.inc_parts.append(
            np.array(
                [np.bincount(group, row[instance] * counted, groups) for row in agg.inc]
            ).reshape(len(agg.inc), groups)
        )
        self.exc_parts.append(
            np.array([np.bincount(group, row[instance], groups) for row in agg.fn_cost]).reshape(
                len(agg.fn_cost), groups
            )
        )
        return first


def callers_budget(n_contexts: int) -> int:
    """How many caller rows (and ten times as many instance steps) a callers view may build."""
    return CALLER_ROWS_PER_CONTEXT * n_contexts + CALLER_ROWS_FLOOR


def bottom_up(catalog: MetricCatalog, options: ViewOptions) -> View:
    """Each function's cost, split over the chains of its callers.

    Built one level of callers at a time over arrays of (group, instance, position) triples, so
    memory holds one level, not every instance's whole chain. Chains can be quadratic in the
    depth (deep recursion, long call chains): the levels stop where the rows or the steps would
    pass :func:`callers_budget`, and the view says so in a note; the callers left out are
    counted as hidden.
    """
    exp = catalog.experiment
    tree = exp.tree
    n = tree.size
    agg = _Aggregator(catalog, options, columns_for(catalog, options))
    key_id: dict[Key, int] = {}
    kid = np.full(n, -1, dtype=np.int64)
    is_entry = np.zeros(n, dtype=bool)
    for i in range(1, n):
        k = _instance_key(tree, i)
        if k is not None:
            kid[i] = key_id.setdefault(k, len(key_id))
            is_entry[i] = k[0] == "entry"
    n_keys = max(len(key_id), 1)
    # owner[i]: the nearest function instance (or entry point) at or above i.
    owner_list = [-1] * n
    parent_list: list[int] = tree.parent.tolist()
    keyed: list[bool] = (kid >= 0).tolist()
    for i in range(1, n):
        owner_list[i] = i if keyed[i] else owner_list[parent_list[i]]
    owner = np.array(owner_list, dtype=np.int64)
    caller = np.full(n, -1, dtype=np.int64)
    caller[1:] = owner[tree.parent[1:]]
    start, end = _preorder_bounds(tree)
    instance = np.flatnonzero((kid >= 0) & ~is_entry)
    instance = instance[instance > 0]

    build = _Callers(tree, agg)
    build.labels.append((exp.title or "<root>", "root", None, 0, None))
    build.parents.append(-1)
    build.inc_parts.append(agg.inc[:, :1].copy())
    build.exc_parts.append(agg.self_cost.sum(axis=1).reshape(-1, 1))
    # Level 1: one group per function; members are the instances themselves.
    _, rep, group = np.unique(kid[instance], return_index=True, return_inverse=True)
    group = group.reshape(-1)
    counted = _outermost_members(group, instance, start, end)
    first = build.add_level(np.zeros(len(rep), np.int64), instance[rep], group, instance, counted)
    position = instance
    budget = callers_budget(n)
    rows, steps, level = len(rep) + 1, len(instance), 1
    max_level = options.depth if options.depth is not None else 1 << 62
    hidden: dict[int, int] = {}
    notes: list[str] = []
    while len(position):
        up = caller[position]
        keep = up > 0
        group, member, up = group[keep], instance[keep], up[keep]
        if len(up) == 0:
            break
        pair = group * n_keys + kid[up]
        uniq, rep, new_group = np.unique(pair, return_index=True, return_inverse=True)
        new_group = new_group.reshape(-1)
        over = rows + len(uniq) > budget or steps + len(up) > 10 * budget
        if level >= max_level or over:
            shown = np.ones(len(member), dtype=bool)
            if not options.show_zero:
                shown = np.any(agg.inc[:, member] != 0, axis=0) | np.any(
                    agg.fn_cost[:, member] != 0, axis=0
                )
            callers = np.zeros(len(uniq), dtype=bool)
            callers[new_group[shown]] = True
            per_group = np.bincount((uniq // n_keys)[callers], minlength=int(group.max()) + 1)
            for g in np.flatnonzero(per_group).tolist():
                hidden[first + g] = int(per_group[g])
            if over and level < max_level:
                notes.append(
                    f"callers shown to level {level}: more levels would pass what {n:,} "
                    f"contexts allow ({budget:,} rows, {10 * budget:,} steps up the chains); "
                    "the callers left out are counted as hidden"
                )
            break
        counted = _outermost_members(new_group, member, start, end)
        parent_of = first + uniq // n_keys
        first = build.add_level(parent_of, up[rep], new_group, member, counted)
        group, instance, position = new_group, member, up
        rows += len(uniq)
        steps += len(up)
        level += 1

    inc = np.concatenate(build.inc_parts, axis=1)
    exc = np.concatenate(build.exc_parts, axis=1)
    view = _finish(agg, build.labels, build.parents, inc, exc, exp.title, "bottom-up", hidden)
    return View(view.kind, view.title, view.columns, view.root, view.sort_column, tuple(notes))


@dataclass
class _StaticScopes:
    """The flat view's groups as a tree grown parents first: module, file, function, ...

    Each group remembers its parent, its kind, and its nearest module, file, function-like
    (function or inlined) and loop group, so no context ever needs its whole path.
    """

    labels: list[Row] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    module_of: list[int] = field(default_factory=list)
    file_of: list[int] = field(default_factory=list)
    function_of: list[int] = field(default_factory=list)  # innermost function-like, or -1
    loop_of: list[int] = field(default_factory=list)  # innermost loop inside it, or -1
    index: dict[tuple[int, Key], int] = field(default_factory=dict)

    def group(self, parent: int, element: Key, row: Row) -> int:
        found = self.index.get((parent, element))
        if found is not None:
            return found
        me = len(self.labels)
        self.index[(parent, element)] = me
        kind = str(element[0]) if parent >= 0 else "root"
        depth = self.depths[parent] + 1 if parent >= 0 else 0
        self.labels.append(row)
        self.parents.append(parent)
        self.kinds.append(kind)
        self.depths.append(depth)
        self.module_of.append(me if depth == 1 else self.module_of[parent] if depth else -1)
        self.file_of.append(me if depth == 2 else self.file_of[parent] if depth > 2 else -1)
        function_like = kind in ("function", "inlined")
        self.function_of.append(me if function_like else self.function_of[parent] if depth else -1)
        self.loop_of.append(
            me if kind == "loop" else -1 if function_like or depth <= 2 else self.loop_of[parent]
        )
        return me


def _file_index(tree: ContextTree, node: int) -> int:
    """The file a context is in: its own, else its function's (-1: unknown)."""
    index = int(tree.file[node])
    f = int(tree.function[node])
    if index < 0 and f >= 0:
        index = tree.functions[f].file
    return index


def _python_modules(tree: ContextTree) -> dict[int, str]:
    """file index -> the module its functions are in, for module-level code (which names none:
    formats.md §3.8); files without a function get ``<logical python>`` when the tree has it."""
    out: dict[int, str] = {}
    for info in tree.functions:
        if info.file >= 0 and info.module >= 0:
            out.setdefault(info.file, tree.modules[info.module])
    logical = next((m for m in tree.modules if m.startswith("<logical ")), None)
    if logical is not None:
        for index in range(len(tree.files)):
            out.setdefault(index, logical)
    return out


def flat(catalog: MetricCatalog, options: ViewOptions, elided: BoolArray | None = None) -> View:
    """Load module → file → function → inlined function / loop → line.

    ``elided``: contexts left out (interpreter frames, :mod:`pyhpctk.present.elide`); their cost
    stays in the scope of their call site.
    """
    exp = catalog.experiment
    tree = exp.tree
    n = tree.size
    agg = _Aggregator(catalog, options, columns_for(catalog, options))
    scopes = _StaticScopes()
    scopes.group(-1, ("root",), (exp.title or "<root>", "root", None, 0, None))
    # scope[i]: the static scope (a group) context i belongs to, 0 for entry points;
    # is_scope[i]: whether the context *is* that scope (function, inlined, loop or line).
    scope = [0] * n
    is_scope = [False] * n
    parent: list[int] = tree.parent.tolist()
    module_code: list[int] = []
    python_module = _python_modules(tree)
    for i in range(1, n):
        lex = int(tree.lexical_type[i])
        rel = int(tree.relation[i])
        if lex == LEX_ENTRY:
            continue
        up = scope[parent[i]]
        if elided is not None and elided[i]:
            scope[i] = up  # an elided frame's cost stays where it was called (its call site)
            continue
        if up and scopes.kinds[up] == "line":
            up = scopes.parents[up]  # a call site line: what it calls belongs to the callee
        label, kind = context_label(tree, i)
        file, line, module = _where(tree, i)
        row = (label, kind, file, line, module)
        code = lex == LEX_LINE and rel == REL_CALL
        if (
            (lex == LEX_FUNCTION and rel != REL_INLINED)
            or (lex == LEX_INSTRUCTION and rel == REL_CALL)
            or code
            or not up
        ):
            if code:  # Python module-level code belongs to its module (formats.md §3.8)
                module = python_module.get(int(tree.file[i]), module)
            mod_name = module or "<unknown module>"
            file_index = _file_index(tree, i) if lex in (LEX_FUNCTION, LEX_LINE, LEX_LOOP) else -1
            file_name = tree.files[file_index] if file_index >= 0 else None
            shown = tree.shown_file(file_index) or "<unknown file>"
            g_mod = scopes.group(
                0, ("module", mod_name), (_base(mod_name), "module", None, 0, mod_name)
            )
            g_file = scopes.group(
                g_mod, ("file", file_name), (shown, "file", file_name, 0, mod_name)
            )
            if code:
                name = function_label(tree, i)
                up = scopes.group(
                    g_file, ("function", name), (name, "function", file_name, 0, mod_name)
                )
                module_code.append(i)
                row = (label, kind, file, line, mod_name)
            elif lex not in (LEX_LINE, LEX_LOOP):
                if lex == LEX_FUNCTION:
                    label = function_label(tree, i)
                    row = (label, kind, file, line, module)
                scope[i] = scopes.group(g_file, ("function", label), row)
                is_scope[i] = True
                continue
            else:
                up = g_file  # code outside any known function
        if lex == LEX_FUNCTION:  # inlined
            scope[i] = scopes.group(up, ("inlined", label), row)
        elif lex == LEX_LOOP:
            scope[i] = scopes.group(up, ("loop", file, int(tree.line[i])), row)
        elif lex == LEX_LINE:
            scope[i] = scopes.group(up, ("line", file, int(tree.line[i])), row)
        else:  # a lexical instruction: stays in its enclosing scope
            scope[i] = up
            continue
        is_scope[i] = True

    n_groups = len(scopes.labels)
    inc = np.zeros((agg.inc.shape[0], n_groups))
    exc = np.zeros((agg.fn_cost.shape[0], n_groups))
    start, end = _preorder_bounds(tree)
    node_scope = np.array(scope, dtype=np.int64)
    scope_nodes = np.flatnonzero(is_scope)
    kinds = np.array(scopes.kinds)
    depths = np.array(scopes.depths, dtype=np.int64)
    # Inclusive: every scope and its module/file ancestors, from their outermost instances
    # (a scope inside another instance of itself, i.e. recursion, adds nothing).
    code_nodes = np.array(module_code, dtype=np.int64)
    group_parent = np.array(scopes.parents, dtype=np.int64)
    is_code = np.zeros(n, dtype=bool)
    is_code[code_nodes] = True
    for level in (None, "module code", "file", "module"):
        nodes, groups = scope_nodes, node_scope[scope_nodes]
        if level == "module code":  # the <module> scope holds its lines' outermost instances
            nodes, groups = code_nodes, group_parent[node_scope[code_nodes]]
        elif level is not None:
            outer = (kinds[groups] == "function") | (depths[groups] <= 3) | is_code[nodes]
            nodes, groups = nodes[outer], groups[outer]
            ancestor = scopes.file_of if level == "file" else scopes.module_of
            groups = np.array(ancestor, dtype=np.int64)[groups]
        counted = _outermost_members(groups, nodes, start, end) > 0
        for row_in, row_out in zip(agg.inc, inc, strict=True):
            row_out += np.bincount(groups[counted], row_in[nodes[counted]], n_groups)
    # Exclusive: each context's self cost goes to its scope and up through the scopes that
    # contain it, where function scope stops at the innermost function-like scope and
    # lex_aware also at the innermost loop (formats.md §3.2): every line, file and module
    # above it, the innermost function or inlined function, and the innermost loop inside that.
    costed = np.flatnonzero(node_scope > 0)
    direct = np.array(
        [np.bincount(node_scope[costed], row[costed], n_groups) for row in agg.self_cost]
    ).reshape(len(agg.self_cost), n_groups)
    through = direct.copy()  # summed over each group's subtree
    for depth in range(int(depths.max()), 1, -1):
        at = np.flatnonzero(depths == depth)
        np.add.at(through.T, group_parent[at], through.T[at])
    plain = ~np.isin(kinds, ("function", "inlined", "loop"))
    exc[:, plain] = through[:, plain]
    for nearest in (scopes.function_of, scopes.loop_of):
        target = np.array(nearest, dtype=np.int64)
        has = np.flatnonzero(target >= 0)
        for row_in, row_out in zip(direct, exc, strict=True):
            row_out += np.bincount(target[has], row_in[has], n_groups)
    inc[:, 0] = agg.inc[:, 0]
    exc[:, 0] = agg.self_cost.sum(axis=1)
    return _finish(agg, scopes.labels, scopes.parents, inc, exc, exp.title, "flat")


def build_view(kind: str, catalog: MetricCatalog, options: ViewOptions) -> View:
    """Build the named view (one of :data:`VIEW_KINDS`)."""
    if kind == "top-down":
        return top_down(catalog, options)
    if kind == "bottom-up":
        return bottom_up(catalog, options)
    if kind == "flat":
        return flat(catalog, options)
    raise ValueError(f"unknown view {kind!r}")
