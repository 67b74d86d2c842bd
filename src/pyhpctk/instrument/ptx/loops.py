"""Dominators, back edges and the natural loops of a PTX control-flow graph, with their nesting.

Dominators by Cooper, Harvey and Kennedy's iterative algorithm ("A Simple, Fast Dominance
Algorithm", 2001) over the blocks reachable from the entry; a back edge is an edge whose target
dominates its source; the natural loop of a header is the header and every block that reaches
one of its back edges' sources without passing through it. A retreating edge of a depth-first
walk that is no back edge marks an irreducible region: it is reported, not made a loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyhpctk.instrument.ptx.cfg import Cfg


@dataclass(frozen=True, slots=True)
class PtxLoop:
    header: int
    blocks: frozenset[int]
    back_edges: tuple[tuple[int, int], ...]
    parent: int | None  # index of the innermost enclosing loop in Loops.loops
    depth: int  # 1 for an outermost loop


@dataclass(frozen=True)
class Loops:
    idom: tuple[int | None, ...]  # immediate dominator of each block (None: entry, unreachable)
    reachable: frozenset[int]
    loops: tuple[PtxLoop, ...]  # outer loops before the loops they hold
    irreducible: tuple[tuple[int, int], ...]  # retreating edges that are not back edges

    def dominates(self, a: int, b: int) -> bool:
        node: int | None = b
        while node is not None:
            if node == a:
                return True
            node = self.idom[node]
        return False

    def depth(self, block: int) -> int:
        """How many loops hold ``block`` (0 outside every loop)."""
        return max((lp.depth for lp in self.loops if block in lp.blocks), default=0)

    def innermost(self, block: int) -> int | None:
        best: int | None = None
        for i, lp in enumerate(self.loops):
            if block in lp.blocks and (best is None or lp.depth > self.loops[best].depth):
                best = i
        return best


def _postorder(successors: tuple[tuple[int, ...], ...], entry: int, nodes: int) -> list[int]:
    """Blocks reachable from ``entry`` in depth-first postorder (iterative, no recursion)."""
    order: list[int] = []
    seen = {entry}
    stack = [(entry, iter(successors[entry]))]
    while stack:
        node, it = stack[-1]
        for nxt in it:
            if nxt < nodes and nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, iter(successors[nxt])))
                break
        else:
            stack.pop()
            order.append(node)
    return order


def dominators(cfg: Cfg) -> tuple[list[int | None], list[int]]:
    """Immediate dominators (entry and unreachable blocks: None) and the reverse postorder."""
    n = len(cfg.blocks)
    rpo = _postorder(cfg.successors, 0, n)[::-1]
    number = {b: i for i, b in enumerate(rpo)}
    idom: list[int | None] = [None] * n
    idom[0] = 0
    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            preds = [p for p in cfg.predecessors[b] if p < n and idom[p] is not None]
            new = preds[0]
            for p in preds[1:]:
                a, c = p, new
                while a != c:
                    while number[a] > number[c]:
                        a = idom[a]  # type: ignore[assignment]
                    while number[c] > number[a]:
                        c = idom[c]  # type: ignore[assignment]
                new = a
            if idom[b] != new:
                idom[b], changed = new, True
    idom[0] = None
    return idom, rpo


def find_loops(cfg: Cfg) -> Loops:
    """The natural loops of ``cfg``, merged by header and ordered outermost first."""
    n = len(cfg.blocks)
    idom, rpo = dominators(cfg)
    number = {b: i for i, b in enumerate(rpo)}
    partial = Loops(tuple(idom), frozenset(rpo), (), ())
    back: dict[int, list[tuple[int, int]]] = {}
    irreducible: list[tuple[int, int]] = []
    for e in cfg.edges:
        if e.src >= n or e.dst >= n or e.src not in number:
            continue
        if number[e.dst] <= number[e.src]:  # retreating in this depth-first order
            if partial.dominates(e.dst, e.src):
                back.setdefault(e.dst, []).append((e.src, e.dst))
            else:
                irreducible.append((e.src, e.dst))
    bodies: dict[int, frozenset[int]] = {}
    for header, edges in back.items():
        body, work = {header}, [src for src, _ in edges]
        while work:
            b = work.pop()
            if b not in body:
                body.add(b)
                work.extend(p for p in cfg.predecessors[b] if p < n and p in number)
        bodies[header] = frozenset(body)
    headers = sorted(bodies, key=lambda h: (-len(bodies[h]), number[h]))
    loops: list[PtxLoop] = []
    for h in headers:
        holders = [i for i, lp in enumerate(loops) if h in lp.blocks and bodies[h] <= lp.blocks]
        parent = max(holders, key=lambda i: loops[i].depth) if holders else None
        depth = 1 if parent is None else loops[parent].depth + 1
        loops.append(PtxLoop(h, bodies[h], tuple(back[h]), parent, depth))
    return Loops(tuple(idom), frozenset(rpo), tuple(loops), tuple(irreducible))
