"""What one thread's profile says about native runtimes' worker threads: the role it can play.

A thread whose samples have Python frames *dispatches* work to a runtime (:mod:`.runtimes`)
where its call path first enters one of the runtime's modules below a Python frame: that frame
is a *dispatch*, and the thread's values below it, its time there. A thread none of whose
samples has a Python frame, and whose outermost frame of its own (below placeholders and the C
library's thread start) is in a runtime's pool modules in nearly every sample (a stack that
could not be unwound to the thread's start stays in the thread), is one of that runtime's
*workers*. :func:`roles_of` finds both on the profile's own call-path tree as it is
read, so that the roles travel with the profile (node ids re-mapped with it) even where its
values are dropped until the statistics (``--memory-limit``); :mod:`.graft` decides from every
thread's roles where each worker's time goes.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.runtimes import (
    Dispatches,
    Process,
    Roles,
    is_logical,
    pool_runtime_of,
    runtime_of,
    starts_threads,
)
from pyhpctk.analysis.unify import ProfileData, levels, module_name

_NAME_TAIL = re.compile(r"-([0-9a-fA-F]+)-([0-9]+)-[0-9]+\.hpcrun$")


def process_of(data: ProfileData, measurement: str) -> Process:
    """The process a profile's thread belongs to: pyrun's and hpcrun's header, else the file
    name (``...-HOSTID-PID-GEN.hpcrun``)."""
    host = data.header.get("host-id", "")
    pid = data.header.get("process-id", "")
    if not pid:
        found = _NAME_TAIL.search(data.name)
        if found is not None:
            host, pid = host or found.group(1), found.group(2)
    return (measurement, host.lower().lstrip("0"), pid)


def _code_table(
    codes: npt.NDArray[np.int64],
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]
]:
    """Per module code (an array indexed by code): runtime, pool runtime, Python, own code."""
    size = int(codes.max(initial=0)) + 1
    runtime = np.full(size, -1, dtype=np.int64)
    pool = np.full(size, -1, dtype=np.int64)
    python = np.zeros(size, dtype=bool)
    own = np.zeros(size, dtype=bool)
    for code in codes.tolist():
        name = module_name(code)
        if name is None:  # placeholders
            continue
        runtime[code] = runtime_of(name)
        pool[code] = pool_runtime_of(name)
        python[code] = is_logical(name)
        own[code] = not starts_threads(name)
    return runtime, pool, python, own


def roles_of(data: ProfileData, measurement: str) -> Roles | None:
    """The profile's roles, or None when it has none (no runtime module and no Python)."""
    if not len(data.value_node):
        return None
    columns = data.tree.columns()
    code = columns.code
    runtime, pool, python, own = _code_table(np.unique(code))
    if not np.any(runtime >= 0) and not np.any(pool >= 0):
        if np.any(python):
            return Roles(process_of(data, measurement), python=True)
        return None
    parent = columns.parent
    by_depth, cuts = levels(parent)
    n = len(parent)
    in_python = np.zeros(n, dtype=bool)
    first = np.full(n, -1, dtype=np.int64)  # the outermost frame of the thread's own
    wanted = np.unique(runtime[runtime >= 0]).tolist()
    entry = {r: np.full(n, -1, dtype=np.int64) for r in wanted}
    for d in range(len(cuts) - 1):
        level = by_depth[cuts[d] : cuts[d + 1]]
        up = parent[level]
        rooted = up < 0
        safe = np.where(rooted, 0, up)
        above_python = ~rooted & in_python[safe]
        in_python[level] = above_python | python[code[level]]
        above = np.where(rooted, -1, first[safe])
        mine = own[code[level]]
        first[level] = np.where(above >= 0, above, np.where(mine, level, -1))
        for r, into in entry.items():
            above_entry = np.where(rooted, -1, into[safe])
            starts = above_python & (runtime[code[level]] == r)
            into[level] = np.where(above_entry >= 0, above_entry, np.where(starts, level, -1))
    roles = Roles(process_of(data, measurement))
    value_nodes = np.unique(data.value_node)
    if np.any(in_python[value_nodes]):
        roles.python = True
        for r, into in entry.items():
            dispatch = _dispatches(data, r, into)
            if dispatch is not None:
                roles.dispatches.append(dispatch)
        return roles
    kind = _pool_kind(data, first, pool[code])
    if kind is None:
        return None
    outer = first[value_nodes]
    kept = (outer < 0) | (pool[code[np.maximum(outer, 0)]] == kind)
    roles.worker = kind
    roles.nodes = value_nodes[kept]
    roles.pool = np.unique(outer[kept & (outer >= 0)])
    if data.trace_time is not None and data.trace_node is not None:
        roles.trace_time, roles.trace_node = data.trace_time, data.trace_node
    return roles


#: The share of a worker's time that must start in one pool's modules: a sample whose native
#: stack could not be unwound to the thread's start (its outermost frame a kernel's, seen under
#: load) stays where it is, and does not make the thread a stranger.
POOL_SHARE = 0.9


def _pool_kind(
    data: ProfileData, first: npt.NDArray[np.int64], pool_of: npt.NDArray[np.int64]
) -> int | None:
    """The pool whose modules hold the outermost own frame of at least :data:`POOL_SHARE` of
    the thread's values (every metric summed), or None."""
    outer = first[data.value_node]
    known = outer >= 0
    if not np.any(known):
        return None
    kinds = pool_of[outer[known]]
    weight = np.abs(data.value[known])
    total = float(weight.sum())
    candidates = np.unique(kinds[kinds >= 0])
    for kind in candidates.tolist():
        if float(weight[kinds == kind].sum()) >= POOL_SHARE * total:
            return int(kind)
    return None


def _dispatches(data: ProfileData, runtime: int, entry: npt.NDArray[np.int64]) -> Dispatches | None:
    """The profile's values and trace records below its dispatches into ``runtime``."""
    below = entry[data.value_node]
    rows = np.flatnonzero(below >= 0)
    if not len(rows):
        return None
    node, where = np.unique(below[rows], return_inverse=True)
    weight = np.zeros((len(node), max(len(data.metrics), 1)), dtype=np.float64)
    np.add.at(weight, (where, data.value_metric[rows]), data.value[rows])
    dispatch = Dispatches(runtime, node, weight)
    if data.trace_time is not None and data.trace_node is not None:
        traced = data.trace_node
        at = np.where(traced >= 0, entry[np.maximum(traced, 0)], -1)
        keep = np.flatnonzero(at >= 0)
        dispatch.time = data.trace_time[keep]
        dispatch.which = np.searchsorted(node, at[keep]).astype(np.int64)
    return dispatch


__all__ = ["process_of", "roles_of"]
