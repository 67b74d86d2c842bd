"""Call path unification: merge every profile's CCT into one tree by an associative reduction.

Each ``.hpcrun`` CCT (formats.md §1.5) names its frames by per-file load-module ids and per-file
node ids. :class:`RawTree` renames a frame by what it *is* — ``(module path, offset, unwound)``,
or ``(None, placeholder code, ...)`` for placeholders (lm_id 0) — so that the same call path in
two profiles is the same node. :meth:`RawTree.merge` inserts another tree and returns where each
of its nodes landed; merging is associative and commutative up to node numbering, which lets
``-j`` workers (or MPI ranks) unify their share of profiles and reduce pairwise.

:func:`extract` turns one profile into a :class:`ProfileData`: its own raw tree, its point
values (node, metric, value × period) decoded in bulk with numpy, and its trace records, all in
terms of that tree. Nothing here knows about structure files or databases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.core.metrics import MetricInfo
from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcrun_model import (
    CCT_FLAG_UNWOUND,
    GPU_CONTEXT_LM_ID,
    GPU_RANGE_LM_ID,
    GPU_ROOT_LM_ID,
    PLACEHOLDER_LM_ID,
    TRACE_FLAG_CALL_TRACE,
    HpcrunProfile,
    HpctraceFile,
    MetricDescriptor,
)

# formats.md §1.5: lm ids of hpcrun's "outlined range trees", named like placeholders.
GPU_RANGE_MODULES: dict[int, str | None] = {
    GPU_ROOT_LM_ID: "<gpu root>",
    GPU_CONTEXT_LM_ID: "<gpu context>",
    GPU_RANGE_LM_ID: "<gpu range>",
}

RawKey = tuple[str | None, int, bool]
"""``(module path or None for a placeholder, offset or packed placeholder code, unwound)``."""


class RawTree:
    """A forest of frames keyed by ``(parent, RawKey)``; ids are dense in creation order."""

    __slots__ = ("_index", "keys", "parent")

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.keys: list[RawKey] = []
        self._index: dict[tuple[int, RawKey], int] | None = {}

    @classmethod
    def from_arrays(cls, parent: list[int], keys: list[RawKey]) -> RawTree:
        """A tree from parent positions and keys already free of duplicate siblings."""
        tree = cls()
        tree.parent = parent
        tree.keys = keys
        tree._index = None  # built on first insertion
        return tree

    def __len__(self) -> int:
        return len(self.parent)

    def _lookup(self) -> dict[tuple[int, RawKey], int]:
        if self._index is None:
            self._index = dict(
                zip(zip(self.parent, self.keys, strict=True), range(len(self.parent)), strict=True)
            )
        return self._index

    def node(self, parent: int, key: RawKey) -> int:
        """The node for ``key`` under ``parent`` (-1 for a root), created on first use."""
        index = self._lookup()
        found = index.get((parent, key))
        if found is not None:
            return found
        ident = len(self.parent)
        index[(parent, key)] = ident
        self.parent.append(parent)
        self.keys.append(key)
        return ident

    def merge(self, other: RawTree) -> npt.NDArray[np.int64]:
        """Insert ``other`` into this tree; element ``i`` of the result is where node ``i`` went."""
        mapping = np.empty(len(other), dtype=np.int64)
        for ident, (parent, key) in enumerate(zip(other.parent, other.keys, strict=True)):
            mapping[ident] = self.node(-1 if parent < 0 else int(mapping[parent]), key)
        return mapping

    def paths(self) -> dict[tuple[RawKey, ...], int]:
        """Every node's root path (for tests: two trees are equal when their path sets are)."""
        result: dict[tuple[RawKey, ...], int] = {}
        cache: list[tuple[RawKey, ...]] = []
        for ident, (parent, key) in enumerate(zip(self.parent, self.keys, strict=True)):
            path = ((cache[parent]) if parent >= 0 else ()) + (key,)
            cache.append(path)
            result[path] = ident
        return result


