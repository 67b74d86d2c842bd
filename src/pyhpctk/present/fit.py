"""Views that fit a screen: hpcviewer's hot path and a line budget (issue #21 item 3).

A real program's whole calling context tree is thousands of rows. pyview's text output shows
by default what hpcviewer opens with its hot-path button:

* **hot path**: the root is expanded, and a child is expanded while it holds at least
  ``hot_share`` of its parent's inclusive value (the sort metric's); the children of an
  expanded row are listed, the others' are not (their count shows as ``(+N hidden)``). With the
  usual share of 50 % that is one path from the root to where the cost splits, with the
  alternatives at each step listed beside it;
* **line budget**: when more rows would be listed than ``budget``, the rows kept are those with
  the largest inclusive values (in the bottom-up and flat views, the values rows are ordered by:
  ``-E`` keeps the largest exclusive ones), a row's parents always before it, so what is cut is
  the smallest (bottom-up: every function that costs anything before any caller); each cut row
  is counted in its parent's ``(+N hidden)``, and the view says how many rows were cut
  (:attr:`Fitted.cut`), which the text output prints as ``… N more rows``.

Nothing is recomputed: rows keep the values the view was built with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyhpctk.present.viewmodel import View, ViewNode


@dataclass(frozen=True, slots=True)
class Fitted:
    """A view cut to fit, and how many of its rows were left out by the budget."""

    view: View
    cut: int


def inclusive_column(view: View) -> int:
    """The sort metric's inclusive column (the sort column where it has none)."""
    sort = view.columns[view.sort_column]
    for i, column in enumerate(view.columns):
        if column.metric == sort.metric and column.inclusive:
            return i
    return view.sort_column


def _value(node: ViewNode, column: int) -> float:
    value = float(node.values[column])
    return -math.inf if math.isnan(value) else value


def chosen(view: View, hot_share: float | None, budget: int | None) -> tuple[set[int], int]:
    """The rows :func:`fit_view` keeps, as the ``id`` of each (the root's among them), and how
    many rows the expansion rule listed that the budget cut. The HTML report opens the same
    rows (:mod:`pyhpctk.present.html`)."""
    column = inclusive_column(view)
    # What the budget keeps first: the largest inclusive values; in the aggregating views the
    # values the rows are ordered by (-E: the functions that cost most themselves).
    ranked = column if view.kind == "top-down" else view.sort_column
    # Bottom-up, the functions that cost anything come before any caller, the callers before
    # what costs nothing: the budget goes to the functions first (issue #36 item 6).
    functions_first = view.kind == "bottom-up"
    # Rows listed by the expansion rule, in pre-order: (row, parent's index, (rank, priority)).
    listed: list[tuple[ViewNode, int, tuple[int, float]]] = []
    stack: list[tuple[ViewNode, int, float, bool]] = [(view.root, -1, math.inf, True)]
    while stack:
        node, parent, priority, expanded = stack.pop()
        me = len(listed)
        rank = (parent > 0) + 2 * (priority <= 0) if functions_first else 0
        listed.append((node, parent, (rank, priority)))
        if not expanded:
            continue
        mine = _value(node, column)
        for child in reversed(node.children):
            value = _value(child, column)
            opens = hot_share is None or (value > 0 and value >= hot_share * mine)
            stack.append((child, me, min(priority, _value(child, ranked)), opens))
    keep = len(listed)
    if budget is not None and len(listed) - 1 > budget:
        keep = budget + 1
    # The rows kept: largest priority first (a parent's priority is never below its child's),
    # ties in pre-order, so every kept row's parent is kept.
    order = sorted(range(len(listed)), key=lambda i: (listed[i][2][0], -listed[i][2][1], i))
    return {id(listed[i][0]) for i in order[:keep]}, len(listed) - keep


def fit_view(view: View, hot_share: float | None, budget: int | None) -> Fitted:
    """``view`` with only its hot path expanded (``hot_share`` None: every row expanded) and
    at most ``budget`` rows besides the root (None: no limit); a row's children left out are
    counted in its ``hidden``."""
    kept, cut = chosen(view, hot_share, budget)
    root = view.root.copy()
    stack = [(view.root, root)]
    while stack:
        node, copy = stack.pop()
        for child in node.children:
            if id(child) in kept:
                mine = child.copy()
                copy.children.append(mine)
                stack.append((child, mine))
            else:
                copy.hidden += 1
    fitted = View(view.kind, view.title, view.columns, root, view.sort_column, view.notes)
    return Fitted(fitted, cut)
