"""Worker threads of native runtimes placed under the Python lines that gave them work.

OpenMP's, OpenBLAS's and PyTorch's pools run the work a Python line hands them on threads that
have no Python frame; on their own those threads' time sits under "application thread", cut off
from the line. Here (issue #36 item 3), from every thread's :class:`~.worker_roles.Roles`:

1. :func:`plan_grafts` (rank 0, after the frames are expanded): the workers of each runtime in
   each process are confirmed (where a structure file or symbols name their outermost frame, it
   must be the pool's thread start, :mod:`.runtimes`) and their time is shared among the
   process's *dispatches* into that runtime: the frames where its Python threads' call paths
   enter it. By default in proportion to the dispatchers' values below each dispatch, metric by
   metric; where the worker and its dispatchers were traced (``pyrun -t``), each worker sample
   goes to the dispatch of the dispatchers' trace record nearest to it in time, and a frame's
   values are shared as its samples are (the proportion stays for frames no record names).
   Below each dispatch a marker (``<OpenBLAS worker threads>``, a pyhpctk placeholder) holds a
   copy of each worker frame's call path from the pool's thread start down; the copies are new
   raw frames, expanded like any other.
2. :func:`graft_profile` (every rank, its own profiles): a worker profile's values move to the
   copies, each split by those shares (the last part takes what the others leave, so the
   parts add up to the value), and, by time, its trace records to the copy their sample went
   to. The profile keeps every value, so per-thread totals do not change.

Workers with no dispatch in their process (no Python thread of theirs was sampled in the
runtime) stay where they were; pyprof says so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.context import LexicalType
from pyhpctk.analysis.expand import Expansion, ModuleClassifiers, expand
from pyhpctk.analysis.runtimes import RUNTIMES, Process, Roles, starts_threads
from pyhpctk.analysis.unify import ProfileData, RawKey, RawTree
from pyhpctk.formats.hpcrun_constants import placeholder_ip


def _ints() -> npt.NDArray[np.int64]:
    return np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class GraftGroup:
    """One runtime's worker threads in one process, and where their time goes.

    ``share[i, g]``: dispatch ``i``'s share of global metric ``g`` (a metric the dispatchers
    have none of is shared as all their values are); ``time``/``which``: the dispatchers' trace
    records below a dispatch, by time (empty: in proportion only); ``nodes``: the workers'
    frames that hold values, ascending; ``pair``: keys ``i * len(nodes) + j`` of the copies
    made, ascending, and ``copy`` the raw frame of each.
    """

    runtime: int
    workers: list[int]
    dispatch: npt.NDArray[np.int64]
    share: npt.NDArray[np.float64]
    time: npt.NDArray[np.int64]
    which: npt.NDArray[np.int64]
    nodes: npt.NDArray[np.int64]
    pair: npt.NDArray[np.int64] = field(default_factory=_ints)
    copy: npt.NDArray[np.int64] = field(default_factory=_ints)

    @property
    def by_time(self) -> bool:
        return bool(len(self.time))

    def copies(
        self, dispatch: npt.NDArray[np.int64], row: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """The raw frames of the copies of ``nodes[row]`` below ``dispatch`` (each made)."""
        key = dispatch * len(self.nodes) + row
        at = np.searchsorted(self.pair, key)
        found: npt.NDArray[np.int64] = self.copy[at]
        return found

    def assign(self, time: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """The dispatch of each worker sample taken at ``time``: that of the dispatchers'
        record nearest in time (the earlier of two as near)."""
        t = time.astype(np.int64)
        after = np.searchsorted(self.time, t, side="left")
        last = len(self.time) - 1
        before = np.clip(after - 1, 0, last)
        later = np.clip(after, 0, last)
        gap_before = np.where(after > 0, t - self.time[before], np.iinfo(np.int64).max)
        gap_after = np.where(after <= last, self.time[later] - t, np.iinfo(np.int64).max)
        chosen: npt.NDArray[np.int64] = np.where(
            gap_after < gap_before, self.which[later], self.which[before]
        )
        return chosen

    def samples(
        self, trace_time: npt.NDArray[np.uint64], trace_node: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Of a worker's trace: the records at its frames with values, the row in ``nodes``
        of each and the dispatch it goes to."""
        row = np.minimum(np.searchsorted(self.nodes, trace_node), max(len(self.nodes) - 1, 0))
        at = np.flatnonzero((trace_node >= 0) & (self.nodes[row] == trace_node))
        return at, row[at], self.assign(trace_time[at])


@dataclass(slots=True)
class GraftPlan:
    """Every group, and the group of each worker profile (by input index)."""

    groups: list[GraftGroup] = field(default_factory=list)
    group_of: dict[int, int] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Planning (rank 0)


