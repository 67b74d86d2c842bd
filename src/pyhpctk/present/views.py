"""The view table: every view pyview shows, as objects that satisfy one protocol.

* **top-down** (:mod:`.topdown`) — the calling context tree itself: entry points, functions
  reached by calls, inlined functions (``[I] name``), loops (``loop at file: line``), lines
  (``file: line``) and, without structure information, raw instructions (``module+0xoffset``).
* **bottom-up** (:mod:`.callers`) — every function with its total cost, expandable into the
  chains of callers that cost came through; recursion is counted once (the outermost instance).
* **flat** (:mod:`.flat`) — static structure: load module → file → function → inlined function
  / loop → line, each context's cost gathered where it sits in the code.

A view is built into a :class:`~pyhpctk.present.viewmodel.View` (:mod:`.viewmodel`), a small tree
of rows the renderers print. ``pyview``'s view options (``--top-down``, ...) and their help are
derived from :data:`VIEWS`: adding a view is one new module and one line here.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from pyhpctk.present.callers import BottomUp
from pyhpctk.present.flat import Flat
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.topdown import TopDown
from pyhpctk.present.viewmodel import BoolArray, View, ViewOptions


class ViewBuilder(Protocol):
    """One view: its name (``pyview --NAME``), its one-line help, and how it is built."""

    @property
    def name(self) -> str: ...

    @property
    def help(self) -> str: ...

    def build(self, catalog: MetricCatalog, options: ViewOptions, elided: BoolArray | None) -> View:
        """The view of ``catalog``'s experiment, leaving out the ``elided`` contexts (their
        cost stays with their callers: :mod:`pyhpctk.present.elide`); None: leave none out."""
        ...


#: Every view, the default first.
VIEWS: tuple[ViewBuilder, ...] = (TopDown(), BottomUp(), Flat())
VIEW_KINDS = tuple(view.name for view in VIEWS)


def build_view(
    kind: str, catalog: MetricCatalog, options: ViewOptions, elided: BoolArray | None = None
) -> View:
    """Build the named view (one of :data:`VIEW_KINDS`), leaving out ``elided`` contexts."""
    if elided is not None and not np.any(elided):
        elided = None
    for view in VIEWS:
        if view.name == kind:
            return view.build(catalog, options, elided)
    raise ValueError(f"unknown view {kind!r}")
