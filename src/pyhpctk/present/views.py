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

Key = tuple[Any, ...]  # what groups contexts in the aggregating views

VIEW_KINDS = ("top-down", "bottom-up", "flat")
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


@dataclass(slots=True)
class ViewNode:
    """One row of a view: what it is, where it is in the code, and its values."""

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
        return f"loop at {_base(tree.file_name(node))}: {int(tree.line[node])}", "loop"
    if lex == LexicalType.LINE:
        return f"{_base(tree.file_name(node))}: {int(tree.line[node])}", "line"
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


def _same_key_ancestor(tree: ContextTree, keys: Sequence[Key | None]) -> IntArray:
    """For each keyed node, its nearest ancestor with the same key (-1: none, or unkeyed)."""
    out = np.full(tree.size, -1, dtype=np.int64)
    active: dict[Key, list[int]] = {}
    stack: list[tuple[int, bool]] = [(0, False)]
    while stack:
        node, leaving = stack.pop()
        k = keys[node]
        if leaving:
            if k is not None:
                active[k].pop()
            continue
        if k is not None:
            chain = active.setdefault(k, [])
            out[node] = chain[-1] if chain else -1
            chain.append(node)
        stack.append((node, True))
        stack.extend((int(c), False) for c in reversed(tree.children(node).tolist()))
    return out


def _outermost(tree: ContextTree, keys: Sequence[Key | None]) -> IntArray:
    """1 for keyed nodes whose key no ancestor shares (recursion counted once), else 0."""
    keyed = np.array([k is not None for k in keys], dtype=bool)
    return (keyed & (_same_key_ancestor(tree, keys) < 0)).astype(np.int64)


def _finish(
    agg: _Aggregator,
    labels: list[tuple[str, str, str | None, int, str | None]],
    parents: list[int],
    inc_sums: FloatArray,
    exc_sums: FloatArray,
    title: str,
    kind: str,
) -> View:
    """Turn grouped sums into a sorted, pruned view tree (group 0 is the root)."""
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
    if lex == LexicalType.FUNCTION:
        f = int(tree.function[node])
        if f < 0:
            return ("function", "<unknown function>", -1)
        info = tree.functions[f]
        return ("function", info.name, info.module)
    if lex == LexicalType.INSTRUCTION and int(tree.relation[node]) == Relation.CALL:
        return ("instruction", int(tree.module[node]), int(tree.offset[node]))
    if lex == LEX_ENTRY:
        return ("entry", tree.names[node])
    return None


def bottom_up(catalog: MetricCatalog, options: ViewOptions) -> View:
    """Each function's cost, split over the chains of its callers."""
    exp = catalog.experiment
    tree = exp.tree
    agg = _Aggregator(catalog, options, columns_for(catalog, options))
    keys = [_instance_key(tree, i) for i in range(tree.size)]
    # owner[i]: the nearest function instance (or entry point) at or above i.
    owner = np.full(tree.size, -1, dtype=np.int64)
    for i in range(1, tree.size):
        owner[i] = i if keys[i] is not None else owner[tree.parent[i]]
    caller = np.array([owner[tree.parent[i]] if i > 0 else -1 for i in range(tree.size)])
    same = _same_key_ancestor(
        tree, [k if k is not None and k[0] != "entry" else None for k in keys]
    )
    instances = [i for i, k in enumerate(keys) if i > 0 and k is not None and k[0] != "entry"]

    def key_of(node: int) -> Key:
        k = keys[node]
        assert k is not None  # only instances and entry points are looked up
        return k

    labels: list[tuple[str, str, str | None, int, str | None]] = [
        (exp.title or "<root>", "root", None, 0, None)
    ]
    parents = [-1]
    members: list[list[tuple[int, int]]] = [[]]  # (instance, current chain position)
    index: dict[tuple[int, Key], int] = {}
    max_depth = options.depth if options.depth is not None else 1 << 30

    def group(parent: int, key: Key, node: int) -> int:
        found = index.get((parent, key))
        if found is None:
            found = len(labels)
            index[(parent, key)] = found
            label, kind = context_label(tree, node)
            label = label.removeprefix("[I] ")
            file, line, module = _where(tree, node)
            labels.append((label, kind if kind != "inlined" else "function", file, line, module))
            parents.append(parent)
            members.append([])
        return found

    for inst in instances:
        g = group(0, key_of(inst), inst)
        members[g].append((inst, inst))
    caller_of: list[int] = caller.tolist()  # plain lists: this loop runs per (instance, level)
    same_of: list[int] = same.tolist()
    frontier = list(range(1, len(labels)))
    depth = 1
    while frontier and depth < max_depth:
        nxt: list[int] = []
        for g in frontier:
            for inst, pos in members[g]:
                up = caller_of[pos]
                if up <= 0:
                    continue
                child = group(g, key_of(up), up)
                if not members[child]:
                    nxt.append(child)
                members[child].append((inst, up))
        frontier = nxt
        depth += 1

    n_groups = len(labels)
    inc = np.zeros((agg.inc.shape[0], n_groups))
    exc = np.zeros((agg.fn_cost.shape[0], n_groups))
    for g in range(1, n_groups):
        insts = np.array([i for i, _ in members[g]], dtype=np.int64)
        # Recursion: an instance inside another instance of the same group adds no inclusive.
        group_set = set(insts.tolist())
        counted = np.ones(len(insts))
        for j, inst in enumerate(insts.tolist()):
            up = same_of[inst]
            while up >= 0:
                if up in group_set:
                    counted[j] = 0
                    break
                up = same_of[up]
        inc[:, g] = (agg.inc[:, insts] * counted).sum(axis=1)
        exc[:, g] = agg.fn_cost[:, insts].sum(axis=1)
    inc[:, 0] = agg.inc[:, 0]
    exc[:, 0] = agg.self_cost.sum(axis=1)
    return _finish(agg, labels, parents, inc, exc, exp.title, "bottom-up")


