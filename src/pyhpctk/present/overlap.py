"""Communication against compute: what each rank's GPU did, instant by instant, from trace.db.

Every element of a GPU stream's trace line (formats.md §3.5) is one operation's interval; its
context says what it was (:func:`context_category`):

* ``communication``: a kernel whose name says it is a collective (NCCL's,
  :mod:`pyhpctk.core.communication`), below ``<gpu kernel>``;
* ``compute``: any other kernel (a kernel whose name is not known counts here);
* ``copy``: copies and memsets (``<gpu copyin>``, ``<gpu copyout>``, ``<gpu copy>``,
  ``<gpu memset>``);
* ``sync``: a synchronization (the host waited; the device did no work for it) and
  ``other`` (allocations): neither counts as GPU work.

:func:`overlap_report` gives, per rank (the ``RANK`` of the stream's id tuple) and per stream,
the time of each category; and, over the rank's *window* (its first GPU record to its last),
a partition of that window by what ran on any of its streams at each instant: compute only,
communication only, both at once (overlap), copies only (neither kernel kind), idle (nothing).
The five add up to the window. The communication kernel time of a stream is the sum of its
communication elements; a rank's communication time is the union over its streams
(communication only + overlap), equal to the sum when its collectives do not overlap one
another (one communicator stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from pyhpctk.core.communication import is_communication
from pyhpctk.errors import UsageError
from pyhpctk.present.model import Experiment, Profile, Timeline

IDLE_CONTEXT = 0
COMPUTE, COMMUNICATION, COPY, SYNC, OTHER, NOTHING = range(6)
CATEGORY_NAMES = ("compute", "communication", "copy", "sync", "other", "idle")
#: pyprof's and hpcprof's names of hpcrun's GPU placeholders (formats.md §1.5), by category.
PLACEHOLDER_CATEGORY = {
    "<gpu kernel>": COMPUTE,
    "<gpu trace>": COMPUTE,
    "<gpu copyin>": COPY,
    "<gpu copyout>": COPY,
    "<gpu copy>": COPY,
    "<gpu memset>": COPY,
    "<gpu sync>": SYNC,
    "<gpu alloc>": OTHER,
    "<gpu delete>": OTHER,
}
WORK = (COMPUTE, COMMUNICATION, COPY)


class NoOverlapError(UsageError):
    """The database has no trace of a GPU stream to analyse."""


def context_category(exp: Experiment, ctx_id: int, cache: dict[int, int] | None = None) -> int:
    """What the GPU did in context ``ctx_id`` of a stream trace (one of the categories above).

    The innermost GPU placeholder on the context's path decides; below ``<gpu kernel>`` the
    kernel's own name (the function under the placeholder) tells communication from compute.
    """
    if ctx_id == IDLE_CONTEXT:
        return NOTHING
    if cache is not None and ctx_id in cache:
        return cache[ctx_id]
    tree = exp.tree
    node = tree.node_of(ctx_id)
    below: list[int] = []
    category = OTHER
    while node > 0:
        name = tree.function_name(node)
        if name is not None and name in PLACEHOLDER_CATEGORY:
            category = PLACEHOLDER_CATEGORY[name]
            if category == COMPUTE and any(
                is_communication(tree.function_name(n) or "") for n in below
            ):
                category = COMMUNICATION
            break
        below.append(node)
        node = int(tree.parent[node])
    if cache is not None:
        cache[ctx_id] = category
    return category


def line_categories(exp: Experiment, line: Timeline, cache: dict[int, int]) -> npt.NDArray[np.int8]:
    """The category of every element of ``line`` (its last element, which only closes the
    line, is ``NOTHING``)."""
    ids, inverse = np.unique(line.ctx_ids.astype(np.int64), return_inverse=True)
    per_id = np.array([context_category(exp, int(c), cache) for c in ids.tolist()], dtype=np.int8)
    out = per_id[inverse.reshape(-1)] if len(ids) else np.zeros(0, dtype=np.int8)
    if len(out):
        out[-1] = NOTHING
    return out


def states_at(
    times: npt.NDArray[np.int64], values: npt.NDArray[Any], cuts: npt.NDArray[np.int64], empty: int
) -> npt.NDArray[Any]:
    """The value of a step function (``values[i]`` from ``times[i]`` to ``times[i+1]``) on each
    segment ``[cuts[k], cuts[k+1])``; ``empty`` before the first and from the last time on."""
    where = np.searchsorted(times, cuts[:-1], side="right") - 1
    valid = (where >= 0) & (where < len(times) - 1)
    out = np.full(len(cuts) - 1, empty, dtype=values.dtype)
    out[valid] = values[where[valid]]
    return out


@dataclass(frozen=True, slots=True)
class StreamShare:
    """One GPU stream's time per category (ns) and its rank's window."""

    profile: str
    rank: int | None
    device: int | None
    stream: int | None
    compute_ns: int
    communication_ns: int
    copy_ns: int
    sync_ns: int
    window_ns: int

    @property
    def busy_ns(self) -> int:
        return self.compute_ns + self.communication_ns + self.copy_ns

    @property
    def idle_ns(self) -> int:
        return max(0, self.window_ns - self.busy_ns)


@dataclass(frozen=True, slots=True)
class RankShare:
    """A rank's window split by what ran on its GPU streams at each instant (ns)."""

    rank: int | None
    start_ns: int
    window_ns: int
    compute_ns: int  # compute kernels and no communication kernel
    communication_ns: int  # communication kernels and no compute kernel
    overlap_ns: int  # both at once
    copy_ns: int  # copies or memsets only
    idle_ns: int  # nothing
    streams: tuple[StreamShare, ...]

    @property
    def communication_kernel_ns(self) -> int:
        """The communication kernels' time summed over streams (the trace's NCCL time)."""
        return sum(s.communication_ns for s in self.streams)

    @property
    def overlap_share(self) -> float:
        """The part of the communication that ran while compute ran too (0..1)."""
        total = self.communication_ns + self.overlap_ns
        return self.overlap_ns / total if total else 0.0


