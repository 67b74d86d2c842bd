"""Counter buffers of known executions, for tests without a GPU (issue #34, item 3).

A Triton program's control flow is uniform (scalar branches: every thread of a program takes
the same path), so an execution is one path of blocks per program. ``walk`` follows a path
through a CFG, asking ``decide`` at each branch; ``counters`` turns paths into the counter
buffer an instrumented kernel would leave in either mode: per probed edge (or block) the
crossings times the program's warps and threads. The tests derive the paths from the kernel's
inputs (its arithmetic) and check what pyview shows against the same arithmetic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from pyhpctk.instrument.ptx import Cfg, Mode, ProbePlan
from pyhpctk.instrument.ptx.loops import Loops

Decide = Callable[[int, tuple[int, ...], list[int]], int]  # (block, successors, path so far)


def reaches(cfg: Cfg, start: int, goal: int, avoid: int | None = None) -> bool:
    """Whether block ``goal`` can be reached from ``start`` without passing ``avoid``."""
    seen, work = set(), [start]
    while work:
        node = work.pop()
        if node == goal:
            return True
        if node in seen or node == avoid or node >= len(cfg.blocks):
            continue
        seen.add(node)
        work.extend(cfg.successors[node])
    return False


def loop_decider(cfg: Cfg, loops: Loops, trips: int, other: Decide | None = None) -> Decide:
    """Decisions of a program whose one loop runs ``trips`` times: at a branch where one way
    leads (back) to the loop's header and the other does not, go round while trips remain;
    other branches go to ``other``."""
    (loop,) = loops.loops

    def decide(block: int, successors: tuple[int, ...], path: list[int]) -> int:
        toward = [s for s in successors if reaches(cfg, s, loop.header)]
        away = [s for s in successors if s not in toward]
        if len(toward) == 1 and len(away) == 1:
            return toward[0] if path.count(loop.header) < trips else away[0]
        assert other is not None, f"no decision at block {block} -> {successors}"
        return other(block, successors, path)

    return decide


def walk(cfg: Cfg, decide: Decide, limit: int = 1 << 20) -> list[int]:
    """The blocks one program visits, from the entry to the virtual EXIT (left out)."""
    path, block = [], 0
    while block < len(cfg.blocks):
        path.append(block)
        if len(path) > limit:
            raise AssertionError("a path that never ends")
        successors = cfg.successors[block]
        block = successors[0] if len(successors) == 1 else decide(block, successors, path)
    return path


def counters(plan: ProbePlan, paths: Sequence[tuple[list[int], int, int]]) -> np.ndarray:
    """The counter buffer (``plan.counters`` rows: warps, threads) that programs following
    ``paths`` — each (path, warps, threads) — leave."""
    out = np.zeros((plan.counters, 2), dtype=np.uint64)
    if plan.mode is Mode.BLOCKS:
        for path, warps, threads in paths:
            for block, n in Counter(path).items():
                out[block] += np.array([n * warps, n * threads], dtype=np.uint64)
        return out
    index = {(e.src, e.dst): i for i, e in enumerate(plan.edges)}
    slot = {edge: k for k, edge in enumerate(plan.probed)}
    for path, warps, threads in paths:
        crossed = Counter(zip(path, [*path[1:], plan.blocks], strict=True))
        crossed[(plan.blocks, path[0])] += 1  # the virtual edge EXIT -> entry
        for (src, dst), n in crossed.items():
            k = slot.get(index[(src, dst)])
            if k is not None:
                out[k] += np.array([n * warps, n * threads], dtype=np.uint64)
    return out


def block_counts(cfg: Cfg, paths: Sequence[tuple[list[int], int, int]]) -> list[int]:
    """Every block's thread count for ``paths`` (the truth the views are checked against)."""
    out = [0] * len(cfg.blocks)
    for path, _, threads in paths:
        for block, n in Counter(path).items():
            out[block] += n * threads
    return out
