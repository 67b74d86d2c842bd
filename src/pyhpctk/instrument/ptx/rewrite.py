"""Counting probes written into PTX: the instrumented module's text and each kernel's plan.

A probe is a scope of its own (``{ .reg ...; ... }``), so its registers are fresh and shadow
nothing the kernel uses, and it writes no register or predicate of the kernel. In it, the warp's
lowest active lane (no active lane below it: ``%lanemask_lt & activemask == 0``) adds
``popc(activemask)`` to the counter's thread slot with ``red.global.add.u64`` and, in blocks
mode, 1 to its warp slot: one atomic (blocks mode: a pair) per warp that passes, whatever its
divergence. Edges mode derives every count from the thread slots, so it adds no warp count.
The counter buffer (16 bytes per counter) is either a ``.param .u64`` appended to the kernel's
parameters, pointing at a zeroed device buffer the caller passes (``Buffer.PARAM``), or a
module-level ``.global .u64`` array of the kernel's own (one replica a SM), zeroed when the
module is loaded and read (or zeroed again) through ``cuModuleGetGlobal`` (``Buffer.GLOBAL``): a
framework's launcher passes only the arguments of the signature it compiled, so its kernels need
the second.

Where an edge's probe goes (edges mode): at the top of the body for the virtual edge; before
the terminator of a block with one successor; at the head of a target with one predecessor;
right after a guarded branch for its fall-through edge; otherwise (a critical edge) the branch
is pointed at a new block, placed after the body's last statement, that counts and branches on.
Device functions (``.func``) are parsed but not instrumented: they have no counter parameter.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.instrument.ptx import cfg as cfgmod
from pyhpctk.instrument.ptx.cfg import Cfg, EdgeKind
from pyhpctk.instrument.ptx.errors import PtxError
from pyhpctk.instrument.ptx.loops import Loops, find_loops
from pyhpctk.instrument.ptx.parse import Kind, PtxFunction, PtxModule, Statement, parse
from pyhpctk.instrument.ptx.probes import Mode, ProbePlan, make_plan, splittable

PREFIX = "__pyhpctk"
_MIN_VERSION = (6, 2)  # activemask.b32 (PTX ISA §9.7.13.6)
#: A ``.global`` counter array holds this many replicas of a kernel's counters, one an SM
#: (``%smid`` modulo the count), each starting on a 128-byte line of its own: the warps of
#: different SMs add to different lines, and the reader sums the replicas. One array for the
#: whole grid made every warp's atomics queue on one L2 line (issue #34: CuPy's stencil, a
#: thread a point and no loop, ran 24x its plain time with two probes a warp).
REPLICAS = 128
#: Fewer replicas (a power of two) for a kernel of many counters, so that its array stays
#: within this many bytes: pyrun reads and zeroes it after every launch.
MAX_COUNTER_BYTES = 64 * 1024
_LINE_ROWS = 8  # counters (16 bytes) in a 128-byte line


class Buffer(enum.Enum):
    """Where a kernel's probes find its counters."""

    PARAM = "param"  # a pointer appended to the kernel's parameters
    GLOBAL = "global"  # a .global array of the module, one per kernel


@dataclass(frozen=True)
class Instrumented:
    """The instrumented PTX and, per instrumented kernel, where its counters are."""

    ptx: str
    plans: dict[str, ProbePlan]
    counter_params: dict[str, str]  # kernel -> the name of its appended counter parameter
    counter_globals: dict[str, str] = field(default_factory=dict)  # kernel -> its array symbol
    source: str = ""  # the PTX as it was before instrumenting (its blocks are the plans')
    #: kernel -> copies of its counters in its .global array (:func:`replicas_for`; absent: 1)
    replicas: dict[str, int] = field(default_factory=dict)

    def copies(self, kernel: str) -> int:
        return self.replicas.get(kernel, 1)

    def rows(self, kernel: str) -> int:
        """Counters (16 bytes each) from one replica of ``kernel``'s to the next."""
        return replica_rows(self.plans[kernel].counters, self.copies(kernel))

    def counter_bytes(self, kernel: str) -> int:
        """The size of ``kernel``'s counter buffer: every replica."""
        return 16 * self.copies(kernel) * self.rows(kernel)

    def fold(self, kernel: str, raw: np.ndarray) -> np.ndarray:
        """``kernel``'s counters, shape (counters, 2): warps, threads, from its buffer's bytes
        (``counter_bytes`` of them), its replicas summed (modulo 2**64, as the atomics add)."""
        replicas = raw.view(np.uint64).reshape(self.copies(kernel), self.rows(kernel), 2)
        total: np.ndarray = replicas.sum(axis=0, dtype=np.uint64)
        return total[: self.plans[kernel].counters]


