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

from pyhpctk.formats.vocabulary import Combine, LexicalType, Relation
from pyhpctk.present import formula as fx
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import (
    LEX_ENTRY,
    LEX_ROOT,
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


def _sort_index(
    options: ViewOptions, columns: Sequence[ColumnSpec], inclusive: bool | None = None
) -> int:
    """The column rows are ordered by (``inclusive``: that side of the sort metric instead)."""
    sort = options.sort or options.metrics[0]
    side = not options.sort_exclusive if inclusive is None else inclusive
    for i, col in enumerate(columns):
        if col.metric == sort and col.inclusive == side:
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
    return (
        int(tree.lexical_type[node]) == LexicalType.LINE
        and int(tree.relation[node]) == Relation.CALL
    )


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
    if info.name.endswith(f" {where}"):  # a native function without source: ``name [lib.so]``
        return info.name
    return f"{info.name} ({where}: {info.line})" if info.line else f"{info.name} ({where})"


def _place(tree: ContextTree, node: int) -> str:
    """``file: line``, or the file alone where no line is known (a binary without DWARF line
    maps names its scopes ``[libfoo.so]`` with line 0)."""
    line = int(tree.line[node])
    return f"{_file(tree, node)}: {line}" if line > 0 else _file(tree, node)


def context_label(tree: ContextTree, node: int) -> tuple[str, str]:
    """(label, kind) of a context, in hpcviewer's words."""
    lex = int(tree.lexical_type[node])
    if lex == LEX_ROOT:
        return "<root>", "root"
    if lex == LEX_ENTRY:
        return tree.names[node] or "<entry>", "entry"
    if lex == LexicalType.FUNCTION:
        name = tree.function_name(node) or "<unknown function>"
        if int(tree.relation[node]) == Relation.INLINED:
            return f"[I] {name}", "inlined"
        return name, "function"
    if lex == LexicalType.LOOP:
        return f"loop at {_place(tree, node)}", "loop"
    if lex == LexicalType.LINE:
        return _place(tree, node), "line"
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
    key = _key(matrix[_sort_index(options, columns, inclusive=True)])
    order_key = _key(matrix[sort])
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
        order = kids[np.argsort(-order_key[kids], kind="stable")]
        hot_child = -1
        biggest = int(kids[int(np.argmax(key[kids]))])
        top = key[biggest]
        if hot and options.expand_hot and top > 0 and top >= options.hot_share * key[node]:
            hot_child = biggest
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


def _finish(
    agg: _Aggregator,
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
    sort = _sort_index(options, agg.columns)
    key = _key(values[_sort_index(options, agg.columns, inclusive=True)])
    order_key = _key(values[sort])
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


def _instance_key(tree: ContextTree, node: int) -> Key | None:
    """What makes a context a function instance for the callers view, or None."""
    lex = int(tree.lexical_type[node])
    if lex == LexicalType.FUNCTION:
        f = int(tree.function[node])
        if f < 0:
            return ("function", "<unknown function>", -1)
        info = tree.functions[f]
        # By name and where it is defined, not by name alone (issue #21 item 2): every
        # __init__ of a program is its own function.
        return ("function", info.name, info.module, info.file, info.line)
    if is_module_code(tree, node):
        return ("module code", int(tree.file[node]))
    if lex == LexicalType.INSTRUCTION and int(tree.relation[node]) == Relation.CALL:
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
    fn_cost: FloatArray  # each instance's exclusive inputs, elided callees' self cost included
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
            np.array([np.bincount(group, row[instance], groups) for row in self.fn_cost]).reshape(
                len(self.fn_cost), groups
            )
        )
        return first


def callers_budget(n_contexts: int) -> int:
    """How many caller rows (and ten times as many instance steps) a callers view may build."""
    return CALLER_ROWS_PER_CONTEXT * n_contexts + CALLER_ROWS_FLOOR


def bottom_up(
    catalog: MetricCatalog, options: ViewOptions, elided: BoolArray | None = None
) -> View:
    """Each function's cost, split over the chains of its callers.

    ``elided`` contexts (interpreter frames, :mod:`pyhpctk.present.elide`) are no function of
    their own: they belong to their caller's frame, whose exclusive cost includes theirs, and
    their callees' callers chains go straight to that caller.

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
        if k is not None and (elided is None or not elided[i]):
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

    fn_cost = agg.fn_cost
    if elided is not None and np.any(elided):
        fn_cost = fn_cost.copy()
        hidden_nodes = np.flatnonzero(elided)
        hidden_nodes = hidden_nodes[owner[hidden_nodes] > 0]
        np.add.at(fn_cost.T, owner[hidden_nodes], agg.self_cost.T[hidden_nodes])
    build = _Callers(tree, agg, fn_cost)
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


def build_view(
    kind: str, catalog: MetricCatalog, options: ViewOptions, elided: BoolArray | None = None
) -> View:
    """Build the named view (one of :data:`VIEW_KINDS`), leaving out ``elided`` contexts
    (their cost stays with their callers: :mod:`pyhpctk.present.elide`)."""
    if elided is not None and not np.any(elided):
        elided = None
    if kind == "top-down":
        if elided is not None:
            from pyhpctk.present.elide import folded_top_down

            return folded_top_down(catalog, options, elided)
        return top_down(catalog, options)
    if kind == "bottom-up":
        return bottom_up(catalog, options, elided)
    if kind == "flat":
        from pyhpctk.present.flat import flat

        return flat(catalog, options, elided)
    raise ValueError(f"unknown view {kind!r}")
