"""The "tree + values" interface every pyview view is built on.

pyview never walks file bytes itself: :mod:`pyhpctk.present.source` turns the readers of
:mod:`pyhpctk.formats` (meta.db, profile.db, cct.db, trace.db) into the objects declared here, and
the views, exports and analyses only see these. Tests build the same objects from plain Python
data, so every view can be checked on a database whose answer is known by construction.

The calling context tree is stored as parallel numpy arrays indexed by *node* (node 0 is the
implicit global context, ctxId 0; parents come before children), because a real database can hold
10^6 contexts. Values stay where they are (memory-mapped profile.db / cct.db) behind
:class:`ValueSource`, which hands out one dense column per metric on demand.

This module must not import the format readers nor do any I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, overload

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats.vocabulary import GPU_ID_NAMES, SCOPE_NAMES, Combine
from pyhpctk.present.names import short_paths

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# formats.md §3.2: a context's lexical type and relation are the database's vocabulary
# (LexicalType, Relation); the tree's two top levels, which meta.db holds no {Ctx} for, get
# pseudo-values outside it.
LEX_ROOT = -2  # the implicit global context (ctxId 0)
LEX_ENTRY = -1  # an entry point ("main thread", "application thread", ...)
REL_NONE = -1  # entry points and the root have no relation

# formats.md §3.2: the four propagation scopes hpcprof always writes, and their viewer terms.
SCOPE_POINT, SCOPE_FUNCTION, SCOPE_LEX_AWARE, SCOPE_EXECUTION = SCOPE_NAMES
INCLUSIVE_SCOPE = SCOPE_EXECUTION
EXCLUSIVE_SCOPE = SCOPE_LEX_AWARE


@dataclass(frozen=True, slots=True)
class FunctionInfo:
    """A meta.db Function: name, defining module and source location (all optional)."""

    name: str
    module: int = -1  # index into ContextTree.modules, -1 when unknown
    file: int = -1  # index into ContextTree.files, -1 when unknown
    line: int = 0
    offset: int = 0  # formats.md §3.9 (6): 0 may also mean unknown


@dataclass(frozen=True, slots=True)
class ContextTree:
    """The calling context tree as parallel arrays, one entry per node, parents first.

    ``ctx_id[i]`` is node i's ctxId; ``parent[i]`` the parent's node index (-1 for node 0, the
    global context). ``function``/``file``/``module`` index the tables below (-1 = none);
    ``names[i]`` is only used for entry points (their pretty name) and may be empty otherwise.
    """

    ctx_id: IntArray
    parent: IntArray
    lexical_type: npt.NDArray[np.int8]
    relation: npt.NDArray[np.int8]
    function: IntArray
    file: IntArray
    line: IntArray
    module: IntArray
    offset: npt.NDArray[np.uint64]
    names: tuple[str, ...]
    functions: tuple[FunctionInfo, ...]
    files: tuple[str, ...]
    modules: tuple[str, ...]
    _children: list[IntArray] = field(default_factory=list, compare=False, repr=False)
    _node_of: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    _shown_files: list[str] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.ctx_id)
        for name in ("parent", "lexical_type", "relation", "function", "file", "line", "module"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"ContextTree.{name} has {len(getattr(self, name))} entries, not {n}"
                )
        if len(self.offset) != n or len(self.names) != n:
            raise ValueError("ContextTree.offset/names must have one entry per node")
        if n == 0 or self.parent[0] != -1 or self.ctx_id[0] != 0:
            raise ValueError("ContextTree node 0 must be the global context (ctxId 0, no parent)")
        rest = self.parent[1:]
        if bool(np.any(rest >= np.arange(1, n))) or bool(np.any(rest < 0)):
            raise ValueError("ContextTree parents must come before their children")

    @property
    def size(self) -> int:
        return len(self.ctx_id)

    def children(self, node: int) -> IntArray:
        """Node indices of ``node``'s children, in tree order (built once for all nodes)."""
        if not self._children:
            n = self.size
            order = np.argsort(self.parent[1:], kind="stable") + 1
            counts = np.bincount(self.parent[1:], minlength=n)
            starts = np.concatenate(([0], np.cumsum(counts)))
            self._children.extend(order[starts[i] : starts[i + 1]] for i in range(n))
        return self._children[node]

    def node_of(self, ctx_id: int) -> int:
        """The node index of a ctxId; -1 when the tree does not hold it (formats.md §3.7)."""
        if not self._node_of:
            self._node_of.update(zip(self.ctx_id.tolist(), range(self.size), strict=True))
        return self._node_of.get(int(ctx_id), -1)

    def depth(self) -> IntArray:
        """Depth of every node (the global context has depth 0)."""
        out = np.zeros(self.size, dtype=np.int64)
        for i in range(1, self.size):  # parents first: one pass suffices
            out[i] = out[self.parent[i]] + 1
        return out

    def function_name(self, node: int) -> str | None:
        f = int(self.function[node])
        return self.functions[f].name if f >= 0 else None

    def file_name(self, node: int) -> str | None:
        f = int(self.file[node])
        return self.files[f] if f >= 0 else None

    def shown_file(self, index: int) -> str:
        """How views name file ``index`` (:mod:`pyhpctk.present.names`); "" for -1."""
        if index < 0:
            return ""
        if not self._shown_files:
            self._shown_files.extend(short_paths(self.files))
        return self._shown_files[index]

    def module_name(self, node: int) -> str | None:
        m = int(self.module[node])
        return self.modules[m] if m >= 0 else None


