"""Tracing probes written into PTX: every warp passing a trace site appends one event (issue #34
item 4).

An event is 32 bytes (:data:`EVENT_DTYPE`): ``%globaltimer`` (ns), ``%clock64`` (the SM's
cycles), the active mask, ``%ctaid`` (x; y and z in 16 bits each, their hardware limit), and a
word holding the site id (16 bits), ``%smid`` (10 bits) and ``%warpid`` (6 bits). The warp's
lowest active lane writes it (two vector stores, ``.cs``: streamed past the caches), so a warp
split by a branch records each part that passes, each with its own mask.

Each kernel gets a control block, a module-level ``.global .u64 <kernel>_<tag>_trace[8]`` the
host fills before a launch (:data:`CONTROL` names the words; the framework's launcher passes only
the arguments it compiled, so nothing is added to the signature), and 16 bytes of ``.shared``
state per warp of a CTA (512 bytes, declared as 1024 so that the kernel's own dynamic shared
memory keeps its alignment: :data:`SHARED_STATE_BYTES`), set by lane 0 of each warp in a
prologue at the kernel's start. The warp's cursor is in shared memory and moved with
``atom.shared``: with independent thread scheduling, two parts of a diverged warp may both be
inside a probe, so a cursor in a register, or a plain load and store, could hand them the same
slot.

Two ways to find room for the events (:class:`Strategy`):

- ``exact`` (hip-analyzer's): sized from counts. Each warp of the grid (its index: linear CTA ×
  warps per CTA + warp in the CTA) has a range ``[start, end)`` of event slots in a table the
  host writes (``TABLE``); an event past ``end`` is not written but counted in the warp's tally
  (``TALLIES``, a u32 per warp). A first run without a table (every range empty) is the counting
  pass: its tallies are each warp's event count, from which the host sizes the buffer and
  writes the table for the second, traced, run. Tallies of the traced run are events lost, 0 when
  the kernel took the same paths both times.
- ``chunks``: an online allocator. A warp takes a chunk of ``CHUNK_EVENTS`` slots from a pool of
  ``CHUNKS`` chunks with one global atomic (``NEXT_CHUNK``) when its current chunk is full, and
  fills it with shared-memory atomics; the part of a diverged warp that finds the chunk full while
  another part is taking the next waits for it. When the pool is exhausted, events are counted
  in ``LOST`` and not written. A chunk holds one warp's events in order; every event names its
  warp, so the decoder needs no chunk header.

No event is lost silently: every event that finds no room is counted, in the warp's tally or in
``LOST`` (also where the host gave no tally array).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from pyhpctk.instrument.ptx.cfg import Cfg
from pyhpctk.instrument.ptx.lines import Location, block_lines
from pyhpctk.instrument.ptx.parse import Kind, PtxModule
from pyhpctk.instrument.ptx.rewrite import Edits, at_head, emit, place_on_edge, prepare
from pyhpctk.instrument.ptx.sites import LineFilter, Sites, TraceSite, choose_sites

EVENT_BYTES = 32
EVENT_DTYPE = np.dtype(
    [
        ("time", "<u8"),  # %globaltimer, ns
        ("clock", "<u8"),  # %clock64, SM cycles
        ("mask", "<u4"),  # activemask
        ("cta_x", "<u4"),
        ("cta_yz", "<u4"),  # ctaid.y | ctaid.z << 16
        ("where", "<u4"),  # site | smid << 16 | warpid << 26
    ]
)
assert EVENT_DTYPE.itemsize == EVENT_BYTES
WARP_STATE_BYTES = 16  # shared state per warp of a CTA
MAX_WARPS_PER_CTA = 32
#: The warps' state is declared this large (it needs 512 bytes): the kernel's dynamic shared
#: memory begins after the static, and must begin where it did modulo the largest alignment
#: Hopper's shared-memory operands need (1024 bytes: a 128-byte-swizzled wgmma or TMA tile).
#: With 512 bytes Triton's matmul read its tiles from a 512-byte-shifted base and computed
#: wrong results on the H100 (its counted variants, which add no shared memory, did not).
SHARED_STATE_BYTES = 1024
assert SHARED_STATE_BYTES >= WARP_STATE_BYTES * MAX_WARPS_PER_CTA
NO_CHUNK = 0xFFFFFFFF


class Strategy(enum.Enum):
    EXACT = "exact"  # sized from a counting pass (hip-analyzer)
    CHUNKS = "chunks"  # an online chunk allocator


class CONTROL(enum.IntEnum):
    """The words of a kernel's control block (u64 each, the host writes them before a launch)."""

    EVENTS = 0  # device address of the event buffer
    TABLE = 1  # exact: per warp, u32 start and end slots (0: the counting pass)
    TALLIES = 2  # exact: per warp, a u32 of events that found no room (the counting pass: all)
    CHUNK_EVENTS = 3  # chunks: slots per chunk
    CHUNKS = 4  # chunks: chunks in the pool
    NEXT_CHUNK = 5  # chunks: the next free chunk (a u32 the probes move)
    LOST = 6  # events that found no room and no tally to count them
    RESERVED = 7