def flat(catalog: MetricCatalog, options: ViewOptions) -> View:
    """Load module → file → function → inlined function / loop → line."""
    exp = catalog.experiment
    tree = exp.tree
    agg = _Aggregator(catalog, options, columns_for(catalog, options))
    labels: list[tuple[str, str, str | None, int, str | None]] = [
        (exp.title or "<root>", "root", None, 0, None)
    ]
    parents = [-1]
    index: dict[tuple[Key, ...], int] = {(): 0}

    Row = tuple[str, str, str | None, int, str | None]

    def group(path: tuple[Key, ...], row: Row) -> int:
        found = index.get(path)
        if found is None:
            found = len(labels)
            index[path] = found
            labels.append(row)
            parents.append(index[path[:-1]])
        return found

    # path[i]: the static scope (tuple of elements) context i belongs to; end[i]: whether the
    # context *is* that scope (function, inlined function, loop or line), for inclusive costs.
    path: list[tuple[Key, ...]] = [()] * tree.size
    scope_group = np.zeros(tree.size, dtype=np.int64)
    is_scope = [False] * tree.size
    # cut[i]: the prefix length that exclusive costs stop at (innermost function-like element).
    for i in range(1, tree.size):
        lex = int(tree.lexical_type[i])
        rel = int(tree.relation[i])
        up = path[int(tree.parent[i])]
        if up and up[-1][0] == "line":
            up = up[:-1]  # a call site line: what it calls belongs to the callee, not the line
        label, kind = context_label(tree, i)
        file, line, module = _where(tree, i)
        if lex == LEX_ENTRY:
            path[i] = ()
            continue
        if (
            (lex == LexicalType.FUNCTION and rel != Relation.INLINED)
            or (lex == LexicalType.INSTRUCTION and rel == Relation.CALL)
            or not up
        ):
            mod_name = module or "<unknown module>"
            file_name = (
                file if lex in (LexicalType.FUNCTION, LexicalType.LINE, LexicalType.LOOP) else None
            )
            p_mod: tuple[Key, ...] = (("module", mod_name),)
            group(p_mod, (_base(mod_name), "module", None, 0, mod_name))
            p_file = (*p_mod, ("file", file_name))
            group(p_file, (_base(file_name), "file", file_name, 0, mod_name))
            if lex in (LexicalType.LINE, LexicalType.LOOP):
                up = p_file  # code outside any known function
            else:
                path[i] = (*p_file, ("function", label))
                scope_group[i] = group(path[i], (label, kind, file, line, module))
                is_scope[i] = True
                continue
        if lex == LexicalType.FUNCTION:  # inlined
            path[i] = (*up, ("inlined", label))
        elif lex == LexicalType.LOOP:
            path[i] = (*up, ("loop", file, int(tree.line[i])))
        elif lex == LexicalType.LINE:
            path[i] = (*up, ("line", file, int(tree.line[i])))
        else:  # a lexical instruction: stays in its enclosing scope
            path[i] = up
            scope_group[i] = index[up]
            continue
        scope_group[i] = group(path[i], (label, kind, file, line, module))
        is_scope[i] = True

    n_groups = len(labels)
    inc = np.zeros((agg.inc.shape[0], n_groups))
    exc = np.zeros((agg.fn_cost.shape[0], n_groups))
    # Inclusive: every scope and its module/file ancestors, from their outermost instances.
    for level in ("scope", "file", "module"):
        keys: list[Any] = [None] * tree.size
        for i in range(1, tree.size):
            if not is_scope[i]:
                continue
            if level == "scope":
                keys[i] = scope_group[i]
            elif path[i][-1][0] == "function" or len(path[i]) <= 3:
                keys[i] = index[path[i][: 2 if level == "file" else 1]]
        counted = _outermost(tree, keys)
        nodes = np.array([i for i in range(tree.size) if keys[i] is not None and counted[i]])
        if len(nodes):
            targets = np.array([keys[i] for i in nodes], dtype=np.int64)
            np.add.at(inc.T, targets, agg.inc.T[nodes])
    # Exclusive: each context's self cost goes to its scope and up through the scopes that
    # contain it, stopping above the innermost function-like scope for function/inlined/loop
    # ancestors (formats.md §3.2: function scope stops at call and inlined edges; lex_aware
    # additionally excludes nested loops).
    for i in range(1, tree.size):
        p = path[i]
        if not p:
            continue
        cost = agg.self_cost[:, i]
        if not np.any(cost):
            continue
        seen_loop = seen_fn = False
        for cut in range(len(p), 0, -1):
            element = p[cut - 1]
            kind = element[0]
            if kind in ("function", "inlined"):
                if seen_fn:
                    continue
                seen_fn = True
            elif kind == "loop":
                if seen_loop or seen_fn:
                    continue
                seen_loop = True
            exc[:, index[p[:cut]]] += cost
    inc[:, 0] = agg.inc[:, 0]
    exc[:, 0] = agg.self_cost.sum(axis=1)
    return _finish(agg, labels, parents, inc, exc, exp.title, "flat")


def build_view(kind: str, catalog: MetricCatalog, options: ViewOptions) -> View:
    """Build the named view (one of :data:`VIEW_KINDS`)."""
    if kind == "top-down":
        return top_down(catalog, options)
    if kind == "bottom-up":
        return bottom_up(catalog, options)
    if kind == "flat":
        return flat(catalog, options)
    raise ValueError(f"unknown view {kind!r}")
