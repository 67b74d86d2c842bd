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
from typing import Any

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.metrics import Partial
from pyhpctk.analysis.planes import ProfilePlane, Spill
from pyhpctk.analysis.stats import SparseValues, TreeShape, summarize_groups
from pyhpctk.core.metrics import SCOPE_FUNCTION, scope_of
from pyhpctk.formats import cctdb, profiledb

BYTES_PER_VALUE = 192
"""Peak bytes one value costs a rank while cct.db is built (sent, received, sorted, written)."""

MAX_ROUND_VALUES = 1 << 25
"""Values per rank in one cct.db round at most, whatever the memory limit: a round's message
between two ranks (18 bytes a value, pickled) must stay under MPI's 2 GiB."""


def split_even(
    weights: npt.NDArray[np.int64],
    parts: int,
    first_share: float = 1.0,
    speeds: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.int64]:
    """``parts + 1`` bounds of contiguous ranges of ``weights`` with about equal sums, or sums
    in proportion to ``speeds`` (one per part, :func:`.balance.rank_speeds`).

    ``first_share`` scales the first range's target (rank 0 has serial work of its own).
    """
    cumulative = np.concatenate([[0], np.cumsum(weights, dtype=np.int64)])
    total = int(cumulative[-1])
    if total == 0:
        inner = np.linspace(0, len(weights), parts + 1)[1:-1].astype(np.int64)
    else:
        capacity = np.ones(parts, dtype=np.float64)
        if speeds is not None:
            capacity[:] = speeds
        capacity[0] *= first_share
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
    per_rank = MAX_ROUND_VALUES
    if memory_limit is not None:
        per_rank = min(max(1, memory_limit // BYTES_PER_VALUE), MAX_ROUND_VALUES)
    return cctdb.windows(counts, per_rank * ranks)


@dataclass(slots=True)
class Window:
    """One rank's share of a round: its cct.db bytes, metric counts and summary values."""

    pieces: list[memoryview]
    size: int
    n_metrics: npt.NDArray[np.int64]
    summary: SparseValues


# The columns one round sends: per value its metric id and value; per run of values of one
# context in one profile, the context and the run's length; per profile slice, the profile.db
# index and its number of values; and the loop children's function values an owner needs for
# its loops' summary lex_aware (formats.md §3.2), one row each.
COLUMN_DTYPES: tuple[np.dtype[Any], ...] = tuple(
    np.dtype(t) for t in ("u2", "f8", "i4", "i4", "i4", "i8", "i8", "i8", "f8")
)
METRIC, VALUE, RUN_CTX, RUN_LEN, PROFILE, PROFILE_LEN, CHILD_CTX, CHILD_METRIC, CHILD_VALUE = range(
    9
)


@dataclass(slots=True)
class Columns:
    """What a rank sends (to every owner) or receives (from every rank) in one round: one
    contiguous array per field, owners' (or senders') parts back to back in rank order, and
    ``counts[rank, field]``. Received parts in rank order are in profile order: ranks hold
    contiguous ranges of profiles."""

    arrays: tuple[npt.NDArray[Any], ...]
    counts: npt.NDArray[np.int64]

    def rank_part(self, field: int, rank: int) -> npt.NDArray[Any]:
        start = int(self.counts[:rank, field].sum())
        return self.arrays[field][start : start + int(self.counts[rank, field])]


def outgoing(
    ranks: int,
    planes: list[ProfilePlane],
    spill: Spill | None,
    owners: npt.NDArray[np.int64],
    loop_children: npt.NDArray[np.int64],
    loop_parents: npt.NDArray[np.int64],
) -> Columns:
    """What this rank sends each owner in one round, profile by profile in index order.

    Each value is copied once, into the column it travels in. Slices of blocks kept in memory
    are views until then. Of a block in the scratch file, the context index is read, then only
    the values of the round's contexts (the whole block when loops need their children's
    values from elsewhere in it), so only the round's values stay in memory.
    """
    start, stop = int(owners[0]), int(owners[-1])
    parts: list[list[list[npt.NDArray[Any]]]] = [[[] for _ in range(9)] for _ in range(ranks)]
    children, child_owner = _foreign_children(owners, start, stop, loop_children, loop_parents)
    # Context ids are 32-bit: so are the owners here, not to widen every block's ids.
    limits = np.minimum(owners, 2**32 - 1).astype(np.uint32)
    for m in planes:
        block: profiledb.ProfileValues | None = None
        if spill is None or len(children):
            block = m.load(spill)
            index = block.ctx_indices
        else:
            index = spill.index(m.spilled_at, m.n_values, m.n_contexts)
        ids = np.asarray(index["ctx_id"], dtype=np.uint32)
        bounds = np.empty(len(index) + 1, dtype=np.int64)
        bounds[:-1] = index["start"]
        bounds[-1] = m.n_values
        # Blocks are sorted by context and owners hold contiguous ranges: one search cuts
        # the block into the owners' slices.
        cut = np.searchsorted(ids, limits)
        if cut[-1] > cut[0]:
            at = bounds[cut].tolist()
            cuts = cut.tolist()
            # The round's runs only: views of the whole index would keep it alive, for every
            # profile, until the round is sent.
            run_ids, run_lengths = ids, np.diff(bounds)
            if cuts[-1] - cuts[0] < len(ids):
                run_ids = ids[cuts[0] : cuts[-1]].copy()
                run_lengths = run_lengths[cuts[0] : cuts[-1]].copy()
                cuts = [c - cut[0] for c in cuts]
            if block is not None:
                first, values = 0, block.values
                if spill is not None:  # keep only the round's values
                    values = np.ascontiguousarray(values[at[0] : at[-1]])
                    first = at[0]
            else:
                assert spill is not None
                first, values = at[0], spill.values(m.spilled_at, at[0], at[-1])
            for r in range(ranks):
                c0, c1 = cuts[r], cuts[r + 1]
                if c1 > c0:
                    v0, v1 = at[r] - first, at[r + 1] - first
                    mine = parts[r]
                    mine[METRIC].append(values["metric_id"][v0:v1])
                    mine[VALUE].append(values["value"][v0:v1])
                    mine[RUN_CTX].append(run_ids[c0:c1])
                    mine[RUN_LEN].append(run_lengths[c0:c1])
                    mine[PROFILE].append(np.array([m.position + 1]))
                    mine[PROFILE_LEN].append(np.array([v1 - v0]))
        if block is not None and len(children) and len(ids):
            _children_values(block, ids, bounds, children, child_owner, parts)
    counts = np.array(
        [[sum(len(a) for a in parts[r][f]) for f in range(9)] for r in range(ranks)],
        dtype=np.int64,
    ).reshape(ranks, 9)
    arrays = []
    for f, dtype in enumerate(COLUMN_DTYPES):
        column = np.empty(int(counts[:, f].sum()), dtype)
        at_ = 0
        for r in range(ranks):
            n = int(counts[r, f])
            if n:
                np.concatenate(parts[r][f], out=column[at_ : at_ + n], casting="unsafe")
            at_ += n
            parts[r][f] = []
        arrays.append(column)
    return Columns(tuple(arrays), counts)


def _foreign_children(
    owners: npt.NDArray[np.int64],
    start: int,
    stop: int,
    loop_children: npt.NDArray[np.int64],
    loop_parents: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Loop children of this round's loops owned by another rank than their loop, sorted, and
    the owner of each one's loop."""
    in_window = (loop_parents >= start) & (loop_parents < stop)
    children = loop_children[in_window]
    child_owner = np.searchsorted(owners, loop_parents[in_window], side="right") - 1
    foreign = (children < owners[child_owner]) | (children >= owners[child_owner + 1])
    children, child_owner = children[foreign], child_owner[foreign]
    order = np.argsort(children, kind="stable")
    return children[order], child_owner[order]


def _children_values(
    block: profiledb.ProfileValues,
    ids: npt.NDArray[np.uint32],
    bounds: npt.NDArray[np.int64],
    children: npt.NDArray[np.int64],
    child_owner: npt.NDArray[np.int64],
    parts: list[list[list[npt.NDArray[Any]]]],
) -> None:
    """One profile's ``function`` values of the foreign loop children, to their loops' owners."""
    at_child = np.minimum(np.searchsorted(ids, children.astype(np.uint32)), len(ids) - 1)
    present = ids[at_child] == children
    if not np.any(present):
        return
    rows = at_child[present]
    count = bounds[rows + 1] - bounds[rows]
    index = np.repeat(bounds[rows], count) + (
        np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    )
    metric = block.values["metric_id"][index].astype(np.int64)
    function = scope_of(metric) == SCOPE_FUNCTION
    ctx = np.repeat(children[present], count)[function]
    owner = np.repeat(child_owner[present], count)[function]
    value = np.asarray(block.values["value"][index][function], np.float64)
    metric = metric[function]
    for r in np.unique(owner).tolist():
        mine = owner == r
        parts[r][CHILD_CTX].append(ctx[mine])
        parts[r][CHILD_METRIC].append(metric[mine])
        parts[r][CHILD_VALUE].append(value[mine])


def own_window(
    received: Columns, lo: int, hi: int, shape: TreeShape, partials: tuple[Partial, ...]
) -> Window:
    """cct.db blocks of contexts ``lo..hi-1`` (slices to write in order), their summary values.

    The values arrive in profile order; each goes to its place in context-major order
    (formats.md §3.4: by context, metric, then profile) by a counting sort over (context,
    metric) keys, so each keeps the profile order within its key without a comparison sort.
    """
    arrays = received.arrays
    metric, value = arrays[METRIC], arrays[VALUE]
    n, span = len(value), hi - lo
    used, dense = _metric_ids(metric, n, span)
    n_ids = max(len(used), 1)
    # Keys are numpy's index type: bincount and every fancy index would convert narrower ones
    # (a whole copy, or a buffer a call).
    run_key = arrays[RUN_CTX].astype(np.intp)
    run_key -= lo
    run_key *= n_ids
    key = np.repeat(run_key, arrays[RUN_LEN])
    del run_key
    key += metric if dense is None else dense[metric]
    counts = np.bincount(key, minlength=span * n_ids)
    records = np.empty(n, cctdb.CCT_VALUE_DTYPE)
    sorted_value = np.empty(n, np.float64)
    _place_context_major(key, counts, arrays, sorted_value, records["prof_index"])
    del key
    records["value"] = sorted_value
    present = np.flatnonzero(counts).astype(np.int64)
    starts = (np.cumsum(counts) - counts)[present]
    u_local, u_metric = present // n_ids, used[present % n_ids] if len(used) else present
    n_values = np.bincount(u_local, weights=counts[present], minlength=span).astype(np.int64)
    n_metrics = np.bincount(u_local, minlength=span).astype(np.int64)
    value_bounds = np.concatenate([[0], np.cumsum(n_values)])
    index = np.empty(len(present), cctdb.CCT_METRIC_INDEX_DTYPE)
    index["metric_id"] = u_metric.astype(np.uint16)
    index["start"] = starts - value_bounds[u_local]
    pieces, size = _block_pieces(records, index, n_values, n_metrics)
    summary = summarize_groups(
        shape, u_local + lo, u_metric, starts, sorted_value, partials, _children(arrays)
    )
    return Window(pieces, size, n_metrics, summary)


def _metric_ids(
    metric: npt.NDArray[np.uint16], n: int, span: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp] | None]:
    """The metric ids a window's keys count in (sorted) and each id's place among them
    (None: the ids are their own places).

    Every id up to the largest when that makes few enough keys (:func:`_place_context_major`'s
    counting sort): its keys are then ``context * (largest + 1) + id``, without looking each
    value's id up; else only the ids present. Either way keys sort as (context, id) do.
    """
    top = int(metric.max()) + 1 if len(metric) else 1
    if span * top <= 4 * n + (1 << 20):
        return np.arange(top, dtype=np.int64), None
    seen = np.zeros(1 << 16, dtype=bool)  # metric ids are 16-bit (profile.db's)
    seen[metric] = True  # (bincount would copy them to 64 bits first)
    used = np.flatnonzero(seen).astype(np.int64)
    dense = np.zeros(int(used[-1]) + 1 if len(used) else 1, dtype=np.intp)
    dense[used] = np.arange(len(used))
    return used, dense


def _place_context_major(
    key: npt.NDArray[np.integer[Any]],
    counts: npt.NDArray[np.int64],
    arrays: tuple[npt.NDArray[Any], ...],
    sorted_value: npt.NDArray[np.float64],
    prof_index: npt.NDArray[np.uint32],
) -> None:
    """Each received value and its profile.db index at its place when sorted by ``key``
    (``counts``: values per key), values of one key in arrival order.

    Arrival order is profile order and a profile has at most one value per key, so each
    profile's values move by one fancy-indexed step per profile (a counting sort), straight
    to their places. When the key space is much larger than the values (a sparse window), a
    stable sort does it.
    """
    value, profiles, lengths = arrays[VALUE], arrays[PROFILE], arrays[PROFILE_LEN]
    if len(counts) > 4 * len(key) + (1 << 20):
        position = np.empty(len(key), np.int64)
        position[np.argsort(key, kind="stable")] = np.arange(len(key))
        sorted_value[position] = value
        prof_index[position] = np.repeat(profiles, lengths)
        return
    fill = (np.cumsum(counts) - counts).astype(key.dtype)
    at = 0
    for profile, length in zip(profiles.tolist(), lengths.tolist(), strict=True):
        mine = key[at : at + length]
        placed = fill[mine]
        fill[mine] = placed + 1
        sorted_value[placed] = value[at : at + length]
        prof_index[placed] = profile
        at += length


def _block_pieces(
    records: npt.NDArray[np.void],
    index: npt.NDArray[np.void],
    n_values: npt.NDArray[np.int64],
    n_metrics: npt.NDArray[np.int64],
) -> tuple[list[memoryview], int]:
    """The window's cct.db bytes as slices to write back to back, and their total size.

    Each block is [values][metric indices][padding] (formats.md §3.4): the values and indices of
    all blocks are two sorted arrays, so the file bytes are alternating slices of them, written
    with one pwritev per 1024 slices (no image of the window is built).
    """
    value_bytes = n_values * cctdb.CCT_VALUE_DTYPE.itemsize
    index_bytes = n_metrics * cctdb.CCT_METRIC_INDEX_DTYPE.itemsize
    sizes = value_bytes + (index_bytes + 3) // 4 * 4
    pieces: list[memoryview] = []
    if len(records):
        values_view = memoryview(records.view(np.uint8).data).cast("B")
        index_view = memoryview(index.view(np.uint8).data).cast("B")
        zeros = memoryview(bytes(4))
        v = i = 0
        pads = (sizes - value_bytes - index_bytes).tolist()
        for nv, ni, pad in zip(value_bytes.tolist(), index_bytes.tolist(), pads, strict=True):
            if nv:
                pieces.append(values_view[v : v + nv])
                v += nv
            if ni:
                pieces.append(index_view[i : i + ni])
                i += ni
            if pad:
                pieces.append(zeros[:pad])
    return pieces, int(sizes.sum())


def _children(arrays: tuple[npt.NDArray[Any], ...]) -> SparseValues | None:
    """The received loop children's function values, summed per (context, metric) in profile
    order (the order their rows arrived in)."""
    ctx, metric, value = arrays[CHILD_CTX], arrays[CHILD_METRIC], arrays[CHILD_VALUE]
    if not len(ctx):
        return None
    stride = int(metric.max()) + 1
    key = ctx * stride + metric
    order = np.argsort(key, kind="stable")
    key, value = key[order], value[order]
    first = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    return SparseValues(key[first] // stride, key[first] % stride, np.add.reduceat(value, first))


__all__ = [
    "BYTES_PER_VALUE",
    "COLUMN_DTYPES",
    "MAX_ROUND_VALUES",
    "Columns",
    "Window",
    "outgoing",
    "own_window",
    "plan_rounds",
    "split_even",
]
