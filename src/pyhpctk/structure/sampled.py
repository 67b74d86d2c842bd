"""Structure of the functions a measurement's samples reach, and symbols for the rest.

Full analysis of a large library costs time in proportion to its code: 37 s for the 25 MB
OpenBLAS of numpy's wheel here, and a 500 MB ``libtorch_cpu.so`` would take minutes and
gigabytes. A measurement can only ever look up the addresses its profiles name, so for large
binaries ``pystruct MEAS`` analyzes fully (CFG, loops, inlined code, lines) only the procedures
that contain one of those addresses, and lists every other procedure by its symbol alone (a
``P`` with one line-0 ``S`` over its range). docs/pystruct.md gives the rule and the figures.

The procedures are those of the full analysis, not an approximation: the skeleton's symbol
procedures need no decoding, and the ``targXXXX`` procedures (call targets no symbol claims,
:func:`~pyhpctk.structure.host.unclaimed_procedures`) that could contain a sampled address are
found without decoding the whole binary. On x86-64 every direct call is ``E8 rel32``, so a scan
of the code bytes (numpy) lists every position that *could* be a call into the unclaimed gap
around a sampled address; only the symbol procedures holding such a position are decoded, and
only the calls their decoding confirms count. Each analyzed ``P`` is therefore identical to the
full analysis's (``tests/test_native_frames.py`` checks it, on a stripped library too).
Other machines decode every symbol procedure for call targets, as the full skeleton does.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pyhpctk.formats.hpcstruct_model import (
    STATEMENT,
    Scope,
    StructureFile,
    format_ranges,
)
from pyhpctk.structure.cfg import Decoder
from pyhpctk.structure.dwarf import read_debug_info
from pyhpctk.structure.elfimage import EM_X86_64, ElfImage
from pyhpctk.structure.host import (
    FunctionAnalyzer,
    Procedure,
    analyze_functions,
    assemble,
    call_targets,
    procedure_scope,
    symbol_procedures,
    unclaimed_procedures,
)

MIN_PARALLEL = 64  # fewer sampled procedures than this are analyzed in the parent process


@dataclass(frozen=True, slots=True)
class SampledStructure:
    """The structure, and how many of its procedures were analyzed fully."""

    structure: StructureFile
    analyzed: int
    procedures: int


def symbol_scope(proc: Procedure) -> Scope:
    """A procedure known by its symbol alone: its entry, and one line-0 statement over it."""
    scope = procedure_scope(proc)
    if proc.end > proc.start:
        statement = {"i": "0", "l": "0", "v": format_ranges([(proc.start, proc.end)])}
        scope.children.append(Scope(STATEMENT, statement))
    return scope


def _unclaimed_gaps(
    image: ElfImage, procs: Sequence[Procedure], addresses: Iterable[int]
) -> list[tuple[int, int]]:
    """``[lo, hi)`` between symbol procedures around each address no symbol procedure claims."""
    starts = [p.start for p in procs]
    reach = np.maximum.accumulate(np.array([p.end for p in procs], dtype=np.int64)).tolist()
    gaps: set[tuple[int, int]] = set()
    for address in addresses:
        region = image.region_of(address)
        if region is None:
            continue
        k = bisect.bisect_right(starts, address) - 1
        if k >= 0 and address < reach[k]:
            continue  # inside a symbol procedure
        lo = max(region.start, reach[k] if k >= 0 else region.start)
        hi = min(region.end, starts[k + 1] if k + 1 < len(starts) else region.end)
        if lo < hi:
            gaps.add((lo, hi))
    return sorted(gaps)


def _candidate_calls(image: ElfImage, gaps: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(position, target) of every ``E8 rel32`` byte pattern whose target lies in a gap."""
    if not gaps:
        return []
    lows = np.array([lo for lo, _ in gaps], dtype=np.int64)
    highs = np.array([hi for _, hi in gaps], dtype=np.int64)
    out: list[tuple[int, int]] = []
    for region in image.regions:
        code = np.frombuffer(region.data, dtype=np.uint8)
        if len(code) < 5:
            continue
        where = np.flatnonzero(code[:-4] == 0xE8)
        rel = (
            code[where + 1].astype(np.uint32)
            | code[where + 2].astype(np.uint32) << 8
            | code[where + 3].astype(np.uint32) << 16
            | code[where + 4].astype(np.uint32) << 24
        ).view(np.int32)
        position = where.astype(np.int64) + region.start
        target = position + 5 + rel.astype(np.int64)
        k = np.searchsorted(lows, target, side="right") - 1
        hit = (k >= 0) & (target < highs[np.maximum(k, 0)])
        out.extend(zip(position[hit].tolist(), target[hit].tolist(), strict=True))
    return out


def gap_call_targets(
    image: ElfImage, procs: Sequence[Procedure], gaps: Sequence[tuple[int, int]]
) -> set[int]:
    """The direct call targets inside ``gaps`` that decoding every symbol procedure would find."""
    decoder = Decoder(image.machine)
    if image.machine != EM_X86_64:
        found: set[int] = set()
        for proc in procs:
            found |= call_targets(decoder.decode(image.read(proc.start, proc.end), proc.start))
        return {t for t in found if any(lo <= t < hi for lo, hi in gaps)}
    starts = [p.start for p in procs]
    decoded: dict[int, set[int]] = {}
    targets: set[int] = set()
    for position, target in _candidate_calls(image, gaps):
        k = bisect.bisect_right(starts, position) - 1
        if k < 0 or position >= procs[k].end:
            continue  # the full skeleton decodes symbol procedures only
        proc = procs[k]
        calls = decoded.get(proc.start)
        if calls is None:
            code = image.read(proc.start, proc.end)
            calls = decoded[proc.start] = call_targets(decoder.decode(code, proc.start))
        if target in calls:
            targets.add(target)
    return targets


def analyze_sampled(
    image: ElfImage,
    addresses: Iterable[int],
    lm_name: str | None = None,
    jobs: int = 1,
    progress: Callable[[int], None] | None = None,
    resolve_paths: bool = True,
    total: Callable[[int], None] | None = None,
) -> SampledStructure:
    """The structure of ``image`` with only the procedures holding ``addresses`` analyzed."""
    wanted = sorted(set(addresses))
    info = read_debug_info(image, resolve_paths)
    name = lm_name or os.path.abspath(image.path)
    procs = symbol_procedures(image, info)
    targets = gap_call_targets(image, procs, _unclaimed_gaps(image, procs, wanted))
    every = sorted(procs + unclaimed_procedures(image, info, procs, targets), key=lambda p: p.start)
    chosen = [p for p in every if holds_any(p, wanted)]
    if total is not None:
        total(len(chosen))
    analyzer = FunctionAnalyzer(image, info, every)
    if jobs > 1 and len(chosen) >= MIN_PARALLEL:
        from pyhpctk.structure.parallel import map_functions

        full = [scope for scope, _ in map_functions(analyzer, chosen, jobs, progress)]
    else:
        full = analyze_functions(analyzer, chosen, progress)
    by_start = {p.start: scope for p, scope in zip(chosen, full, strict=True)}
    scopes = [by_start[p.start] if p.start in by_start else symbol_scope(p) for p in every]
    return SampledStructure(assemble(name, every, scopes), len(chosen), len(every))


class Span(Protocol):
    """Code from ``start`` to ``end`` (a procedure, an ELF function symbol)."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


def holds_any(proc: Span, wanted: Sequence[int]) -> bool:
    """Whether ``proc`` holds one of the sorted addresses ``wanted``."""
    k = bisect.bisect_left(wanted, proc.start)
    return k < len(wanted) and wanted[k] < proc.end
