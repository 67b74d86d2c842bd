"""One profile as arrays: an ``.hpcrun`` profile and its trace as a :class:`~.unify.ProfileData`.

:func:`extract` turns a profile into its own :class:`~.unify.RawTree` (formats.md §1.5), its
point values (node, metric, value × period; §1.8) and its trace records (§2), all in terms of
that tree, decoded in bulk with numpy.

pyprof reads profiles with ``hpcrun.read(strict=False)``: what the strict reader would refuse
(:func:`~pyhpctk.formats.hpcrun_check.fatal_problems`: duplicate or reserved node ids, parents
missing or after their children, no root or two, value runs out of order, unknown nodes and
metrics) :func:`extract` finds on the columns it converts from the file's big-endian bytes
anyway, each converted once. Should anything be wrong, the error raised is the strict reader's,
so a damaged profile is reported in the same words either way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.metrics import MeasuredMetric
from pyhpctk.analysis.unify import GPU_RANGE_MODULES, ProfileData, RawKey, RawTree, module_code
from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcrun_check import fatal_problems
from pyhpctk.formats.hpcrun_model import (
    CCT_FLAG_UNWOUND,
    GPU_ROOT_LM_ID,
    PLACEHOLDER_LM_ID,
    TRACE_FLAG_CALL_TRACE,
    HpcrunProfile,
    HpctraceFile,
    MetricDescriptor,
)


class _Locator:
    """hpcrun node id -> position in the file, for many ids at once (-1: no such node)."""

    def __init__(self, ids: npt.NDArray[np.int64]) -> None:
        n = len(ids)
        self.duplicates = False
        self.table: npt.NDArray[np.int64] | None = None
        low = int(ids.min()) if n else 0
        high = int(ids.max()) if n else 0
        if low >= 0 and high < 8 * n + 1024:
            table = np.full(high + 1, -1, dtype=np.int64)
            table[ids] = np.arange(n, dtype=np.int64)
            self.duplicates = int(np.count_nonzero(table >= 0)) != n
            self.table = table
        else:
            self.order = np.argsort(ids, kind="stable")
            self.sorted = ids[self.order]
            self.duplicates = n > 1 and bool(np.any(self.sorted[1:] == self.sorted[:-1]))

    def __call__(self, wanted: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        table = self.table
        if table is not None:
            if not len(wanted) or (int(wanted.min()) >= 0 and int(wanted.max()) < len(table)):
                direct: npt.NDArray[np.int64] = table[wanted]  # every id inside the table
                return direct
            inside = (wanted >= 0) & (wanted < len(table))
            found: npt.NDArray[np.int64] = np.where(inside, table[np.where(inside, wanted, 0)], -1)
            return found
        if not len(self.sorted):
            return np.full(len(wanted), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.sorted, wanted), len(self.sorted) - 1)
        result: npt.NDArray[np.int64] = np.where(
            self.sorted[at] == wanted, self.order[at], -1
        ).astype(np.int64)
        return result


def metric_info(descriptor: MetricDescriptor) -> MeasuredMetric:
    """The parts of an ``.hpcrun`` metric descriptor pyprof uses (formats.md §1.6)."""
    return MeasuredMetric(
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
    """Reduce one profile (and its trace) to a raw tree plus bulk value and trace arrays.

    A profile the strict reader refuses raises the FormatError it would (module docstring).
    """
    try:
        return _extract(profile, trace, name, path, measurement)
    except Exception:
        fatal = fatal_problems(profile)
        if fatal:
            raise FormatError(path, *fatal[0]) from None
        raise


def _extract(
    profile: HpcrunProfile,
    trace: HpctraceFile | None,
    name: str,
    path: str | None,
    measurement: str,
) -> ProfileData:
    tree, local, locate = _cct_tree(profile, path)

    def lookup(node_ids: npt.NDArray[np.int64], what: str) -> npt.NDArray[np.int64]:
        """Raw nodes of hpcrun node ids (values, trace records), vectorised."""
        where = locate(node_ids)
        if len(node_ids) and int(where.min()) < 0:
            bad = node_ids[where < 0][0]
            raise FormatError(path, what, f"refers to CCT node {int(bad)}, which does not exist")
        return where if local is None else local[where]

    metrics = [metric_info(d) for d in profile.metrics]
    value_node, metric, decoded = _decoded_values(profile, metrics, lookup, path)
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
        value=decoded,
        trace_time=trace_time,
        trace_node=trace_node,
        call_trace=call_trace,
        module_paths={lm.path: measurement for lm in profile.load_modules},
    )


def _cct_tree(
    profile: HpcrunProfile, path: str | None
) -> tuple[RawTree, npt.NDArray[np.int64] | None, _Locator]:
    """A profile's CCT as a :class:`RawTree` (formats.md §1.5): the tree, the raw node of each
    file node (None: the same position) and the lookup from hpcrun node ids to file positions.

    The tree's call-path hashes are computed here, once: sorted, they show whether two
    siblings have the same key (which the slow path merges), and merges reuse them.
    """
    cct = profile.cct
    n = len(cct)
    ids = cct["id"].astype(np.int64)
    locate = _Locator(ids)
    if locate.duplicates:
        raise FormatError(path, "cct", "node ids are not unique")
    if n and int(ids.min()) == 0:
        raise FormatError(path, "cct", "node id 0 is reserved and may not be used")
    # Node ids -> positions in file order: hpcrun numbers nodes densely (ids below a few
    # times the node count), so a direct table usually does it; sparse ids fall back to a
    # sorted search. Id 0 is no node's: roots (parent 0) find -1.
    parents = cct["parent_id"].astype(np.int64)
    parent_pos = locate(parents)
    del parents
    is_root = parent_pos < 0
    lm_ids = cct["lm_id"].astype(np.uint16)
    if int(np.count_nonzero(is_root & (lm_ids != GPU_ROOT_LM_ID))) > 1:
        raise FormatError(path, "cct", "more than one root")
    bad = (is_root != (cct["parent_id"] == 0)) | (parent_pos >= np.arange(n))
    if np.any(bad):
        first = int(np.argmax(bad))
        raise FormatError(
            path,
            "cct",
            f"node {int(ids[first])}: parent {int(cct['parent_id'][first])} does not precede it",
        )
    del bad, is_root
    modules = {lm.id: lm.path for lm in profile.load_modules}
    module_of: dict[int, str | None] = {PLACEHOLDER_LM_ID: None, **GPU_RANGE_MODULES}
    used = np.unique(lm_ids)
    for lm in used.tolist():
        if lm in module_of and lm not in modules:
            continue
        found = modules.get(lm)
        if found is None:
            bad_node = int(ids[np.argmax(lm_ids == lm)])
            raise FormatError(
                path, "cct", f"node {bad_node} names load module {lm}, not in load map"
            )
        module_of[lm] = found
    codes = np.array([module_code(module_of[lm]) for lm in used.tolist()], dtype=np.int64)
    if len(used) == 1:
        code = np.full(n, codes[0], dtype=np.int64)
    else:
        code = codes[np.searchsorted(used, lm_ids)]
    ips = cct["lm_ip"].astype(np.uint64)
    unwound = np.bitwise_and(cct["flags"], CCT_FLAG_UNWOUND).view(np.bool_)
    tree = RawTree.from_columns(parent_pos, code, ips, unwound)
    # Equal keys under one parent give equal path hashes: only then (or on a collision of
    # two different paths, astronomically rare) does the exact, slower path run.
    hashes = np.sort(tree.path_hashes())
    if n < 2 or not np.any(hashes[1:] == hashes[:-1]):
        return tree, None, locate
    keys: list[RawKey] = list(
        zip([module_of[lm] for lm in lm_ids.tolist()], ips.tolist(), unwound.tolist(), strict=True)
    )
    tree = RawTree()
    local = np.empty(n, dtype=np.int64)
    for index in range(n):
        parent = int(parent_pos[index])
        local[index] = tree.node(-1 if parent < 0 else int(local[parent]), keys[index])
    return tree, local, locate


def _decoded_values(
    profile: HpcrunProfile,
    metrics: list[MeasuredMetric],
    lookup: Callable[[npt.NDArray[np.int64], str], npt.NDArray[np.int64]],
    path: str | None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """(raw node, metric index, value x period) of every stored value (formats.md §1.8: run i
    of (value, metric) pairs belongs to node_starts[i])."""
    values = profile.values
    starts = profile.node_starts
    n_values = len(values)
    run_start = starts["start"].astype(np.int64)
    if len(run_start) == 0 and n_values:
        raise FormatError(path, "sparse metrics", f"{n_values} values belong to no node")
    if len(run_start) and int(run_start[0]) != 0:
        raise FormatError(path, "sparse metrics", "the first node's values do not start at 0")
    lengths = np.diff(run_start, append=n_values)
    if len(lengths) and int(lengths.min()) < 0:
        raise FormatError(path, "sparse metrics", "node value runs are out of order")
    run_nodes = lookup(starts["node_id"].astype(np.int64), "sparse metrics")
    value_node = np.repeat(run_nodes, lengths)
    metric = values["metric"].astype(np.int64)
    if len(metric) and metric.max() >= len(metrics):
        raise FormatError(path, "sparse metrics", f"metric index {int(metric.max())} out of range")
    # The value bits, native, read as doubles; the integer metrics' converted in place.
    decoded = values["value_bits"].astype(np.uint64).view(np.float64)
    integer = [i for i, m in enumerate(metrics) if not m.is_real]
    if integer and n_values:
        rows = np.isin(metric, integer) if len(integer) < len(metrics) else slice(None)
        decoded[rows] = decoded[rows].view(np.uint64).astype(np.float64)
    period = np.array([m.period for m in metrics] or [1], dtype=np.float64)
    if len(metrics) == 1:
        decoded *= period[0]
    elif n_values:
        decoded *= period[metric]
    return value_node, metric, decoded


__all__ = ["extract", "metric_info"]