def replica_rows(counters: int, replicas: int) -> int:
    """Rows (counters) a replica takes: all of them, rounded up to whole 128-byte lines when
    there are several replicas."""
    rows = max(counters, 1)
    return rows if replicas == 1 else -(-rows // _LINE_ROWS) * _LINE_ROWS


def replicas_for(counters: int, buffer: Buffer) -> int:
    """How many replicas of ``counters`` counters a buffer holds: one in a parameter buffer;
    in a ``.global`` array :data:`REPLICAS`, halved while it would pass
    :data:`MAX_COUNTER_BYTES`."""
    if buffer is Buffer.PARAM:
        return 1
    replicas = REPLICAS
    while replicas > 1 and 16 * replicas * replica_rows(counters, replicas) > MAX_COUNTER_BYTES:
        replicas //= 2
    return replicas


@dataclass
class Edits:
    before: dict[int, list[str]] = field(default_factory=dict)
    after: dict[int, list[str]] = field(default_factory=dict)
    replace: dict[int, str] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)
    tables: dict[int, tuple[str, list[str]]] = field(default_factory=dict)  # brx -> new targets

    def add(self, where: dict[int, list[str]], index: int, code: str) -> None:
        where.setdefault(index, []).append(code)


def _address(
    r: str, where: str, buffer: Buffer, guard: str = "", spread: tuple[int, int] = (1, 0)
) -> list[str]:
    """The counter buffer's address into ``{r}_a``: loaded from the parameter ``where``, or the
    ``.global`` array's own (a ``mov`` of it gives its address in the global window) plus the
    offset of this SM's replica (``spread``: how many replicas, how many bytes apart)."""
    if buffer is Buffer.PARAM:
        return [f"\t{guard}ld.param.u64 {r}_a, [{where}];",
                f"\t{guard}cvta.to.global.u64 {r}_a, {r}_a;"]  # fmt: skip
    replicas, stride = spread
    if replicas == 1:
        return [f"\t{guard}mov.u64 {r}_a, {where};"]
    return [f"\t{guard}mov.u64 {r}_a, {where};",
            f"\t{guard}mov.u32 {r}_s, %smid;",
            f"\t{guard}and.b32 {r}_s, {r}_s, {replicas - 1};",
            f"\t{guard}mul.wide.u32 {r}_o, {r}_s, {stride};",
            f"\t{guard}add.u64 {r}_a, {r}_a, {r}_o;"]  # fmt: skip


def _replica_registers(r: str, buffer: Buffer) -> list[str]:
    """The registers :func:`_address` takes to find this SM's replica (``.global`` arrays)."""
    return [] if buffer is Buffer.PARAM else [f"\t.reg .b32 {r}_s;", f"\t.reg .b64 {r}_o;"]


