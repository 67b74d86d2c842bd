"""Where the counters go: a maximum spanning tree of the CFG, and probes on the edges it leaves.

Knuth ("Optimal measurement points for program frequency counts", 1973) and Ball and Larus
("Optimally profiling and tracing programs", 1994): the execution counts of a function's edges,
with a virtual edge EXIT → entry, form a circulation, so the counts of the edges of any spanning
tree of the (undirected) graph follow from the counts of the others. A graph of N nodes (blocks
and EXIT) and E edges (the virtual one included) needs E − (N − 1) counters instead of E —
hip-analyzer's "n − 1" reduction. The tree takes the edges we would rather not count: those
inside the deepest loops (the hottest) first, then those that would need a block of their own
(a critical edge: its source has several successors and its target several predecessors).

Two modes:
- ``edges``: counters on the non-tree edges; every edge's and every block's thread count is
  derived exactly (:mod:`.counts`). The probes add no warp count (the warp slot stays 0): the
  warps that take an edge do not form a flow (a warp split by a branch enters the join block
  once but crosses both incoming edges), so warp counts of blocks cannot be derived, and the
  probed edges' own would cost an atomic (or a register) each for nothing read.
- ``blocks``: a counter at the head of every block; exact warp and thread counts of every block,
  no edge counts, no reduction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pyhpctk.instrument.ptx.cfg import Cfg, EdgeKind, PtxEdge
from pyhpctk.instrument.ptx.loops import Loops


class Mode(enum.Enum):
    EDGES = "edges"
    BLOCKS = "blocks"


@dataclass(frozen=True)
class ProbePlan:
    """Where one kernel's counters are: counter ``k`` counts ``edges[probed[k]]`` (edges mode)
    or block ``k`` (blocks mode). Two 64-bit slots per counter: warps, then threads."""

    kernel: str
    mode: Mode
    blocks: int
    edges: tuple[PtxEdge, ...]
    tree: frozenset[int]  # indices into edges
    probed: tuple[int, ...]  # edges mode: edge index of each counter; blocks mode: block index
    instructions: tuple[int, ...]  # PTX instructions per block, as written before instrumenting

    @property
    def counters(self) -> int:
        return len(self.probed)

    @property
    def nodes(self) -> int:
        return self.blocks + 1  # with the virtual EXIT


def needs_split(cfg: Cfg, edge: PtxEdge) -> bool:
    """Whether a probe on ``edge`` needs a block of its own: taken, indirect or guarded-exit
    edges out of a block with several successors into a node with several predecessors."""
    if edge.kind in (EdgeKind.FALL, EdgeKind.VIRTUAL):
        return False
    if len(cfg.successors[edge.src]) < 2:
        return False
    return edge.kind is EdgeKind.EXIT or len(cfg.predecessors[edge.dst]) > 1


def splittable(cfg: Cfg, edge: PtxEdge) -> bool:
    """Whether a block of its own can stand on ``edge``: the new block sits in the body's
    outermost scope and branches on to the target, which PTX allows only if the target's label
    is not local to a nested ``{ }`` scope (ptxas: "Unknown symbol")."""
    if edge.kind not in (EdgeKind.TAKEN, EdgeKind.INDIRECT) or edge.dst >= len(cfg.blocks):
        return True
    return cfg.blocks[edge.dst].depth == 0


def spanning_tree(nodes: int, edges: tuple[PtxEdge, ...], weights: list[int]) -> frozenset[int]:
    """Kruskal's maximum spanning forest of the undirected graph, heaviest first, ties by edge
    index (so the same CFG always gives the same tree); self-loops never join it."""
    parent = list(range(nodes))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree: set[int] = set()
    for i in sorted(range(len(edges)), key=lambda i: (-weights[i], i)):
        a, b = root(edges[i].src), root(edges[i].dst)
        if a != b:
            parent[a] = b
            tree.add(i)
    return frozenset(tree)


def edge_weights(cfg: Cfg, loops: Loops) -> list[int]:
    """A guess at how costly counting each edge is: loop depth first, a needed split second;
    an edge no block can stand on (into a nested scope) before everything."""
    weights = []
    for e in cfg.edges:
        depth = sum(1 for lp in loops.loops if e.src in lp.blocks and e.dst in lp.blocks)
        split = needs_split(cfg, e)
        weights.append(
            4 * depth + (2 if split else 0) + (10**6 if split and not splittable(cfg, e) else 0)
        )
    return weights


def make_plan(cfg: Cfg, loops: Loops, mode: Mode = Mode.EDGES) -> ProbePlan:
    """Where ``cfg``'s counters go in ``mode``."""
    instructions = tuple(len(b.instructions) for b in cfg.blocks)
    name = cfg.function.name
    if mode is Mode.BLOCKS:
        probed = tuple(range(len(cfg.blocks)))
        return ProbePlan(name, mode, len(cfg.blocks), cfg.edges, frozenset(), probed, instructions)
    tree = spanning_tree(len(cfg.blocks) + 1, cfg.edges, edge_weights(cfg, loops))
    probed = tuple(i for i in range(len(cfg.edges)) if i not in tree)
    return ProbePlan(name, mode, len(cfg.blocks), cfg.edges, tree, probed, instructions)
