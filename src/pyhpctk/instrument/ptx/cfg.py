"""Basic blocks and the control-flow graph of one PTX function.

A block starts at a label or after a terminator (``bra``, ``brx.idx``, ``ret``, ``exit``,
``trap``) and runs to the next of either; a guarded terminator (``@%p bra``) has its target and
the fall-through as successors. ``call`` returns to the next instruction, so it stays inside its
block (the block lists its call sites). The graph has one more node than blocks, the virtual
EXIT, reached by every ``ret``/``exit``/``trap`` and by a block that falls off the body's end,
and one virtual edge EXIT → entry that makes every execution count a circulation (flow in =
flow out at every node), the form Knuth's and Ball–Larus's edge-counting needs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

from pyhpctk.instrument.ptx.errors import PtxError
from pyhpctk.instrument.ptx.parse import Kind, PtxFunction, Statement

TERMINATORS = frozenset({"bra", "brx", "ret", "exit", "trap"})
_LEAVES = frozenset({"ret", "exit", "trap"})


class EdgeKind(enum.Enum):
    FALL = "fall"  # to the next block in the text
    TAKEN = "taken"  # a bra's target
    INDIRECT = "indirect"  # one of brx.idx's targets
    EXIT = "exit"  # ret / exit / trap / falling off the end, to the virtual EXIT
    VIRTUAL = "virtual"  # EXIT -> entry


@dataclass(frozen=True, slots=True)
class PtxEdge:
    src: int
    dst: int
    kind: EdgeKind


@dataclass(frozen=True, slots=True)
class PtxBlock:
    """Statements ``first..last`` (indices into the function's body, both included)."""

    index: int
    labels: tuple[str, ...]
    first: int
    last: int
    instructions: tuple[int, ...]
    terminator: int | None  # body index of the bra/brx/ret/exit/trap ending it, if any
    calls: tuple[int, ...] = ()
    depth: int = 0  # how many nested { } scopes hold its head (its labels are local to them)


@dataclass(frozen=True)
class Cfg:
    function: PtxFunction
    blocks: tuple[PtxBlock, ...]
    edges: tuple[PtxEdge, ...]  # block edges, EXIT edges, and the virtual edge last

    @property
    def exit(self) -> int:
        """The virtual EXIT node's index (one past the last block)."""
        return len(self.blocks)

    def _adjacent(self, forward: bool) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in range(len(self.blocks) + 1)]
        for e in self.edges:
            (out[e.src] if forward else out[e.dst]).append(e.dst if forward else e.src)
        return tuple(tuple(x) for x in out)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """Successors of every node (blocks, then EXIT), duplicates merged."""
        return self._adjacent(True)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        return self._adjacent(False)

    def statement(self, index: int) -> Statement:
        return self.function.body[index]

    def block_of_label(self, label: str) -> int:
        for block in self.blocks:
            if label in block.labels:
                return block.index
        raise PtxError(0, f"{self.function.name}: no block has the label {label!r}")


def branch_labels(body: tuple[Statement, ...]) -> frozenset[str]:
    """Labels some branch may jump to: ``bra`` targets and ``.branchtargets`` entries. Other
    labels (LLVM's ``$L__tmp``/``$L__func_begin`` debug labels) start no block."""
    out: set[str] = set()
    for s in body:
        if s.kind is Kind.INSTRUCTION and s.base_opcode == "bra" and s.operands:
            out.add(s.operands[-1])
        elif s.kind is Kind.DIRECTIVE and s.opcode == ".branchtargets":
            out.update(t.strip() for t in s.operands)
    return frozenset(out)


def _segment(body: tuple[Statement, ...]) -> list[PtxBlock]:
    blocks: list[PtxBlock] = []
    leaders = branch_labels(body)
    start = 0
    labels: list[str] = []
    instructions: list[int] = []
    calls: list[int] = []
    is_open = False

    depth = head_depth = 0

    def close(last: int, terminator: int | None) -> None:
        block = (tuple(labels), start, last, tuple(instructions), terminator, tuple(calls))
        blocks.append(PtxBlock(len(blocks), *block, head_depth))
        labels.clear()
        instructions.clear()
        calls.clear()

    for i, s in enumerate(body):
        depth += (s.kind is Kind.OPEN) - (s.kind is Kind.CLOSE)
        if s.kind is Kind.LABEL and s.label in leaders:
            if is_open and instructions:
                close(i - 1, None)
                start, is_open = i, False
            if not is_open:
                head_depth = depth
            is_open = True
            labels.append(s.label)
        elif s.kind is Kind.INSTRUCTION:
            if not is_open:
                head_depth = depth
            is_open = True
            instructions.append(i)
            if s.base_opcode == "call":
                calls.append(i)
            if s.base_opcode in TERMINATORS:
                close(i, i)
                start, is_open = i + 1, False
    if is_open:
        close(len(body) - 1, None)
    return blocks


def targets(function: PtxFunction, statement: Statement) -> list[str]:
    """The labels a ``brx.idx`` may jump to, from the ``.branchtargets`` it names."""
    name = statement.operands[-1] if statement.operands else ""
    for s in function.body:
        if s.kind is Kind.DIRECTIVE and s.opcode == ".branchtargets" and s.label == name:
            return [t.strip() for t in s.operands]
    raise PtxError(statement.line, f"brx.idx names no .branchtargets list {name!r}")


def _out_edges(
    exit_node: int, function: PtxFunction, b: PtxBlock, label_block: dict[str, int]
) -> list[PtxEdge]:
    after = b.index + 1 if b.index + 1 < exit_node else exit_node
    fall = PtxEdge(b.index, after, EdgeKind.FALL if after != exit_node else EdgeKind.EXIT)
    if b.terminator is None:
        return [fall]
    s = function.body[b.terminator]

    def block(label: str) -> int:
        if label not in label_block:
            raise PtxError(s.line, f"branch to an unknown label {label!r}")
        return label_block[label]

    if s.base_opcode == "bra":
        if not s.operands:
            raise PtxError(s.line, "bra without a target")
        out = [PtxEdge(b.index, block(s.operands[-1]), EdgeKind.TAKEN)]
    elif s.base_opcode == "brx":
        out = [PtxEdge(b.index, block(t), EdgeKind.INDIRECT) for t in targets(function, s)]
    else:
        out = [PtxEdge(b.index, exit_node, EdgeKind.EXIT)]
    if s.guard:
        out.append(fall)
    seen: set[int] = set()
    unique: list[PtxEdge] = []
    for e in out:  # a target equal to the fall-through (or listed twice) is one edge
        if e.dst not in seen:
            seen.add(e.dst)
            unique.append(e)
    return unique


def build(function: PtxFunction) -> Cfg:
    """The control-flow graph of ``function``'s body."""
    blocks = _segment(function.body)
    if not blocks:
        blocks = [PtxBlock(0, (), 0, len(function.body) - 1, (), None)]
    label_block = {label: b.index for b in blocks for label in b.labels}
    edges: list[PtxEdge] = []
    for b in blocks:
        edges.extend(_out_edges(len(blocks), function, b, label_block))
    edges.append(PtxEdge(len(blocks), 0, EdgeKind.VIRTUAL))
    return Cfg(function, tuple(blocks), tuple(edges))