def probe_code(
    where: str,
    counter: int,
    tag: str,
    guard: str = "",
    buffer: Buffer = Buffer.PARAM,
    into: tuple[str | None, str] | None = None,
    spread: tuple[int, int] = (1, 0),
    warps: bool = True,
) -> str:
    """The PTX of one probe adding to counter ``counter`` of the buffer ``where`` points at (a
    parameter) or is (a ``.global`` array); with a branch's ``guard`` (``@%p``, ``@!%p``), only
    the threads for which it holds count. With ``into`` (a warp and a thread register, 64-bit)
    it adds to those registers instead: no memory access; :func:`flush_code` adds them to the
    buffer where the kernel ends. Without ``warps`` (or a warp register) only the thread slot
    is added to."""
    r = f"%{tag}"
    off = 16 * counter
    if into is None:
        adds = [*_address(r, where, buffer, f"@{r}_p ", spread),
                *([f"\t@{r}_p red.global.add.u64 [{r}_a+{off}], 1;"] if warps else []),
                f"\t@{r}_p red.global.add.u64 [{r}_a+{off + 8}], {r}_n;"]  # fmt: skip
    else:
        w, t = into
        adds = [*([f"\t@{r}_p add.u64 {w}, {w}, 1;"] if w is not None else []),
                f"\t@{r}_p add.u64 {t}, {t}, {r}_n;"]  # fmt: skip
    taking = []
    if guard:  # the takers: a ballot of the guard; the lowest taker must itself take
        taking = [
            f"\tvote.sync.ballot.b32 {r}_m, {guard[1:]}, {r}_m;",
            f"\tmov.u32 {r}_l, %lanemask_eq;",
            f"\tand.b32 {r}_l, {r}_l, {r}_m;",
            f"\tsetp.ne.u32 {r}_q, {r}_l, 0;",
        ]  # fmt: skip
    last = (
        f"\tsetp.eq.and.u32 {r}_p, {r}_l, 0, {r}_q;" if guard else f"\tsetp.eq.u32 {r}_p, {r}_l, 0;"
    )
    return "\n".join([
        "\t{",
        f"\t.reg .pred {r}_p, {r}_q;",
        f"\t.reg .b32 {r}_m, {r}_l;",
        f"\t.reg .b64 {r}_a, {r}_n;",
        *_replica_registers(r, buffer),
        f"\tactivemask.b32 {r}_m;",
        *taking,
        f"\tmov.u32 {r}_l, %lanemask_lt;",
        f"\tand.b32 {r}_l, {r}_l, {r}_m;",
        last,
        f"\t@{r}_p popc.b32 {r}_l, {r}_m;",
        f"\t@{r}_p cvt.u64.u32 {r}_n, {r}_l;",
        *adds,
        "\t}",
    ])  # fmt: skip


def flush_code(
    where: str,
    registers: dict[int, tuple[str | None, str]],
    tag: str,
    buffer: Buffer,
    spread: tuple[int, int] = (1, 0),
) -> str:
    """Where threads leave the kernel: each adds its nonzero counter registers (``registers``:
    counter → its warp register, if warps are counted, and its thread register) to the buffer.
    Only the lanes that were a warp's lowest active lane hold counts, so a warp adds about once
    per register counter."""
    r = f"%{tag}"
    lines = ["\t{", f"\t.reg .pred {r}_p;", f"\t.reg .b64 {r}_a;", *_replica_registers(r, buffer),
             *_address(r, where, buffer, spread=spread)]  # fmt: skip
    for counter, (warps, threads) in sorted(registers.items()):
        for slot, register in ((0, warps), (8, threads)):
            if register is None:
                continue
            at = f"{r}_a+{16 * counter + slot}"
            lines += [f"\tsetp.ne.u64 {r}_p, {register}, 0;",
                      f"\t@{r}_p red.global.add.u64 [{at}], {register};"]  # fmt: skip
    return "\n".join([*lines, "\t}"])


#: At most this many counters are kept in registers (two 64-bit registers each), those of the
#: deepest loops first: more would cost the kernel occupancy.
MAX_REGISTER_COUNTERS = 8


