"""The top-down view: the calling context tree itself, hot path expanded.

Values come straight from the database (inclusive = ``execution``, exclusive = ``lex_aware``,
formats.md §3.2). With interpreter frames left out, the folded tree of
:mod:`pyhpctk.present.elide` is built instead.
"""

from __future__ import annotations

import numpy as np

from pyhpctk.present.elide import folded_top_down
from pyhpctk.present.labels import context_label, where
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.viewmodel import (
    BoolArray,
    View,
    ViewNode,
    ViewOptions,
    columns_for,
    sort_index,
    sort_key,
)


def top_down(catalog: MetricCatalog, options: ViewOptions) -> View:
    """The calling context tree, children sorted by the sort metric, hot path expanded."""
    exp = catalog.experiment
    tree = exp.tree
    columns = columns_for(catalog, options)
    sort = sort_index(options, columns)
    matrix = np.vstack([catalog.column(c.metric, c.inclusive) for c in columns])
    key = sort_key(matrix[sort_index(options, columns, inclusive=True)])
    order_key = sort_key(matrix[sort])
    total = float(key[0]) if np.isfinite(key[0]) else 0.0
    cutoff = abs(total) * options.threshold / 100.0
    nonzero = np.any(np.nan_to_num(matrix) != 0, axis=0)

    def make(node: int) -> ViewNode:
        label, kind = context_label(tree, node)
        file, line, module = where(tree, node)
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


class TopDown:
    """The calling context tree (pyview's default view)."""

    name = "top-down"
    help = "Calling context tree (default)."

    def build(self, catalog: MetricCatalog, options: ViewOptions, elided: BoolArray | None) -> View:
        if elided is not None:
            return folded_top_down(catalog, options, elided)
        return top_down(catalog, options)
