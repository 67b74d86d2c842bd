"""The tree folded to its ranges (``pyview --ranges``, issue #37 item 1).

``pyrun --ranges`` puts each PyTorch module call, ``record_function`` and NVTX range in the tree
as a context node (a function of the pseudo file :data:`~pyhpctk.formats.vocabulary.RANGE_FILE`)
above the Python frames and the GPU work inside it. Folded to those nodes (and the threads'
entries, which keep threads apart) the tree reads as the model does::

    main thread
      ResNet
        layer1 (Sequential)
          layer1.0 (BasicBlock)
            layer1.0.conv1 (Conv2d)

with every other context left out the way interpreter frames are (:mod:`.elide`): a range's
exclusive value is the cost of its own frames and kernels, outside its inner ranges; a thread's,
the cost outside any range.
"""

from __future__ import annotations

import numpy as np

from pyhpctk.formats.vocabulary import RANGE_FILE, LexicalType
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import LEX_ENTRY, ContextTree
from pyhpctk.present.viewmodel import BoolArray, View, ViewOptions
from pyhpctk.present.views import build_view


def range_contexts(tree: ContextTree) -> BoolArray:
    """Which contexts are ranges' nodes (a function context of a range's function)."""
    is_range = np.array(
        [0 <= f.file < len(tree.files) and tree.files[f.file] == RANGE_FILE for f in tree.functions]
        + [False],
        dtype=bool,
    )
    found: BoolArray = is_range[tree.function] & (tree.lexical_type == LexicalType.FUNCTION)
    return found


def outside_ranges(tree: ContextTree) -> BoolArray:
    """The contexts ``pyview --ranges`` leaves out: all but the ranges, the threads' entries
    and the root."""
    kept = range_contexts(tree) | (tree.lexical_type == LEX_ENTRY)
    kept[0] = True
    outside: BoolArray = ~kept
    return outside


def ranges_view(kind: str, catalog: MetricCatalog, options: ViewOptions) -> View:
    """The view ``kind`` of the tree folded to its ranges, with a note saying so (or that the
    measurement has none)."""
    tree = catalog.experiment.tree
    ranges = range_contexts(tree)
    view = build_view(kind, catalog, options, outside_ranges(tree))
    count = int(np.count_nonzero(ranges))
    note = (
        f"folded to its {count:,} range contexts (pyview --ranges): each range's exclusive "
        "cost is its own frames' and kernels', a thread's the cost outside any range"
        if count
        else "this measurement has no ranges (pyrun --ranges measures them): only the "
        "threads are shown"
    )
    return View(view.kind, view.title, view.columns, view.root, view.sort_column, (note,))


__all__ = ["outside_ranges", "range_contexts", "ranges_view"]
