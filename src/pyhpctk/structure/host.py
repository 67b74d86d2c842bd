"""Structure of a host ELF binary (x86-64, AArch64): procedures, statements, inlines, loops.

The pipeline mirrors hpcstruct's ``makeStructure`` for CPU binaries:

1. the *skeleton*: one procedure per function symbol, one per ``.plt`` stub (``name@plt``), and
   one per call target that no symbol claims (``targXXXX``, suffixed ``@plt`` when at most 32
   bytes long) — each placed in the file of its entry's line (``[basename]`` without one);
2. for each procedure, a CFG from capstone and its loop nest, then the inline tree
   (:mod:`pyhpctk.structure.inline_tree`) filled from the DWARF line map and inline table;
   bytes of the procedure no block reaches ("gaps") still become statements;
3. ``F``/``P`` scopes, files sorted by name and procedures by address, as hpcstruct orders them.

Functions are independent, so :func:`analyze_functions` can run them in worker processes.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pyhpctk.formats.hpcstruct_model import (
    FILE,
    LOAD_MODULE,
    PROCEDURE,
    Scope,
    StructureFile,
    format_ranges,
)
from pyhpctk.structure.cfg import (
    Block,
    Decoder,
    Flow,
    FunctionCFG,
    Instruction,
    Loop,
    build_cfg,
    noreturn_names,
)
from pyhpctk.structure.cython_names import cython_names
from pyhpctk.structure.dwarf import DebugInfo, InlineNode, demangle_many, read_debug_info
from pyhpctk.structure.elfimage import EM_X86_64, PLT_STUB_MAX, ElfImage
from pyhpctk.structure.inline_tree import (
    ExitCondition,
    LoopInfo,
    Stmt,
    TreeNode,
    find_loop_header,
    tree_scopes,
)
from pyhpctk.structure.jumptables import JumpTableResolver
from pyhpctk.structure.mypyc_names import mypyc_names

InlinePath = tuple[InlineNode, ...]


@dataclass(frozen=True, slots=True)
class Procedure:
    """One skeleton entry: range, names, file and line of the entry, symbol index."""

    start: int
    end: int
    link_name: str
    pretty_name: str
    file: str
    line: int
    symbol_index: int = 0
    fill_gaps: bool = True


@dataclass(frozen=True, slots=True)
class HostStructOptions:
    """Knobs for host analysis."""

    call_tags: bool = False


def proc_line(info: DebugInfo, start: int, end: int) -> tuple[str, int]:
    """getProcLineMap (host): the line at the entry, else the first line within 800 bytes."""
    hit = info.line_map.lookup(start)
    if hit is not None:
        return hit[0], hit[1]
    starts = info.line_map.starts
    if len(starts) == 0:
        return "", 0
    limit = min(end, start + 800)
    i = int(np.searchsorted(starts, start, side="left"))
    while i < len(starts) and int(starts[i]) < limit:
        return info.line_map.files[int(info.line_map.file_index[i])], int(info.line_map.lines[i])
    return "", 0


def skeleton(
    image: ElfImage,
    info: DebugInfo,
    decoder: Decoder,
    decoded: dict[int, list[Instruction]] | None = None,
) -> list[Procedure]:
    """The procedures hpcstruct would list, sorted by entry address.

    Symbol functions are decoded here to find call targets; ``decoded`` (if given) keeps those
    instructions by entry address so the analysis does not decode them again.
    """
    procs = symbol_procedures(image, info)
    targets: set[int] = set()
    for proc in procs:
        instructions = decoder.decode(image.read(proc.start, proc.end), proc.start)
        if decoded is not None:
            decoded[proc.start] = instructions
        targets.update(call_targets(instructions))
    every = procs + unclaimed_procedures(image, info, procs, targets)
    every.sort(key=lambda p: p.start)
    return every


def call_targets(instructions: Iterable[Instruction]) -> set[int]:
    """Direct call targets of a function's instructions."""
    return {i.target for i in instructions if i.flow == Flow.CALL and i.target is not None}


def symbol_procedures(image: ElfImage, info: DebugInfo) -> list[Procedure]:
    """Procedures of the function symbols (makeSkeleton case 1), sorted by entry address."""
    suffix = f" [{image.basename}]" if image.is_shared else ""
    unknown_file = f"[{image.basename}]"
    symbols = image.functions
    links = [f.link_name for f in symbols]
    pretties = demangle_many(links)
    compiled = mypyc_names(links)  # a Python function mypyc compiled is named as Python names it
    cythoned = cython_names(links)  # ... and one Cython compiled, by its dotted name
    procs: list[Procedure] = []
    for func, pretty, mypyc, cython in zip(symbols, pretties, compiled, cythoned, strict=True):
        python = mypyc if mypyc is not None else cython
        file, line = proc_line(info, func.start, func.end)
        procs.append(
            Procedure(
                func.start,
                func.end,
                func.link_name,
                pretty + suffix if python is None else python,
                file or unknown_file,
                line if file else 0,
                func.symbol_index,
            )
        )
    procs.sort(key=lambda p: p.start)
    return procs


