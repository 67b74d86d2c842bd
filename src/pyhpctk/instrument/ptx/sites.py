"""Where a traced kernel records an event: its trace sites (issue #34 item 4).

A site is a point of the kernel where the warp passing it appends one event to its trace. Three
ways to choose them (:class:`Sites`), each with an ``entry`` site (the kernel's first block, so
every warp's trace starts when it starts) and an ``exit`` site on every edge to the virtual EXIT
(``ret``, ``exit``, ``trap``, falling off the end; so every trace ends when its warp does):

- ``blocks``: the head of every block; the time from one event to the warp's next is the time
  the warp spent in that block (and the blocks it reached without a site: none here).
- ``loops``: the head of every loop header (one event per iteration) besides entry and exit.
- ``lines``: where the instructions of a named source line start within a block, and where they
  stop (an ``other`` site: the code after the line is not the line's), besides entry and exit;
  at the head of a block whose first instructions are not a named line but follow one in a
  predecessor, an ``other`` site too. A filter names lines as ``FILE:LINE`` or
  ``FILE:FIRST-LAST``, FILE matched as a suffix of the ``.file`` path (:func:`line_filter`).

A site id is 16 bits in the event (``traces.EVENT_DTYPE``): a kernel with more sites is refused.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pyhpctk.instrument.ptx.cfg import Cfg, EdgeKind
from pyhpctk.instrument.ptx.errors import PtxError
from pyhpctk.instrument.ptx.lines import Location, instruction_locations
from pyhpctk.instrument.ptx.loops import find_loops
from pyhpctk.instrument.ptx.parse import PtxModule

MAX_SITES = 1 << 16
LineFilter = Callable[[Location], bool]


class Sites(enum.Enum):
    """Which points of a kernel record events."""

    BLOCKS = "blocks"
    LOOPS = "loops"
    LINES = "lines"


class SiteKind(enum.Enum):
    ENTRY = "entry"  # the head of the kernel's first block
    BLOCK = "block"  # the head of a block
    LOOP = "loop"  # the head of a loop header: one event per iteration
    LINE = "line"  # where a named line's instructions start
    OTHER = "other"  # where they stop (lines mode)
    EXIT = "exit"  # an edge to the virtual EXIT: the warp (or some of its threads) ends


@dataclass(frozen=True, slots=True)
class TraceSite:
    """One site: its id (the event's site field), what it marks, the block it is in, where its
    probe goes (``statement``: the body index it goes before; ``edge``: the index of the EXIT
    edge it stands on, ``statement`` then -1) and the source location of the code after it
    (its block's first located instruction from the probe on)."""

    id: int
    kind: SiteKind
    block: int
    statement: int
    location: Location | None
    edge: int = -1


def line_filter(specs: Iterable[str]) -> LineFilter:
    """A filter from ``FILE:LINE`` / ``FILE:FIRST-LAST`` specs; a malformed one is a one-line
    :class:`PtxError`."""
    wanted: list[tuple[str, int, int]] = []
    for spec in specs:
        m = re.fullmatch(r"(.+):(\d+)(?:-(\d+))?", spec.strip())
        if not m:
            raise PtxError(0, f"bad line filter {spec!r}: say FILE:LINE or FILE:FIRST-LAST")
        first = int(m.group(2))
        last = int(m.group(3)) if m.group(3) else first
        if last < first:
            raise PtxError(0, f"bad line filter {spec!r}: the range runs backwards")
        wanted.append((m.group(1), first, last))

    def named(location: Location) -> bool:
        return any(
            location.file.endswith(file) and first <= location.line <= last
            for file, first, last in wanted
        )

    return named


def _runs(cfg: Cfg, block: int, where: dict[int, Location]) -> list[tuple[int, Location | None]]:
    """The block's runs of instructions of one source line: (first instruction, location);
    instructions without a location join the run before them."""
    runs: list[tuple[int, Location | None]] = []
    for i in cfg.blocks[block].instructions:
        location = where.get(i)
        if not runs or (location is not None and location.key != _key(runs[-1][1])):
            runs.append((i, location))
    return runs


def _key(location: Location | None) -> tuple[str, int] | None:
    return None if location is None else location.key


def _named(location: Location | None, named: LineFilter) -> bool:
    return location is not None and named(location)


def _line_sites(
    cfg: Cfg, where: dict[int, Location], named: LineFilter
) -> list[tuple[SiteKind, int, int]]:
    """(kind, block, statement) of the lines mode's sites inside blocks."""
    runs = [_runs(cfg, b.index, where) for b in cfg.blocks]
    ends_named = [bool(r) and _named(r[-1][1], named) for r in runs]
    out: list[tuple[SiteKind, int, int]] = []
    for b, block_runs in enumerate(runs):
        before = any(ends_named[p] for p in cfg.predecessors[b] if p < len(cfg.blocks))
        for k, (i, location) in enumerate(block_runs):
            is_named = _named(location, named)
            if is_named:
                out.append((SiteKind.LINE, b, i))
            elif before and (k > 0 or b != 0):
                out.append((SiteKind.OTHER, b, i))
            before = is_named
    return out


def _located(cfg: Cfg, where: dict[int, Location], block: int, statement: int) -> Location | None:
    """The location of the code a site at ``statement`` times: its block's first instruction
    with a location from there on (a ``.loc`` often follows a block's first instruction), else
    the last one before it in the block."""
    instructions = cfg.blocks[block].instructions
    after = [where[i] for i in instructions if i >= statement and i in where]
    before = [where[i] for i in instructions if i < statement and i in where]
    return after[0] if after else (before[-1] if before else None)


def choose_sites(
    module: PtxModule, cfg: Cfg, sites: Sites, lines: LineFilter | None = None
) -> tuple[TraceSite, ...]:
    """The trace sites of ``cfg``'s kernel in mode ``sites`` (the module docstring)."""
    where = instruction_locations(module, cfg)
    chosen: list[tuple[SiteKind, int, int]] = []
    if cfg.blocks and cfg.blocks[0].instructions:
        chosen.append((SiteKind.ENTRY, 0, cfg.blocks[0].instructions[0]))
    if sites is Sites.BLOCKS:
        chosen += [(SiteKind.BLOCK, b.index, b.instructions[0])
                   for b in cfg.blocks[1:] if b.instructions]  # fmt: skip
    elif sites is Sites.LOOPS:
        headers = sorted({lp.header for lp in find_loops(cfg).loops})
        chosen += [(SiteKind.LOOP, h, cfg.blocks[h].instructions[0])
                   for h in headers if h != 0 and cfg.blocks[h].instructions]  # fmt: skip
    else:
        if lines is None:
            raise PtxError(0, "lines mode needs a filter naming the lines to trace")
        entry = {i for _, _, i in chosen}  # a named line at the kernel's start: its entry site
        chosen += [s for s in _line_sites(cfg, where, lines) if s[2] not in entry]
    out = [
        TraceSite(n, kind, block, statement, _located(cfg, where, block, statement))
        for n, (kind, block, statement) in enumerate(sorted(chosen, key=lambda s: s[2]))
    ]
    for e, edge in enumerate(cfg.edges):
        if edge.kind is EdgeKind.EXIT:
            out.append(TraceSite(len(out), SiteKind.EXIT, edge.src, -1, None, e))
    if len(out) > MAX_SITES:
        raise PtxError(cfg.function.line, f"{cfg.function.name}: {len(out)} trace sites, more "
                                          f"than the {MAX_SITES} an event can name")  # fmt: skip
    return tuple(out)