@dataclass(frozen=True)
class TracePlan:
    """One traced kernel: its sites, its symbols, and per block its source lines (each location
    with how many of the block's instructions it holds) and its instructions."""

    kernel: str
    strategy: Strategy
    sites: tuple[TraceSite, ...]
    control: str  # the control block's symbol (.global .u64[8])
    state: str  # the per-warp shared state's symbol
    lines: tuple[tuple[tuple[Location, int], ...], ...]
    instructions: tuple[int, ...]


@dataclass(frozen=True)
class TracedModule:
    """The traced PTX and, per traced kernel, its plan."""

    ptx: str
    plans: dict[str, TracePlan]
    source: str  # the PTX before tracing


class _Code:
    """The PTX of one probe: a scope of its own whose registers are named after ``tag``."""

    def __init__(self, tag: str) -> None:
        self.r = f"%{tag}"
        self.label = f"$L{tag}"
        self.lines: list[str] = []

    def __call__(self, *statements: str) -> None:
        self.lines.extend(f"\t{s};" if not s.endswith(":") else s for s in statements)

    def scope(self, preds: str, b32: str, b64: str) -> str:
        r = self.r
        regs = [
            f"\t.reg .pred {', '.join(f'{r}_{n}' for n in preds.split())};",
            f"\t.reg .b32 {', '.join(f'{r}_{n}' for n in b32.split())};",
            f"\t.reg .b64 {', '.join(f'{r}_{n}' for n in b64.split())};",
        ]
        return "\n".join(["\t{", *regs, *self.lines, "\t}"])

    def warp_state(self, state: str) -> None:
        """``_s``: the shared address of this warp's state; ``_x``: the linear thread id."""
        r = self.r
        self(f"mov.u32 {r}_x, %tid.x", f"mov.u32 {r}_y, %tid.y", f"mov.u32 {r}_z, %tid.z",
             f"mov.u32 {r}_n, %ntid.y", f"mad.lo.u32 {r}_y, {r}_z, {r}_n, {r}_y",
             f"mov.u32 {r}_n, %ntid.x", f"mad.lo.u32 {r}_x, {r}_y, {r}_n, {r}_x",
             f"shr.u32 {r}_w, {r}_x, 5", f"mov.u32 {r}_s, {state}",
             f"mad.lo.u32 {r}_s, {r}_w, {WARP_STATE_BYTES}, {r}_s")  # fmt: skip

    def lowest_lane(self) -> None:
        """``_p``: this thread is the lowest active lane of its warp; ``_m``: the active mask."""
        r = self.r
        self(f"activemask.b32 {r}_m", f"mov.u32 {r}_l, %lanemask_lt",
             f"and.b32 {r}_l, {r}_l, {r}_m", f"setp.eq.u32 {r}_p, {r}_l, 0")  # fmt: skip

    def event_words(self, site: int) -> None:
        """``_i``: ctaid.y | ctaid.z << 16; ``_j``: site | smid << 16 | warpid << 26; ``_k``:
        ctaid.x (time and clock were read first, into ``_t`` and ``_c``)."""
        r = self.r
        self(f"mov.u32 {r}_k, %ctaid.x", f"mov.u32 {r}_i, %ctaid.y", f"mov.u32 {r}_j, %ctaid.z",
             f"shl.b32 {r}_j, {r}_j, 16", f"or.b32 {r}_i, {r}_i, {r}_j",
             f"mov.u32 {r}_j, %smid", f"and.b32 {r}_j, {r}_j, 1023", f"shl.b32 {r}_j, {r}_j, 16",
             f"mov.u32 {r}_l, %warpid", f"shl.b32 {r}_l, {r}_l, 26", f"or.b32 {r}_j, {r}_j, {r}_l",
             f"or.b32 {r}_j, {r}_j, {site}")  # fmt: skip

    def store(self, guard: str, address: str) -> None:
        r = self.r
        self(
            f"@{guard} st.global.cs.v2.u64 [{address}], {{{r}_t, {r}_c}}",
            f"@{guard} st.global.cs.v4.u32 [{address}+16], {{{r}_m, {r}_k, {r}_i, {r}_j}}",
        )