@dataclass(frozen=True, slots=True)
class SummaryStat:
    """One summary statistic of a metric (formats.md §3.2 {SS}): ``combine`` of ``formula``."""

    scope: str
    formula: str
    combine: str  # Combine.label: "sum", "min" or "max"
    stat_id: int


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """A meta.db metric: its propagation-scope instances and summary statistics."""

    name: str
    prop_ids: tuple[tuple[str, int], ...]  # (scope name, propMetricId)
    summaries: tuple[SummaryStat, ...]
    description: str = ""

    def prop_id(self, scope: str) -> int | None:
        for name, ident in self.prop_ids:
            if name == scope:
                return ident
        return None

    def stat_id(
        self, scope: str, combine: str = Combine.SUM.label, formula: str = "$$"
    ) -> int | None:
        for stat in self.summaries:
            if stat.scope == scope and stat.combine == combine and stat.formula == formula:
                return stat.stat_id
        return None


@dataclass(frozen=True, slots=True)
class Profile:
    """A non-summary profile (thread or GPU stream) and its hierarchical identifier tuple."""

    index: int  # the profile.db index (>= 1)
    identifier: tuple[tuple[str, int], ...]  # (kind name, logical id) pairs, outermost first

    @property
    def label(self) -> str:
        return " / ".join(f"{kind} {ident}" for kind, ident in self.identifier) or f"#{self.index}"

    @property
    def is_gpu(self) -> bool:
        return any(kind in GPU_ID_NAMES for kind, _ in self.identifier)

    @property
    def is_warp(self) -> bool:
        """A line of a traced kernel's warps: a GPU device's SM (``CORE``) and warp slot
        (``THREAD``), not a stream (docs/formats.md, "Warp traces")."""
        return self.is_gpu and self.element("CORE") is not None

    @property
    def warp_label(self) -> str:
        """``SM 3 / warp slot 5`` for a warp line."""
        return f"SM {self.element('CORE')} / warp slot {self.element('THREAD')}"

    def element(self, kind: str) -> int | None:
        """The id of the tuple's ``kind`` element (``"RANK"``, ``"GPUDEVICE"``...), or None."""
        for name, ident in self.identifier:
            if name == kind:
                return ident
        return None

    @property
    def rank(self) -> int | None:
        """The process's rank (None: measured outside a parallel launch)."""
        return self.element("RANK")


class ProfileList(Sequence[Profile]):
    """Profiles of a database, each :class:`Profile` made only when asked for.

    ``indices`` are the profiles' profile.db indices (ascending); ``identify(index)`` gives one
    profile's identifier; ``gpu()`` says for every index of the database whether it is a GPU
    stream. A database of 100,000 profiles is opened, viewed and summarised without 100,000
    objects (issue #19): only the arrays and what is printed.
    """

    __slots__ = ("_gpu", "_identify", "indices")

    def __init__(
        self,
        indices: IntArray,
        identify: Callable[[int], tuple[tuple[str, int], ...]],
        gpu: Callable[[], npt.NDArray[np.bool_]],
    ) -> None:
        self.indices = indices
        self._identify = identify
        self._gpu = gpu

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, position: int) -> Profile: ...

    @overload
    def __getitem__(self, position: slice) -> ProfileList: ...

    def __getitem__(self, position: int | slice) -> Profile | ProfileList:
        if isinstance(position, slice):
            return ProfileList(self.indices[position], self._identify, self._gpu)
        index = int(self.indices[position])
        return Profile(index, self._identify(index))

    def find(self, index: int) -> Profile | None:
        """The profile of profile.db index ``index`` among these, or None (a binary search:
        ``indices`` ascend)."""
        position = int(np.searchsorted(self.indices, index))
        if position < len(self.indices) and int(self.indices[position]) == index:
            return Profile(index, self._identify(index))
        return None

    def where(self, kind: str) -> ProfileList:
        """The GPU streams (``gpu``) or the other profiles (``cpu``) among these."""
        gpu = self._gpu()[self.indices]
        chosen = gpu if kind == "gpu" else ~gpu
        return ProfileList(self.indices[chosen], self._identify, self._gpu)


def profile_indices(profiles: Sequence[Profile]) -> IntArray:
    """The profile.db indices of ``profiles``, in their order (no object made for a list)."""
    if isinstance(profiles, ProfileList):
        return profiles.indices
    return np.fromiter((p.index for p in profiles), dtype=np.int64, count=len(profiles))


