"""Read, write, dump and check HPCToolkit's ``meta.db`` (database format v4.0, formats.md §3.2).

``meta.db`` holds everything about a database except the metric values: the program title, the
id-tuple kind names, the metric descriptions and their propagation scopes, the load modules,
source files and functions, and the calling context tree (entry points and contexts). pyprof
*builds* a :class:`MetaDB` from scratch and writes it; pyview reads one and navigates the tree
through :meth:`MetaDB.index` (a :class:`ContextIndex`: a flat numpy table of every context plus
lookups by ctxId). This module knows only this one file; the frame shared with ``profile.db``,
``cct.db`` and ``trace.db`` (header, footer, strings, bounds checks) lives in
:mod:`pyhpctk.formats._db`. It must never import anything above ``formats``.

Model
    Objects refer to each other **by index**: a :class:`Function`'s ``module``/``file``, a
    :class:`Context`'s ``function``/``file``/``module`` are indices into ``MetaDB.modules``,
    ``.files`` and ``.functions`` (``None`` = absent), and a metric's scope instances and
    summaries name scopes by index into ``MetaDB.scopes``. A context's payload flags are derived:
    hasFunction iff ``function is not None``, hasSrcLoc iff ``file is not None`` (then ``line``
    counts), hasPoint iff ``module is not None`` (then ``offset`` counts). Enum-valued fields
    (relation, lexical type, scope type, combine, entry-point kind) are plain ints so that
    unknown values survive a round trip (§3.1, forward compatibility); the ``IntEnum`` classes
    here name the known ones.

Writer: hpcprof's exact layout (§3.6 and hpcprof's ``sinks/metadb.cpp``), checked byte for byte
against every ``meta.db`` of the reference databases:

- header and section table (0x90 bytes), then each section 8-aligned with NUL padding, in the
  order General, IdNames, Metrics, Strings, Modules, Files, Functions, Context, then the footer;
- General: its 16-byte header, the title, the description;
- IdNames: 9-byte header, an empty string, the names, then (8-aligned) the pointer array;
- Metrics: 27-byte header; the scope names, then (8-aligned) the scopes; per metric: the scope
  instances (8-aligned), its formula strings (one copy per summary, never deduplicated), the
  summaries (8-aligned) and its name; then (8-aligned) the metric descriptions;
- Strings: the deduplicated pool, no header;
- Modules / Files / Functions: 14-byte header, then (8-aligned) the entries;
- Context: 11-byte header, then (8-aligned) every non-empty child array in post-order (an array
  after the arrays of all its descendants, entry points' subtrees in order), then the entry
  points. A leaf has ``szChildren = pChildren = 0``, except a leaf whose children hpcprof elided
  (§3.7): hpcprof writes an empty array for it, so ``pChildren`` is the offset the traversal had
  reached; :attr:`Context.elided_children` keeps that fact so the bytes come back.

The one thing not derivable from the model is the order of the Strings pool, which hpcprof fills
in the order its worker threads first met each string. :func:`read` records it in
``MetaDB.string_order``, a layout hint that the writer seeds its pool with (strings the model no
longer uses stay in the pool); without it the writer uses a canonical order: the entry-point
names, then each function's name, module path and file path in table order, then the remaining
module and file paths. The hint is not part of equality. With it, ``write(read(f))`` gives back
the same bytes for every hpcprof file in the reference data; without it, only the Strings order
(and so string pointers) can differ from hpcprof's.

Reader: every pointer and size is bounds-checked; every function/file/module/scope pointer must
hit an entry of its table; child arrays must be tiled exactly by their records, and may not be
shared or overlap (so a corrupt file cannot loop); neither may the metrics' scope-instance and
summary arrays, nor the strings named (so a small file cannot name the square of its size).
Bad input raises :class:`~pyhpctk.errors.FormatError`; a newer minor version warns. The Context
section is read in two passes: a loop that only finds record offsets (depth-first pre-order),
then bulk numpy gathers of all fields, flags and flex words, from which both the objects and the
flat index are made; the writer lays out all context records with numpy in one go. Deep trees
are handled without recursion.
"""

from __future__ import annotations

import contextlib
import gc
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats import _blocks, _db
from pyhpctk.formats._db import Buffer
from pyhpctk.formats.vocabulary import (
    DEFAULT_ID_NAMES,
    ENTRY_POINT_NAMES,
    FILE_COPIED,
    NO_PROPAGATION_INDEX,
    PROPAGATION_FUNCTION_BIT,
    Combine,
    ContextFlags,
    LexicalType,
    Relation,
    ScopeType,
    StandardScope,
)
from pyhpctk.formats.vocabulary import EntryPoint as EntryPointKind

FORMAT_ID = b"meta"
FOOTER = _db.FOOTERS[FORMAT_ID]
N_SECTIONS = 8
HEADER_END = _db.HEADER_SIZE + N_SECTIONS * _db.SECTION_ENTRY_SIZE
assert HEADER_END == 0x90

# formats.md §3.2, file header: section k's (size, offset) pair sits at 0x10 + 16*k.
SEC_GENERAL, SEC_ID_NAMES, SEC_METRICS, SEC_CONTEXT = 0, 1, 2, 3
SEC_STRINGS, SEC_MODULES, SEC_FILES, SEC_FUNCTIONS = 4, 5, 6, 7
SECTION_NAMES = (
    "General",
    "IdNames",
    "Metrics",
    "Context",
    "Strings",
    "Modules",
    "Files",
    "Functions",
)


# formats.md §3.2, General section (expandable).
GENERAL_DTYPE = _db.struct_dtype([("pTitle", "<u8", 0x00), ("pDescription", "<u8", 0x08)], 0x10)
# formats.md §3.2, IdNames section header.
ID_NAMES_DTYPE = _db.struct_dtype([("ppNames", "<u8", 0x00), ("nKinds", "u1", 0x08)], 0x09)
# formats.md §3.2, Metrics section header; nScopes is u16 on disk (§3.9 item 4).
METRICS_HEADER_DTYPE = _db.struct_dtype(
    [
        ("pMetrics", "<u8", 0x00),
        ("nMetrics", "<u4", 0x08),
        ("szMetric", "u1", 0x0C),
        ("szScopeInst", "u1", 0x0D),
        ("szSummary", "u1", 0x0E),
        ("pScopes", "<u8", 0x10),
        ("nScopes", "<u2", 0x18),
        ("szScope", "u1", 0x1A),
    ],
    0x1B,
)
# formats.md §3.2, {MD} metric description.
METRIC_DTYPE = _db.struct_dtype(
    [
        ("pName", "<u8", 0x00),
        ("pScopeInsts", "<u8", 0x08),
        ("pSummaries", "<u8", 0x10),
        ("nScopeInsts", "<u2", 0x18),
        ("nSummaries", "<u2", 0x1A),
    ],
    0x20,
)
# formats.md §3.2, {PSI} propagation-scope instance.
SCOPE_INST_DTYPE = _db.struct_dtype([("pScope", "<u8", 0x00), ("propMetricId", "<u2", 0x08)], 0x10)
# formats.md §3.2, {SS} summary statistic.
SUMMARY_DTYPE = _db.struct_dtype(
    [
        ("pScope", "<u8", 0x00),
        ("pFormula", "<u8", 0x08),
        ("combine", "u1", 0x10),
        ("statMetricId", "<u2", 0x12),
    ],
    0x18,
)
# formats.md §3.2, {PS} propagation scope.
SCOPE_DTYPE = _db.struct_dtype(
    [("pScopeName", "<u8", 0x00), ("type", "u1", 0x08), ("propagationIndex", "u1", 0x09)], 0x10
)
# formats.md §3.2: Modules, Files and Functions section headers share one shape.
TABLE_HEADER_DTYPE = _db.struct_dtype(
    [("pEntries", "<u8", 0x00), ("nEntries", "<u4", 0x08), ("szEntry", "<u2", 0x0C)], 0x0E
)
MODULE_DTYPE = _db.struct_dtype([("flags", "<u4", 0x00), ("pPath", "<u8", 0x08)], 0x10)
FILE_DTYPE = _db.struct_dtype([("flags", "<u4", 0x00), ("pPath", "<u8", 0x08)], 0x10)
FUNCTION_DTYPE = _db.struct_dtype(
    [
        ("pName", "<u8", 0x00),
        ("pModule", "<u8", 0x08),
        ("offset", "<u8", 0x10),
        ("pFile", "<u8", 0x18),
        ("line", "<u4", 0x20),
        ("flags", "<u4", 0x24),
    ],
    0x28,
)
# formats.md §3.2 and §3.9 item 3, Context section header.
CONTEXTS_HEADER_DTYPE = _db.struct_dtype(
    [("pEntryPoints", "<u8", 0x00), ("nEntryPoints", "<u2", 0x08), ("szEntryPoint", "u1", 0x0A)],
    0x0B,
)
# formats.md §3.2, {Entry} entry point.
ENTRY_POINT_DTYPE = _db.struct_dtype(
    [
        ("szChildren", "<u8", 0x00),
        ("pChildren", "<u8", 0x08),
        ("ctxId", "<u4", 0x10),
        ("entryPoint", "<u2", 0x14),
        ("pPrettyName", "<u8", 0x18),
    ],
    0x20,
)
# formats.md §3.2, {Ctx} context: this fixed head, then nFlexWords 8-byte flex words.
#
#   0x00 szChildren   0x08 pChildren   0x10 ctxId(u32) flags relation lexicalType nFlexWords
#   0x18 propagation(u16) pad[6]       0x20 flex: [pFunction] [pFile, line|pad] [pModule, offset]
CONTEXT_DTYPE = _db.struct_dtype(
    [
        ("szChildren", "<u8", 0x00),
        ("pChildren", "<u8", 0x08),
        ("ctxId", "<u4", 0x10),
        ("flags", "u1", 0x14),
        ("relation", "u1", 0x15),
        ("lexicalType", "u1", 0x16),
        ("nFlexWords", "u1", 0x17),
        ("propagation", "<u2", 0x18),
    ],
    0x20,
)
for _dtype, _size in (
    (GENERAL_DTYPE, 16),
    (METRICS_HEADER_DTYPE, 27),
    (METRIC_DTYPE, 32),
    (SCOPE_INST_DTYPE, 16),
    (SUMMARY_DTYPE, 24),
    (SCOPE_DTYPE, 16),
    (MODULE_DTYPE, 16),
    (FILE_DTYPE, 16),
    (FUNCTION_DTYPE, 40),
    (ENTRY_POINT_DTYPE, 32),
    (CONTEXT_DTYPE, 32),
):
    assert _dtype.itemsize == _size