def _prologue(plan: TracePlan, tag: str) -> str:
    """At the kernel's start, lane 0 of each warp sets its warp's shared state: exact, its slot
    range and grid-wide warp index; chunks, 'the current chunk is full' (the first event takes
    one) and the chunk size, or 'no chunk' when the host set no pool."""
    code = _Code(tag)
    r, ctl = code.r, plan.control
    code.warp_state(plan.state)
    code(f"and.b32 {r}_l, {r}_x, 31", f"setp.eq.u32 {r}_p, {r}_l, 0", f"mov.u64 {r}_b, {ctl}",
         f"mov.u32 {r}_e, 0", f"mov.u32 {r}_k, 0")  # fmt: skip
    if plan.strategy is Strategy.EXACT:
        code(f"mov.u32 {r}_x, %ctaid.x", f"mov.u32 {r}_y, %ctaid.y", f"mov.u32 {r}_z, %ctaid.z",
             f"mov.u32 {r}_n, %nctaid.y", f"mad.lo.u32 {r}_y, {r}_z, {r}_n, {r}_y",
             f"mov.u32 {r}_n, %nctaid.x", f"mad.lo.u32 {r}_g, {r}_y, {r}_n, {r}_x",
             f"mov.u32 {r}_x, %ntid.x", f"mov.u32 {r}_y, %ntid.y", f"mov.u32 {r}_z, %ntid.z",
             f"mul.lo.u32 {r}_x, {r}_x, {r}_y", f"mul.lo.u32 {r}_x, {r}_x, {r}_z",
             f"add.u32 {r}_x, {r}_x, 31", f"shr.u32 {r}_x, {r}_x, 5",
             f"mad.lo.u32 {r}_g, {r}_g, {r}_x, {r}_w",  # the warp's index in the grid
             f"mov.u64 {r}_a, 0", f"@{r}_p ld.global.u64 {r}_a, [{r}_b+{8 * CONTROL.TABLE}]",
             f"setp.ne.and.u64 {r}_q, {r}_a, 0, {r}_p", f"@{r}_q cvta.to.global.u64 {r}_a, {r}_a",
             f"@{r}_q mad.wide.u32 {r}_a, {r}_g, 8, {r}_a",
             f"@{r}_q ld.global.v2.u32 {{{r}_e, {r}_k}}, [{r}_a]",
             f"@{r}_p st.shared.v4.u32 [{r}_s], {{{r}_e, {r}_k, {r}_g, {r}_k}}")  # fmt: skip
    else:
        code(f"@{r}_p ld.global.u32 {r}_k, [{r}_b+{8 * CONTROL.CHUNK_EVENTS}]",
             f"setp.eq.and.u32 {r}_q, {r}_k, 0, {r}_p", f"mov.u32 {r}_g, 0",
             f"@{r}_q mov.u32 {r}_g, {NO_CHUNK}",  # no pool: every event is counted as lost
             f"@{r}_p st.shared.v4.u32 [{r}_s], {{{r}_k, {r}_g, {r}_k, {r}_e}}")  # fmt: skip
    code(f"activemask.b32 {r}_m", f"bar.warp.sync {r}_m")
    return code.scope("p q", "x y z n w s l e k g m", "a b")