@dataclass(frozen=True, slots=True)
class Timeline:
    """One trace.db line: a profile's (timestamp ns, ctxId) samples, sorted by time."""

    profile: int
    timestamps: npt.NDArray[np.uint64]
    ctx_ids: npt.NDArray[np.uint32]


class ValueSource(Protocol):
    """Where metric values come from (profile.db and cct.db behind memory maps)."""

    @property
    def n_contexts(self) -> int:
        """One more than the largest ctxId holding values (cct.db's nCtxs)."""
        ...

    def summary_column(self, stat_id: int) -> FloatArray:
        """Summary-profile values of one statMetricId, dense by ctxId (zeros where absent)."""
        ...

    def context_profiles(
        self, ctx_id: int, prop_id: int
    ) -> tuple[npt.NDArray[np.int64], FloatArray]:
        """(profile indices, values) of one context and propMetricId, from cct.db."""
        ...

    def profile_column(self, profile: int, prop_id: int) -> FloatArray:
        """One profile's values of one propMetricId, dense by ctxId."""
        ...


class TraceSource(Protocol):
    """Where trace lines come from (trace.db)."""

    def lines(self) -> Sequence[Timeline]: ...


@dataclass(frozen=True, slots=True)
class InMemoryValues:
    """A :class:`ValueSource` over plain arrays, for tests and small synthetic databases.

    ``summary[stat_id]`` is dense by ctxId; ``per_profile[prop_id]`` is a (profiles x contexts)
    matrix whose row ``p - 1`` holds profile ``p``.
    """

    contexts: int
    summary: dict[int, FloatArray]
    per_profile: dict[int, FloatArray]

    @property
    def n_contexts(self) -> int:
        return self.contexts

    def summary_column(self, stat_id: int) -> FloatArray:
        col = self.summary.get(stat_id)
        return np.zeros(self.contexts) if col is None else col

    def context_profiles(
        self, ctx_id: int, prop_id: int
    ) -> tuple[npt.NDArray[np.int64], FloatArray]:
        mat = self.per_profile.get(prop_id)
        if mat is None or ctx_id >= mat.shape[1]:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        col = mat[:, ctx_id]
        nz = np.flatnonzero(col)
        return (nz + 1).astype(np.int64), col[nz].astype(np.float64)

    def profile_column(self, profile: int, prop_id: int) -> FloatArray:
        mat = self.per_profile.get(prop_id)
        if mat is None:
            return np.zeros(self.contexts)
        return np.asarray(mat[profile - 1], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class InMemoryTraces:
    """A :class:`TraceSource` over a list of lines."""

    trace_lines: tuple[Timeline, ...]

    def lines(self) -> Sequence[Timeline]:
        return self.trace_lines


@dataclass(frozen=True, slots=True)
class ThreadName:
    """What pyrun recorded of the thread a profile measured (the database's ``threads.txt``):
    its name (``MainThread``, ``ThreadPoolExecutor-0_1``, a native thread's kernel name) and the
    process it ran in (its pid and program)."""

    name: str
    pid: int
    program: str


@dataclass(frozen=True, slots=True)
class Experiment:
    """An opened database: the tree, metric and profile tables, values and traces.

    ``thread_names``: by profile.db index, for the profiles pyrun named (none for databases
    of hpcrun's measurements or of an older pyrun: views then name profiles by identifier).
    """

    path: str
    title: str
    tree: ContextTree
    metrics: tuple[MetricInfo, ...]
    profiles: Sequence[Profile]
    values: ValueSource
    traces: TraceSource | None = None
    taxonomy_text: str | None = None  # metrics/default.yaml, when the database has one
    thread_names: Mapping[int, ThreadName] = field(default_factory=dict)

    def profile_title(self, prof: Profile) -> str:
        """How views name a profile: ``ThreadPoolExecutor-0_1 (NODE 0 / THREAD 2)`` where pyrun
        recorded the thread's name, else its identifier (``NODE 0 / THREAD 2``)."""
        named = self.thread_names.get(prof.index)
        if prof.is_warp:
            return f"GPU {prof.element('GPUDEVICE')} {prof.warp_label} ({prof.label})"
        return prof.label if named is None else f"{named.name} ({prof.label})"

    def metric(self, name: str) -> MetricInfo:
        for m in self.metrics:
            if m.name == name:
                return m
        raise FormatError(self.path, "metrics", f"no metric named {name!r}")

    def summary_scope_column(self, metric: MetricInfo, scope: str) -> FloatArray:
        """The summary (sum over profiles) of ``metric`` in ``scope``, dense by *node*."""
        stat = metric.stat_id(scope)
        if stat is None:
            return np.zeros(self.tree.size)
        return self.by_node(self.values.summary_column(stat))

    def by_node(self, by_ctx: FloatArray) -> FloatArray:
        """Re-index a dense-by-ctxId column by node (ctxIds beyond the column give 0)."""
        ids = self.tree.ctx_id
        out = np.zeros(self.tree.size)
        inside = ids < len(by_ctx)
        out[inside] = by_ctx[ids[inside]]
        return out
