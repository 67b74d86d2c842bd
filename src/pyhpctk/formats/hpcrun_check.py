"""Checking an ``.hpcrun`` profile: what the reader refuses and what ``verify`` reports
(formats.md §1.3, §1.5, §1.8).

:func:`fatal_problems` finds what hpcprof could not use (duplicate node ids, a parent after its
child, no root or two roots, a value on a node missing from the CCT, a metric index past the
table, a broken ``end!`` sentinel): the reader (:mod:`pyhpctk.formats.hpcrun`) refuses such a
file. :func:`verify` adds what no measurement writes though the file parses: a header number that
is no number (``mpi-rank = %``), a trace span that ends before it starts, a NaN or infinite
value, a negative time. Pure functions of the model, vectorised; no I/O.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from pyhpctk.formats.hpcrun_constants import (
    GPU_CONTEXT_LM_ID,
    GPU_RANGE_LM_ID,
    GPU_ROOT_LM_ID,
    METRIC_SHOW_NAMES,
    PLACEHOLDER_LM_ID,
    PRIMARY_ROOT,
    VALFMT_INT,
    id_kind,
    placeholder_ip,
)
from pyhpctk.formats.hpcrun_model import VALFMT_REAL, HpcrunProfile, is_time_metric

# formats.md §1.3: the nv-pairs hpcrun writes as numbers (``%d``, ``%lx``, ``%ld``).
_SIGNED, _UNSIGNED = re.compile(r"-?[0-9]+"), re.compile(r"[0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]+")
NUMERIC_NVPAIRS: dict[str, tuple[re.Pattern[str], str]] = {
    "mpi-rank": (_SIGNED, "a decimal integer"),
    "thread-id": (_SIGNED, "a decimal integer"),
    "host-id": (_HEX, "a hexadecimal number"),
    "process-id": (_UNSIGNED, "a decimal number"),
    "trace-min-time": (_UNSIGNED, "a decimal number of nanoseconds"),
    "trace-max-time": (_UNSIGNED, "a decimal number of nanoseconds"),
    "trace-disorder": (_UNSIGNED, "a decimal number"),
}
REQUIRED_NVPAIRS = ("program-name", "mpi-rank", "thread-id", "host-id", "process-id")
_U64_MAX = 2**64 - 1
_PRIMARY_ROOT_IP = placeholder_ip(PRIMARY_ROOT)


def _show(text: str) -> str:
    return text if text.isprintable() else repr(text)


def header_problems(profile: HpcrunProfile) -> list[str]:
    """Missing nv-pairs, nv-pairs that must be numbers but are not, and a trace span that ends
    before it starts (formats.md §1.3)."""
    problems = []
    present = {key for key, _ in profile.nvpairs}
    for name in REQUIRED_NVPAIRS:
        if name not in present:
            problems.append(f"header: nv-pair {name!r} is missing")
    for key, value in profile.nvpairs:
        rule = NUMERIC_NVPAIRS.get(key)
        if rule is not None and rule[0].fullmatch(value) is None:
            problems.append(f"header: nv-pair {key!r} is {_show(value)!r}, not {rule[1]}")
    span = trace_span(profile)
    if span is None and all(
        _UNSIGNED.fullmatch(profile.header(key)) for key in ("trace-min-time", "trace-max-time")
    ):
        problems.append("header: trace-min-time or trace-max-time does not fit in 64 bits")
    if span is not None and span[0] > span[1]:
        problems.append(f"header: trace-min-time {span[0]} is after trace-max-time {span[1]}")
    return problems


def trace_span(profile: HpcrunProfile) -> tuple[int, int] | None:
    """``(trace-min-time, trace-max-time)`` from the header, or None when either is missing or
    not a 64-bit number; ``(0, 0)`` means the thread recorded no trace (formats.md §1.3)."""
    low, high = profile.header("trace-min-time"), profile.header("trace-max-time")
    if _UNSIGNED.fullmatch(low) is None or _UNSIGNED.fullmatch(high) is None:
        return None
    if max(len(low), len(high)) > 20 or max(int(low), int(high)) > _U64_MAX:
        return None
    return int(low), int(high)


def value_problems(profile: HpcrunProfile) -> list[str]:
    """Values no measurement can produce: a real value that is NaN or infinite, a negative
    time (a metric named ``... (sec)``, :func:`~pyhpctk.formats.hpcrun_model.is_time_metric`).

    The profile's sparse section must be sound (no metric index past the table).
    """
    if not len(profile.values):
        return []
    node_ids, metric, decoded = profile.decoded_values()
    problems = []
    real = np.array([m.value_format == VALFMT_REAL for m in profile.metrics], dtype=bool)
    time = np.array([is_time_metric(m.name) for m in profile.metrics], dtype=bool)
    with np.errstate(invalid="ignore"):
        negative = decoded < 0
    for bad, what in (
        (real[metric] & ~np.isfinite(decoded), "a value that is not a finite number"),
        (time[metric] & negative, "a negative time"),
    ):
        if bad.any():
            i = int(np.argmax(bad))
            m, node, value = int(metric[i]), int(node_ids[i]), float(decoded[i])
            problems.append(
                f"sparse metrics: node {node} has {what}, {value!r}, for metric {m} "
                f"({_show(profile.metrics[m].name)}) ({int(bad.sum())} such values)"
            )
    return problems


# --------------------------------------------------------------------------------------------
# Consistency checks (vectorised: profiles may hold millions of nodes and values)


class _Index:
    """CCT node ids sorted once, to find the file positions of many ids at a time.

    Ids and queries are sorted as ``id << 32 | position`` keys (numpy sorts u64 far faster than
    it argsorts), so lookups are a merge of two sorted arrays rather than random binary searches.
    """

    def __init__(self, cct: npt.NDArray[np.void]) -> None:
        self.ids = np.asarray(cct["id"], dtype=np.uint32)
        keys = np.sort(_keyed(self.ids))
        self.sorted = (keys >> np.uint64(32)).astype(np.uint32)
        self.order = (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)

    def duplicate(self) -> int | None:
        """An id that appears more than once, if any."""
        same = self.sorted[1:] == self.sorted[:-1]
        return int(self.sorted[1:][same][0]) if same.any() else None

    def positions(self, ids: npt.NDArray[np.uint32]) -> npt.NDArray[np.int64]:
        """The file position of each id, or -1 where the CCT has no such node."""
        found_at = np.full(len(ids), -1, dtype=np.int64)
        if len(self.sorted) == 0 or len(ids) == 0:
            return found_at
        keys = np.sort(_keyed(np.asarray(ids, dtype=np.uint32)))
        query = (keys >> np.uint64(32)).astype(np.uint32)
        where = np.minimum(np.searchsorted(self.sorted, query), len(self.sorted) - 1)
        hit = self.sorted[where] == query
        found_at[(keys & np.uint64(0xFFFFFFFF)).astype(np.int64)] = np.where(
            hit, self.order[where], -1
        )
        return found_at


def _keyed(ids: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint64]:
    """``id << 32 | index`` for each id: sorting these sorts ids and keeps where each came from."""
    return (ids.astype(np.uint64) << np.uint64(32)) | np.arange(len(ids), dtype=np.uint64)


def fatal_problems(profile: HpcrunProfile, index: _Index | None = None) -> list[tuple[str, str]]:
    """(section, problem) pairs that make the profile unusable; empty when it can be used."""
    problems: list[tuple[str, str]] = []
    cct = profile.cct
    index = index if index is not None else _Index(cct)
    n = len(cct)
    if n:
        if int(index.sorted[0]) == 0:
            problems.append(("cct", "node id 0 is reserved and may not be used"))
        duplicate = index.duplicate()
        if duplicate is not None:
            problems.append(("cct", f"node id {duplicate} appears more than once"))
        parents = np.asarray(cct["parent_id"], dtype=np.uint32)
        lm_ids = np.asarray(cct["lm_id"], dtype=np.uint16)
        roots = parents == 0
        main_roots = roots & (lm_ids != GPU_ROOT_LM_ID)
        if not roots.any():
            problems.append(("cct", "the CCT has no root (no node with parent 0)"))
        elif main_roots.sum() > 1:
            ids = index.ids[main_roots][:2]
            problems.append(
                (
                    "cct",
                    f"the CCT has {int(main_roots.sum())} roots (nodes {int(ids[0])} and "
                    f"{int(ids[1])}...); only a GPU_ROOT (lm 65533) may be a second root",
                )
            )
        child_pos = np.flatnonzero(~roots)
        parent_pos = index.positions(parents[child_pos])
        missing = parent_pos < 0
        if missing.any():
            i = child_pos[np.argmax(missing)]
            problems.append(
                ("cct", f"node {int(index.ids[i])} has parent {int(parents[i])}, not in the CCT")
            )
        late = parent_pos > child_pos
        if late.any():
            i = child_pos[np.argmax(late)]
            problems.append(
                ("cct", f"node {int(index.ids[i])}'s parent {int(parents[i])} follows it")
            )
        elif (parent_pos == child_pos).any():
            i = child_pos[np.argmax(parent_pos == child_pos)]
            problems.append(("cct", f"node {int(index.ids[i])} is its own parent"))

    values, starts = profile.values, profile.node_starts
    metric = np.asarray(values["metric"], dtype=np.uint16)
    if len(metric) and int(metric.max()) >= len(profile.metrics):
        problems.append(
            (
                "sparse metrics",
                f"metric index {int(metric.max())} out of range: the table has "
                f"{len(profile.metrics)} metrics",
            )
        )
    start = np.asarray(starts["start"], dtype=np.uint64)
    if len(start) == 0 and len(values):
        problems.append(("sparse metrics", f"{len(values)} values belong to no node"))
    if len(start):
        if int(start[0]) != 0:
            problems.append(("sparse metrics", f"the first node's values start at {start[0]}"))
        if (np.diff(start.astype(np.int64)) < 0).any() or int(start[-1]) > len(values):
            problems.append(
                ("sparse metrics", "node start indices are not ascending within the values")
            )
        node_ids = np.asarray(starts["node_id"], dtype=np.uint32)
        absent = index.positions(node_ids) < 0
        if absent.any():
            problems.append(
                ("sparse metrics", f"values name node {int(node_ids[absent][0])}, not in the CCT")
            )
    return problems


def verify(profile: HpcrunProfile) -> list[str]:
    """Every consistency problem of ``profile`` as ``SECTION: PROBLEM``; empty when clean.

    Includes everything :func:`read` refuses, plus what hpcprof would stumble on or that hpcrun
    never writes: unknown load modules, bad metric flags, unsorted or zero values, nodes with
    values out of CCT order, an id tuple naming kinds missing from the dictionary, and
    (:mod:`~pyhpctk.formats.hpcrun_check`) header numbers that are no numbers, a trace span
    that ends before it starts, NaN or infinite values, negative times.
    """
    index = _Index(profile.cct)
    problems = [f"{section}: {problem}" for section, problem in fatal_problems(profile, index)]
    if not profile.version.startswith("04."):
        problems.append(f"header: version {profile.version!r} is not 04.xx")
    problems.extend(header_problems(profile))

    lm_ids = [m.id for m in profile.load_modules]
    if len(set(lm_ids)) != len(lm_ids):
        problems.append("load map: load module ids are not unique")
    if PLACEHOLDER_LM_ID in lm_ids:
        problems.append("load map: id 0 is reserved for placeholders")

    cct = profile.cct
    if len(cct) == 0:
        problems.append("cct: the CCT is empty (hpcrun always writes a ^Primary root)")
    else:
        used = np.unique(np.asarray(cct["lm_id"], dtype=np.uint16))
        special = {PLACEHOLDER_LM_ID, GPU_ROOT_LM_ID, GPU_RANGE_LM_ID, GPU_CONTEXT_LM_ID}
        unknown = sorted(set(used.tolist()) - set(lm_ids) - special)
        if unknown:
            problems.append(f"cct: nodes use load module ids {unknown} missing from the load map")
        roots = np.flatnonzero(np.asarray(cct["parent_id"]) == 0)
        for i in roots[:4]:
            lm, ip = int(cct["lm_id"][i]), int(cct["lm_ip"][i])
            if lm != GPU_ROOT_LM_ID and (lm, ip) != (PLACEHOLDER_LM_ID, _PRIMARY_ROOT_IP):
                problems.append(f"cct: root {int(cct['id'][i])} is not the ^Primary placeholder")

    for i, m in enumerate(profile.metrics):
        if m.flags[8:] != bytes(8):
            problems.append(f"metric table: metric {i} ({m.name}): unused flag bytes are not 0")
        if not m.formula and m.value_format not in (VALFMT_INT, VALFMT_REAL):
            problems.append(
                f"metric table: metric {i} ({m.name}): valFmt {m.value_format} is neither "
                "1 (int) nor 2 (real)"
            )
        if m.show not in METRIC_SHOW_NAMES:
            problems.append(f"metric table: metric {i} ({m.name}): unknown show {m.show}")

    dictionary = {kind for kind, _ in profile.id_names}
    for kind in np.asarray(profile.id_tuple["kind"], dtype=np.uint16).tolist():
        if id_kind(kind) not in dictionary:
            problems.append(f"sparse metrics: id tuple kind {id_kind(kind)} not in the dictionary")

    if not any(s.startswith("sparse metrics") for s in problems):
        problems.extend(_sparse_order_problems(profile, index))
        problems.extend(value_problems(profile))
    return problems


def _sparse_order_problems(profile: HpcrunProfile, index: _Index) -> list[str]:
    """Problems of a well-formed sparse section that hpcrun would never write (§1.8)."""
    problems = []
    values, starts = profile.values, profile.node_starts
    start = np.asarray(starts["start"], dtype=np.int64)
    node_ids = np.asarray(starts["node_id"], dtype=np.uint32)
    sorted_ids = np.sort(node_ids)
    if (sorted_ids[1:] == sorted_ids[:-1]).any():
        problems.append("sparse metrics: a node appears twice in the node starts")
    counts = np.diff(np.append(start, len(values)))
    if (counts == 0).any():
        problems.append("sparse metrics: a node is listed without any value")
    positions = index.positions(node_ids)
    if (np.diff(positions) < 0).any():
        problems.append("sparse metrics: nodes with values are not in CCT (file) order")
    metric = np.asarray(values["metric"], dtype=np.int64)
    if len(metric) > 1:
        new_node = np.zeros(len(metric), dtype=bool)
        new_node[start[start < len(metric)]] = True
        unsorted = (np.diff(metric) <= 0) & ~new_node[1:]
        if unsorted.any():
            problems.append("sparse metrics: metric indices are not strictly ascending in a node")
    if (np.asarray(values["value_bits"], dtype=np.uint64) == 0).any():
        problems.append("sparse metrics: a zero value is stored (hpcrun stores only non-zeros)")
    return problems


def decoded_values(
    profile: HpcrunProfile, scaled: bool = False
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint16], npt.NDArray[np.float64]]:
    """``(node_ids u32[n], metric u16[n], values f64[n])`` of every stored value (formats.md §1.8).

    Values are decoded by each metric's valFmt (u64 or double bits), vectorised; with ``scaled``
    they are multiplied by the metric's period, as hpcprof does.
    """
    return profile.decoded_values(scaled=scaled)