def _exact_event(plan: TracePlan, site: int, tag: str) -> str:
    code = _Code(tag)
    r, ctl = code.r, plan.control
    code(f"mov.u64 {r}_t, %globaltimer", f"mov.u64 {r}_c, %clock64")
    code.lowest_lane()
    code.warp_state(plan.state)
    code(f"mov.u32 {r}_e, 0", f"mov.u32 {r}_n, 0", f"mov.u32 {r}_g, 0",
         f"@{r}_p atom.shared.add.u32 {r}_e, [{r}_s], 1",  # this event's slot
         # the warp's index and end (+8: a .v2 needs 8-byte alignment, +4 faults)
         f"@{r}_p ld.shared.v2.u32 {{{r}_g, {r}_n}}, [{r}_s+8]",
         f"setp.lt.and.u32 {r}_q, {r}_e, {r}_n, {r}_p",  # room: write the event
         f"setp.ge.and.u32 {r}_o, {r}_e, {r}_n, {r}_p",  # none: count it
         f"mov.u64 {r}_b, {ctl}", f"mov.u64 {r}_a, 0",
         f"@{r}_q ld.global.u64 {r}_a, [{r}_b+{8 * CONTROL.EVENTS}]",
         f"@{r}_q cvta.to.global.u64 {r}_a, {r}_a", f"@{r}_q mad.wide.u32 {r}_a, {r}_e, "
         f"{EVENT_BYTES}, {r}_a")  # fmt: skip
    code.event_words(site)
    code.store(f"{r}_q", f"{r}_a")
    code(f"mov.u64 {r}_a, 0", f"@{r}_o ld.global.u64 {r}_a, [{r}_b+{8 * CONTROL.TALLIES}]",
         f"setp.ne.and.u64 {r}_q, {r}_a, 0, {r}_o", f"setp.eq.and.u64 {r}_o, {r}_a, 0, {r}_o",
         f"@{r}_q cvta.to.global.u64 {r}_a, {r}_a", f"@{r}_q mad.wide.u32 {r}_a, {r}_g, 4, {r}_a",
         f"@{r}_q red.global.add.u32 [{r}_a], 1",
         f"@{r}_o red.global.add.u64 [{r}_b+{8 * CONTROL.LOST}], 1")  # fmt: skip
    return code.scope("p q o", "m l x y z n w s e g k i j", "t c a b")


def _chunk_event(plan: TracePlan, site: int, tag: str) -> str:
    code = _Code(tag)
    r, ctl, lab = code.r, plan.control, code.label
    code(f"mov.u64 {r}_t, %globaltimer", f"mov.u64 {r}_c, %clock64")
    code.lowest_lane()
    code.warp_state(plan.state)
    code.event_words(site)
    code(f"mov.u64 {r}_b, {ctl}", f"mov.u64 {r}_u, 0", f"mov.u32 {r}_n, 0",
         f"@{r}_p ld.shared.u32 {r}_n, [{r}_s+8]",  # slots per chunk
         f"{lab}_retry:",
         f"@{r}_p atom.shared.add.u64 {r}_u, [{r}_s], 1",  # chunk << 32 | fill
         f"cvt.u32.u64 {r}_e, {r}_u", f"shr.u64 {r}_a, {r}_u, 32", f"cvt.u32.u64 {r}_g, {r}_a",
         f"setp.ne.and.u32 {r}_v, {r}_g, {NO_CHUNK}, {r}_p",
         f"setp.eq.and.u32 {r}_o, {r}_g, {NO_CHUNK}, {r}_p",  # no pool left: count it
         f"setp.gt.and.u32 {r}_h, {r}_e, {r}_n, {r}_v",  # another part is taking a chunk
         f"@{r}_h bra {lab}_wait",
         f"setp.lt.and.u32 {r}_q, {r}_e, {r}_n, {r}_v",  # room in the current chunk
         f"setp.eq.and.u32 {r}_v, {r}_e, {r}_n, {r}_v",  # the first past its end: a new one
         f"@{r}_v atom.global.add.u32 {r}_g, [{r}_b+{8 * CONTROL.NEXT_CHUNK}], 1",
         f"mov.u32 {r}_x, 0", f"@{r}_v ld.global.u32 {r}_x, [{r}_b+{8 * CONTROL.CHUNKS}]",
         f"setp.ge.and.u32 {r}_ex, {r}_g, {r}_x, {r}_v",  # the pool is exhausted
         f"setp.lt.and.u32 {r}_v, {r}_g, {r}_x, {r}_v",  # a chunk: this event is its first
         f"@{r}_v mov.u32 {r}_e, 0", f"mov.u32 {r}_y, 1",
         f"@{r}_v mov.b64 {r}_u, {{{r}_y, {r}_g}}", f"@{r}_v st.shared.u64 [{r}_s], {r}_u",
         f"mov.u32 {r}_y, 0", f"mov.u32 {r}_x, {NO_CHUNK}",
         f"@{r}_ex mov.b64 {r}_u, {{{r}_y, {r}_x}}", f"@{r}_ex st.shared.u64 [{r}_s], {r}_u",
         f"or.pred {r}_q, {r}_q, {r}_v", f"or.pred {r}_o, {r}_o, {r}_ex",
         f"mov.u64 {r}_a, 0", f"@{r}_q ld.global.u64 {r}_a, [{r}_b+{8 * CONTROL.EVENTS}]",
         f"@{r}_q cvta.to.global.u64 {r}_a, {r}_a",
         f"mul.wide.u32 {r}_d, {r}_g, {r}_n", f"cvt.u64.u32 {r}_f, {r}_e",
         f"add.u64 {r}_d, {r}_d, {r}_f", f"shl.b64 {r}_d, {r}_d, 5",
         f"add.u64 {r}_a, {r}_a, {r}_d")  # fmt: skip
    code.store(f"{r}_q", f"{r}_a")
    code(f"@{r}_o red.global.add.u64 [{r}_b+{8 * CONTROL.LOST}], 1", f"bra {lab}_done",
         f"{lab}_wait:", f"ld.volatile.shared.u64 {r}_u, [{r}_s]", f"cvt.u32.u64 {r}_e, {r}_u",
         f"setp.gt.u32 {r}_h, {r}_e, {r}_n", f"@{r}_h bra {lab}_wait", f"bra {lab}_retry",
         f"{lab}_done:")  # fmt: skip
    return code.scope("p q o v h ex", "m l x y z n w s e g k i j", "t c u a b d f")