def register_counters(cfg: Cfg, loops: Loops, plan: ProbePlan) -> tuple[int, ...]:
    """The counters whose probes run inside a loop (an edge with both ends in one loop, or a
    block of a loop), deepest loop first: kept in registers and flushed at exit, so a loop's
    trips cost no atomic (hip-analyzer keeps its counters in registers the same way)."""

    def depth(k: int) -> int:
        probed = plan.probed[k]
        if plan.mode is Mode.BLOCKS:
            return loops.depth(probed)
        edge = plan.edges[probed]
        inside = [lp.depth for lp in loops.loops if {edge.src, edge.dst} <= lp.blocks]
        return max(inside, default=0)

    hot = sorted((k for k in range(plan.counters) if depth(k) > 0), key=lambda k: (-depth(k), k))
    return tuple(sorted(hot[:MAX_REGISTER_COUNTERS]))


def _head(cfg: Cfg, block: int) -> int:
    """Index of the statement a probe at the head of ``block`` goes before (its first
    instruction), or -1 - last for an empty block (the probe then goes after its last one)."""
    b = cfg.blocks[block]
    return b.instructions[0] if b.instructions else -1 - b.last


def at_head(edits: Edits, cfg: Cfg, block: int, code: str) -> None:
    i = _head(cfg, block)
    edits.add(edits.before, i, code) if i >= 0 else edits.add(edits.after, -1 - i, code)


def at_tail(edits: Edits, cfg: Cfg, block: int, code: str) -> None:
    b = cfg.blocks[block]
    last = b.instructions[-1] if b.instructions else b.last
    edits.add(edits.after, last, code)


def _unguarded(s: Statement, target: str | None = None) -> str:
    operands = list(s.operands)
    if target is not None:
        operands[-1] = target
    return f"{s.opcode} {', '.join(operands)}".strip()


def split_edge(edits: Edits, cfg: Cfg, edge_index: int, code: str, label: str) -> None:
    """Point the edge's branch at a new block ``label`` that counts, then goes on."""
    e = cfg.edges[edge_index]
    term = cfg.blocks[e.src].terminator
    assert term is not None
    s = cfg.statement(term)
    if not splittable(cfg, e):
        head = cfg.statement(cfg.blocks[e.dst].first)
        raise PtxError(s.line, f"{cfg.function.name}: this branch's edge into the nested scope "
                               f"at line {head.line} must be counted, but a counting block "
                               "cannot branch into that scope")  # fmt: skip
    if e.kind is EdgeKind.EXIT:  # `@p exit` -> `@p bra L` ... `L: probe; exit`
        edits.replace[term] = f"{s.guard} bra {label}"
        edits.tail.append(f"{label}:\n{code}\n\t{_unguarded(s)};")
    elif e.kind is EdgeKind.TAKEN:
        edits.replace[term] = f"{s.guard} {_unguarded(s, label)}".strip()
        edits.tail.append(f"{label}:\n{code}\n\tbra {s.operands[-1]};")
    else:  # INDIRECT: a copy of the target list with this target pointing at the new block
        target = cfg.blocks[e.dst].labels[0]
        name, targets = edits.tables.get(
            term, (f"{label}_targets", cfgmod.targets(cfg.function, s))
        )
        where = {name: b.index for b in cfg.blocks for name in b.labels}
        targets = [label if where.get(t) == e.dst else t for t in targets]
        edits.tables[term] = (name, targets)
        edits.replace[term] = f"{s.guard} {_unguarded(s, name)}".strip()
        edits.tail.append(f"{label}:\n{code}\n\tbra {target};")


