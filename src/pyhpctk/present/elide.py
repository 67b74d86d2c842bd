"""Interpreter frames left out of the views, their cost kept where a reader looks for it.

Every Python profile is full of frames that are the interpreter's, not the program's: the import
system (``<frozen importlib._bootstrap>`` chains, five to ten frames per ``import``, nested once
per package level), ``runpy`` (``python -m``) and ``site`` (the interpreter's start-up), and
the wrappers through which Python calls a function mypyc compiled (``Vector.dot [mypyc
wrapper]`` above ``Vector.dot``, named by pystruct and pyprof). Views
leave them out by default (issue #21 item 3; ``pyview --show-internal`` shows them):

* an elided frame is its function context and its lines and loops (one frame of the program);
  so is a line or loop of native code that no source names (:func:`sourceless_scopes`);
* its callees take its place: they hang below the nearest shown context above it (the line
  that called ``import``), and callees that then print alike (two imports of one module's code
  through different ``importlib`` lines) become one row holding both;
* inclusive values do not change: a row's inclusive value already holds everything below it;
* an elided frame's exclusive (self) cost becomes exclusive cost of the context that called
  it, and of what holds that context exclusively (its innermost loop and its function, as
  ``lex_aware`` nests, formats.md §3.2), so each row's exclusive value plus its children's
  inclusive values still adds up to its inclusive value.

The folded top-down view sums metric inputs over the contexts a row stands for and applies the
formulas after, as the other aggregating views do; the bottom-up and flat views take the same
``elided`` mask (:func:`pyhpctk.present.views.build_view`).
"""

from __future__ import annotations

import re

import numpy as np

from pyhpctk.formats.vocabulary import WRAPPER_MARKS, LexicalType, Relation
from pyhpctk.present.aggregate import Aggregator, finish_view
from pyhpctk.present.labels import context_label, where
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import LEX_ENTRY, ContextTree
from pyhpctk.present.viewmodel import BoolArray, Row, View, ViewOptions, columns_for

#: Files whose frames are the interpreter's: the import system and runpy, frozen or not.
INTERNAL_FILES = (
    "<frozen importlib._bootstrap>",
    "<frozen importlib._bootstrap_external>",
    "<frozen zipimport>",
    "<frozen runpy>",
    "<frozen site>",
)
INTERNAL_SUFFIXES = (
    "/importlib/__init__.py",
    "/importlib/_bootstrap.py",
    "/importlib/_bootstrap_external.py",
    "/zipimport.py",
    "/runpy.py",
)
#: Native modules whose frames only pass control on: asyncio's C accelerator resumes every
#: coroutine through ``task_step`` or ``TaskStepMethWrapper_call`` (issue #36: they split one
#: ``worker`` coroutine 48/47 %); left out, a coroutine is one row whichever way it was resumed.
INTERNAL_MODULES = re.compile(r"(?:^|/)_asyncio(?:\.[^/]*)?\.so$")
# site.py is the interpreter's start-up (and where pyrun's own start-up runs from); matched only
# in the standard library, not a program's own site.py.
STDLIB_SITE = re.compile(r"/lib/python\d+(?:\.\d+)?t?/site\.py$")


def is_internal_file(path: str) -> bool:
    """Whether frames of the source file ``path`` are the interpreter's (see above)."""
    return (
        path in INTERNAL_FILES
        or path.endswith(INTERNAL_SUFFIXES)
        or STDLIB_SITE.search(path) is not None
    )


def sourceless_scopes(tree: ContextTree) -> BoolArray:
    """Lines and loops that no source names: pystruct's scopes of a binary without a line map
    (file ``[libfoo.so]``, line 0). Shown, they are rows ``[libfoo.so]``, ``loop at
    [libfoo.so]`` and call sites ``f [libfoo.so] ← [libfoo.so]`` that say less than the
    function above them; left out, the view reads as it does without pystruct."""
    pseudo = np.array(
        [f.startswith("[") and f.endswith("]") for f in tree.files] + [True], dtype=bool
    )
    lexical = (tree.lexical_type == LexicalType.LINE) | (tree.lexical_type == LexicalType.LOOP)
    nowhere = pseudo[tree.file] & (tree.line <= 0)
    out: BoolArray = lexical & (tree.relation == Relation.LEXICAL) & nowhere
    return out


def moved_cost(tree: ContextTree, elided: BoolArray) -> BoolArray:
    """The ``elided`` contexts whose self cost moves to their caller: those of an elided frame
    (its function context, its lines and loops). A line or loop left out of a shown frame
    (:func:`sourceless_scopes`) moves nothing: its frame's exclusive value holds it already."""
    lexical = (tree.relation == Relation.LEXICAL).tolist()
    parent = tree.parent.tolist()
    frame = list(range(tree.size))
    for i in range(1, tree.size):
        if lexical[i]:
            frame[i] = frame[parent[i]]
    out: BoolArray = elided & elided[np.array(frame, dtype=np.int64)]
    return out