def unclaimed_procedures(
    image: ElfImage, info: DebugInfo, symbol_procs: Sequence[Procedure], targets: Iterable[int]
) -> list[Procedure]:
    """Parsed functions without a symbol: ``.plt`` stubs and unclaimed call targets (case 2/4)."""
    suffix = f" [{image.basename}]" if image.is_shared else ""
    unknown_file = f"[{image.basename}]"
    procs: list[Procedure] = []
    claimed = [(p.start, p.end) for p in symbol_procs]
    extra: dict[int, str] = {}
    for address, name in image.plt_names.items():
        extra[address] = name
    starts = sorted(s for s, _ in claimed)
    claimed_arr = np.array(sorted(claimed), dtype=np.int64).reshape(-1, 2)

    def is_claimed(address: int) -> bool:
        if len(claimed_arr) == 0:
            return False
        i = int(np.searchsorted(claimed_arr[:, 0], address, side="right")) - 1
        return i >= 0 and address < int(claimed_arr[i, 1])

    for t in sorted(targets):
        if t not in extra and not is_claimed(t) and image.region_of(t) is not None:
            extra[t] = f"targ{t:x}"
    every_start = sorted(set(starts) | set(extra))
    for address, name in sorted(extra.items()):
        if is_claimed(address):
            continue
        region = image.region_of(address)
        if region is None:
            continue
        k = bisect.bisect_left(every_start, address)
        end = every_start[k + 1] if k + 1 < len(every_start) else region.end
        end = min(end, region.end) if address < region.end else address + 20
        if name.startswith("targ") and any(region.start <= s < address for s in starts):
            # makeSkeleton case 2: Dyninst's symtab places a parsed function that follows a
            # symbol of the same region inside that symbol ("outline" code): it is named
            # <unknown procedure> and gets no gap statements of its own.
            file, line = proc_line(info, address, end)
            pretty = f"<unknown procedure> {address:#x}"
            if file:
                pretty += f" {os.path.basename(file)}" + (f":{line}" if line > 0 else "")
            procs.append(
                Procedure(address, end, name, pretty + suffix, file or unknown_file, line, 0, False)
            )
            continue
        link = name
        pretty = name
        if end - address <= PLT_STUB_MAX and not link.lower().endswith("@plt"):
            link += "@plt"
            pretty += "@plt"
        procs.append(Procedure(address, end, link, pretty + suffix, unknown_file, 0, 0))
    procs.sort(key=lambda p: p.start)
    return procs


def _gap_ranges(blocks: list[Block], start: int, end: int) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    cursor = start
    for block in sorted(blocks, key=lambda b: b.start):
        if block.end <= cursor:
            continue
        if block.start > cursor:
            gaps.append((cursor, min(block.start, end)))
        cursor = max(cursor, block.end)
        if cursor >= end:
            break
    if cursor < end:
        gaps.append((cursor, end))
    return [(lo, hi) for lo, hi in gaps if hi > lo]