def place_on_edge(
    edits: Edits,
    cfg: Cfg,
    edge_index: int,
    code: str,
    label: str,
    guarded: Callable[[str], str] | None = None,
) -> None:
    """Put the probe ``code`` on edge ``edge_index`` (module docstring: where), through a new
    block ``label`` when the edge needs one. An edge into a nested scope, where no block can
    stand, takes ``guarded(guard)``: the probe counting only the threads the branch's guard
    sends (the counting probe's ballot); without ``guarded`` such an edge is refused."""
    e = cfg.edges[edge_index]
    src_block = cfg.blocks[e.src] if e.src < len(cfg.blocks) else None
    if e.kind is EdgeKind.VIRTUAL:
        first = next(i for i, s in enumerate(cfg.function.body)
                     if s.kind in (Kind.LABEL, Kind.INSTRUCTION))  # fmt: skip
        edits.add(edits.before, first, code)
    elif len(cfg.successors[e.src]) == 1:
        assert src_block is not None
        if src_block.terminator is not None:
            edits.add(edits.before, src_block.terminator, code)
        else:
            at_tail(edits, cfg, e.src, code)
    elif e.kind is EdgeKind.FALL:
        assert src_block is not None and src_block.terminator is not None
        edits.add(edits.after, src_block.terminator, code)
    elif e.kind is not EdgeKind.EXIT and len(cfg.predecessors[e.dst]) == 1:
        at_head(edits, cfg, e.dst, code)
    elif e.kind is EdgeKind.TAKEN and not splittable(cfg, e) and guarded is not None:
        # no block can stand on an edge into a nested scope: count the takers at the branch
        assert src_block is not None and src_block.terminator is not None
        guard = cfg.statement(src_block.terminator).guard
        edits.add(edits.before, src_block.terminator, guarded(guard))
    else:
        split_edge(edits, cfg, edge_index, code, label)


def _place(edits: Edits, cfg: Cfg, plan: ProbePlan, where: str, tag: str, buffer: Buffer,
           in_registers: tuple[int, ...] = ()) -> None:  # fmt: skip
    warps = plan.mode is Mode.BLOCKS  # edges mode derives from thread counts alone
    registers = {k: (f"%{tag}w{k}" if warps else None, f"%{tag}t{k}") for k in in_registers}
    ends = [i for i, e in enumerate(cfg.edges)
            if e.dst == len(cfg.blocks) and e.kind is not EdgeKind.VIRTUAL]  # fmt: skip
    exits = ends if registers else []
    replicas = replicas_for(plan.counters, buffer)
    spread = (replicas, 16 * replica_rows(plan.counters, replicas))
    flush = flush_code(where, registers, f"{tag}f", buffer, spread) if registers else ""
    if registers:  # declared and zeroed in the body's outermost scope, before anything runs
        names = [name for pair in registers.values() for name in pair if name is not None]
        first = next(i for i, s in enumerate(cfg.function.body)
                     if s.kind in (Kind.LABEL, Kind.INSTRUCTION))  # fmt: skip
        zeroed = "\n".join(f"\tmov.u64 {name}, 0;" for name in names)
        edits.add(edits.before, first, f"\t.reg .b64 {', '.join(names)};\n{zeroed}")
    for k, probed in enumerate(plan.probed):
        into = registers.get(k)
        code = probe_code(where, k, f"{tag}{k}", "", buffer, into, spread, warps)
        if plan.mode is Mode.BLOCKS:
            at_head(edits, cfg, probed, code)
            continue
        if probed in exits:  # the counter first, then the flush: one placement on the edge
            code = f"{code}\n{flush}"
            exits.remove(probed)

        def guarded(guard: str, k: int = k, into: tuple[str | None, str] | None = into) -> str:
            return probe_code(where, k, f"{tag}{k}", guard, buffer, into, spread, warps)

        place_on_edge(edits, cfg, probed, code, f"$L{tag}_split{k}", guarded)
    for edge in exits:
        place_on_edge(edits, cfg, edge, flush, f"$L{tag}_flush{edge}")


def _statement_text(s: Statement) -> str:
    if s.kind is Kind.LABEL:
        return s.text
    if s.kind in (Kind.OPEN, Kind.CLOSE):
        return s.text
    if s.kind is Kind.LOC or s.opcode in (".loc", ".file"):
        return "\t" + s.text
    prefix = f"{s.label}: " if s.label else ""
    return f"\t{prefix}{s.text};"