# formats.md §3.2: the enumerations and flag bits are the database's vocabulary (.vocabulary),
# re-exported here under the names this module's users know (EntryPointKind is its EntryPoint:
# here EntryPoint is the record).
CTX_HAS_FUNCTION, CTX_HAS_SRCLOC, CTX_HAS_POINT = (int(flag) for flag in ContextFlags)

DEFAULT_TITLE = "<unnamed>"
DEFAULT_DESCRIPTION = "TODO database description"


# ------------------------------------------------------------------------------------------------
# Model


@dataclass(frozen=True, slots=True)
class PropagationScope:
    """{PS}: how a metric's values propagate up the tree (formats.md §3.2)."""

    name: str
    type: int
    propagation_index: int = NO_PROPAGATION_INDEX


# formats.md §3.2: hpcprof always emits exactly these 4 scopes, in this order.
STANDARD_SCOPES = tuple(
    PropagationScope(scope.label, scope.scope_type, scope.propagation_index)
    for scope in StandardScope
)


@dataclass(frozen=True, slots=True)
class ScopeInstance:
    """{PSI}: a metric in one scope; ``scope`` indexes ``MetaDB.scopes``."""

    scope: int
    prop_metric_id: int


@dataclass(frozen=True, slots=True)
class SummaryStatistic:
    """{SS}: a summary-profile statistic; ``scope`` indexes ``MetaDB.scopes``."""

    scope: int
    formula: str
    combine: int
    stat_metric_id: int


@dataclass(frozen=True, slots=True)
class Metric:
    """{MD}: one metric, its scope instances (prop ids) and summaries (stat ids)."""

    name: str
    scope_insts: tuple[ScopeInstance, ...] = ()
    summaries: tuple[SummaryStatistic, ...] = ()

    @classmethod
    def standard(cls, name: str, base_id: int, n_scopes: int = len(STANDARD_SCOPES)) -> Metric:
        """The shape hpcprof gives a plain metric (§3.2 metric ids): scope k has prop id and
        ``sum`` of ``$$`` stat id ``base_id + k``."""
        return cls(
            name,
            tuple(ScopeInstance(k, base_id + k) for k in range(n_scopes)),
            tuple(SummaryStatistic(k, "$$", Combine.SUM, base_id + k) for k in range(n_scopes)),
        )