class FunctionAnalyzer:
    """Builds the ``P`` scope of each procedure of one image."""

    def __init__(
        self,
        image: ElfImage,
        info: DebugInfo,
        procs: Sequence[Procedure],
        options: HostStructOptions | None = None,
        decoded: dict[int, list[Instruction]] | None = None,
    ) -> None:
        self.decoded = decoded if decoded is not None else {}
        self.image = image
        self.info = info
        self.procs = list(procs)
        self.options = options or HostStructOptions()
        self.decoder = Decoder(image.machine)
        self.jump_tables = JumpTableResolver(image) if image.machine == EM_X86_64 else None
        self.entries = {p.start for p in self.procs}
        noreturn = noreturn_names()
        self.noreturn = {
            p.start for p in self.procs if p.link_name.removesuffix("@plt") in noreturn
        }
        # PLT stubs are known before the skeleton is complete (the parallel path needs them).
        self.noreturn.update(a for a, name in image.plt_names.items() if name in noreturn)
        self.entries.update(image.plt_names)

    def statements(
        self, addresses: np.ndarray, lengths: np.ndarray, start: int, end: int
    ) -> list[tuple[InlinePath, Stmt]]:
        """(inline path, Stmt) for each instruction address (sorted)."""
        files = self.info.line_map.files
        fidx, lines = self.info.line_map.lookup_many(addresses)
        nodes = self.info.inlines.nodes_for(addresses, start, end)
        out = []
        for a, n, f, ln, node in zip(
            addresses.tolist(),
            lengths.tolist(),
            fidx.tolist(),
            lines.tolist(),
            nodes.tolist(),
            strict=True,
        ):
            file = files[f] if f >= 0 else ""
            line = ln if f >= 0 else 0
            out.append((self.info.inlines.chain(node), Stmt(a, n, file, line)))
        return out

    def analyze(self, proc: Procedure) -> Scope:
        """The ``P`` scope of one procedure."""
        return self.analyze_with_calls(proc)[0]

    def analyze_with_calls(self, proc: Procedure) -> tuple[Scope, set[int]]:
        """The ``P`` scope of one procedure and the direct call targets in its code."""
        instructions = self.decoded.pop(proc.start, None)
        if instructions is None:
            code = self.image.read(proc.start, proc.end)
            instructions = self.decoder.decode(code, proc.start)
        tables = (
            self.jump_tables.resolve(instructions, proc.start, proc.end)
            if self.jump_tables is not None
            else {}
        )
        cfg = build_cfg(
            instructions,
            proc.start,
            proc.start,
            proc.end,
            self.noreturn,
            self.entries,
            tables,
        )
        root = self._tree(proc, cfg)
        scope_file = proc.file
        scope = procedure_scope(proc)
        scope.children.extend(tree_scopes(root, scope_file, proc.line, self.options.call_tags))
        return scope, call_targets(instructions)

    def _tree(self, proc: Procedure, cfg: FunctionCFG) -> TreeNode:
        blocks = cfg.blocks
        block_stmts: dict[int, list[tuple[InlinePath, Stmt]]] = {}
        if blocks:
            addrs = np.array(
                [ins.address for b in blocks for ins in b.instructions], dtype=np.uint64
            )
            lens = np.array([ins.size for b in blocks for ins in b.instructions], dtype=np.int64)
            stmts = self.statements(addrs, lens, proc.start, proc.end)
            k = 0
            for b in blocks:
                n = len(b.instructions)
                block_stmts[b.index] = stmts[k : k + n]
                k += n
        visited: set[int] = set()

        def do_block(b: int, node: TreeNode) -> None:
            if b in visited:
                return
            visited.add(b)
            for path, stmt in block_stmts[b]:
                node.add_stmt(path, stmt)

        def do_loop(loop: Loop) -> LoopInfo:
            children = sorted(loop.children, key=lambda c: min(blocks[e].start for e in c.entries))
            infos = [do_loop(child) for child in children]
            raw = TreeNode()
            for b in sorted(loop.blocks, key=lambda i: blocks[i].start):
                if b not in visited:
                    do_block(b, raw)
            for info in infos:
                raw.merge_loop(info)
            conditions = self._exit_conditions(loop, blocks, block_stmts)
            entry_vma = min(blocks[e].start for e in loop.entries)
            return find_loop_header(raw, conditions, proc.file, entry_vma, len(loop.entries) > 1)

        root = TreeNode()
        top = sorted(cfg.loops, key=lambda c: min(blocks[e].start for e in c.entries))
        infos = [do_loop(loop) for loop in top]
        for index in range(len(blocks)):
            if index not in visited:
                do_block(index, root)
        for info in infos:
            root.merge_loop(info)
        # Gaps: bytes of the procedure no block claims (addGaps, basic version).
        gaps = _gap_ranges(blocks, proc.start, proc.end) if proc.fill_gaps else []
        if gaps:
            self._add_gaps(root, gaps, proc)
        return root

    def _add_gaps(self, root: TreeNode, gaps: list[tuple[int, int]], proc: Procedure) -> None:
        line_map = self.info.line_map
        for lo, hi in gaps:
            vma = lo
            pieces: list[tuple[int, int, str, int]] = []
            while vma < hi:
                hit = line_map.lookup(vma)
                if hit is not None:
                    file, line, rend = hit
                    stop = min(rend, hi)
                    pieces.append((vma, stop, file, line))
                else:
                    stop = min(vma + 4, hi)
                    pieces.append((vma, stop, proc.file, proc.line))
                vma = stop
            addrs = np.array([p[0] for p in pieces], dtype=np.uint64)
            nodes = self.info.inlines.nodes_for(addrs, proc.start, proc.end)
            for (a, b, file, line), node in zip(pieces, nodes.tolist(), strict=True):
                root.add_stmt(self.info.inlines.chain(node), Stmt(a, b - a, file, line))

    @staticmethod
    def _exit_conditions(
        loop: Loop, blocks: list[Block], block_stmts: dict[int, list[tuple[InlinePath, Stmt]]]
    ) -> list[ExitCondition]:
        out = []
        for b in loop.blocks:
            block = blocks[b]
            if block.is_call:
                continue
            inside = any(s in loop.blocks for s in block.succs)
            outside = any(s not in loop.blocks for s in block.succs)
            if block.instructions[-1].flow == Flow.BRANCH:
                # A branch whose target leaves the function is an exit without a block.
                outside = outside or len(block.succs) < 2
            if inside and outside:
                path, stmt = block_stmts[b][-1]
                out.append(ExitCondition(stmt.vma, stmt.file, stmt.line, path))
        return out