def event_code(plan: TracePlan, site: int, tag: str) -> str:
    """The PTX of the probe of ``site``."""
    if plan.strategy is Strategy.EXACT:
        return _exact_event(plan, site, tag)
    return _chunk_event(plan, site, tag)


def _plan(module: PtxModule, cfg: Cfg, strategy: Strategy, sites: Sites, lines: LineFilter | None,
          names: tuple[str, str]) -> TracePlan:  # fmt: skip
    chosen = choose_sites(module, cfg, sites, lines)
    per_block = tuple(
        tuple(sorted(c.items(), key=lambda kv: (kv[0].file, kv[0].line)))
        for c in block_lines(module, cfg)
    )
    sizes = tuple(len(b.instructions) for b in cfg.blocks)
    return TracePlan(cfg.function.name, strategy, chosen, names[0], names[1], per_block, sizes)


def _place(edits: Edits, cfg: Cfg, plan: TracePlan, tag: str) -> None:
    body = cfg.function.body
    first = next(i for i, s in enumerate(body) if s.kind in (Kind.LABEL, Kind.INSTRUCTION))
    edits.add(edits.before, first, _prologue(plan, f"{tag}p"))  # before every site's probe
    for site in plan.sites:
        code = event_code(plan, site.id, f"{tag}{site.id}")
        if site.edge >= 0:
            place_on_edge(edits, cfg, site.edge, code, f"$L{tag}_exit{site.id}")
        elif site.statement == cfg.blocks[site.block].instructions[0]:
            at_head(edits, cfg, site.block, code)
        else:
            edits.add(edits.before, site.statement, code)


def instrument_traces(
    ptx: str,
    strategy: Strategy = Strategy.CHUNKS,
    sites: Sites = Sites.BLOCKS,
    lines: LineFilter | None = None,
    kernels: set[str] | None = None,
) -> TracedModule:
    """``ptx`` with tracing probes at ``sites`` of every kernel (or those in ``kernels``)."""
    module, tag, chosen = prepare(ptx, kernels)
    pieces: list[str] = []
    plans: dict[str, TracePlan] = {}
    done = 0
    for function, cfg in chosen:
        names = (f"{function.name}_{tag}_trace", f"{function.name}_{tag}_warps")
        plan = _plan(module, cfg, strategy, sites, lines, names)
        edits = Edits()
        if plan.sites:
            _place(edits, cfg, plan, f"{tag}_t")
        pieces.append(ptx[done : function.start])
        pieces.append(f".visible .global .align 8 .u64 {names[0]}[{len(CONTROL)}];\n")
        pieces.append(f".shared .align 16 .b8 {names[1]}[{SHARED_STATE_BYTES}];\n")
        pieces.append(emit(cfg, edits, function.header.rstrip()))
        done = function.end
        plans[function.name] = plan
    pieces.append(ptx[done:])
    return TracedModule("".join(pieces), plans, ptx)