def internal_frames(tree: ContextTree) -> BoolArray:
    """The contexts of interpreter frames: a function (or module-level code) of an internal
    file or a native frame of an internal module, with its lines and loops (the lexical
    contexts below it)."""
    n = tree.size
    out = np.zeros(n, dtype=bool)
    internal_file = np.array([is_internal_file(f) for f in tree.files] + [False], dtype=bool)
    internal_module = np.array(
        [INTERNAL_MODULES.search(m) is not None for m in tree.modules] + [False], dtype=bool
    )
    wrapper = np.array([f.name.endswith(WRAPPER_MARKS) for f in tree.functions] + [False])
    if not internal_file.any() and not internal_module.any() and not wrapper.any():
        return sourceless_scopes(tree)
    function_file = np.array([f.file for f in tree.functions] + [-1], dtype=np.int64)
    function_module = np.array([f.module for f in tree.functions] + [-1], dtype=np.int64)
    own_file = np.where(tree.function >= 0, function_file[tree.function], tree.file)
    own_module = np.where(tree.function >= 0, function_module[tree.function], tree.module)
    # -1 indexes the trailing False
    frame_start = internal_file[own_file] | internal_module[own_module] | wrapper[tree.function]
    lexical = (tree.relation == Relation.LEXICAL).tolist()
    parent = tree.parent.tolist()
    starts = frame_start.tolist()
    flags = [False] * n
    for i in range(1, n):
        flags[i] = flags[parent[i]] if lexical[i] else starts[i]
    out[:] = flags
    return out | sourceless_scopes(tree)


def _identity(tree: ContextTree, node: int) -> tuple[int, ...]:
    """What a context is among its siblings, as meta.db stores it."""
    return (
        int(tree.lexical_type[node]),
        int(tree.relation[node]),
        int(tree.function[node]),
        int(tree.file[node]),
        int(tree.line[node]),
        int(tree.module[node]),
        int(tree.offset[node]),
        hash(tree.names[node]),
    )


def _exclusive_holders(tree: ContextTree, node: int) -> list[int]:
    """``node`` and the contexts whose exclusive value holds its own cost: up its lexical
    parents, the innermost loop and the frame's function (formats.md §3.2, ``lex_aware``)."""
    out = [node]
    loop_seen = int(tree.lexical_type[node]) == LexicalType.LOOP
    current = node
    while int(tree.relation[current]) == Relation.LEXICAL and current > 0:
        current = int(tree.parent[current])
        lex = int(tree.lexical_type[current])
        if lex == LexicalType.LOOP:
            if not loop_seen:
                out.append(current)
                loop_seen = True
        elif (
            lex in (LexicalType.FUNCTION, LEX_ENTRY)
            or int(tree.relation[current]) != Relation.LEXICAL
        ):
            out.append(current)
            break
    return out


def folded_top_down(catalog: MetricCatalog, options: ViewOptions, elided: BoolArray) -> View:
    """The top-down view without the ``elided`` contexts (see the module docstring)."""
    exp = catalog.experiment
    tree = exp.tree
    n = tree.size
    agg = Aggregator(catalog, options, columns_for(catalog, options))
    parent: list[int] = tree.parent.tolist()
    hidden: list[bool] = elided.tolist()
    # at[i]: the shown context i stands for (itself, or the nearest shown one above it).
    at = list(range(n))
    row = [-1] * n
    row[0] = 0
    rows_parent = [-1]
    members: list[list[int]] = [[0]]
    index: dict[tuple[int, tuple[int, ...]], int] = {}
    for i in range(1, n):
        up = at[parent[i]]
        if hidden[i]:
            at[i] = up
            continue
        key = (row[up], _identity(tree, i))
        found = index.get(key)
        if found is None:
            found = len(members)
            index[key] = found
            members.append([])
            rows_parent.append(row[up])
        members[found].append(i)
        row[i] = found
    groups = len(members)
    member_rows = np.array(row, dtype=np.int64)
    shown = np.flatnonzero(member_rows >= 0)
    inc = np.zeros((len(agg.inc), groups))
    for source, target in zip(agg.inc, inc, strict=True):
        target += np.bincount(member_rows[shown], source[shown], groups)
    # Exclusive inputs as the database has them (lex_aware), summed over members, plus the
    # self cost of the elided frames each row now holds.
    exc = np.zeros((len(agg.exclusive_inputs), groups))
    for k, (name, ref) in enumerate(agg.exclusive_inputs):
        inp = catalog.get(name).inputs[ref]
        column = catalog.input_column(inp)
        if inp.combine != "sum":
            column = np.full(n, np.nan)
        exc[k] = np.bincount(member_rows[shown], column[shown], groups)
    holders: dict[int, list[int]] = {}
    sources: list[int] = []
    targets: list[int] = []
    for e in np.flatnonzero(moved_cost(tree, elided)).tolist():
        anchor = at[e]
        found_holders = holders.get(anchor)
        if found_holders is None:
            found_holders = sorted({row[h] for h in _exclusive_holders(tree, anchor)})
            holders[anchor] = found_holders
        sources.extend([e] * len(found_holders))
        targets.extend(found_holders)
    if sources:
        extra = agg.self_cost[:, np.array(sources, dtype=np.int64)]
        np.add.at(exc.T, np.array(targets, dtype=np.int64), extra.T)
    labels: list[Row] = []
    for g in range(groups):
        node = members[g][0]
        label, kind = context_label(tree, node)
        file, line, module = where(tree, node)
        labels.append((label, kind, file, line, module))
    labels[0] = (exp.title or "<root>", "root", None, 0, None)
    ctx_ids = [int(tree.ctx_id[m[0]]) for m in members]
    view = finish_view(
        agg, labels, rows_parent, inc, exc, exp.title, "top-down", None, ctx_ids, True
    )
    count = int(np.count_nonzero(elided))
    note = (
        f"{count:,} contexts of interpreter frames (import system, runpy, site, asyncio's "
        "C accelerator, mypyc's and Cython's wrappers) and native lines and loops without a "
        "source are left out, their cost kept in their callers "
        "(--show-internal shows them)"
    )
    return View(view.kind, view.title, view.columns, view.root, view.sort_column, (note,))
