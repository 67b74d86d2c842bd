"""The bottom-up (callers) view: every function with its total cost, expandable into the
chains of callers that cost came through; recursion is counted once (the outermost instance).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pyhpctk.formats.vocabulary import LexicalType, Relation
from pyhpctk.present.aggregate import (
    Aggregator,
    finish_view,
    outermost_members,
    preorder_bounds,
)
from pyhpctk.present.elide import moved_cost
from pyhpctk.present.labels import context_label, function_label, is_module_code, where
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import LEX_ENTRY, ContextTree, FloatArray, IntArray
from pyhpctk.present.viewmodel import BoolArray, Key, Row, View, ViewOptions, columns_for

# The callers view of a chain of D calls has D levels for each of D functions: quadratic. It
# stops adding levels before passing this many rows per context (plus a floor for small trees).
CALLER_ROWS_PER_CONTEXT = 4
CALLER_ROWS_FLOOR = 100_000


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


@dataclass
class _Callers:
    """The callers view being built level by level: groups, their rows and summed inputs."""

    tree: ContextTree
    agg: Aggregator
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
            file, line, module = where(self.tree, node)
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
    agg = Aggregator(catalog, options, columns_for(catalog, options))
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
    start, end = preorder_bounds(tree)
    instance = np.flatnonzero((kid >= 0) & ~is_entry)
    instance = instance[instance > 0]

    fn_cost = agg.fn_cost
    if elided is not None and np.any(elided):
        fn_cost = fn_cost.copy()
        hidden_nodes = np.flatnonzero(moved_cost(tree, elided))
        hidden_nodes = hidden_nodes[owner[hidden_nodes] > 0]
        np.add.at(fn_cost.T, owner[hidden_nodes], agg.self_cost.T[hidden_nodes])
    build = _Callers(tree, agg, fn_cost)
    build.labels.append((exp.title or "<root>", "root", None, 0, None))
    build.parents.append(-1)
    build.inc_parts.append(agg.inc[:, :1].copy())
    # The root is the program, no function: its exclusive value is its own context's (none),
    # not every function's self cost over again (issue #36 item 6: it read 100 % with -E).
    build.exc_parts.append(agg.self_cost[:, :1].copy())
    # Level 1: one group per function; members are the instances themselves.
    _, rep, group = np.unique(kid[instance], return_index=True, return_inverse=True)
    group = group.reshape(-1)
    counted = outermost_members(group, instance, start, end)
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
        counted = outermost_members(new_group, member, start, end)
        parent_of = first + uniq // n_keys
        first = build.add_level(parent_of, up[rep], new_group, member, counted)
        group, instance, position = new_group, member, up
        rows += len(uniq)
        steps += len(up)
        level += 1

    inc = np.concatenate(build.inc_parts, axis=1)
    exc = np.concatenate(build.exc_parts, axis=1)
    view = finish_view(agg, build.labels, build.parents, inc, exc, exp.title, "bottom-up", hidden)
    return View(view.kind, view.title, view.columns, view.root, view.sort_column, tuple(notes))


class BottomUp:
    """The callers view."""

    name = "bottom-up"
    help = "Callers view: each function's cost split over its callers."

    def build(self, catalog: MetricCatalog, options: ViewOptions, elided: BoolArray | None) -> View:
        return bottom_up(catalog, options, elided)