def analyze_functions(
    analyzer: FunctionAnalyzer,
    procs: Iterable[Procedure],
    progress: Callable[[int], None] | None = None,
) -> list[Scope]:
    """Analyze procedures in order (the serial path; drivers may split the list over workers)."""
    out = []
    for proc in procs:
        out.append(analyzer.analyze(proc))
        if progress is not None:
            progress(1)
    return out


def assemble(
    lm_name: str, procs: Sequence[Procedure], scopes: Sequence[Scope], has_calls: bool = False
) -> StructureFile:
    """``LM > F > P`` with files sorted by name and procedures by address; ids in output order."""
    by_file: dict[str, list[tuple[int, Scope]]] = {}
    for proc, scope in zip(procs, scopes, strict=True):
        by_file.setdefault(proc.file, []).append((proc.start, scope))
    lm = Scope(
        LOAD_MODULE,
        {"i": "2", "n": lm_name, "has-calls": "1" if has_calls else "0", "v": "{}"},
    )
    for file in sorted(by_file):
        fscope = Scope(FILE, {"i": "0", "n": file})
        for _, scope in sorted(by_file[file], key=lambda item: item[0]):
            fscope.children.append(scope)
        lm.children.append(fscope)
    number_scopes(lm)
    return StructureFile(modules=[lm])


def number_scopes(lm: Scope, first: int = 3) -> None:
    """Assign ``i`` in document order (LM is 2, the next scope 3), as hpcstruct does."""
    counter = first
    for scope in lm.walk():
        if scope is lm:
            continue
        scope.attrs["i"] = str(counter)
        counter += 1


def analyze_host(
    image: ElfImage,
    lm_name: str | None = None,
    options: HostStructOptions | None = None,
    jobs: int = 1,
    progress: Callable[[int], None] | None = None,
    resolve_paths: bool = True,
    total: Callable[[int], None] | None = None,
    min_parallel: int = 64,
) -> StructureFile:
    """The whole structure of a host ELF image.

    ``total`` is told the number of procedures once known; ``progress`` then counts them done.
    """
    info = read_debug_info(image, resolve_paths)
    name = lm_name or os.path.abspath(image.path)
    if jobs > 1 and len(image.functions) >= min_parallel:
        # Symbol functions are decoded once, in the workers, which also report call targets;
        # the few procedures those targets add are analyzed afterwards (same result as serial).
        from pyhpctk.structure.parallel import map_functions

        procs = symbol_procedures(image, info)
        analyzer = FunctionAnalyzer(image, info, procs, options)
        if total is not None:
            total(len(procs))
        results = map_functions(analyzer, procs, jobs, progress)
        targets = set().union(*(calls for _, calls in results)) if results else set()
        extra = unclaimed_procedures(image, info, procs, targets)
        every = sorted(procs + extra, key=lambda p: p.start)
        analyzer = FunctionAnalyzer(image, info, every, options)
        scopes = [scope for scope, _ in results] + analyze_functions(analyzer, extra)
        ordered = sorted(zip(procs + extra, scopes, strict=True), key=lambda item: item[0].start)
        return assemble(name, [p for p, _ in ordered], [s for _, s in ordered])
    decoder = Decoder(image.machine)
    decoded: dict[int, list[Instruction]] = {}
    procs = skeleton(image, info, decoder, decoded)
    analyzer = FunctionAnalyzer(image, info, procs, options, decoded)
    if total is not None:
        total(len(procs))
    scopes = analyze_functions(analyzer, procs, progress)
    return assemble(name, procs, scopes)


def procedure_scope(proc: Procedure) -> Scope:
    """A procedure's ``P`` scope (names, line, entry address), without children."""
    attrs = {"i": "0", "n": proc.pretty_name}
    if proc.link_name != proc.pretty_name:
        attrs["ln"] = proc.link_name
    attrs["l"] = str(proc.line)
    attrs["v"] = format_ranges([(proc.start, proc.start + 1)])
    return Scope(PROCEDURE, attrs)
