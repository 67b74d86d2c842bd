"""The flat view: load module → file → function → inlined function / loop → line.

Each context's own cost is gathered in its static scope, as hpcviewer's flat view does (see
:mod:`pyhpctk.present.views` for the other two views, :mod:`pyhpctk.present.aggregate` for the
aggregation they share). Python module-level code is the ``<module>`` scope of its file
(formats.md §3.8).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pyhpctk.formats.vocabulary import LexicalType, Relation
from pyhpctk.present.aggregate import Aggregator, finish_view, outermost_members, preorder_bounds
from pyhpctk.present.labels import base_name, context_label, function_label, where
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import LEX_ENTRY, ContextTree
from pyhpctk.present.viewmodel import BoolArray, Key, Row, View, ViewOptions, columns_for


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
    agg = Aggregator(catalog, options, columns_for(catalog, options))
    placed = _place(exp.tree, exp.title, elided)
    inc = _inclusive(agg, exp.tree, placed)
    exc = _exclusive(agg, placed)
    inc[:, 0] = agg.inc[:, 0]
    exc[:, 0] = agg.self_cost.sum(axis=1)
    scopes = placed.scopes
    return finish_view(agg, scopes.labels, scopes.parents, inc, exc, exp.title, "flat")


@dataclass
class _Placement:
    """Where each context's cost goes in the flat view.

    ``scope[i]``: the static scope (a group) context i belongs to, 0 for entry points;
    ``is_scope[i]``: whether the context *is* that scope (function, inlined, loop or line);
    ``module_code``: the contexts of Python module-level code (formats.md §3.8).
    """

    scopes: _StaticScopes
    scope: list[int]
    is_scope: list[bool]
    module_code: list[int]


def _place(tree: ContextTree, title: str | None, elided: BoolArray | None) -> _Placement:
    """Grow the static scopes, parents first, and place every context in one of them."""
    n = tree.size
    scopes = _StaticScopes()
    scopes.group(-1, ("root",), (title or "<root>", "root", None, 0, None))
    placed = _Placement(scopes, [0] * n, [False] * n, [])
    scope, is_scope = placed.scope, placed.is_scope
    parent: list[int] = tree.parent.tolist()
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
        file, line, module = where(tree, i)
        row = (label, kind, file, line, module)
        code = lex == LexicalType.LINE and rel == Relation.CALL
        if (
            (lex == LexicalType.FUNCTION and rel != Relation.INLINED)
            or (lex == LexicalType.INSTRUCTION and rel == Relation.CALL)
            or code
            or not up
        ):
            if code:  # Python module-level code belongs to its module (formats.md §3.8)
                module = python_module.get(int(tree.file[i]), module)
            mod_name = module or "<unknown module>"
            file_index = (
                _file_index(tree, i)
                if lex in (LexicalType.FUNCTION, LexicalType.LINE, LexicalType.LOOP)
                else -1
            )
            file_name = tree.files[file_index] if file_index >= 0 else None
            shown = tree.shown_file(file_index) or "<unknown file>"
            g_mod = scopes.group(
                0, ("module", mod_name), (base_name(mod_name), "module", None, 0, mod_name)
            )
            g_file = scopes.group(
                g_mod, ("file", file_name), (shown, "file", file_name, 0, mod_name)
            )
            if code:
                name = function_label(tree, i)
                up = scopes.group(
                    g_file, ("function", name), (name, "function", file_name, 0, mod_name)
                )
                placed.module_code.append(i)
                row = (label, kind, file, line, mod_name)
            elif lex not in (LexicalType.LINE, LexicalType.LOOP):
                if lex == LexicalType.FUNCTION:
                    label = function_label(tree, i)
                    row = (label, kind, file, line, module)
                scope[i] = scopes.group(g_file, ("function", label), row)
                is_scope[i] = True
                continue
            else:
                up = g_file  # code outside any known function
        if lex == LexicalType.FUNCTION:  # inlined
            scope[i] = scopes.group(up, ("inlined", label), row)
        elif lex == LexicalType.LOOP:
            scope[i] = scopes.group(up, ("loop", file, int(tree.line[i])), row)
        elif lex == LexicalType.LINE:
            scope[i] = scopes.group(up, ("line", file, int(tree.line[i])), row)
        else:  # a lexical instruction: stays in its enclosing scope
            scope[i] = up
            continue
        is_scope[i] = True
    return placed


def _inclusive(agg: Aggregator, tree: ContextTree, placed: _Placement) -> np.ndarray:
    """Inclusive: every scope and its module/file ancestors, from their outermost instances
    (a scope inside another instance of itself, i.e. recursion, adds nothing)."""
    scopes = placed.scopes
    n_groups = len(scopes.labels)
    inc = np.zeros((agg.inc.shape[0], n_groups))
    start, end = preorder_bounds(tree)
    node_scope = np.array(placed.scope, dtype=np.int64)
    scope_nodes = np.flatnonzero(placed.is_scope)
    kinds = np.array(scopes.kinds)
    depths = np.array(scopes.depths, dtype=np.int64)
    code_nodes = np.array(placed.module_code, dtype=np.int64)
    group_parent = np.array(scopes.parents, dtype=np.int64)
    is_code = np.zeros(tree.size, dtype=bool)
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
        counted = outermost_members(groups, nodes, start, end) > 0
        for row_in, row_out in zip(agg.inc, inc, strict=True):
            row_out += np.bincount(groups[counted], row_in[nodes[counted]], n_groups)
    return inc


def _exclusive(agg: Aggregator, placed: _Placement) -> np.ndarray:
    """Exclusive: each context's self cost goes to its scope and up through the scopes that
    contain it, where function scope stops at the innermost function-like scope and
    lex_aware also at the innermost loop (formats.md §3.2): every line, file and module
    above it, the innermost function or inlined function, and the innermost loop inside that."""
    scopes = placed.scopes
    n_groups = len(scopes.labels)
    exc = np.zeros((agg.fn_cost.shape[0], n_groups))
    node_scope = np.array(placed.scope, dtype=np.int64)
    kinds = np.array(scopes.kinds)
    depths = np.array(scopes.depths, dtype=np.int64)
    group_parent = np.array(scopes.parents, dtype=np.int64)
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
    return exc


class Flat:
    """The flat view of static structure."""

    name = "flat"
    help = "Flat view: load module > file > function > loop > line."

    def build(self, catalog: MetricCatalog, options: ViewOptions, elided: BoolArray | None) -> View:
        return flat(catalog, options, elided)