def plan_grafts(
    raw: RawTree,
    expansion: Expansion,
    classifiers: ModuleClassifiers,
    roles: Sequence[tuple[int, Roles]],
    mappings: dict[int, npt.NDArray[np.int64]],
    n_metrics: int,
    mode: str,
    problems: list[str],
) -> tuple[Expansion, GraftPlan]:
    """The groups of ``roles`` (input index, roles; in index order), their copies appended to
    ``raw`` and expanded; the expansion with them."""
    plan = GraftPlan()
    processes: dict[Process, list[tuple[int, Roles]]] = {}
    for index, found in roles:
        processes.setdefault(found.process, []).append((index, found))
    parents: list[int] = []
    keys: list[RawKey] = []
    base = len(raw)
    for process, threads in processes.items():
        for runtime in range(len(RUNTIMES)):
            workers = [
                (i, r)
                for i, r in threads
                if r.worker == runtime and _pool_confirmed(raw, classifiers, r, runtime)
            ]
            if not workers:
                continue
            group = _group(runtime, threads, workers, mappings, n_metrics, mode)
            if group is None:
                if any(r.python for _, r in threads):
                    problems.append(_alone(runtime, process, len(workers)))
                continue
            _make_copies(raw, group, workers, base, parents, keys)
            for index, _ in workers:
                plan.group_of[index] = len(plan.groups)
            plan.groups.append(group)
    if not parents:
        return expansion, plan
    raw.extend(parents, keys)
    grown = expand(raw, classifiers, expansion.tree, base, expansion)
    grown.split_node, grown.split_leaf = expansion.split_node, expansion.split_leaf
    grown.split_call, grown.split_fraction = expansion.split_call, expansion.split_fraction
    return grown, plan


def _alone(runtime: int, process: Process, count: int) -> str:
    name = RUNTIMES[runtime].name
    threads = "thread stays a thread" if count == 1 else "threads stay threads"
    return (
        f"{count} {name} worker {threads} of its own (process {process[2] or '?'}): no Python "
        f"thread of that process was sampled in {name} (docs/pyprof.md, worker threads)"
    )


#: A function no symbol of its library covers (``libgomp.so.1 @ 0x1d2e0``: a wheel's stripped
#: libgomp hides gomp_thread_start; :func:`.symbols.unknown_function`), or one named after the
#: nearest symbol before it, as pyprof named them before (``omp_in_final+0xa0 [libgomp.so.1]``).
_NEAREST_SYMBOL = re.compile(r"(\+0x[0-9a-f]+( \[[^\]]*\])?| @ 0x[0-9a-f]+)$")


def _pool_confirmed(
    raw: RawTree, classifiers: ModuleClassifiers, roles: Roles, runtime: int
) -> bool:
    """Whether a worker's named outermost frames show its runtime's thread start: one of them
    is the start, or none is named. Another named one beside the start is a stack the engine
    could not unwind to it (``memset@plt`` on a busy machine), not a thread of another kind."""
    keys = raw.keys
    named = False
    for node in roles.pool.tolist():
        module, offset, _ = keys[node]
        if module is None:
            continue
        steps = classifiers.steps(module, offset)
        first = steps[0] if steps else None
        if first is None or first.lexical_type is not LexicalType.FUNCTION:
            continue  # nothing names it: the module alone decides
        if first.function is None or first.function.name is None:
            continue
        if _NEAREST_SYMBOL.search(first.function.name):
            continue  # a stripped library's unnamed code: its name says nothing
        if RUNTIMES[runtime].starts_in(first.function.name):
            return True
        named = True
    return not named


def _group(
    runtime: int,
    threads: list[tuple[int, Roles]],
    workers: list[tuple[int, Roles]],
    mappings: dict[int, npt.NDArray[np.int64]],
    n_metrics: int,
    mode: str,
) -> GraftGroup | None:
    """The shares and the time line of one process's dispatches into ``runtime``."""
    parts = [
        (index, d)
        for index, r in threads
        for d in r.dispatches
        if d.runtime == runtime and len(d.node)
    ]
    if not parts:
        return None
    dispatch = np.unique(np.concatenate([d.node for _, d in parts]))
    weight = np.zeros((len(dispatch), n_metrics + 1), dtype=np.float64)
    times: list[npt.NDArray[np.int64]] = []
    which: list[npt.NDArray[np.int64]] = []
    for index, d in parts:
        rows = np.searchsorted(dispatch, d.node)
        columns = mappings[index][: d.weight.shape[1]]
        weight[np.ix_(rows, columns)] += d.weight[:, : len(columns)]
        if len(d.time):
            times.append(d.time.astype(np.int64))
            which.append(rows[d.which])
    weight[:, n_metrics] = weight[:, :n_metrics].sum(axis=1)
    totals = weight.sum(axis=0)
    if totals[n_metrics] <= 0:
        return None
    share = weight / np.where(totals > 0, totals, 1.0)
    share[:, totals <= 0] = share[:, [n_metrics]]
    time = np.concatenate(times) if times and mode == "auto" else np.zeros(0, np.int64)
    order = np.argsort(time, kind="stable")
    return GraftGroup(
        runtime,
        [index for index, _ in workers],
        dispatch,
        share[:, :n_metrics],
        time[order],
        np.concatenate(which)[order] if len(time) else np.zeros(0, np.int64),
        np.unique(np.concatenate([r.nodes for _, r in workers])),
    )


