"""Waits in collectives across ranks: which rank's work made the others' GPUs wait.

A collective cannot finish on any rank before every rank has joined it, so a rank whose
communication kernel starts early spends the time until the last rank's start waiting inside
the kernel: its GPU is busy on paper and idle in fact. This is GPU idleness blame (Zhou et al.,
SC'21; :func:`pyhpctk.present.traces.gpu_idle_blame`) carried across ranks (docs/pyview.md,
"Waits across ranks"):

1. *Instances.* The k-th communication kernel of every rank (its GPU streams' communication
   elements, :mod:`.overlap`, in start order) is the k-th instance of a collective: NCCL
   requires every rank of a communicator to issue its collectives in the same order. Ranks
   with different numbers of communication kernels are matched up to the smallest number, and
   the report says so.
2. *Arrival and the late rank.* Rank r arrives at ``s_r``, its kernel's start; the instance's
   late rank ``L`` is the one that arrives last (the lowest rank among equals).
3. *Waiting.* At each instant ``t`` in ``[min s_r, s_L)`` the number of ranks waiting is
   ``n(t) = #{r != L : s_r <= t < min(e_r, s_L)}`` (``e_r`` the kernel's end); the instance's
   wait is the integral of ``n``.
4. *Blame.* That wait is charged, instant by instant, to what rank ``L`` was doing at ``t``:
   the compute kernels running on its GPU (equal shares; its device was still busy: the
   lateness is GPU work), else the CPU contexts its busy threads were in (equal shares; the
   lateness is CPU work, the question the issue asks), else ``<nothing traced>``.

Times of different ranks are compared as they stand: ranks on one node share its clock (CUPTI
and pyrun both read it); across nodes the clocks' offsets enter the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

import numpy as np
import numpy.typing as npt

from pyhpctk.present.model import Experiment, Profile, Timeline
from pyhpctk.present.overlap import (
    COMMUNICATION,
    COMPUTE,
    line_categories,
    rank_key,
    states_at,
)
from pyhpctk.present.traces import IDLE, function_of

NOTHING_TRACED = "<nothing traced>"


@dataclass(frozen=True, slots=True)
class Waits:
    """The result of :func:`collective_waits`."""

    instances: int  # collectives matched across ranks
    unmatched: tuple[tuple[int | None, int], ...]  # (rank, its communication kernels) if unequal
    wait_ns: float  # total waiting of early ranks
    by_rank: tuple[tuple[int | None, float], ...]  # (late rank, wait it caused), largest first
    by_cause: tuple[tuple[int | None, str, str, float], ...]  # (rank, "gpu"/"cpu", what, ns)


def _communication_intervals(
    exp: Experiment, lines: list[Timeline], cache: dict[int, int]
) -> npt.NDArray[np.int64]:
    """(start, end) of every communication element of ``lines``, in start order."""
    parts = []
    for line in lines:
        times = line.timestamps.astype(np.int64)
        categories = line_categories(exp, line, cache)
        index = np.flatnonzero(categories == COMMUNICATION)
        index = index[index < len(times) - 1]
        parts.append(np.stack([times[index], times[index + 1]], axis=1))
    found = np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)
    return found[np.argsort(found[:, 0], kind="stable")]


def collective_waits(exp: Experiment) -> Waits:
    """Match collectives across ranks, measure the waits, blame the late rank's work."""
    by_index = {p.index: p for p in exp.profiles}
    lines = exp.traces.lines() if exp.traces is not None else []
    gpu: dict[int | None, list[Timeline]] = {}
    cpu: dict[int | None, list[Timeline]] = {}
    for line in lines:
        info = by_index.get(line.profile, Profile(line.profile, ()))
        if len(line.timestamps) > 1 and not info.is_warp:
            (gpu if info.is_gpu else cpu).setdefault(info.rank, []).append(line)
    cache: dict[int, int] = {}
    ranks = sorted(gpu, key=rank_key)
    comms = {rank: _communication_intervals(exp, gpu[rank], cache) for rank in ranks}
    ranks = [rank for rank in ranks if len(comms[rank])]
    counts = [len(comms[rank]) for rank in ranks]
    if len(ranks) < 2:
        return Waits(0, (), 0.0, (), ())
    unmatched = tuple(zip(ranks, counts, strict=True)) if len(set(counts)) > 1 else ()
    instances = min(counts)
    caused: dict[int | None, float] = {}
    causes: dict[tuple[int | None, str, str], float] = {}
    total = 0.0
    for k in range(instances):
        starts = np.array([comms[rank][k, 0] for rank in ranks], dtype=np.int64)
        ends = np.array([comms[rank][k, 1] for rank in ranks], dtype=np.int64)
        late = int(np.argmax(starts))  # argmax: the first (lowest rank) among equals
        arrival = int(starts[late])
        others = np.arange(len(ranks)) != late
        until = np.minimum(ends[others], arrival)
        if not (until > starts[others]).any():
            continue
        rank = ranks[late]
        state = _Culprit(exp, gpu[rank], cpu.get(rank, []), cache)
        cuts = np.unique(np.concatenate([starts[others], until, [arrival]]))
        cuts = state.refine(cuts[(cuts >= starts.min()) & (cuts <= arrival)])
        middle = cuts[:-1]
        waiting = ((starts[others][:, None] <= middle) & (middle < until[:, None])).sum(axis=0)
        weight = waiting * np.diff(cuts).astype(np.float64)
        if not weight.any():
            continue
        total += float(weight.sum())
        caused[rank] = caused.get(rank, 0.0) + float(weight.sum())
        for (where, what), value in state.blame(cuts, weight).items():
            key = (rank, where, what)
            causes[key] = causes.get(key, 0.0) + value
    return Waits(
        instances,
        unmatched,
        total,
        tuple(sorted(caused.items(), key=lambda kv: (-kv[1], rank_key(kv[0])))),
        tuple(
            sorted(
                ((r, where, what, v) for (r, where, what), v in causes.items()),
                key=lambda item: (-item[3], rank_key(item[0]), item[2]),
            )
        ),
    )


