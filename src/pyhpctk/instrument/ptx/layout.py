"""Addresses in PTX: what pyrun's calling context trees and pystruct's structure of a PTX module
both call each instruction (issue #34, item 3).

PTX has no machine addresses, so each statement gets one from its place in the text: 16 times
its line plus its rank among the statements of its function that start on that line
(compilers write one per line; 16 are told apart, later ones share the 16th). An instruction
covers ``[address, address + 1)``. The same text always gives the same addresses, so the
measurement (counts at addresses) and the structure (scopes of addresses) never disagree, and
a reader finds an address's statement at line ``address // 16`` of the saved PTX.

A block's code is cut into *segments*: runs of consecutive instructions with one source
location (``.loc``, inlined frames included). Counts go to a segment's first address: its
instructions executed there, and the block's executions at the block's first segment.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyhpctk.instrument.ptx.cfg import Cfg
from pyhpctk.instrument.ptx.lines import Location, instruction_locations
from pyhpctk.instrument.ptx.parse import PtxFunction, PtxModule

LINE_SLOTS = 16


@dataclass(frozen=True, slots=True)
class Segment:
    """Consecutive instructions of one block at one source location (None: no ``.loc``)."""

    address: int
    instructions: int
    location: Location | None


@dataclass(frozen=True)
class KernelLayout:
    """Where one function's blocks are: ``blocks[b]`` is block ``b``'s segments, in order (an
    empty block has one segment of no instructions at its last statement)."""

    name: str
    entry: int  # the first instruction's address (the node of the kernel's launches)
    blocks: tuple[tuple[Segment, ...], ...]
    statements: tuple[int, ...]  # every body statement's address

    def head(self, block: int) -> int:
        """The address a block's executions go to."""
        return self.blocks[block][0].address


def statement_addresses(function: PtxFunction) -> tuple[int, ...]:
    """The address of every statement of ``function``'s body (module docstring)."""
    rank: dict[int, int] = {}
    out = []
    for statement in function.body:
        k = rank.get(statement.line, 0)
        rank[statement.line] = k + 1
        out.append(LINE_SLOTS * statement.line + min(k, LINE_SLOTS - 1))
    return tuple(out)


def layout(module: PtxModule, cfg: Cfg) -> KernelLayout:
    """The addresses and segments of ``cfg``'s function in ``module``."""
    function = cfg.function
    addresses = statement_addresses(function)
    where = instruction_locations(module, cfg)
    blocks: list[tuple[Segment, ...]] = []
    for block in cfg.blocks:
        segments: list[Segment] = []
        for i in block.instructions:
            location = where.get(i)
            last = segments[-1] if segments else None
            if last is not None and last.location == location:
                segments[-1] = Segment(last.address, last.instructions + 1, location)
            else:
                segments.append(Segment(addresses[i], 1, location))
        if not segments:
            segments.append(Segment(addresses[block.last] if addresses else 0, 0, None))
        blocks.append(tuple(segments))
    first = next((s[0].address for s in blocks if s[0].instructions), None)
    entry = first if first is not None else LINE_SLOTS * function.line
    return KernelLayout(function.name, entry, tuple(blocks), addresses)