def _gpu_lines(exp: Experiment) -> list[tuple[Profile, Timeline]]:
    if exp.traces is None:
        raise NoOverlapError(f"{exp.path}: no trace.db: measure with tracing on (pyrun -t)")
    by_index = {p.index: p for p in exp.profiles}
    out = []
    for line in exp.traces.lines():
        info = by_index.get(line.profile, Profile(line.profile, ()))
        if info.is_gpu and not info.is_warp and len(line.timestamps) > 1:
            out.append((info, line))
    return out


def rank_key(rank: int | None) -> int:
    return -1 if rank is None else rank


def overlap_report(exp: Experiment) -> list[RankShare]:
    """Per rank (in rank order), its streams' categories and its window's partition."""
    lines = _gpu_lines(exp)
    if not lines:
        raise NoOverlapError(f"{exp.path}: no GPU stream in the traces: nothing to compare")
    cache: dict[int, int] = {}
    ranks: dict[int | None, list[tuple[Profile, Timeline, npt.NDArray[np.int8]]]] = {}
    for info, line in lines:
        ranks.setdefault(info.rank, []).append((info, line, line_categories(exp, line, cache)))
    return [_rank_share(rank, ranks[rank]) for rank in sorted(ranks, key=rank_key)]


def _rank_share(
    rank: int | None, lines: list[tuple[Profile, Timeline, npt.NDArray[np.int8]]]
) -> RankShare:
    start = min(int(line.timestamps[0]) for _, line, _ in lines)
    end = max(int(line.timestamps[-1]) for _, line, _ in lines)
    window = end - start
    cuts = np.unique(np.concatenate([line.timestamps.astype(np.int64) for _, line, _ in lines]))
    length = np.diff(cuts)
    running = {category: np.zeros(len(length), dtype=bool) for category in WORK}
    streams = []
    for info, line, categories in lines:
        times = line.timestamps.astype(np.int64)
        spans = np.zeros(len(times), dtype=np.int64)
        spans[:-1] = np.diff(times)
        per = np.bincount(categories, weights=spans, minlength=len(CATEGORY_NAMES))
        streams.append(
            StreamShare(
                info.label,
                rank,
                info.element("GPUDEVICE"),
                info.element("GPUSTREAM"),
                int(per[COMPUTE]),
                int(per[COMMUNICATION]),
                int(per[COPY]),
                int(per[SYNC]),
                window,
            )
        )
        state = states_at(times, categories, cuts, NOTHING)
        for category in WORK:
            running[category] |= state == category
    compute, comm, copy = running[COMPUTE], running[COMMUNICATION], running[COPY]
    overlap = compute & comm
    copy_only = copy & ~compute & ~comm
    busy = compute | comm | copy
    return RankShare(
        rank,
        start,
        window,
        int(length[compute & ~comm].sum()),
        int(length[comm & ~compute].sum()),
        int(length[overlap].sum()),
        int(length[copy_only].sum()),
        int(length[~busy].sum()),
        tuple(streams),
    )


def _share(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:5.1f}%" if whole else "    -"


def render_overlap(report: Sequence[RankShare], out: TextIO) -> None:
    """The report as text: one block per rank, its partition, then one row per stream."""
    out.write("GPU time by what ran: compute, communication (NCCL), both at once, copies, idle\n")
    for rank in report:
        name = "rank -" if rank.rank is None else f"rank {rank.rank}"
        w = rank.window_ns
        out.write(
            f"{name}: window {w / 1e9:.6f}s  compute {rank.compute_ns / 1e9:.6f}s "
            f"{_share(rank.compute_ns, w)}  communication {rank.communication_ns / 1e9:.6f}s "
            f"{_share(rank.communication_ns, w)}  overlap {rank.overlap_ns / 1e9:.6f}s "
            f"{_share(rank.overlap_ns, w)}  copies {rank.copy_ns / 1e9:.6f}s "
            f"{_share(rank.copy_ns, w)}  idle {rank.idle_ns / 1e9:.6f}s {_share(rank.idle_ns, w)}\n"
        )
        out.write(
            f"  communication kernels {rank.communication_kernel_ns / 1e9:.6f}s, "
            f"{100.0 * rank.overlap_share:.1f}% of it overlapped with compute\n"
        )
        out.write("      compute  communication       copies         idle  stream\n")
        for s in rank.streams:
            out.write(
                f"  {s.compute_ns / 1e9:11.6f}  {s.communication_ns / 1e9:13.6f}  "
                f"{s.copy_ns / 1e9:11.6f}  {s.idle_ns / 1e9:11.6f}  {s.profile}\n"
            )
