"""meta.db's model: the objects a reader returns and a writer takes (formats.md §3.2, §3.7).

Objects refer to each other **by index**: a :class:`Function`'s ``module``/``file``, a
:class:`Context`'s ``function``/``file``/``module`` are indices into ``MetaDB.modules``,
``.files`` and ``.functions`` (``None`` = absent), and a metric's scope instances and summaries
name scopes by index into ``MetaDB.scopes``. A context's payload flags are derived: hasFunction
iff ``function is not None``, hasSrcLoc iff ``file is not None`` (then ``line`` counts),
hasPoint iff ``module is not None`` (then ``offset`` counts). Enum-valued fields (relation,
lexical type, scope type, combine, entry-point kind) are plain ints so that unknown values
survive a round trip (§3.1, forward compatibility); the vocabulary's ``IntEnum`` classes name the
known ones. :class:`ContextIndex` is the flat numpy table of every context pyview navigates by.
No I/O here.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.formats.metadb.layout import (
    CTX_HAS_FUNCTION,
    CTX_HAS_POINT,
    CTX_HAS_SRCLOC,
    DEFAULT_DESCRIPTION,
    DEFAULT_TITLE,
)
from pyhpctk.formats.vocabulary import (
    DEFAULT_ID_NAMES,
    FILE_COPIED,
    NO_PROPAGATION_INDEX,
    Combine,
    LexicalType,
    Relation,
    StandardScope,
)
from pyhpctk.formats.vocabulary import EntryPoint as EntryPointKind


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
class Entry:
    """{Entry}: a top-level context ("main thread", ...) under the implicit global context 0."""

    ctx_id: int
    kind: int = EntryPointKind.MAIN_THREAD
    pretty_name: str = "main thread"
    children: list[Context] = field(default_factory=list)

    def _key(self) -> tuple[object, ...]:
        return (self.ctx_id, self.kind, self.pretty_name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        return _trees_equal([self], [other])

    __hash__ = None  # type: ignore[assignment]


Node = Context | Entry


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
def no_gc() -> Iterator[None]:
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


def fill_parent_ids(table: npt.NDArray[np.void], parent_row: npt.NDArray[np.int64]) -> None:
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
    def build(cls, roots: Sequence[Entry]) -> ContextIndex:
        """Index the trees under ``roots`` (one pass over the objects, then numpy)."""
        nodes: list[Node] = []
        rows: list[tuple[int, ...]] = []
        parents: list[int] = []
        with no_gc():
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
        fill_parent_ids(table, parent_row)
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
    entry_points: list[Entry] = field(default_factory=list)
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
