"""The view a person reads first: calls instead of alternating function and line rows, and
pass-through chains folded into one row (issue #36 item 1).

A real program's calling context tree spends most of its depth on frames that only pass their
time on: pyperf's harness is seven frames of 100 % above the benchmark, and every frame is two
rows (the function, then the line that calls the next one). :func:`condense` rewrites a built
view for the screen, the HTML tree and the flame graph:

* **one row per call** (top-down): a line that calls is not a row of its own; each function it
  calls is one row named with that line, ``Vector.__sub__ ← raytrace.py: 22``. What the line
  costs itself, if anything, stays a row ``raytrace.py: 22`` holding that cost alone;
* **pass-through chains folded**: a run of three or more rows, each holding at least
  :data:`PASS_THROUGH_SHARE` of the one above it (sort metric, inclusive), is one row that names
  its two ends and says how many frames it hides: ``bench_time_func → … → render (5 frames
  folded)``, after the line that makes the first call where a line does (``app.py: 9 →
  multiarray+0x2c44 → … → cblas_dgemm (4 frames folded)``: two lines calling one library are
  two rows a reader tells apart). The row keeps the first's inclusive values and the sum of
  the chain's exclusive ones; the small calls that leave the chain on the way are its
  children. A chain stops before the call by which the file of its first calling line hands
  over to another file (``wrapper ← app.py: 34`` calling ``fit`` in ``sklearn/base.py``): the
  line of the program that calls a library stays a row.

In the bottom-up view the same folding turns a chain of single callers into one row
(``trace_ray ← … ← <module> (6 frames folded)``). Entry points (threads) and the root are
never folded. ``pyview --full`` shows the view without any of this.

Nothing is recomputed from the database: rows are moved and their values added, as built.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from pyhpctk.present.viewmodel import View, ViewNode

#: A row holding at least this share of its parent passes it through (issue #36: "~all").
PASS_THROUGH_SHARE = 0.95
#: The shortest chain folded into one row (two rows would become one row of two names).
FOLDED_CHAIN = 3
#: Rows that are frames of the program: what a chain may be made of.
FRAME_KINDS = frozenset({"function", "inlined", "line", "loop", "instruction"})
#: Rows that are called (a function, an inlined function, a native call site).
CALL_KINDS = frozenset({"function", "inlined", "instruction"})
CALLED_FROM = " ← "
#: What is left of a line's value once its calls are taken away, below which it is rounding.
ROUNDING = 1e-9


class _Condenser:
    """One view being condensed: which columns are inclusive, additive, and sort the rows."""

    def __init__(self, view: View) -> None:
        self.view = view
        sort = view.columns[view.sort_column]
        self.key = next(
            (i for i, c in enumerate(view.columns) if c.metric == sort.metric and c.inclusive),
            view.sort_column,
        )
        self.inclusive = np.array([c.inclusive for c in view.columns], dtype=bool)
        self.additive = np.array([c.percent for c in view.columns], dtype=bool)
        self.arrow = " → " if view.kind == "top-down" else " ← "
        # A call row's name without the line it came from, by the row's id; the row is kept
        # with it, so that an id is never reused by another row while it is looked up.
        self.names: dict[int, tuple[ViewNode, str]] = {}

    def value(self, node: ViewNode) -> float:
        v = float(node.values[self.key])
        return -math.inf if math.isnan(v) else v

    def name(self, node: ViewNode) -> str:
        """A row's name without the line it is called from."""
        found = self.names.get(id(node))
        return found[1] if found is not None and found[0] is node else node.label

    def caller_file(self, node: ViewNode) -> str | None:
        """The file of the line a call row is called from (top-down), or None."""
        called_from = node.label[len(self.name(node)) :]
        if not called_from.startswith(CALLED_FROM) or ": " not in called_from:
            return None
        return called_from[len(CALLED_FROM) :].rsplit(": ", 1)[0]

    def kids(self, node: ViewNode) -> list[ViewNode]:
        """``node``'s children; top-down, each calling line replaced by the calls it makes."""
        if self.view.kind != "top-down":
            return list(node.children)
        out: list[ViewNode] = []
        for child in node.children:
            called = [k for k in child.children if k.kind in CALL_KINDS]
            if child.kind != "line" or not called:
                out.append(child)
                continue
            for k in called:
                renamed = k.copy(k.children)
                renamed.label = f"{k.label}{CALLED_FROM}{child.label}"
                self.names[id(renamed)] = (renamed, k.label)
                out.append(renamed)
            rest = [k for k in child.children if k.kind not in CALL_KINDS]
            own = child.copy(rest)
            spent = np.sum([k.values for k in called], axis=0)
            # The line alone: its inclusive value less its calls' (a ratio cannot be split).
            alone = np.where(self.additive, own.values - spent, np.nan)
            own.values[self.inclusive] = alone[self.inclusive]
            if rest or self.value(own) > ROUNDING * self.value(child):
                out.append(own)
        return out

    def chain(self, node: ViewNode) -> list[tuple[ViewNode, list[ViewNode]]]:
        """``node`` and the calls below it that each hold nearly all of the row above, each with
        its children (:meth:`kids`)."""
        run = [(node, self.kids(node))]
        home = self.caller_file(node)
        while run[-1][1]:
            last, below = run[-1]
            big = max(below, key=self.value)
            share = PASS_THROUGH_SHARE * self.value(last)
            if big.kind not in CALL_KINDS or not (self.value(big) > 0 and self.value(big) >= share):
                break
            if len(run) > 1 and self.caller_file(last) == home != self.caller_file(big) is not None:
                run.pop()  # ``last`` leaves the first calling line's file: its line stays a row
                break
            home = home or self.caller_file(big)
            run.append((big, self.kids(big)))
        # A run ends where the time is spent: a leaf it reaches stays a row of its own (the hot
        # function is never hidden inside a folded row).
        if len(run) > 1 and not run[-1][1]:
            run.pop()
        return run

    def row(self, node: ViewNode, fold: bool) -> ViewNode:
        """The row standing for ``node``: itself, or (``fold``) the chain it starts folded into
        one."""
        run = self.chain(node) if fold and node.kind in FRAME_KINDS else [(node, self.kids(node))]
        first, last = run[0][0], run[-1][0]
        if len(run) < FOLDED_CHAIN:
            out = first.copy(run[0][1])
            self.names[id(out)] = (out, self.name(first))
            return out
        out = last.copy(list(run[-1][1]))
        out.values = first.values.copy()
        if self.view.kind == "top-down":  # callers of one function all hold the same cost
            # A call's exclusive value is its own; a loop's or line's is its function's too
            # (lex_aware, formats.md §3.2), and only the first row's function is not in the run.
            exclusive = ~self.inclusive & self.additive
            own = [first.values] + [r.values for r, _ in run[1:] if r.kind in CALL_KINDS]
            out.values[exclusive] = np.nansum(own, axis=0)[exclusive]
        for (above, kids), (below, _) in itertools.pairwise(run):
            out.children.extend(c for c in kids if c is not below)
            out.hidden += above.hidden
        head, tail = self.name(first), self.name(last)
        called_from = first.label[len(head) + len(CALLED_FROM) :]
        if self.view.kind == "top-down" and first.label == f"{head}{CALLED_FROM}{called_from}":
            head = f"{called_from}{self.arrow}{head}"  # the line that makes the first call
        hid = len(run) - 2
        out.label = f"{head}{self.arrow}…{self.arrow}{tail} ({hid} frame{'s' * (hid > 1)} folded)"
        out.hot = first.hot
        return out

    def run(self) -> ViewNode:
        root = self.view.root.copy(self.kids(self.view.root))
        stack = [root]
        while stack:
            node = stack.pop()
            # Bottom-up, the functions themselves are not folded: the chains of their callers are.
            fold = self.view.kind == "top-down" or node is not root
            rows = [self.row(child, fold) for child in node.children]
            rows.sort(key=lambda c: -_order(c, self.view.sort_column))
            node.children = rows
            stack.extend(rows)
        return root


def _order(node: ViewNode, column: int) -> float:
    v = float(node.values[column])
    return -math.inf if math.isnan(v) else v


def condense(view: View) -> View:
    """``view`` as a person reads it first (see the module docstring); the flat view as it is."""
    if view.kind not in ("top-down", "bottom-up"):
        return view
    sort = view.sort_column
    if view.kind == "bottom-up":  # the functions that cost most themselves first
        metric = view.columns[sort].metric
        sort = next(
            (i for i, c in enumerate(view.columns) if c.metric == metric and not c.inclusive), sort
        )
        view = View(view.kind, view.title, view.columns, view.root, sort, view.notes)
    root = _Condenser(view).run()
    return View(view.kind, view.title, view.columns, root, sort, view.notes)
