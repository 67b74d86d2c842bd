"""The cct.db exchange: each rank's values sent to the owner of their contexts, in rounds.

cct.db is context-major (formats.md §3.4), the ranks' values profile-major. Non-zero counts per
context are summed over ranks; the contexts are cut into windows (*rounds*, :func:`plan_rounds`)
so that no rank handles more than its share of ``memory_limit`` at a time, and each window is
split among the ranks by those counts (:func:`split_even`). :func:`outgoing` cuts this rank's
blocks into the owners' slices (one ``alltoall`` moves each value once);
:func:`own_window` sorts what an owner received context-major, lays out its cct.db blocks as
slices to write with ``pwritev`` and computes the summary of its contexts exactly as
:func:`.stats.summarize` does (a loop's summary ``lex_aware`` needs its children's ``function``
values: they are sent to the loop's owner too). Floating-point sums see the same values in the
same order on any number of ranks, so every rank count writes the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.planes import ProfilePlane, Spill
from pyhpctk.analysis.stats import SparseValues, TreeShape, summarize
from pyhpctk.core.metrics import N_SCOPES, SCOPE_FUNCTION, Partial
from pyhpctk.formats import cctdb

BYTES_PER_VALUE = 192
"""Peak bytes one value costs a rank while cct.db is built (sent, received, sorted, written)."""

MAX_ROUND_VALUES = 1 << 25
"""Values per rank in one cct.db round at most, whatever the memory limit: a round's message
between two ranks (18 bytes a value, pickled) must stay under MPI's 2 GiB."""


def split_even(
    weights: npt.NDArray[np.int64], parts: int, first_share: float = 1.0
) -> npt.NDArray[np.int64]:
    """``parts + 1`` bounds of contiguous ranges of ``weights`` with about equal sums.

    ``first_share`` scales the first range's target (rank 0 has serial work of its own).
    """
    cumulative = np.concatenate([[0], np.cumsum(weights, dtype=np.int64)])
    total = int(cumulative[-1])
    if total == 0:
        inner = np.linspace(0, len(weights), parts + 1)[1:-1].astype(np.int64)
    else:
        capacity = np.ones(parts, dtype=np.float64)
        capacity[0] = first_share
        targets = total * np.cumsum(capacity)[:-1] / capacity.sum()
        inner = np.searchsorted(cumulative, targets, side="left").astype(np.int64)
    bounds = np.concatenate([[0], inner, [len(weights)]]).astype(np.int64)
    return np.maximum.accumulate(np.clip(bounds, 0, len(weights)))