def _with_param(function: PtxFunction, param: str) -> str:
    head = function.header.rstrip()
    name_end = head.find(function.name) + len(function.name)
    rest = head[name_end:]
    decl = f".param .u64 .ptr .global .align 8 {param}"
    if not rest.lstrip().startswith("("):
        return f"{head[:name_end]}(\n\t{decl}\n){rest}"
    depth, close = 0, -1
    for i, c in enumerate(rest):
        depth += c == "("
        depth -= c == ")"
        if c == ")" and depth == 0:
            close = i
            break
    inside = rest[rest.index("(") + 1 : close]
    sep = ",\n\t" if inside.strip() else "\n\t"
    return f"{head[:name_end]}{rest[:close].rstrip()}{sep}{decl}\n{rest[close:]}"


def emit(cfg: Cfg, edits: Edits, header: str) -> str:
    out = [header, "{"]
    for i, s in enumerate(cfg.function.body):
        out.extend(edits.before.get(i, []))
        if i in edits.tables:
            name, targets = edits.tables[i]
            out.append(f"\t{name}: .branchtargets {', '.join(targets)};")
        out.append(edits.replace[i] + ";" if i in edits.replace else _statement_text(s))
        out.extend(edits.after.get(i, []))
    if edits.tail:
        last = cfg.blocks[-1] if cfg.blocks else None
        if last is not None and last.terminator is None:
            out.append("\tret;")  # the last block fell off the end: it must not run into a probe
        out.extend(edits.tail)
    out.append("}")
    return "\n".join(out)


def fresh_tag(text: str) -> str:
    tag = PREFIX
    n = 0
    while tag in text:
        n += 1
        tag = f"{PREFIX}{n}"
    return tag


def ptx_version(module: PtxModule) -> tuple[int, int]:
    try:
        major, minor = module.version.split(".")
        return int(major), int(minor)
    except ValueError:
        raise PtxError(0, f"unreadable .version {module.version!r}") from None


def prepare(
    ptx: str, kernels: set[str] | None
) -> tuple[PtxModule, str, list[tuple[PtxFunction, Cfg]]]:
    """``ptx`` parsed (refused if older than PTX ISA 6.2), a tag no name of it holds, and the
    kernels to instrument (all, or those named in ``kernels``) with their CFGs."""
    module = parse(ptx)
    if ptx_version(module) < _MIN_VERSION:
        raise PtxError(0, f"PTX ISA {module.version} is older than 6.2, which activemask needs")
    chosen = [(f, cfgmod.build(f)) for f in module.kernels if kernels is None or f.name in kernels]
    return module, fresh_tag(ptx), chosen


def instrument(
    ptx: str,
    mode: Mode = Mode.EDGES,
    kernels: set[str] | None = None,
    buffer: Buffer = Buffer.PARAM,
    registers: bool = False,
) -> Instrumented:
    """``ptx`` with counting probes in every kernel (or those named in ``kernels``), their
    counters in ``buffer``; with ``registers``, the counters of loops kept in registers and
    added to the buffer where threads leave the kernel (:func:`register_counters`)."""
    _, tag, chosen = prepare(ptx, kernels)
    pieces: list[str] = []
    plans: dict[str, ProbePlan] = {}
    params: dict[str, str] = {}
    arrays: dict[str, str] = {}
    replicas: dict[str, int] = {}
    done = 0
    for function, cfg in chosen:
        loops = find_loops(cfg)
        plan = make_plan(cfg, loops, mode)
        name = f"{function.name}_{tag}_counters"
        edits = Edits()
        in_registers = register_counters(cfg, loops, plan) if registers else ()
        _place(edits, cfg, plan, name, f"{tag}_", buffer, in_registers)
        pieces.append(ptx[done : function.start])
        if buffer is Buffer.PARAM:
            pieces.append(emit(cfg, edits, _with_param(function, name)))
            params[function.name] = name
        else:
            replicas[function.name] = copies = replicas_for(plan.counters, buffer)
            size = 2 * copies * replica_rows(plan.counters, copies)
            pieces.append(f".visible .global .align 8 .u64 {name}[{size}];\n")
            pieces.append(emit(cfg, edits, function.header.rstrip()))
            arrays[function.name] = name
        done = function.end
        plans[function.name] = plan
    pieces.append(ptx[done:])
    return Instrumented("".join(pieces), plans, params, arrays, ptx, replicas)