@dataclass(slots=True)
class ProfileData:
    """One profile reduced to arrays over its own :class:`RawTree` (see :func:`extract`)."""

    name: str
    tree: RawTree
    header: dict[str, str]
    id_tuple: list[tuple[int, int, int]]
    metrics: list[MetricInfo]
    value_node: npt.NDArray[np.int64]
    value_metric: npt.NDArray[np.int64]
    value: npt.NDArray[np.float64]
    trace_time: npt.NDArray[np.uint64] | None = None
    trace_node: npt.NDArray[np.int64] | None = None
    call_trace: bool = False
    module_paths: dict[str, str] = field(default_factory=dict)
    """Load-module path -> the measurement directory it is relative to."""

    def remap(self, mapping: npt.NDArray[np.int64]) -> None:
        """Renumber nodes after this profile's tree was merged into a bigger one."""
        self.value_node = mapping[self.value_node]
        if self.trace_node is not None:
            self.trace_node = np.where(self.trace_node >= 0, mapping[self.trace_node], -1)


def metric_info(descriptor: MetricDescriptor) -> MetricInfo:
    """The parts of an ``.hpcrun`` metric descriptor pyprof uses (formats.md §1.6)."""
    return MetricInfo(
        name=descriptor.name,
        description=descriptor.description,
        is_real=descriptor.is_real,
        move_to_proc=descriptor.move_to_proc,
        show=descriptor.show,
        show_percent=descriptor.show_percent,
        period=descriptor.period,
        formula=descriptor.formula,
        format=descriptor.format,
    )


