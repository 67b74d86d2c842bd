"""The structure of a PTX module: kernels, inlined functions, loops and source lines (issue #34).

pyrun saves the PTX of every kernel it counts as ``ptxbins/<md5>.ptx`` and names the counts by
(that file, address), the addresses of :mod:`pyhpctk.instrument.ptx.layout`. This module gives
pyprof the hpcstruct scopes of those addresses, as hpcstruct gives a binary's: one ``P`` per
kernel (its entry: the first instruction's address), ``A`` pairs for code inlined from other
functions (``.loc ... inlined_at``), ``L`` for the natural loops of the PTX control-flow graph
(headers placed by hpcstruct's rules, :func:`~.inline_tree.find_loop_header`), ``S`` lines.
Device functions (``.func``) are described too, though counts never name them. Kernels
without ``.loc`` get the PTX file's own lines: an instruction's line is its line in the saved
PTX. Nothing here runs ptxas or a GPU.
"""

from __future__ import annotations

from pathlib import Path

from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcstruct_model import PROCEDURE, Scope, StructureFile, format_ranges
from pyhpctk.instrument.ptx import PtxError, build, find_loops, parse
from pyhpctk.instrument.ptx.cfg import Cfg
from pyhpctk.instrument.ptx.layout import KernelLayout, layout
from pyhpctk.instrument.ptx.lines import Location
from pyhpctk.instrument.ptx.loops import Loops, PtxLoop
from pyhpctk.instrument.ptx.parse import PtxFunction
from pyhpctk.structure.dwarf import InlineNode, demangle_many
from pyhpctk.structure.host import Procedure, assemble
from pyhpctk.structure.inline_tree import (
    ExitCondition,
    LoopInfo,
    Stmt,
    TreeNode,
    find_loop_header,
    tree_scopes,
)

SUFFIX = ".ptx"


def _path(location: Location | None) -> tuple[InlineNode, ...]:
    """The inline path of a location, outermost call first (Location lists innermost first)."""
    if location is None:
        return ()
    return tuple(InlineNode(f.file, f.line, f.function) for f in reversed(location.inlined))


class _Kernel:
    """One function's statements, placed: what the tree and the loops are built from."""

    def __init__(self, cfg: Cfg, placed: KernelLayout, ptx_file: str) -> None:
        self.cfg = cfg
        self.layout = placed
        located = [s.location for b in placed.blocks for s in b if s.location is not None]
        self.plain = not located  # no .loc at all: the PTX's own lines
        outermost = [loc.inlined[-1] if loc.inlined else loc for loc in located]
        self.file = ptx_file if self.plain else outermost[0].file
        lines = [o.line for o in outermost if o.file == self.file and o.line > 0]
        self.line = cfg.function.line if self.plain else min(lines, default=0)
        self.stmts: list[list[tuple[tuple[InlineNode, ...], Stmt]]] = []
        body = cfg.function.body
        addresses = placed.statements
        for block, segments in zip(cfg.blocks, placed.blocks, strict=True):
            items: list[tuple[tuple[InlineNode, ...], Stmt]] = []
            instructions = iter(block.instructions)
            for segment in segments:
                location = segment.location
                if segment.instructions == 0:  # an empty block: one statement at its label
                    items.append(((), self._stmt(segment.address, None, body[block.last].line)))
                for _ in range(segment.instructions):
                    i = next(instructions)
                    stmt = self._stmt(addresses[i], location, body[i].line)
                    items.append((_path(location), stmt))
            self.stmts.append(items)

    def _stmt(self, address: int, location: Location | None, ptx_line: int) -> Stmt:
        if self.plain:
            return Stmt(address, 1, self.file, ptx_line)
        if location is None:
            return Stmt(address, 1, self.file, 0)
        return Stmt(address, 1, location.file, location.line)

    def exit_conditions(self, loop: PtxLoop) -> list[ExitCondition]:
        """The branches of ``loop`` with one successor inside and one outside it."""
        out = []
        for b in loop.blocks:
            successors = self.cfg.successors[b]
            if any(s in loop.blocks for s in successors) and any(
                s not in loop.blocks for s in successors
            ):
                path, stmt = self.stmts[b][-1]
                out.append(ExitCondition(stmt.vma, stmt.file, stmt.line, path))
        return out

    def tree(self, loops: Loops) -> TreeNode:
        """The inline tree of the function with its loops detached (host.py's ``_tree``)."""
        visited: set[int] = set()
        children: dict[int | None, list[int]] = {}
        for index, loop in enumerate(loops.loops):
            children.setdefault(loop.parent, []).append(index)

        def first(index: int) -> int:
            return self.cfg.blocks[loops.loops[index].header].first

        def do_block(b: int, node: TreeNode) -> None:
            if b not in visited:
                visited.add(b)
                for path, stmt in self.stmts[b]:
                    node.add_stmt(path, stmt)

        def do_loop(index: int) -> LoopInfo:
            loop = loops.loops[index]
            infos = [do_loop(c) for c in sorted(children.get(index, []), key=first)]
            raw = TreeNode()
            for b in sorted(loop.blocks, key=lambda i: self.cfg.blocks[i].first):
                do_block(b, raw)
            for info in infos:
                raw.merge_loop(info)
            entry = self.layout.head(loop.header)
            return find_loop_header(raw, self.exit_conditions(loop), self.file, entry, False)

        root = TreeNode()
        infos = [do_loop(index) for index in sorted(children.get(None, []), key=first)]
        for b in range(len(self.cfg.blocks)):
            do_block(b, root)
        for info in infos:
            root.merge_loop(info)
        return root


def _scope(kernel: _Kernel, name: str, pretty: str) -> Scope:
    attrs = {"i": "0", "n": pretty}
    if pretty != name:
        attrs["ln"] = name
    entry = kernel.layout.entry
    attrs["l"] = str(kernel.line)
    attrs["v"] = format_ranges([(entry, entry + 1)])
    scope = Scope(PROCEDURE, attrs)
    root = kernel.tree(find_loops(kernel.cfg))
    scope.children.extend(tree_scopes(root, kernel.file, kernel.line, call_tags=False))
    return scope


def analyze_ptx_text(text: str, lm_name: str) -> StructureFile:
    """The structure of PTX ``text``, describing the load module ``lm_name`` (module doc)."""
    module = parse(text)
    functions: list[PtxFunction] = list(module.functions)
    pretty = demangle_many(f.name for f in functions)
    procs: list[Procedure] = []
    scopes: list[Scope] = []
    for function, shown in zip(functions, pretty, strict=True):
        cfg = build(function)
        kernel = _Kernel(cfg, layout(module, cfg), lm_name)
        entry = kernel.layout.entry
        procs.append(Procedure(entry, entry + 1, function.name, shown, kernel.file, kernel.line))
        scopes.append(_scope(kernel, function.name, shown))
    return assemble(lm_name, procs, scopes, has_calls=False)


def analyze_ptx(path: Path, lm_name: str | None = None) -> StructureFile:
    """The structure of the PTX file ``path``; a bad file raises :class:`FormatError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise FormatError(path, "PTX", str(error)) from None
    try:
        return analyze_ptx_text(text, lm_name or str(path))
    except PtxError as error:
        raise FormatError(path, "PTX", str(error)) from None
