"""From counter values to every block's and edge's execution count, and the metrics built on them.

The derivation solves flow conservation (in = out at every node, the virtual edge EXIT → entry
closing the circulation) for the spanning tree's edges, leaf by leaf: a node with one unknown
tree edge left fixes that edge. Arithmetic is on Python integers, so counts past 2**63 stay exact.
Counter values that are no circulation (a negative derived count) raise :class:`PtxError`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pyhpctk.instrument.ptx.errors import PtxError
from pyhpctk.instrument.ptx.lines import Location
from pyhpctk.instrument.ptx.probes import Mode, ProbePlan


@dataclass(frozen=True)
class Counts:
    """One kernel's counts (summed over the launches its counters saw)."""

    plan: ProbePlan
    block_threads: tuple[int, ...]
    block_warps: tuple[int, ...] | None  # blocks mode only
    edge_threads: tuple[int, ...] | None  # edges mode only, every edge of plan.edges
    probe_warps: tuple[int, ...]  # the warp slot of each counter as read (edges mode: 0)

    @property
    def thread_instructions(self) -> int:
        """PTX instructions executed, summed over threads."""
        return sum(n * c for n, c in zip(self.plan.instructions, self.block_threads, strict=True))

    @property
    def warp_instructions(self) -> int | None:
        """PTX instructions issued, summed over warps (blocks mode only)."""
        if self.block_warps is None:
            return None
        return sum(n * c for n, c in zip(self.plan.instructions, self.block_warps, strict=True))

    def per_line(self, lines: Sequence[Counter[Location]]) -> dict[tuple[str, int], int]:
        """PTX instructions executed by threads per source line (file, line), through ``.loc``."""
        out: dict[tuple[str, int], int] = {}
        for block, counter in enumerate(lines):
            for location, n in counter.items():
                key = location.key
                out[key] = out.get(key, 0) + n * self.block_threads[block]
        return out


def _values(counters: np.ndarray | Sequence[Sequence[int]], plan: ProbePlan) -> list[list[int]]:
    array = np.asarray(counters, dtype=np.uint64).reshape(-1, 2)
    if array.shape[0] != plan.counters:
        raise PtxError(0, f"{plan.kernel}: {array.shape[0]} counters read, the plan has "
                          f"{plan.counters}")  # fmt: skip
    return [[int(w), int(t)] for w, t in array.tolist()]


def solve_tree(plan: ProbePlan, known: dict[int, int]) -> list[int]:
    """Every edge's count from the counts of the non-tree edges (``known``: edge index → count)."""
    edges, count = plan.edges, dict(known)
    incident: list[list[int]] = [[] for _ in range(plan.nodes)]
    for i in plan.tree:
        incident[edges[i].src].append(i)
        incident[edges[i].dst].append(i)
    flow = [0] * plan.nodes  # in - out over known edges
    for i, c in count.items():
        flow[edges[i].dst] += c
        flow[edges[i].src] -= c
    unknown = [len(x) for x in incident]
    leaves = [v for v in range(plan.nodes) if unknown[v] == 1]
    while leaves:
        v = leaves.pop()
        if unknown[v] != 1:
            continue
        i = next(j for j in incident[v] if j not in count)
        e = edges[i]
        c = flow[v] if e.src == v else -flow[v]  # out = in at v
        if c < 0:
            raise PtxError(0, f"{plan.kernel}: the counters are no flow (edge {e.src}->{e.dst} "
                              f"would run {c} times)")  # fmt: skip
        count[i] = c
        flow[e.dst] += c
        flow[e.src] -= c
        for w in (e.src, e.dst):
            unknown[w] -= 1
            if unknown[w] == 1:
                leaves.append(w)
    if any(flow):
        raise PtxError(0, f"{plan.kernel}: the counters are no flow (in != out at a block)")
    return [count[i] for i in range(len(edges))]


def derive(plan: ProbePlan, counters: np.ndarray | Sequence[Sequence[int]]) -> Counts:
    """The counts of ``plan``'s kernel from its counter buffer (``plan.counters`` pairs of
    uint64: warps, threads), as the instrumented kernel left it."""
    values = _values(counters, plan)
    warps = tuple(w for w, _ in values)
    if plan.mode is Mode.BLOCKS:
        threads = tuple(t for _, t in values)
        return Counts(plan, threads, warps, None, warps)
    edge = solve_tree(plan, {e: t for e, (_, t) in zip(plan.probed, values, strict=True)})
    blocks = [0] * plan.blocks
    for i, e in enumerate(plan.edges):
        if e.dst < plan.blocks:
            blocks[e.dst] += edge[i]
    return Counts(plan, tuple(blocks), None, tuple(edge), warps)
