"""Source lines of PTX instructions, from ``.loc`` and ``.file`` (PTX ISA §11.5).

A ``.loc file line column`` holds for the instructions after it until the next ``.loc``. Newer
PTX (nvcc ≥ 11.x, LLVM's NVPTX back-end that Triton uses) adds ``, function_name LABEL,
inlined_at file line column``: the instruction's code was inlined from the function named by the
``.debug_str`` label at LABEL, at the call site given. A call site that is itself inlined is
written as its own earlier ``.loc`` with an ``inlined_at``; the chain is rebuilt from the last
``.loc`` seen at each call site. Line 0 is the compiler's "no line" and stays without one.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from pyhpctk.instrument.ptx.cfg import Cfg
from pyhpctk.instrument.ptx.parse import Kind, PtxModule

_LOC = re.compile(
    r"\.loc\s+(\d+)\s+(\d+)\s+(\d+)"
    r"(?:\s*,\s*function_name\s+([\w$%]+)(?:\s*\+\s*\d+)?\s*,\s*inlined_at\s+(\d+)\s+(\d+)\s+(\d+))?"
)


@dataclass(frozen=True, slots=True)
class Frame:
    """One inlined call: code of ``function`` inlined at ``file:line:column``."""

    function: str
    file: str
    line: int
    column: int


@dataclass(frozen=True, slots=True)
class Location:
    file: str
    line: int
    column: int
    inlined: tuple[Frame, ...] = ()  # innermost call site first

    @property
    def key(self) -> tuple[str, int]:
        return (self.file, self.line)


def _file(module: PtxModule, index: int) -> str:
    return module.files.get(index, f"<file {index}>")


def instruction_locations(module: PtxModule, cfg: Cfg) -> dict[int, Location]:
    """The source location of every instruction of ``cfg``'s function that has one, by the
    instruction's index in the body."""
    out: dict[int, Location] = {}
    current: Location | None = None
    seen_at: dict[tuple[str, int, int], Location] = {}
    for i, s in enumerate(cfg.function.body):
        if s.kind is Kind.LOC:
            m = _LOC.match(s.text)
            if not m:
                continue
            file, line, column = _file(module, int(m.group(1))), int(m.group(2)), int(m.group(3))
            inlined: tuple[Frame, ...] = ()
            if m.group(4):
                site = (_file(module, int(m.group(5))), int(m.group(6)), int(m.group(7)))
                outer = seen_at.get(site)
                name = module.strings.get(m.group(4), m.group(4))
                inlined = (Frame(name, *site), *(outer.inlined if outer else ()))
            current = Location(file, line, column, inlined) if line else None
            if current is not None:
                seen_at[(file, line, column)] = current
        elif s.kind is Kind.INSTRUCTION and current is not None:
            out[i] = current
    return out


def block_lines(module: PtxModule, cfg: Cfg) -> list[Counter[Location]]:
    """For each block, how many of its instructions each source location holds."""
    where = instruction_locations(module, cfg)
    out: list[Counter[Location]] = []
    for block in cfg.blocks:
        out.append(Counter(where[i] for i in block.instructions if i in where))
    return out