def extract(
    profile: HpcrunProfile,
    trace: HpctraceFile | None,
    name: str,
    path: str | None = None,
    measurement: str = "",
) -> ProfileData:
    """Reduce one profile (and its trace) to a raw tree plus bulk value and trace arrays."""
    modules = {lm.id: lm.path for lm in profile.load_modules}
    cct = profile.cct
    ids = cct["id"].astype(np.int64)
    parents = cct["parent_id"].astype(np.int64)
    lm_ids = cct["lm_id"].astype(np.int64)
    ips = cct["lm_ip"].astype(np.uint64)
    unwound = (cct["flags"] & CCT_FLAG_UNWOUND) != 0

    # Parent positions, vectorised: node ids -> positions in file order.
    n = len(cct)
    by_id = np.argsort(ids, kind="stable")
    sorted_ids = ids[by_id]
    if n > 1 and np.any(sorted_ids[1:] == sorted_ids[:-1]):
        raise FormatError(path, "cct", "node ids are not unique")
    is_root = parents == 0
    where = np.minimum(np.searchsorted(sorted_ids, parents), max(n - 1, 0))
    parent_pos = np.where(is_root, -1, by_id[where] if n else where)
    bad = (~is_root) & ((sorted_ids[where] != parents) | (parent_pos >= np.arange(n)))
    if np.any(bad):
        first = int(np.argmax(bad))
        raise FormatError(
            path,
            "cct",
            f"node {int(ids[first])}: parent {int(parents[first])} does not precede it",
        )
    module_of: dict[int, str | None] = {PLACEHOLDER_LM_ID: None, **GPU_RANGE_MODULES}
    for lm in np.unique(lm_ids).tolist():
        if lm in module_of and lm not in modules:
            continue
        found = modules.get(lm)
        if found is None:
            bad_node = int(ids[np.argmax(lm_ids == lm)])
            raise FormatError(
                path, "cct", f"node {bad_node} names load module {lm}, not in load map"
            )
        module_of[lm] = found
    keys: list[RawKey] = list(
        zip(
            [module_of[lm] for lm in lm_ids.tolist()],
            ips.tolist(),
            unwound.tolist(),
            strict=True,
        )
    )
    # Siblings with the same key (rare) are merged by the slow path.
    sibling_key = np.lexsort((unwound, ips, lm_ids, parent_pos))
    same = np.zeros(n, dtype=bool)
    if n > 1:
        a, b = sibling_key[1:], sibling_key[:-1]
        same[1:] = (
            (parent_pos[a] == parent_pos[b])
            & (lm_ids[a] == lm_ids[b])
            & (ips[a] == ips[b])
            & (unwound[a] == unwound[b])
        )
    if not np.any(same):
        tree = RawTree.from_arrays(parent_pos.tolist(), keys)
        local = np.arange(n, dtype=np.int64)
    else:
        tree = RawTree()
        local = np.empty(n, dtype=np.int64)
        for index in range(n):
            parent = int(parent_pos[index])
            local[index] = tree.node(-1 if parent < 0 else int(local[parent]), keys[index])

    # Sorted (hpcrun id -> raw node) table, for vectorised lookups of values and trace records.
    sorted_nodes = local[by_id]

    def lookup(node_ids: npt.NDArray[np.int64], what: str) -> npt.NDArray[np.int64]:
        where = np.searchsorted(sorted_ids, node_ids)
        where = np.minimum(where, max(len(sorted_ids) - 1, 0))
        if len(node_ids) and (len(sorted_ids) == 0 or np.any(sorted_ids[where] != node_ids)):
            bad = node_ids[(len(sorted_ids) == 0) | (sorted_ids[where] != node_ids)][0]
            raise FormatError(path, what, f"refers to CCT node {int(bad)}, which does not exist")
        result: npt.NDArray[np.int64] = sorted_nodes[where]
        return result

    metrics = [metric_info(d) for d in profile.metrics]

    # formats.md §1.8: run i of (value, metric) pairs belongs to node_starts[i].
    values = profile.values
    starts = profile.node_starts
    n_values = len(values)
    run_start = starts["start"].astype(np.int64)
    run_end = np.append(run_start[1:], n_values)
    if np.any(run_end < run_start) or (len(run_start) and run_end[-1] > n_values):
        raise FormatError(path, "sparse metrics", "node value runs are out of order")
    run_nodes = lookup(starts["node_id"].astype(np.int64), "sparse metrics")
    value_node = np.repeat(run_nodes, run_end - run_start)
    metric = values["metric"].astype(np.int64)
    if len(metric) and metric.max() >= len(metrics):
        raise FormatError(path, "sparse metrics", f"metric index {int(metric.max())} out of range")
    bits = values["value_bits"].astype(np.uint64)
    is_real = np.array([m.is_real for m in metrics] or [True], dtype=bool)
    period = np.array([m.period for m in metrics] or [1], dtype=np.float64)
    real_values = bits.view(np.float64)
    int_values = bits.astype(np.float64)
    decoded = np.where(is_real[metric], real_values, int_values) * period[metric]

    trace_time = trace_node = None
    call_trace = False
    if trace is not None:
        records = trace.records
        trace_time = records["time"].astype(np.uint64)
        trace_node = lookup(records["node_id"].astype(np.int64), "trace")
        call_trace = bool(trace.flags & TRACE_FLAG_CALL_TRACE)

    id_tuple = [(int(e["kind"]), int(e["physical"]), int(e["logical"])) for e in profile.id_tuple]
    return ProfileData(
        name=name,
        tree=tree,
        header=dict(profile.nvpairs),
        id_tuple=id_tuple,
        metrics=metrics,
        value_node=value_node,
        value_metric=metric,
        value=decoded.astype(np.float64),
        trace_time=trace_time,
        trace_node=trace_node,
        call_trace=call_trace,
        module_paths={lm.path: measurement for lm in profile.load_modules},
    )


@dataclass(slots=True)
class Unified:
    """A reduction result: one tree and the profiles whose nodes refer to it."""

    tree: RawTree
    profiles: list[tuple[int, ProfileData]]


def leaf(index: int, data: ProfileData) -> Unified:
    """The reduction's unit: a single profile with its own tree."""
    return Unified(data.tree, [(index, data)])


def combine(left: Unified, right: Unified) -> Unified:
    """The associative merge of two partial unifications (``right`` is folded into ``left``)."""
    mapping = left.tree.merge(right.tree)
    for _, data in right.profiles:
        data.remap(mapping)
        data.tree = left.tree
    return Unified(left.tree, left.profiles + right.profiles)