@dataclass(frozen=True, slots=True)
class Module:
    """A load module (formats.md §3.2): absolute path, path relative to the measurements, or
    ``<logical python>``."""

    path: str
    flags: int = 0


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A source file; ``copied`` means it was copied into the database's ``src/``.

    ``flags`` keeps any flag bits other than ``copied`` (none are defined today).
    """

    path: str
    copied: bool = False
    flags: int = 0

    @property
    def raw_flags(self) -> int:
        """The on-disk flags word."""
        return (self.flags & ~FILE_COPIED) | (FILE_COPIED if self.copied else 0)


@dataclass(frozen=True, slots=True)
class Function:
    """A function (formats.md §3.2): ``module``/``file`` index the tables or are None.

    ``offset`` 0 also means unknown (§3.9 item 6); names are not unique.
    """

    name: str | None
    module: int | None = None
    offset: int = 0
    file: int | None = None
    line: int = 0
    flags: int = 0


@dataclass(slots=True, eq=False)
class Context:
    """One calling context (formats.md §3.2 {Ctx}, §3.7).

    The payload flags come from which of ``function``, ``file`` (with ``line``) and ``module``
    (with ``offset``) are set. ``propagation`` is the scope-bit mask (bit 0 iff lexical).
    ``elided_children`` marks a leaf whose children hpcprof elided (lexical instruction contexts,
    §3.7): hpcprof still writes an empty child array for it, so its ``pChildren`` is not 0.
    Equality compares whole subtrees without recursion.
    """

    ctx_id: int
    relation: int = Relation.CALL
    lexical_type: int = LexicalType.FUNCTION
    function: int | None = None
    file: int | None = None
    line: int = 0
    module: int | None = None
    offset: int = 0
    propagation: int = 0
    children: list[Context] = field(default_factory=list)
    elided_children: bool = False

    @property
    def flags(self) -> int:
        """The on-disk flags byte: hasFunction, hasSrcLoc, hasPoint."""
        return (
            (CTX_HAS_FUNCTION if self.function is not None else 0)
            | (CTX_HAS_SRCLOC if self.file is not None else 0)
            | (CTX_HAS_POINT if self.module is not None else 0)
        )

    def _key(self) -> tuple[object, ...]:
        return (
            self.ctx_id,
            self.relation,
            self.lexical_type,
            self.function,
            self.file,
            self.line,
            self.module,
            self.offset,
            self.propagation,
            self.elided_children and not self.children,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Context):
            return NotImplemented
        return _trees_equal([self], [other])

    __hash__ = None  # type: ignore[assignment]


@dataclass(slots=True, eq=False)
class EntryPoint:
    """{Entry}: a top-level context ("main thread", ...) under the implicit global context 0."""

    ctx_id: int
    kind: int = EntryPointKind.MAIN_THREAD
    pretty_name: str = "main thread"
    children: list[Context] = field(default_factory=list)

    def _key(self) -> tuple[object, ...]:
        return (self.ctx_id, self.kind, self.pretty_name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EntryPoint):
            return NotImplemented
        return _trees_equal([self], [other])

    __hash__ = None  # type: ignore[assignment]


Node = Context | EntryPoint


def _trees_equal(left: Sequence[Node], right: Sequence[Node]) -> bool:
    """Compare two forests node by node, iteratively (trees may be deeper than the C stack)."""
    stack: list[tuple[Sequence[Node], Sequence[Node]]] = [(left, right)]
    while stack:
        a, b = stack.pop()
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):
            if type(x) is not type(y) or x._key() != y._key():
                return False
            if x.children or y.children:
                stack.append((x.children, y.children))
    return True


def iter_contexts(roots: Sequence[Node]) -> Iterator[tuple[Node, Node | None, int]]:
    """Every node under ``roots`` in depth-first pre-order, as ``(node, parent, depth)``."""
    stack: list[tuple[Node, Node | None, int]] = [(r, None, 0) for r in reversed(roots)]
    while stack:
        node, parent, depth = stack.pop()
        yield node, parent, depth
        stack.extend((c, node, depth + 1) for c in reversed(node.children))


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while making many small objects.

    Creating 10^6 contexts with the collector on triggers repeated full scans and costs ~3x the
    time; nothing made in these loops is cyclic garbage. The previous state is restored.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _fill_parent_ids(table: npt.NDArray[np.void], parent_row: npt.NDArray[np.int64]) -> None:
    """Set ``parent_ctx_id`` from the parent rows (0, the global context, for entry points)."""
    if len(table):
        table["parent_ctx_id"] = np.where(
            parent_row >= 0, table["ctx_id"][np.maximum(parent_row, 0)], 0
        )


# Row layout of ContextIndex.table: one row per entry point and context, depth-first pre-order.
CONTEXT_TABLE_DTYPE = np.dtype(
    [
        ("ctx_id", "<u4"),
        ("parent_ctx_id", "<u4"),  # 0 (the global context) for entry points
        ("depth", "<u4"),  # entry points are depth 0
        ("entry_point", "<i2"),  # the entry-point kind, -1 for ordinary contexts
        ("relation", "u1"),  # NO_ENUM for entry points
        ("lexical_type", "u1"),  # NO_ENUM for entry points
        ("propagation", "<u2"),
        ("function", "<i4"),  # index into MetaDB.functions, -1 if none
        ("file", "<i4"),  # index into MetaDB.files, -1 if none
        ("line", "<u4"),
        ("module", "<i4"),  # index into MetaDB.modules, -1 if none
        ("offset", "<u8"),
    ]
)
NO_ENUM = 255


class ContextIndex:
    """pyview's navigation over a :class:`MetaDB`'s tree, built once.

    ``table`` is a numpy structured array (:data:`CONTEXT_TABLE_DTYPE`), one row per entry point
    and context in depth-first pre-order; ``nodes[row]`` is the object of that row and
    ``parent_row[row]`` its parent's row (-1 under the global context). ctxId 0 is the implicit
    global context: its children are the entry points.
    """

    __slots__ = ("_ids_sorted", "_rows_sorted", "nodes", "parent_row", "table")

    def __init__(
        self,
        table: npt.NDArray[np.void],
        nodes: list[Node],
        parent_row: npt.NDArray[np.int64],
    ) -> None:
        """Wrap ready-made columns; use :meth:`build` to index a tree of objects."""
        if not (len(table) == len(nodes) == len(parent_row)):
            raise ValueError("table, nodes and parent_row must have one entry per row")
        self.table: npt.NDArray[np.void] = table
        self.nodes: list[Node] = nodes
        self.parent_row: npt.NDArray[np.int64] = parent_row
        order = np.argsort(table["ctx_id"], kind="stable")
        self._ids_sorted: npt.NDArray[np.uint32] = table["ctx_id"][order]
        self._rows_sorted: npt.NDArray[np.int64] = order.astype(np.int64)

    @classmethod
    def build(cls, roots: Sequence[EntryPoint]) -> ContextIndex:
        """Index the trees under ``roots`` (one pass over the objects, then numpy)."""
        nodes: list[Node] = []
        rows: list[tuple[int, ...]] = []
        parents: list[int] = []
        with _no_gc():
            stack: list[tuple[Node, int, int]] = [(r, -1, 0) for r in reversed(roots)]
            while stack:
                node, parent, depth = stack.pop()
                row = len(nodes)
                nodes.append(node)
                parents.append(parent)
                if isinstance(node, Context):
                    has_sl, has_pt = node.file is not None, node.module is not None
                    rows.append(
                        (
                            node.ctx_id,
                            0,
                            depth,
                            -1,
                            node.relation,
                            node.lexical_type,
                            node.propagation,
                            -1 if node.function is None else node.function,
                            -1 if node.file is None else node.file,
                            node.line if has_sl else 0,
                            -1 if node.module is None else node.module,
                            node.offset if has_pt else 0,
                        )
                    )
                else:
                    rows.append(
                        (node.ctx_id, 0, depth, node.kind, NO_ENUM, NO_ENUM, 0, -1, -1, 0, -1, 0)
                    )
                stack.extend((c, row, depth + 1) for c in reversed(node.children))
        table = np.array(rows, dtype=CONTEXT_TABLE_DTYPE)
        parent_row = np.array(parents, dtype=np.int64)
        _fill_parent_ids(table, parent_row)
        return cls(table, nodes, parent_row)

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, ctx_id: object) -> bool:
        return isinstance(ctx_id, int) and self.row(ctx_id, None) is not None

    def rows(self, ctx_ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The rows of many ctxIds at once (-1 where absent, e.g. elided contexts, §3.7)."""
        ids = np.asarray(ctx_ids, dtype=np.int64)
        pos = np.searchsorted(self._ids_sorted, ids)
        pos = np.minimum(pos, max(len(self._ids_sorted) - 1, 0))
        if not len(self._ids_sorted):
            return np.full(ids.shape, -1, dtype=np.int64)
        found = self._ids_sorted[pos] == ids
        return np.where(found, self._rows_sorted[pos], -1)

    def row(self, ctx_id: int, default: int | None = -1) -> int | None:
        """The row of ``ctx_id``, or ``default`` when no entry point or context has it."""
        r = int(self.rows([ctx_id])[0])
        return default if r < 0 else r

    def node(self, ctx_id: int) -> Node:
        """The entry point or context with ``ctx_id`` (KeyError if absent)."""
        r = self.row(ctx_id, None)
        if r is None:
            raise KeyError(ctx_id)
        return self.nodes[r]

    def parent(self, ctx_id: int) -> int | None:
        """The parent's ctxId (0 for entry points), or None for 0 and unknown ids."""
        r = self.row(ctx_id, None)
        if r is None:
            return None
        return int(self.table["parent_ctx_id"][r])

    def children(self, ctx_id: int) -> list[Node]:
        """The children of ``ctx_id``; ctxId 0 (the global context) has the entry points."""
        if ctx_id == 0:
            return [self.nodes[r] for r in np.flatnonzero(self.parent_row < 0)]
        return list(self.node(ctx_id).children)

    def ancestors(self, ctx_id: int) -> list[int]:
        """ctxIds from ``ctx_id``'s parent up to its entry point (empty for entry points)."""
        out: list[int] = []
        r = self.row(ctx_id, None)
        if r is None:
            raise KeyError(ctx_id)
        r = int(self.parent_row[r])
        while r >= 0:
            out.append(int(self.table["ctx_id"][r]))
            r = int(self.parent_row[r])
        return out


@dataclass(slots=True, eq=False)
class MetaDB:
    """The whole of a ``meta.db`` (formats.md §3.2); see the module docstring for the rules.

    ``string_order`` is a layout hint (the Strings pool order read from a file), not data: it is
    ignored by ``==``, as is ``read_problems``: what :func:`read` saw in the bytes that the model
    cannot hold (a string outside the Strings pool), which :func:`verify` reports.
    :meth:`index` caches a :class:`ContextIndex`; call :meth:`invalidate_index` after changing
    the tree.
    """

    title: str = DEFAULT_TITLE
    description: str = DEFAULT_DESCRIPTION
    id_names: list[str] = field(default_factory=lambda: list(DEFAULT_ID_NAMES))
    scopes: list[PropagationScope] = field(default_factory=lambda: list(STANDARD_SCOPES))
    metrics: list[Metric] = field(default_factory=list)
    modules: list[Module] = field(default_factory=list)
    files: list[SourceFile] = field(default_factory=list)
    functions: list[Function] = field(default_factory=list)
    entry_points: list[EntryPoint] = field(default_factory=list)
    string_order: tuple[str, ...] | None = None
    read_problems: tuple[str, ...] = field(default=(), repr=False)
    _index: ContextIndex | None = field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MetaDB):
            return NotImplemented
        return (
            self.title == other.title
            and self.description == other.description
            and self.id_names == other.id_names
            and self.scopes == other.scopes
            and self.metrics == other.metrics
            and self.modules == other.modules
            and self.files == other.files
            and self.functions == other.functions
            and _trees_equal(self.entry_points, other.entry_points)
        )

    __hash__ = None  # type: ignore[assignment]

    def index(self) -> ContextIndex:
        """The (cached) flat index of the context tree."""
        if self._index is None:
            self._index = ContextIndex.build(self.entry_points)
        return self._index

    def invalidate_index(self) -> None:
        """Forget the cached index (after the tree was changed)."""
        self._index = None

    def contexts(self) -> Iterator[tuple[Node, Node | None, int]]:
        """Every entry point and context, depth-first pre-order, as ``(node, parent, depth)``."""
        return iter_contexts(self.entry_points)


# ------------------------------------------------------------------------------------------------
# Reading


def sniff(head: bytes) -> bool:
    """Is this the start of a ``meta.db``?"""
    return _db.sniff(head, FORMAT_ID)


class _Reader:
    """One read of one buffer: holds the buffer, the path for messages and the section table."""

    def __init__(self, buf: Buffer, path: str | None) -> None:
        self.buf = buf
        self.path = path
        self.size = len(buf)
        self.strings: dict[int, str] = {}
        # Bytes of distinct strings decoded so far: hpcprof's strings are disjoint, so more than
        # the file holds means pointers into one another's strings (a file naming far more
        # text than it holds, pointer by pointer).
        self.decoded = 0

    def fail(self, section: str, problem: str) -> FormatError:
        return FormatError(self.path, section, problem)

    def array(
        self,
        offset: int,
        dtype: np.dtype[Any],
        count: int,
        stride: int,
        section: str,
        what: str,
    ) -> npt.NDArray[Any]:
        """``count`` records of ``dtype`` every ``stride`` bytes (stored sizes, §3.1)."""
        if count and stride < dtype.itemsize:
            raise self.fail(
                section, f"{what}: element size {stride} is smaller than {dtype.itemsize}"
            )
        if count == 0:
            return np.zeros(0, dtype=dtype)
        _db.check_range(
            self.size, offset, (count - 1) * stride + dtype.itemsize, self.path, section, what
        )
        return np.ndarray(
            shape=(count,), dtype=dtype, buffer=self.buf, offset=offset, strides=(stride,)
        )

    def string(self, pointer: int, section: str) -> str:
        found = self.strings.get(pointer)
        if found is None:
            found = _db.cstring_at(self.buf, pointer, self.path, section)
            self.strings[pointer] = found
            self.decoded += len(found)
            if self.decoded > self.size:
                raise self.fail(
                    section,
                    f"string pointers overlap: the strings named add up to more than the "
                    f"file's {self.size} bytes",
                )
        return found