def plan_rounds(
    counts: npt.NDArray[np.int64], ranks: int, memory_limit: int | None
) -> list[tuple[int, int]]:
    """Windows of contexts, each holding at most ``ranks * memory_limit`` bytes of values.

    Without a limit, a window holds at most :data:`MAX_ROUND_VALUES` values per rank (MPI
    messages count their bytes in a C ``int``). A context is never split, so one whose values
    alone exceed the budget gets a round of its own.
    """
    n = len(counts)
    if n == 0:
        return []
    per_rank = MAX_ROUND_VALUES
    if memory_limit is not None:
        per_rank = min(max(1, memory_limit // BYTES_PER_VALUE), MAX_ROUND_VALUES)
    budget = per_rank * ranks
    cumulative = np.cumsum(counts, dtype=np.int64)
    rounds = []
    start = 0
    while start < n:
        before = int(cumulative[start - 1]) if start else 0
        end = int(np.searchsorted(cumulative, before + budget, side="right"))
        end = max(end, start + 1)
        rounds.append((start, min(end, n)))
        start = end
    return rounds


@dataclass(slots=True)
class Window:
    """One rank's share of a round: its cct.db bytes, metric counts and summary values."""

    pieces: list[memoryview]
    size: int
    n_metrics: npt.NDArray[np.int64]
    summary: SparseValues


Payload = tuple[
    npt.NDArray[np.int32],
    npt.NDArray[np.uint16],
    npt.NDArray[np.int32],
    npt.NDArray[np.float64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.float64],
]
"""(ctx, metric, profile index, value) of the owner's contexts, then (ctx, metric, value) of
``function``-scope values of loop children the owner needs for its loops' summary."""


def _joined(parts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _joined_float(parts: list[npt.NDArray[np.float64]]) -> npt.NDArray[np.float64]:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)


def outgoing(
    ranks: int,
    planes: list[ProfilePlane],
    spill: Spill | None,
    owners: npt.NDArray[np.int64],
    loop_children: npt.NDArray[np.int64],
    loop_parents: npt.NDArray[np.int64],
) -> list[Payload]:
    """What this rank sends each owner in one round, profile by profile in index order."""
    start, stop = int(owners[0]), int(owners[-1])
    # Per owner: lists of (ctx, metric, profile index, value) slices, profile by profile.
    parts: list[
        tuple[
            list[npt.NDArray[np.int32]],
            list[npt.NDArray[np.uint16]],
            list[npt.NDArray[np.int32]],
            list[npt.NDArray[np.float64]],
        ]
    ] = [([], [], [], []) for _ in range(ranks)]
    # Loop children outside their parent's owner's range, per owner.
    in_window = (loop_parents >= start) & (loop_parents < stop)
    children = loop_children[in_window]
    child_owner = np.searchsorted(owners, loop_parents[in_window], side="right") - 1
    foreign = (children < owners[child_owner]) | (children >= owners[child_owner + 1])
    children, child_owner = children[foreign], child_owner[foreign]
    order = np.argsort(children, kind="stable")
    children, child_owner = children[order], child_owner[order]
    extra_ctx: list[npt.NDArray[np.int64]] = []
    extra_metric: list[npt.NDArray[np.int64]] = []
    extra_value: list[npt.NDArray[np.float64]] = []
    extra_owner: list[npt.NDArray[np.int64]] = []
    for m in planes:
        block = m.load(spill)
        ids = block.ctx_ids().astype(np.int64)
        bounds = block.bounds().astype(np.int64)
        # Blocks are sorted by context and owners hold contiguous ranges: one search cuts
        # the block into the owners' slices.
        cut = np.searchsorted(ids, owners)
        if cut[-1] > cut[0]:
            at = bounds[cut].tolist()
            cuts = cut.tolist()
            ids32 = ids.astype(np.int32)
            counts = np.diff(bounds)
            metric_ids = block.values["metric_id"]
            values = block.values["value"]
            for r in range(ranks):
                c0, c1 = cuts[r], cuts[r + 1]
                if c1 > c0:
                    v0, v1 = at[r], at[r + 1]
                    ctx_r, metric_r, prof_r, value_r = parts[r]
                    ctx_r.append(np.repeat(ids32[c0:c1], counts[c0:c1]))
                    metric_r.append(metric_ids[v0:v1].astype(np.uint16))  # copies
                    prof_r.append(np.full(v1 - v0, m.position + 1, dtype=np.int32))
                    value_r.append(values[v0:v1].astype(np.float64))
        if len(children) and len(ids):
            at_child = np.minimum(np.searchsorted(ids, children), len(ids) - 1)
            present = ids[at_child] == children
            if np.any(present):
                rows = at_child[present]
                count = bounds[rows + 1] - bounds[rows]
                index = np.repeat(bounds[rows], count) + (
                    np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
                )
                metric = block.values["metric_id"][index].astype(np.int64)
                keep = metric % N_SCOPES == SCOPE_FUNCTION
                extra_ctx.append(np.repeat(children[present], count)[keep])
                extra_metric.append(metric[keep])
                extra_value.append(np.asarray(block.values["value"][index][keep], np.float64))
                extra_owner.append(np.repeat(child_owner[present], count)[keep])

    e_ctx = _joined(extra_ctx)
    e_metric = _joined(extra_metric)
    e_value = _joined_float(extra_value)
    e_owner = _joined(extra_owner)
    e_by = np.argsort(e_owner, kind="stable")
    e_cuts = np.searchsorted(e_owner[e_by], np.arange(ranks + 1))
    result: list[Payload] = []
    for r in range(ranks):
        extra = e_by[e_cuts[r] : e_cuts[r + 1]]
        ctx_r, metric_r, prof_r, value_r = parts[r]
        result.append(
            (
                np.concatenate(ctx_r) if ctx_r else np.zeros(0, np.int32),
                np.concatenate(metric_r) if metric_r else np.zeros(0, np.uint16),
                np.concatenate(prof_r) if prof_r else np.zeros(0, np.int32),
                np.concatenate(value_r) if value_r else np.zeros(0, np.float64),
                e_ctx[extra],
                e_metric[extra],
                e_value[extra],
            )
        )
        parts[r] = ([], [], [], [])
    return result


def own_window(
    incoming: list[Payload], lo: int, hi: int, shape: TreeShape, partials: tuple[Partial, ...]
) -> Window:
    """cct.db blocks of contexts ``lo..hi-1`` (slices to write in order), their summary values."""
    ctx = np.concatenate([p[0] for p in incoming]).astype(np.int64)
    metric = np.concatenate([p[1] for p in incoming]).astype(np.int64)
    prof = np.concatenate([p[2] for p in incoming])
    value = np.concatenate([p[3] for p in incoming])
    key = (ctx << 16) | metric
    order = np.argsort(key, kind="stable")
    key, prof_sorted, value_sorted = key[order], prof[order], value[order]
    del order
    span = hi - lo
    local = (key >> 16) - lo
    n_values = np.bincount(local, minlength=span).astype(np.int64)
    new_metric = np.ones(len(key), dtype=bool)
    new_metric[1:] = key[1:] != key[:-1]
    first = np.flatnonzero(new_metric)
    n_metrics = np.bincount(local[first], minlength=span).astype(np.int64)
    value_bounds = np.concatenate([[0], np.cumsum(n_values)])
    sizes = n_values * cctdb.CCT_VALUE_DTYPE.itemsize + (
        (n_metrics * cctdb.CCT_METRIC_INDEX_DTYPE.itemsize + 3) // 4 * 4
    )
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    pieces: list[memoryview] = []
    if len(key):
        records = np.empty(len(key), cctdb.CCT_VALUE_DTYPE)
        records["prof_index"] = prof_sorted
        records["value"] = value_sorted
        index = np.empty(len(first), cctdb.CCT_METRIC_INDEX_DTYPE)
        index["metric_id"] = (key[first] & 0xFFFF).astype(np.uint16)
        index["start"] = first - value_bounds[local[first]]
        # Each block is [values][metric indices][padding]: the values and indices of all
        # blocks are two sorted arrays, so the file bytes are alternating slices of them,
        # written with one pwritev per 1024 slices (no image of the window is built).
        value_bytes = (n_values * cctdb.CCT_VALUE_DTYPE.itemsize).tolist()
        index_bytes = (n_metrics * cctdb.CCT_METRIC_INDEX_DTYPE.itemsize).tolist()
        pads = (sizes.astype(np.int64) - n_values * 12 - n_metrics * 10).tolist()
        values_view = memoryview(records.view(np.uint8).data).cast("B")
        index_view = memoryview(index.view(np.uint8).data).cast("B")
        zeros = memoryview(bytes(4))
        v = i = 0
        for nv, ni, pad in zip(value_bytes, index_bytes, pads, strict=True):
            if nv:
                pieces.append(values_view[v : v + nv])
                v += nv
            if ni:
                pieces.append(index_view[i : i + ni])
                i += ni
            if pad:
                pieces.append(zeros[:pad])
    # The summary from the sorted rows (summarize's stable sort then finds them in order).
    extra = [p for p in incoming if len(p[4])]
    del ctx, metric, prof, value
    summary_input = SparseValues(
        np.concatenate([key >> 16] + [p[4] for p in extra]),
        np.concatenate([key & 0xFFFF] + [p[5] for p in extra]),
        np.concatenate([value_sorted] + [p[6] for p in extra]),
    )
    del key, prof_sorted, value_sorted
    summary = summarize(shape, [summary_input], partials)
    inside = (summary.ctx >= lo) & (summary.ctx < hi)
    return Window(
        pieces,
        int(offsets[-1]),
        n_metrics,
        SparseValues(summary.ctx[inside], summary.metric[inside], summary.value[inside]),
    )


__all__ = [
    "BYTES_PER_VALUE",
    "MAX_ROUND_VALUES",
    "Payload",
    "Window",
    "outgoing",
    "own_window",
    "plan_rounds",
    "split_even",
]