def _used_pairs(group: GraftGroup, workers: list[tuple[int, Roles]]) -> npt.NDArray[np.int64]:
    """The keys of the copies the workers' values will go to (:func:`_fractions`' rule)."""
    k, w = len(group.dispatch), len(group.nodes)
    if not group.by_time:
        return np.arange(k * w, dtype=np.int64)
    used = np.zeros((w, k), dtype=bool)
    for _, roles in workers:
        rows = np.searchsorted(group.nodes, roles.nodes)
        if roles.trace_time is None or roles.trace_node is None:
            used[rows] = True
            continue
        _, row, chosen = group.samples(roles.trace_time, roles.trace_node)
        seen = np.zeros((w, k), dtype=bool)
        seen[row, chosen] = True
        untraced = rows[~seen[rows].any(axis=1)]
        seen[untraced] = True
        used |= seen
    j, i = np.nonzero(used)
    return np.sort(i * w + j)


def _make_copies(
    raw: RawTree,
    group: GraftGroup,
    workers: list[tuple[int, Roles]],
    base: int,
    parents: list[int],
    keys: list[RawKey],
) -> None:
    """Below each dispatch, the marker and the copies of the workers' frames, appended to
    ``parents``/``keys`` (numbered from ``base``); the group learns its copies."""
    raw_parent, raw_keys = raw.parent, raw.keys
    marker: RawKey = (None, placeholder_ip(RUNTIMES[group.runtime].marker), True)
    paths = [_own_path(raw_parent, raw_keys, int(node)) for node in group.nodes.tolist()]
    pairs = _used_pairs(group, workers)
    w = len(group.nodes)
    made: dict[tuple[int, RawKey], int] = {}

    def node(parent: int, key: RawKey) -> int:
        found = made.get((parent, key))
        if found is None:
            found = made[(parent, key)] = base + len(parents)
            parents.append(parent)
            keys.append(key)
        return found

    copies = np.empty(len(pairs), dtype=np.int64)
    for at, pair in enumerate(pairs.tolist()):
        i, j = divmod(pair, w)
        below = node(int(group.dispatch[i]), marker)
        for frame in paths[j]:
            below = node(below, raw_keys[frame])
        copies[at] = below
    group.pair, group.copy = pairs, copies


def _own_path(parent: list[int], keys: list[RawKey], node: int) -> list[int]:
    """A worker frame's call path from the thread's outermost frame of its own (below the
    placeholders and the C library's thread start) down to it."""
    path = []
    while node >= 0:
        path.append(node)
        node = parent[node]
    path.reverse()
    start = 0
    while start < len(path) and (
        keys[path[start]][0] is None or starts_threads(keys[path[start]][0])
    ):
        start += 1
    return path[start:]


# --------------------------------------------------------------------------------------------
# Moving a worker's values (every rank, its own profiles)


def graft_profile(
    data: ProfileData, index: int, plan: GraftPlan | None, mapping: npt.NDArray[np.int64]
) -> None:
    """Move a worker profile's values (and, by time, its trace) to its group's copies."""
    if plan is None or index not in plan.group_of:
        return
    group = plan.groups[plan.group_of[index]]
    row = np.minimum(np.searchsorted(group.nodes, data.value_node), len(group.nodes) - 1)
    stays = group.nodes[row] != data.value_node  # not from the pool's start: left in the thread
    kept = (data.value_node[stays], data.value_metric[stays], data.value[stays])
    if np.any(stays):
        moves = ~stays
        data.value_node, data.value_metric, data.value = (
            data.value_node[moves],
            data.value_metric[moves],
            data.value[moves],
        )
        row = row[moves]
    fractions = group.share[:, mapping[data.value_metric]].T.copy()
    if group.by_time and data.trace_time is not None and data.trace_node is not None:
        at, traced_row, chosen = group.samples(data.trace_time, data.trace_node)
        counts = np.zeros((len(group.nodes), len(group.dispatch)), dtype=np.float64)
        np.add.at(counts, (traced_row, chosen), 1.0)
        total = counts.sum(axis=1)
        traced = total[row] > 0
        fractions[traced] = counts[row[traced]] / total[row[traced], None]
        trace_node = data.trace_node.copy()
        trace_node[at] = group.copies(chosen, traced_row)
        data.trace_node = trace_node
    r, i = np.nonzero(fractions > 0)
    part = data.value[r] * fractions[r, i]
    # The last part of each value is what the others leave, so that the parts add up to it.
    last = np.flatnonzero(np.append(r[1:] != r[:-1], True))
    first = np.concatenate([[0], last[:-1] + 1])
    others = np.add.reduceat(part, first) - part[last] if len(part) else part
    part[last] = data.value[r[last]] - others
    data.value_node = np.concatenate([group.copies(i, row[r]), kept[0]])
    data.value_metric = np.concatenate([data.value_metric[r], kept[1]])
    data.value = np.concatenate([part, kept[2]])


__all__ = ["GraftGroup", "GraftPlan", "graft_profile", "plan_grafts"]