def _resolve(
    pointers: npt.NDArray[np.uint64],
    base: int,
    stride: int,
    count: int,
    fail: FormatError,
    allow_null: bool,
) -> npt.NDArray[np.int64]:
    """Turn pointers to table entries into indices (-1 for a null pointer when allowed)."""
    # Unsigned arithmetic throughout: pointers and bases are arbitrary u64s in a corrupt file.
    p = pointers.astype(np.uint64)
    step = np.uint64(max(stride, 1))
    above = p >= np.uint64(base)
    rel = np.where(above, p - np.uint64(base), np.uint64(0))
    idx = rel // step
    ok = above & (rel % step == 0) & (idx < np.uint64(count))
    null = p == 0
    if allow_null:
        ok |= null
    if not bool(np.all(ok)):
        bad = int(p[np.flatnonzero(~ok)[0]])
        raise FormatError(fail.path, fail.section, f"{fail.problem} 0x{bad:x}")
    return np.where(null, -1, idx.astype(np.int64))


def read(source: _db.Source) -> MetaDB:
    """Read a ``meta.db`` from a path, a buffer or a binary file object."""
    buf, path = _db.open_source(source)
    return read_buffer(buf, path)


def read_buffer(buf: Buffer, path: str | None = None) -> MetaDB:
    """Read a ``meta.db`` held in ``buf``; ``path`` names it in error messages."""
    with _no_gc():
        return _read_buffer(buf, path)


def _read_buffer(buf: Buffer, path: str | None) -> MetaDB:
    _, sections = _db.read_header(buf, path, FORMAT_ID, N_SECTIONS)
    _db.check_footer(buf, path, FOOTER)
    r = _Reader(buf, path)
    for k, (size, offset) in enumerate(sections):
        if offset + size > r.size - _db.FOOTER_SIZE:
            raise r.fail("header", f"{SECTION_NAMES[k]} section overlaps the footer")

    def need(k: int, dtype: np.dtype[np.void]) -> np.void:
        size, offset = sections[k]
        if size < dtype.itemsize:
            raise r.fail(
                SECTION_NAMES[k],
                f"section is {size} bytes, smaller than its {dtype.itemsize}-byte header",
            )
        return _db.read_record(buf, offset, dtype, path, SECTION_NAMES[k], "section header")

    # formats.md §3.2, General.
    general = need(SEC_GENERAL, GENERAL_DTYPE)
    title = r.string(int(general["pTitle"]), "General")
    description = r.string(int(general["pDescription"]), "General")

    # IdNames.
    idn = need(SEC_ID_NAMES, ID_NAMES_DTYPE)
    name_ptrs = r.array(
        int(idn["ppNames"]), np.dtype("<u8"), int(idn["nKinds"]), 8, "IdNames", "name pointers"
    )
    id_names = [r.string(int(p), "IdNames") for p in name_ptrs.tolist()]

    # Metrics.
    mh = need(SEC_METRICS, METRICS_HEADER_DTYPE)
    n_scopes, p_scopes, sz_scope = int(mh["nScopes"]), int(mh["pScopes"]), int(mh["szScope"])
    scope_recs = r.array(p_scopes, SCOPE_DTYPE, n_scopes, sz_scope, "Metrics", "scopes")
    scopes = [
        PropagationScope(
            r.string(int(s["pScopeName"]), "Metrics"), int(s["type"]), int(s["propagationIndex"])
        )
        for s in scope_recs
    ]
    metric_recs = r.array(
        int(mh["pMetrics"]),
        METRIC_DTYPE,
        int(mh["nMetrics"]),
        int(mh["szMetric"]),
        "Metrics",
        "metric descriptions",
    )
    # formats.md §3.6: each metric has arrays of its own; aliases would let a small file name
    # the square of its size in scope instances.
    n_insts = metric_recs["nScopeInsts"].astype(np.uint64)
    n_sums = metric_recs["nSummaries"].astype(np.uint64)
    p_insts, p_sums = metric_recs["pScopeInsts"], metric_recs["pSummaries"]
    sz_insts, sz_sums = np.uint64(mh["szScopeInst"]), np.uint64(mh["szSummary"])
    _blocks.refuse_overlaps(
        path,
        "Metrics",
        [
            ("the scope instances of metric {}", p_insts, p_insts + n_insts * sz_insts),
            ("the summaries of metric {}", p_sums, p_sums + n_sums * sz_sums),
        ],
    )
    # Metric tables are small and many (4 records per metric): numpy views per metric, but
    # scope pointers resolved through a dict, since per-call numpy overhead dominates here.
    scope_of = {p_scopes + k * sz_scope: k for k in range(n_scopes)}

    def scope_index(pointer: int) -> int:
        found = scope_of.get(pointer)
        if found is None:
            raise r.fail("Metrics", f"scope pointer 0x{pointer:x} does not point at a scope")
        return found

    metrics: list[Metric] = []
    for name_p, insts_p, sums_p, n_insts, n_sums in metric_recs.tolist():
        insts = r.array(
            insts_p,
            SCOPE_INST_DTYPE,
            n_insts,
            int(mh["szScopeInst"]),
            "Metrics",
            "scope instances",
        )
        sums = r.array(sums_p, SUMMARY_DTYPE, n_sums, int(mh["szSummary"]), "Metrics", "summaries")
        metrics.append(
            Metric(
                r.string(name_p, "Metrics"),
                tuple(ScopeInstance(scope_index(sp), i) for sp, i in insts.tolist()),
                tuple(
                    SummaryStatistic(scope_index(sp), r.string(f, "Metrics"), c, i)
                    for sp, f, c, i in sums.tolist()
                ),
            )
        )

    # Strings: the pool's order is the writer's layout hint; pointers into it decode via a table.
    s_size, s_off = sections[SEC_STRINGS]
    pool = bytes(buf[s_off : s_off + s_size])
    strings_at: dict[int, str] = {}
    string_order: list[str] = []
    pos = 0
    for raw in pool.split(b"\0")[: -1 if pool.endswith(b"\0") else None]:
        if pos + len(raw) >= len(pool):
            break  # an unterminated tail: leave it to cstring_at if anything points there
        text = raw.decode("utf-8", "surrogateescape")  # hpcprof writes names as bytes
        strings_at[s_off + pos] = text
        string_order.append(text)
        pos += len(raw) + 1

    stray: list[str] = []

    def pooled(pointer: int, section: str) -> str:
        found = strings_at.get(pointer)
        if found is not None:
            return found
        # formats.md §3.6: these strings live in the Strings pool; elsewhere is readable, not right.
        if len(stray) < 10:
            stray.append(
                f"{section}: string pointer 0x{pointer:x} is not the start of a string of the "
                f"Strings section [0x{s_off:x}, 0x{s_off + s_size:x})"
            )
        return r.string(pointer, section)

    def table(k: int, dtype: np.dtype[np.void], what: str) -> tuple[npt.NDArray[np.void], int, int]:
        h = need(k, TABLE_HEADER_DTYPE)
        base, n, sz = int(h["pEntries"]), int(h["nEntries"]), int(h["szEntry"])
        return r.array(base, dtype, n, sz, SECTION_NAMES[k], what), base, sz

    mod_recs, mod_base, mod_sz = table(SEC_MODULES, MODULE_DTYPE, "modules")
    modules = [
        Module(pooled(p, "Modules"), f)
        for f, p in zip(mod_recs["flags"].tolist(), mod_recs["pPath"].tolist(), strict=True)
    ]
    file_recs, file_base, file_sz = table(SEC_FILES, FILE_DTYPE, "files")
    files = [
        SourceFile(pooled(p, "Files"), bool(f & FILE_COPIED), f & ~FILE_COPIED)
        for f, p in zip(file_recs["flags"].tolist(), file_recs["pPath"].tolist(), strict=True)
    ]
    fn_recs, fn_base, fn_sz = table(SEC_FUNCTIONS, FUNCTION_DTYPE, "functions")
    fn_mod = _resolve(
        fn_recs["pModule"],
        mod_base,
        mod_sz,
        len(modules),
        FormatError(path, "Functions", "module pointer does not point at a module:"),
        True,
    )
    fn_file = _resolve(
        fn_recs["pFile"],
        file_base,
        file_sz,
        len(files),
        FormatError(path, "Functions", "file pointer does not point at a file:"),
        True,
    )
    functions = [
        Function(
            None if p == 0 else pooled(p, "Functions"),
            None if m < 0 else m,
            off,
            None if f < 0 else f,
            line,
            flags,
        )
        for p, m, off, f, line, flags in zip(
            fn_recs["pName"].tolist(),
            fn_mod.tolist(),
            fn_recs["offset"].tolist(),
            fn_file.tolist(),
            fn_recs["line"].tolist(),
            fn_recs["flags"].tolist(),
            strict=True,
        )
    ]

    entry_points, index = _read_contexts(
        r,
        sections[SEC_CONTEXT],
        need(SEC_CONTEXT, CONTEXTS_HEADER_DTYPE),
        pooled,
        (fn_base, fn_sz, len(functions)),
        (file_base, file_sz, len(files)),
        (mod_base, mod_sz, len(modules)),
    )
    return MetaDB(
        title=title,
        description=description,
        id_names=id_names,
        scopes=scopes,
        metrics=metrics,
        modules=modules,
        files=files,
        functions=functions,
        entry_points=entry_points,
        string_order=tuple(string_order),
        read_problems=tuple(stray),
        _index=index,
    )