class _Culprit:
    """What the late rank's GPU streams and CPU threads were doing, segment by segment."""

    def __init__(
        self, exp: Experiment, gpu: list[Timeline], cpu: list[Timeline], cache: dict[int, int]
    ) -> None:
        self.exp = exp
        self.gpu = [(line, line_categories(exp, line, cache)) for line in gpu]
        self.cpu = cpu

    def refine(self, cuts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``cuts`` and every record time of the late rank's lines inside them."""
        if len(cuts) < 2:
            return cuts
        low, high = int(cuts[0]), int(cuts[-1])
        every = [line for line, _ in self.gpu] + self.cpu
        inner = [
            t[(t > low) & (t < high)] for t in (line.timestamps.astype(np.int64) for line in every)
        ]
        return np.unique(np.concatenate([cuts, *inner]))

    def blame(
        self, cuts: npt.NDArray[np.int64], weight: npt.NDArray[np.float64]
    ) -> dict[tuple[str, str], float]:
        """``weight`` of each segment, shared among what the late rank ran in it."""
        out: dict[tuple[str, str], float] = {}
        left = weight.copy()
        for where, rows in (("gpu", self._gpu_rows(cuts)), ("cpu", self._cpu_rows(cuts))):
            if not rows:
                continue
            contexts = np.vstack(rows)
            active = (contexts != IDLE).sum(axis=0)
            share = np.where((active > 0) & (left > 0), left / np.maximum(active, 1), 0.0)
            for row in contexts:
                hit = (row != IDLE) & (share > 0)
                for ctx in np.unique(row[hit]).tolist():
                    name = function_of(self.exp, int(ctx))
                    value = float(share[hit & (row == ctx)].sum())
                    out[(where, name)] = out.get((where, name), 0.0) + value
            left = np.where(active > 0, 0.0, left)
        if left.any():
            out[("-", NOTHING_TRACED)] = float(left.sum())
        return out

    def _gpu_rows(self, cuts: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int64]]:
        """Per GPU line, the context of its compute kernel on each segment (0 elsewhere)."""
        rows = []
        for line, categories in self.gpu:
            times = line.timestamps.astype(np.int64)
            contexts = np.where(categories == COMPUTE, line.ctx_ids.astype(np.int64), IDLE)
            rows.append(states_at(times, contexts, cuts, IDLE))
        return rows

    def _cpu_rows(self, cuts: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int64]]:
        return [
            states_at(line.timestamps.astype(np.int64), line.ctx_ids.astype(np.int64), cuts, IDLE)
            for line in self.cpu
        ]


def render_waits(waits: Waits, out: TextIO, top: int = 20) -> None:
    """The waits as text: per late rank, then its GPU or CPU work that made the others wait."""
    out.write(
        f"Waits in collectives across ranks: {waits.instances} collectives matched, "
        f"{waits.wait_ns / 1e9:.6f}s of waiting on early ranks\n"
    )
    if waits.unmatched:
        counts = ", ".join(f"rank {rank}: {n}" for rank, n in waits.unmatched)
        out.write(f"  ranks ran different numbers of communication kernels ({counts}): "
                  "matched up to the smallest\n")  # fmt: skip
    for rank, value in waits.by_rank:
        share = 100.0 * value / waits.wait_ns if waits.wait_ns else 0.0
        out.write(f"  rank {rank} arrived last: {value / 1e9:.6f}s ({share:.1f}%)\n")
    if waits.by_cause:
        out.write("  blame (s)   share  rank  where  what the late rank was running\n")
    for rank, where, what, value in waits.by_cause[:top]:
        share = 100.0 * value / waits.wait_ns if waits.wait_ns else 0.0
        out.write(f"  {value / 1e9:9.6f}  {share:5.1f}%  {rank!s:>4}  {where:>5}  {what}\n")
    if not waits.by_rank:
        out.write("  no rank waited for another (needs two ranks with communication kernels)\n")