_ARRAY_HEAD = struct.Struct("<QQ")


def _read_contexts(
    r: _Reader,
    section: tuple[int, int],
    header: np.void,
    pooled: Callable[[int, str], str],
    fn_table: tuple[int, int, int],
    file_table: tuple[int, int, int],
    mod_table: tuple[int, int, int],
) -> tuple[list[EntryPoint], ContextIndex]:
    """formats.md §3.2 Context section: entry points, then the tree, in two passes."""
    S = "Context"
    eps = r.array(
        int(header["pEntryPoints"]),
        ENTRY_POINT_DTYPE,
        int(header["nEntryPoints"]),
        int(header["szEntryPoint"]),
        S,
        "entry points",
    )
    data = r.buf if isinstance(r.buf, bytes) else bytes(r.buf)
    size = len(data)
    seen_arrays: dict[int, int] = {}  # child-array start -> end, to refuse shared/overlapping ones

    def child_array(p: int, sz: int, owner: int) -> list[int]:
        """Record offsets of the child array [p, p+sz) of context ``owner`` (checked)."""
        if sz == 0:
            return []
        if p + sz > size or p < 0:
            raise r.fail(
                S,
                f"child array of context {owner} at 0x{p:x} (+{sz} bytes) runs past the end of "
                f"the file (0x{size:x} bytes)",
            )
        if p in seen_arrays:
            raise r.fail(S, f"child array at 0x{p:x} of context {owner} is shared with another")
        seen_arrays[p] = p + sz
        out = []
        end = p + sz
        pos = p
        while pos < end:
            if pos + 0x20 > end:
                raise r.fail(
                    S,
                    f"child array of context {owner} at 0x{p:x}: record at 0x{pos:x} overruns "
                    f"the array's {sz} bytes",
                )
            out.append(pos)
            pos += 0x20 + 8 * data[pos + 0x17]
            if pos > end:
                raise r.fail(
                    S,
                    f"child array of context {owner} at 0x{p:x}: record at 0x{out[-1]:x} "
                    f"overruns the array's {sz} bytes",
                )
        return out

    # Pass 1: record offsets in depth-first pre-order, with parent rows (entry points are -1-k).
    offsets: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    ep_first: list[int] = []  # the first context row of each entry point's subtree
    unpack = _ARRAY_HEAD.unpack_from
    for k, (ep_sz, ep_p, ep_id) in enumerate(
        zip(
            eps["szChildren"].tolist(),
            eps["pChildren"].tolist(),
            eps["ctxId"].tolist(),
            strict=True,
        )
    ):
        ep_first.append(len(offsets))
        stack = [(o, -1 - k, 1) for o in reversed(child_array(ep_p, ep_sz, ep_id))]
        while stack:
            o, parent, depth = stack.pop()
            row = len(offsets)
            offsets.append(o)
            parents.append(parent)
            depths.append(depth)
            sz, p = unpack(data, o)
            if sz:
                ctx_id = int.from_bytes(data[o + 0x10 : o + 0x14], "little")
                stack.extend((c, row, depth + 1) for c in reversed(child_array(p, sz, ctx_id)))

    # No two child arrays may overlap (a shared tail would make one record two contexts).
    if seen_arrays:
        starts = np.array(sorted(seen_arrays), dtype=np.int64)
        ends = np.array([seen_arrays[s] for s in starts.tolist()], dtype=np.int64)
        clash = np.flatnonzero(starts[1:] < ends[:-1])
        if len(clash):
            raise r.fail(
                S, f"child arrays at 0x{starts[clash[0]]:x} and 0x{starts[clash[0] + 1]:x} overlap"
            )

    # Pass 2: gather every field in bulk (formats.md §3.2 {Ctx}).
    n = len(offsets)
    off = np.array(offsets, dtype=np.int64)
    sz_children = _gather_u64(data, off)
    p_children = _gather_u64(data, off + 0x08)
    packed = _gather_u64(data, off + 0x10)  # ctxId | flags<<32 | relation<<40 | lex<<48 | n<<56
    ctx_id_col = (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    flags = ((packed >> np.uint64(32)) & np.uint64(0xFF)).astype(np.int64)
    relation = ((packed >> np.uint64(40)) & np.uint64(0xFF)).astype(np.uint8)
    lexical = ((packed >> np.uint64(48)) & np.uint64(0xFF)).astype(np.uint8)
    n_flex = (packed >> np.uint64(56)).astype(np.int64)
    propagation = (_gather_u64(data, off + 0x18) & np.uint64(0xFFFF)).astype(np.uint16)
    has_fn = (flags & CTX_HAS_FUNCTION) != 0
    has_sl = (flags & CTX_HAS_SRCLOC) != 0
    has_pt = (flags & CTX_HAS_POINT) != 0
    # Flex words in fixed order: [pFunction] [pFile, line] [pModule, offset] (formats.md §3.2).
    w_file = has_fn.astype(np.int64)
    w_mod = w_file + 2 * has_sl
    needed = w_mod + 2 * has_pt
    short = np.flatnonzero(needed > n_flex)
    if len(short):
        i = int(short[0])
        raise r.fail(
            S,
            f"context {int(ctx_id_col[i])} has flags 0x{int(flags[i]):x} needing "
            f"{int(needed[i])} flex words but nFlexWords is {int(n_flex[i])}",
        )

    def word(k: npt.NDArray[np.int64], mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint64]:
        out = np.zeros(n, dtype=np.uint64)
        sel = np.flatnonzero(mask)
        if len(sel):
            out[sel] = _gather_u64(data, off[sel] + 0x20 + 8 * k[sel])
        return out

    def bad(what: str) -> FormatError:
        return FormatError(r.path, S, f"context {what} pointer does not point at an entry:")

    fn_idx = _resolve_flagged(word(w_file * 0, has_fn), has_fn, fn_table, bad("function"))
    file_idx = _resolve_flagged(word(w_file, has_sl), has_sl, file_table, bad("file"))
    lines = word(w_file + 1, has_sl) & np.uint64(0xFFFFFFFF)
    mod_idx = _resolve_flagged(word(w_mod, has_pt), has_pt, mod_table, bad("module"))
    point_offsets = word(w_mod + 1, has_pt)
    elided = (sz_children == 0) & (p_children != 0)

    # Build the objects from plain lists (the fastest way to make many small Python objects).
    entry_points = [
        EntryPoint(ctx_id, kind, pooled(p, S), [])
        for ctx_id, kind, p in zip(
            eps["ctxId"].tolist(),
            eps["entryPoint"].tolist(),
            eps["pPrettyName"].tolist(),
            strict=True,
        )
    ]
    with _no_gc():
        nodes = [
            Context(
                cid,
                rel,
                lex,
                None if fn < 0 else fn,
                None if fl < 0 else fl,
                ln,
                None if md < 0 else md,
                ofs,
                prop,
                [],
                eld,
            )
            for cid, rel, lex, fn, fl, ln, md, ofs, prop, eld in zip(
                ctx_id_col.tolist(),
                relation.tolist(),
                lexical.tolist(),
                fn_idx.tolist(),
                file_idx.tolist(),
                lines.tolist(),
                mod_idx.tolist(),
                point_offsets.tolist(),
                propagation.tolist(),
                elided.tolist(),
                strict=True,
            )
        ]
        for node, parent in zip(nodes, parents, strict=True):
            (nodes[parent] if parent >= 0 else entry_points[-1 - parent]).children.append(node)

        # The flat index, straight from the columns: entry point k's row goes right before its
        # subtree, so context row i moves down by the number of entry points up to its own.
        n_eps = len(entry_points)
        parent_arr = np.array(parents, dtype=np.int64)
        ep_of = np.zeros(n, dtype=np.int64)
        if n_eps and n:
            ep_of = np.searchsorted(np.array(ep_first, dtype=np.int64), np.arange(n), "right") - 1
        ctx_rows = np.arange(n, dtype=np.int64) + ep_of + 1
        ep_rows = np.array(ep_first, dtype=np.int64) + np.arange(n_eps, dtype=np.int64)
        table = np.zeros(n + n_eps, dtype=CONTEXT_TABLE_DTYPE)
        parent_row = np.full(n + n_eps, -1, dtype=np.int64)
        if n:
            parent_row[ctx_rows] = np.where(
                parent_arr >= 0,
                ctx_rows[np.maximum(parent_arr, 0)],
                ep_rows[np.clip(-1 - parent_arr, 0, max(n_eps - 1, 0))] if n_eps else -1,
            )
        columns = (
            ("ctx_id", ctx_id_col),
            ("depth", np.array(depths, dtype=np.uint32)),
            ("entry_point", -1),
            ("relation", relation),
            ("lexical_type", lexical),
            ("propagation", propagation),
            ("function", fn_idx),
            ("file", file_idx),
            ("line", np.where(has_sl, lines, 0)),
            ("module", mod_idx),
            ("offset", np.where(has_pt, point_offsets, 0)),
        )
        for name, column in columns:
            table[name][ctx_rows] = column
        table["ctx_id"][ep_rows] = eps["ctxId"]
        table["entry_point"][ep_rows] = eps["entryPoint"]
        table["relation"][ep_rows] = NO_ENUM
        table["lexical_type"][ep_rows] = NO_ENUM
        for name in ("function", "file", "module"):
            table[name][ep_rows] = -1
        _fill_parent_ids(table, parent_row)
        all_nodes: list[Node] = [None] * (n + n_eps)  # type: ignore[list-item]
        for row, ep in zip(ep_rows.tolist(), entry_points, strict=True):
            all_nodes[row] = ep
        for row, node in zip(ctx_rows.tolist(), nodes, strict=True):
            all_nodes[row] = node
    return entry_points, ContextIndex(table, all_nodes, parent_row)


def _gather_u64(data: bytes, at: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """The little-endian u64s at byte offsets ``at`` (already bounds-checked), in bulk."""
    if not len(at):
        return np.zeros(0, dtype=np.uint64)
    if not bool(np.any(at & 7)):
        words = np.frombuffer(data, dtype="<u8", count=len(data) // 8)
        gathered: npt.NDArray[np.uint64] = words[at >> 3].astype(np.uint64)
        return gathered
    u8 = np.frombuffer(data, dtype=np.uint8)
    out = np.zeros(len(at), dtype=np.uint64)
    for k in range(8):
        out |= u8[at + k].astype(np.uint64) << np.uint64(8 * k)
    return out


def _resolve_flagged(
    pointers: npt.NDArray[np.uint64],
    present: npt.NDArray[np.bool_],
    table: tuple[int, int, int],
    fail: FormatError,
) -> npt.NDArray[np.int64]:
    """Indices of flagged pointers into a table (a flagged null pointer is an error), else -1."""
    base, stride, count = table
    idx = np.full(len(pointers), -1, dtype=np.int64)
    sel = np.flatnonzero(present)
    if len(sel):
        idx[sel] = _resolve(pointers[sel], base, stride, count, fail, False)
    return idx


# ------------------------------------------------------------------------------------------------
# Writing


def _string_pool(db: MetaDB) -> _db.StringTable:
    """The Strings pool: the hint's order first, then the canonical order (module docstring)."""
    pool = _db.StringTable()
    for s in db.string_order or ():
        pool.add(s)
    for ep in db.entry_points:
        pool.add(ep.pretty_name)
    for f in db.functions:
        if f.name is not None:
            pool.add(f.name)
        if f.module is not None:
            pool.add(db.modules[f.module].path)
        if f.file is not None:
            pool.add(db.files[f.file].path)
    for m in db.modules:
        pool.add(m.path)
    for sf in db.files:
        pool.add(sf.path)
    return pool


def _check_tables(db: MetaDB) -> None:
    """The table cross-references the writer follows must resolve (a ValueError otherwise)."""
    problems = [p for p in _table_problems(db) if p.startswith("dangling")]
    if problems:
        raise ValueError("cannot write meta.db: " + "; ".join(problems[:5]))


def _column(values: Sequence[int], dtype: str, what: str) -> npt.NDArray[Any]:
    """``values`` as a numpy column of ``dtype``; a value out of range is a ValueError."""
    try:
        wide = np.array(values, dtype=np.uint64 if dtype == "<u8" else np.int64)
    except OverflowError as error:
        raise ValueError(f"cannot write meta.db: a {what} does not fit in {dtype}") from error
    info = np.iinfo(np.dtype(dtype))
    if len(wide) and (int(wide.min()) < info.min or int(wide.max()) > info.max):
        raise ValueError(f"cannot write meta.db: a {what} does not fit in {dtype}")
    return wide.astype(dtype)


def _record(dtype: np.dtype[np.void], **values: int) -> bytes:
    rec = np.zeros(1, dtype=dtype)
    for name, value in values.items():
        rec[name] = value
    return rec.tobytes()


def _post_order(
    entry_points: Sequence[EntryPoint],
) -> tuple[list[Context], dict[int, tuple[int, int]], list[tuple[int, int]]]:
    """hpcprof's Context-section order (``sinks/metadb.cpp``): every non-empty child array after
    the arrays of all its descendants, entry point by entry point.

    Returns the records in file order, ``id(node) -> (first record, count)`` for each node with
    children, and ``(record, records before)`` for each elided-children leaf, whose empty array
    hpcprof "writes" at the position reached when the traversal passes it.
    """
    records: list[Context] = []
    array_of: dict[int, tuple[int, int]] = {}
    elided_at: list[tuple[int, int]] = []
    record_of: dict[int, int] = {}
    for ep in entry_points:
        stack: list[tuple[Node, bool]] = [(ep, False)]
        while stack:
            node, expanded = stack.pop()
            if not node.children:
                if isinstance(node, Context) and node.elided_children:
                    elided_at.append((id(node), len(records)))
                continue
            if not expanded:
                stack.append((node, True))
                stack.extend((c, False) for c in reversed(node.children))
                continue
            array_of[id(node)] = (len(records), len(node.children))
            for c in node.children:
                record_of[id(c)] = len(records)
                records.append(c)
    return records, array_of, [(record_of[node], k) for node, k in elided_at]


def to_bytes(db: MetaDB) -> bytes:
    """The ``meta.db`` file for ``db``, laid out exactly as hpcprof lays it out.

    Raises ValueError when the model cannot be encoded (an index that resolves to nothing, a
    value too wide for its field).
    """
    with _no_gc():
        return _to_bytes(db)


def _to_bytes(db: MetaDB) -> bytes:
    _check_tables(db)
    out = bytearray(HEADER_END)
    sections: list[tuple[int, int]] = [(0, 0)] * N_SECTIONS

    def cstr(text: str) -> int:
        at = len(out)
        raw = text.encode("utf-8", "surrogateescape")  # non-UTF-8 bytes as read (cstring_at)
        if b"\0" in raw:
            raise ValueError(f"strings cannot contain NUL: {text!r}")
        out.extend(raw + b"\0")
        return at

    def begin() -> int:
        _db.pad_to(out, 8)
        return len(out)

    def end(k: int, start: int) -> None:
        sections[k] = (len(out) - start, start)

    def put(at: int, data: bytes) -> None:
        out[at : at + len(data)] = data

    # General.
    start = begin()
    out.extend(bytes(GENERAL_DTYPE.itemsize))
    p_title, p_desc = cstr(db.title), 0
    p_desc = cstr(db.description)
    put(start, _record(GENERAL_DTYPE, pTitle=p_title, pDescription=p_desc))
    end(SEC_GENERAL, start)

    # IdNames: header, an empty string, the names, the pointer array.
    start = begin()
    out.extend(bytes(ID_NAMES_DTYPE.itemsize))
    cstr("")
    name_ptrs = [cstr(s) for s in db.id_names]
    pp = begin()
    out.extend(np.array(name_ptrs, dtype="<u8").tobytes())
    put(start, _record(ID_NAMES_DTYPE, ppNames=pp, nKinds=len(name_ptrs)))
    end(SEC_ID_NAMES, start)

    # Metrics.
    start = begin()
    out.extend(bytes(METRICS_HEADER_DTYPE.itemsize))
    scope_names = [cstr(s.name) for s in db.scopes]
    p_scopes = begin()
    scope_arr = np.zeros(len(db.scopes), dtype=SCOPE_DTYPE)
    scope_arr["pScopeName"] = scope_names
    scope_arr["type"] = [s.type for s in db.scopes]
    scope_arr["propagationIndex"] = [s.propagation_index for s in db.scopes]
    out.extend(scope_arr.tobytes())
    metric_arr = np.zeros(len(db.metrics), dtype=METRIC_DTYPE)
    for i, m in enumerate(db.metrics):
        p_insts = begin()
        insts = np.zeros(len(m.scope_insts), dtype=SCOPE_INST_DTYPE)
        insts["pScope"] = [p_scopes + SCOPE_DTYPE.itemsize * s.scope for s in m.scope_insts]
        insts["propMetricId"] = [s.prop_metric_id for s in m.scope_insts]
        out.extend(insts.tobytes())
        formulas = [cstr(s.formula) for s in m.summaries]
        p_sums = begin()
        sums = np.zeros(len(m.summaries), dtype=SUMMARY_DTYPE)
        sums["pScope"] = [p_scopes + SCOPE_DTYPE.itemsize * s.scope for s in m.summaries]
        sums["pFormula"] = formulas
        sums["combine"] = [s.combine for s in m.summaries]
        sums["statMetricId"] = [s.stat_metric_id for s in m.summaries]
        out.extend(sums.tobytes())
        metric_arr[i] = (cstr(m.name), p_insts, p_sums, len(m.scope_insts), len(m.summaries))
    p_metrics = begin()
    out.extend(metric_arr.tobytes())
    put(
        start,
        _record(
            METRICS_HEADER_DTYPE,
            pMetrics=p_metrics,
            nMetrics=len(db.metrics),
            szMetric=METRIC_DTYPE.itemsize,
            szScopeInst=SCOPE_INST_DTYPE.itemsize,
            szSummary=SUMMARY_DTYPE.itemsize,
            pScopes=p_scopes,
            nScopes=len(db.scopes),
            szScope=SCOPE_DTYPE.itemsize,
        ),
    )
    end(SEC_METRICS, start)

    # Strings.
    pool = _string_pool(db)
    s_base = len(out)
    out.extend(pool.data)
    sections[SEC_STRINGS] = (len(pool), s_base)

    def sp(text: str) -> int:
        return s_base + pool.add(text)

    def table(k: int, dtype: np.dtype[np.void], arr: npt.NDArray[np.void]) -> int:
        start = begin()
        out.extend(bytes(TABLE_HEADER_DTYPE.itemsize))
        base = begin()
        out.extend(arr.tobytes())
        put(
            start,
            _record(TABLE_HEADER_DTYPE, pEntries=base, nEntries=len(arr), szEntry=dtype.itemsize),
        )
        end(k, start)
        return base

    # Modules, Files, Functions: each table's base is known before it is written, since the
    # header's 14 bytes pad to 16.
    mods = np.zeros(len(db.modules), dtype=MODULE_DTYPE)
    mods["flags"] = [m.flags for m in db.modules]
    mods["pPath"] = [sp(m.path) for m in db.modules]
    mod_base = table(SEC_MODULES, MODULE_DTYPE, mods)
    files = np.zeros(len(db.files), dtype=FILE_DTYPE)
    files["flags"] = [f.raw_flags for f in db.files]
    files["pPath"] = [sp(f.path) for f in db.files]
    file_base = table(SEC_FILES, FILE_DTYPE, files)

    def p_mod(k: int | None) -> int:
        return 0 if k is None else mod_base + MODULE_DTYPE.itemsize * k

    def p_file(k: int | None) -> int:
        return 0 if k is None else file_base + FILE_DTYPE.itemsize * k

    fns = np.zeros(len(db.functions), dtype=FUNCTION_DTYPE)
    fns["pName"] = [0 if f.name is None else sp(f.name) for f in db.functions]
    fns["pModule"] = [p_mod(f.module) for f in db.functions]
    fns["offset"] = [f.offset for f in db.functions]
    fns["pFile"] = [p_file(f.file) for f in db.functions]
    fns["line"] = [f.line for f in db.functions]
    fns["flags"] = [f.flags for f in db.functions]
    fn_base = table(SEC_FUNCTIONS, FUNCTION_DTYPE, fns)

    # Context: child arrays in post-order, then the entry points.
    start = begin()
    out.extend(bytes(CONTEXTS_HEADER_DTYPE.itemsize))
    base = begin()
    records, array_of, elided_at = _post_order(db.entry_points)
    n = len(records)
    ids = _column([c.ctx_id for c in records], "<u4", "ctxId")
    relation = _column([c.relation for c in records], "u1", "relation")
    lexical = _column([c.lexical_type for c in records], "u1", "lexicalType")
    propagation = _column([c.propagation for c in records], "<u2", "propagation")
    fn_idx = _column([-1 if c.function is None else c.function for c in records], "<i8", "")
    file_idx = _column([-1 if c.file is None else c.file for c in records], "<i8", "")
    mod_idx = _column([-1 if c.module is None else c.module for c in records], "<i8", "")
    lines = _column([c.line if c.file is not None else 0 for c in records], "<u4", "line")
    offsets = _column([c.offset if c.module is not None else 0 for c in records], "<u8", "offset")
    for what, idx, count in (
        ("function", fn_idx, len(db.functions)),
        ("file", file_idx, len(db.files)),
        ("module", mod_idx, len(db.modules)),
    ):
        if n and int(idx.max()) >= count:
            raise ValueError(f"cannot write meta.db: a context refers to a missing {what}")
        if n and int(idx.min()) < -1:
            raise ValueError(f"cannot write meta.db: a context has a negative {what} index")
    has_fn, has_sl, has_pt = fn_idx >= 0, file_idx >= 0, mod_idx >= 0
    n_flex = has_fn.astype(np.int64) + 2 * has_sl + 2 * has_pt
    flags = has_fn * CTX_HAS_FUNCTION | has_sl * CTX_HAS_SRCLOC | has_pt * CTX_HAS_POINT
    word_at = np.zeros(n + 1, dtype=np.int64)  # word index of each record, then of the end
    np.cumsum(4 + n_flex, out=word_at[1:])
    byte_at = base + 8 * word_at
    # szChildren / pChildren of every record, and of the entry points, from their arrays.
    sz_children = np.zeros(n, dtype=np.uint64)
    p_children = np.zeros(n, dtype=np.uint64)
    own = [(i, array_of[id(c)]) for i, c in enumerate(records) if c.children]
    if own:
        rows = np.array([i for i, _ in own], dtype=np.int64)
        firsts = np.array([a[0] for _, a in own], dtype=np.int64)
        counts = np.array([a[1] for _, a in own], dtype=np.int64)
        sz_children[rows] = byte_at[firsts + counts] - byte_at[firsts]
        p_children[rows] = byte_at[firsts]
    for i, k in elided_at:
        p_children[i] = byte_at[k]  # hpcprof's empty array points where it would have started
    words = np.zeros(int(word_at[-1]), dtype="<u8")
    head = word_at[:-1]
    words[head] = sz_children
    words[head + 1] = p_children
    words[head + 2] = (
        ids.astype(np.uint64)
        | flags.astype(np.uint64) << np.uint64(32)
        | relation.astype(np.uint64) << np.uint64(40)
        | lexical.astype(np.uint64) << np.uint64(48)
        | n_flex.astype(np.uint64) << np.uint64(56)
    )
    words[head + 3] = propagation
    flex = head + 4  # formats.md §3.2: [pFunction] [pFile, line] [pModule, offset]
    words[flex[has_fn]] = fn_base + FUNCTION_DTYPE.itemsize * fn_idx[has_fn]
    flex = flex + has_fn
    words[flex[has_sl]] = file_base + FILE_DTYPE.itemsize * file_idx[has_sl]
    words[flex[has_sl] + 1] = lines[has_sl]
    flex = flex + 2 * has_sl
    words[flex[has_pt]] = mod_base + MODULE_DTYPE.itemsize * mod_idx[has_pt]
    words[flex[has_pt] + 1] = offsets[has_pt]
    out.extend(words.tobytes())

    def array_at(node: Node) -> tuple[int, int]:
        found = array_of.get(id(node))
        if found is None:
            return 0, 0
        first_k, count_k = found
        return int(byte_at[first_k + count_k] - byte_at[first_k]), int(byte_at[first_k])

    p_eps = begin()
    eps = np.zeros(len(db.entry_points), dtype=ENTRY_POINT_DTYPE)
    for i, ep in enumerate(db.entry_points):
        sz, p = array_at(ep)
        eps[i] = (sz, p, ep.ctx_id, ep.kind, sp(ep.pretty_name))
    out.extend(eps.tobytes())
    put(
        start,
        _record(
            CONTEXTS_HEADER_DTYPE,
            pEntryPoints=p_eps,
            nEntryPoints=len(db.entry_points),
            szEntryPoint=ENTRY_POINT_DTYPE.itemsize,
        ),
    )
    end(SEC_CONTEXT, start)
    if len(pool) != sections[SEC_STRINGS][0]:
        raise AssertionError("a string was added to the pool after it was written")

    out.extend(FOOTER)
    put(0, _db.write_header(FORMAT_ID, sections))
    return bytes(out)


def write(db: MetaDB, dest: _db.Dest) -> None:
    """Write ``db`` as a ``meta.db`` to a path or a binary file object."""
    _db.write_dest(to_bytes(db), dest)


# ------------------------------------------------------------------------------------------------
# Checking


def verify(db: MetaDB) -> list[str]:
    """Consistency problems of ``db`` (formats.md §3.2, §3.7); empty when clean.

    Checks: names that :func:`read` found outside the Strings section (``read_problems``);
    every scope, module, file and function index resolves ("dangling ..." otherwise);
    prop and stat metric ids are each unique; ctxIds are unique and not 0; the propagation bit 0
    is set exactly on lexical contexts. Runs in bulk over the flat index (built afresh, so it
    sees the tree as it is now).
    """
    problems = [*db.read_problems, *_table_problems(db)]
    try:
        index = ContextIndex.build(db.entry_points)
    except (OverflowError, ValueError) as error:
        return [*problems, f"a context field is out of range for its on-disk type ({error})"]
    t = index.table
    ids, counts = np.unique(t["ctx_id"], return_counts=True)
    if bool(np.any(counts > 1)):
        problems.append(f"duplicate ctxIds: {ids[counts > 1][:10].tolist()}")
    if bool(np.any(t["ctx_id"] == 0)):
        problems.append("ctxId 0 is reserved for the global context")
    ctx = t[t["entry_point"] < 0]
    for what, count in (
        ("function", len(db.functions)),
        ("file", len(db.files)),
        ("module", len(db.modules)),
    ):
        bad = ctx[(ctx[what] >= count) | (ctx[what] < -1)]
        if len(bad):
            problems.append(
                f"dangling {what} {int(bad[what][0])} in context {int(bad['ctx_id'][0])}"
                + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
            )
    lexical = ctx["relation"] == Relation.LEXICAL
    bit = (ctx["propagation"] & PROPAGATION_FUNCTION_BIT) != 0
    wrong = ctx[lexical != bit]
    if len(wrong):
        c = wrong[0]
        problems.append(
            f"context {int(c['ctx_id'])}: propagation bit 0 is "
            f"{'set' if int(c['propagation']) & 1 else 'clear'} on a "
            f"{_enum_name(Relation, int(c['relation']))} context (it must be set iff the "
            "relation is lexical)" + (f"; {len(wrong) - 1} more" if len(wrong) > 1 else "")
        )
    return problems


def _table_problems(db: MetaDB) -> list[str]:
    """verify()'s checks of the metric and function tables."""
    problems: list[str] = []

    def dangling(k: int | None, n: int) -> bool:
        return k is not None and not 0 <= k < n

    for i, m in enumerate(db.metrics):
        for s in m.scope_insts:
            if dangling(s.scope, len(db.scopes)):
                problems.append(f"dangling scope {s.scope} in metric {i} ({m.name})")
        for ss in m.summaries:
            if dangling(ss.scope, len(db.scopes)):
                problems.append(f"dangling scope {ss.scope} in a summary of metric {i}")
    prop_ids = [s.prop_metric_id for m in db.metrics for s in m.scope_insts]
    stat_ids = [s.stat_metric_id for m in db.metrics for s in m.summaries]
    for kind, ids in (("propMetricId", prop_ids), ("statMetricId", stat_ids)):
        dup = _dups(ids)
        if dup:
            problems.append(f"duplicate {kind}s: {dup[:10]}")
    for i, f in enumerate(db.functions):
        if dangling(f.module, len(db.modules)):
            problems.append(f"dangling module {f.module} in function {i} ({f.name})")
        if dangling(f.file, len(db.files)):
            problems.append(f"dangling file {f.file} in function {i} ({f.name})")
    return problems


def _dups(ids: list[int]) -> list[int]:
    arr = np.sort(np.array(ids, dtype=np.int64))
    return sorted(set(arr[1:][arr[1:] == arr[:-1]].tolist()))


# ------------------------------------------------------------------------------------------------
# Dumping


def _enum_name(enum: type[IntEnum], value: int) -> str:
    try:
        return enum(value).name.lower()
    except ValueError:
        return f"unknown({value})"


_RELATION_ARROWS = {
    Relation.LEXICAL: "lexical",
    Relation.CALL: "call",
    Relation.INLINED: "inlined",
}


def describe(db: MetaDB, c: Context) -> str:
    """One line for a context: ``-call> [function] main (/src/a.c:10) [/bin/a+0x118b]``."""
    try:
        arrow = _RELATION_ARROWS[Relation(c.relation)]
    except ValueError:
        arrow = f"rel{c.relation}"
    parts = [f"-{arrow}> [{_enum_name(LexicalType, c.lexical_type)}]"]
    if c.function is not None:
        f = db.functions[c.function] if 0 <= c.function < len(db.functions) else None
        if f is None:
            parts.append(f"<function {c.function}?>")
        else:
            parts.append(f.name if f.name is not None else "<unnamed function>")
            where = []
            if f.file is not None:
                where.append(f"{_path(db.files, f.file)}:{f.line}")
            if f.module is not None:
                where.append(f"{_path(db.modules, f.module)}+0x{f.offset:x}")
            if where:
                parts.append("(" + " ".join(where) + ")")
    elif c.lexical_type == LexicalType.FUNCTION:
        parts.append("<unknown function>")
    if c.file is not None:
        parts.append(f"{_path(db.files, c.file)}:{c.line}")
    if c.module is not None:
        parts.append(f"{_path(db.modules, c.module)}+0x{c.offset:x}")
    return " ".join(parts)


def _path(table: Sequence[Module] | Sequence[SourceFile], k: int) -> str:
    return table[k].path if 0 <= k < len(table) else f"<missing {k}>"


def dump(db: MetaDB, out: TextIO) -> None:
    """Write every field of ``db`` as readable text; two dumps diff cleanly."""
    w = out.write
    w(f"meta.db v{_db.MAJOR}.{_db.MINOR}\n")
    w(f"title: {db.title}\n")
    w(f"description: {db.description}\n")
    w("id names:\n")
    for k, name in enumerate(db.id_names):
        w(f"  [{k}] {name}\n")
    w("propagation scopes:\n")
    for k, s in enumerate(db.scopes):
        w(
            f"  [{k}] {s.name} type={_enum_name(ScopeType, s.type)} "
            f"propagation_index={s.propagation_index}\n"
        )
    w("metrics:\n")
    for k, m in enumerate(db.metrics):
        w(f"  [{k}] {m.name}\n")
        for si in m.scope_insts:
            w(f"      scope {_scope_name(db, si.scope)}: prop_metric_id={si.prop_metric_id}\n")
        for ss in m.summaries:
            w(
                f"      summary {_scope_name(db, ss.scope)}: {_enum_name(Combine, ss.combine)} of "
                f"{ss.formula!r} stat_metric_id={ss.stat_metric_id}\n"
            )
    w("modules:\n")
    for k, mod in enumerate(db.modules):
        w(f"  [{k}] {mod.path} flags=0x{mod.flags:x}\n")
    w("files:\n")
    for k, f in enumerate(db.files):
        extra = f" flags=0x{f.flags:x}" if f.flags else ""
        w(f"  [{k}] {f.path}{' (copied)' if f.copied else ''}{extra}\n")
    w("functions:\n")
    for k, fn in enumerate(db.functions):
        module = "-" if fn.module is None else f"[{fn.module}]"
        file = "-" if fn.file is None else f"[{fn.file}]:{fn.line}"
        w(
            f"  [{k}] {fn.name if fn.name is not None else '<no name>'} module={module} "
            f"offset=0x{fn.offset:x} file={file} flags=0x{fn.flags:x}\n"
        )
    w("context tree:\n")
    for node, _, depth in db.contexts():
        indent = "  " * (depth + 1)
        if isinstance(node, EntryPoint):
            w(
                f"{indent}#{node.ctx_id} entry {_enum_name(EntryPointKind, node.kind)} "
                f"({node.pretty_name})\n"
            )
        else:
            elided = " (children elided)" if node.elided_children and not node.children else ""
            w(f"{indent}#{node.ctx_id} {describe(db, node)} prop=0x{node.propagation:x}{elided}\n")


def _scope_name(db: MetaDB, k: int) -> str:
    return db.scopes[k].name if 0 <= k < len(db.scopes) else f"<missing scope {k}>"


__all__ = [
    "CONTEXT_TABLE_DTYPE",
    "DEFAULT_ID_NAMES",
    "ENTRY_POINT_NAMES",
    "FILE_COPIED",
    "NO_PROPAGATION_INDEX",
    "PROPAGATION_FUNCTION_BIT",
    "STANDARD_SCOPES",
    "Combine",
    "Context",
    "ContextIndex",
    "EntryPoint",
    "EntryPointKind",
    "Function",
    "LexicalType",
    "MetaDB",
    "Metric",
    "Module",
    "PropagationScope",
    "Relation",
    "ScopeInstance",
    "ScopeType",
    "SourceFile",
    "SummaryStatistic",
    "describe",
    "dump",
    "iter_contexts",
    "read",
    "read_buffer",
    "sniff",
    "to_bytes",
    "verify",
    "write",
]
