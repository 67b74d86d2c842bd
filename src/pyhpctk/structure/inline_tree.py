"""The per-procedure inline tree and its translation into hpcstruct scopes (formats.md §4.3).

Statements (one per instruction, with file and line) are hung under the chain of inlined calls
that holds their address; loops are placed in that tree at the inline depth where their exit
conditions live and get a header file and line from those exit conditions. The rules are those of
hpcstruct (``Struct.cpp: findLoopHeader``, ``Struct-Inline.cpp``, ``Struct-Output.cpp:
doTreeNode``), because the point is to produce the same scopes HPCToolkit does:

* an inlined call is a pair of ``A`` scopes (call site, then callee);
* statements and loops whose file differs from the enclosing scope's, or whose line is earlier
  than the scope's line, go inside a guard alien ``A n="<inline>"``;
* non-call statements with the same line in one scope merge into one ``S`` with a range set.

Nothing here reads binaries; :mod:`pyhpctk.structure.host` and :mod:`pyhpctk.structure.cubin`
feed it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from pyhpctk.formats.hpcstruct_model import (
    ALIEN,
    CALL,
    LOOP,
    STATEMENT,
    Scope,
    format_ranges,
)
from pyhpctk.structure.dwarf import InlineNode

GUARD_NAME = "<inline>"


def basename(path: str) -> str:
    return os.path.basename(path) if path else ""


@dataclass(slots=True)
class Stmt:
    """One instruction's statement: address range, file and line, maybe a call site."""

    vma: int
    length: int
    file: str
    line: int
    is_call: bool = False
    is_sink: bool = False
    target: int = 0
    device: str = ""

    @property
    def base(self) -> str:
        return basename(self.file)


@dataclass(slots=True)
class TreeNode:
    """A level of the inline tree: statements, loops and inlined-call subtrees."""

    stmts: dict[int, Stmt] = field(default_factory=dict)
    nodes: dict[InlineNode, TreeNode] = field(default_factory=dict)
    loops: list[LoopInfo] = field(default_factory=list)

    def add_stmt(self, path: tuple[InlineNode, ...], stmt: Stmt) -> None:
        """Insert ``stmt`` below the inline ``path`` (creating levels as needed)."""
        node = self
        for flp in path:
            child = node.nodes.get(flp)
            if child is None:
                child = TreeNode()
                node.nodes[flp] = child
            node = child
        node.stmts.setdefault(stmt.vma, stmt)

    def merge(self, other: TreeNode) -> None:
        """mergeInlineTree: fold ``other`` into this node."""
        if other is self:
            return
        for vma, stmt in other.stmts.items():
            self.stmts.setdefault(vma, stmt)
        self.loops.extend(other.loops)
        for flp, sub in other.nodes.items():
            mine = self.nodes.get(flp)
            if mine is None:
                self.nodes[flp] = sub
            else:
                mine.merge(sub)

    def merge_loop(self, info: LoopInfo, path: tuple[InlineNode, ...] = ()) -> None:
        """mergeInlineLoop: hang a detached loop at its inline path (minus a common prefix)."""
        k = 0
        while k < len(path) and k < len(info.path) and path[k] == info.path[k]:
            k += 1
        node = self
        for flp in info.path[k:]:
            child = node.nodes.get(flp)
            if child is None:
                child = TreeNode()
                node.nodes[flp] = child
            node = child
        node.loops.append(info)


@dataclass(slots=True)
class LoopInfo:
    """A detached loop: its subtree, inline path above it, entry address and header line."""

    node: TreeNode
    path: tuple[InlineNode, ...]
    entry_vma: int
    file: str
    line: int
    irreducible: bool

    @property
    def base(self) -> str:
        return basename(self.file)


@dataclass(frozen=True, slots=True)
class ExitCondition:
    """A loop exit condition (branch with edges in and out of the loop), as findLoopHeader uses."""

    vma: int
    file: str
    line: int
    path: tuple[InlineNode, ...]

    @property
    def base(self) -> str:
        return basename(self.file)


def find_loop_header(
    root: TreeNode,
    conditions: list[ExitCondition],
    proc_file: str,
    entry_vma: int,
    irreducible: bool,
) -> LoopInfo:
    """Port of hpcstruct's ``findLoopHeader``: choose inline depth, file and line of a loop."""
    clist = sorted(conditions, key=lambda c: c.vma)
    path: list[InlineNode] = []
    moved: dict[int, Stmt] = {}
    depth_root = 0

    # Step 2: descend single inline chains while no exit condition pins the loop here.
    while len(root.nodes) == 1 and not root.loops:
        flp = next(iter(root.nodes))
        found = False
        for cond in clist:
            if cond.vma in root.stmts:
                found = True
                break
            stmt = moved.get(cond.vma)
            if stmt is not None and stmt.base == basename(flp.file):
                found = True
                break
        if found:
            break
        moved.update(root.stmts)
        root.stmts = {}
        subtree = root.nodes[flp]
        root.nodes = {}
        root = subtree
        path.append(flp)
        depth_root += 1

    # Step 3: reattach the statements collected on the way down.
    for vma, stmt in moved.items():
        root.stmts.setdefault(vma, stmt)

    # Step 4: the header file, then the line.
    proc_base = basename(proc_file)
    file_ans = ""
    line_ans = 0
    chosen = False
    if depth_root == 0:
        for cond in clist:
            if len(cond.path) == depth_root and cond.base and cond.base == proc_base:
                file_ans, chosen = proc_file, True
                break
    if not chosen:
        for flp in root.nodes:
            for cond in clist:
                if len(cond.path) == depth_root and cond.base and cond.base == basename(flp.file):
                    file_ans, chosen = flp.file, True
                    break
            if chosen:
                break
    if not chosen:
        for cond in clist:
            if len(cond.path) == depth_root and cond.base:
                file_ans, chosen = cond.file, True
                break
    if not chosen and depth_root == 0 and proc_file:
        file_ans, chosen = proc_file, True
    if not chosen:
        for flp in root.nodes:
            if flp.file:
                file_ans, chosen = flp.file, True
                break
    if not chosen:
        for loop in root.loops:
            if loop.file:
                file_ans, chosen = loop.file, True
                break
    if not chosen:
        for vma in sorted(root.stmts):
            stmt = root.stmts[vma]
            if stmt.file:
                file_ans, line_ans, chosen = stmt.file, stmt.line, True
                break

    if file_ans:
        base_ans = basename(file_ans)
        # The lowest line among exit conditions at this depth, exit conditions inlined
        # deeper whose next call step is in this file, and subloops (never below a subloop).
        candidates = [
            cond.line
            for cond in clist
            if len(cond.path) == depth_root and cond.base == base_ans and cond.line > 0
        ]
        candidates += [
            cond.path[depth_root].line
            for cond in clist
            if len(cond.path) > depth_root
            and basename(cond.path[depth_root].file) == base_ans
            and cond.path[depth_root].line > 0
        ]
        candidates += [loop.line for loop in root.loops if loop.base == base_ans and loop.line > 0]
        if candidates:
            lowest = min(candidates)
            line_ans = lowest if line_ans == 0 else min(line_ans, lowest)
    else:
        line_ans = 0

    info = LoopInfo(root, tuple(path), entry_vma, file_ans, line_ans, irreducible)
    _merge_irreducible(info)
    return info


def _merge_irreducible(outer: LoopInfo) -> None:
    """mergeIrredLoops: an irreducible subloop at the same file and line joins its parent."""
    if not outer.irreducible or not any(sub.irreducible for sub in outer.node.loops):
        return
    kept: list[LoopInfo] = []
    for sub in outer.node.loops:
        if sub.irreducible and sub.base == outer.base and sub.line == outer.line:
            kept.extend(sub.node.loops)
            sub.node.loops = []
            outer.node.merge(sub.node)
        else:
            kept.append(sub)
    kept.sort(key=lambda loop: loop.entry_vma)
    outer.node.loops = kept


# --------------------------------------------------------------------------- output


@dataclass(slots=True)
class _ScopeInfo:
    file: str
    line: int

    @property
    def base(self) -> str:
        return basename(self.file)


def _merge_intervals(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    ranges.sort()
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _stmt_scopes(stmts: list[Stmt], call_tags: bool) -> list[Scope]:
    """doStmtList: one ``S`` per line (merged ranges), then one ``C`` per call."""
    by_line: dict[int, list[tuple[int, int]]] = {}
    calls: list[Stmt] = []
    for stmt in stmts:
        if stmt.is_call and call_tags:
            calls.append(stmt)
        else:
            by_line.setdefault(stmt.line, []).append((stmt.vma, stmt.vma + stmt.length))
    out: list[Scope] = []
    for line in sorted(by_line):
        out.append(
            Scope(
                STATEMENT,
                {"i": "0", "l": str(line), "v": format_ranges(_merge_intervals(by_line[line]))},
            )
        )
    calls.sort(key=lambda s: (s.line, s.vma))
    for stmt in calls:
        attrs = {
            "i": "0",
            "l": str(stmt.line),
            "v": format_ranges([(stmt.vma, stmt.vma + stmt.length)]),
        }
        if not stmt.is_sink:
            attrs["t"] = f"{stmt.target:#x}"
        attrs["d"] = stmt.device
        out.append(Scope(CALL, attrs))
    return out


def _locate(node: TreeNode, scope: _ScopeInfo, use_file: bool) -> _ScopeInfo:
    """locateTree: guess the file and line of a subtree (for alien scopes)."""
    file = scope.file
    if not use_file:
        file = ""
        found = False
        for flp in node.nodes:
            if flp.file:
                file, found = flp.file, True
                break
        if not found:
            for loop in node.loops:
                if loop.file:
                    file, found = loop.file, True
                    break
        if not found:
            for vma in sorted(node.stmts):
                if node.stmts[vma].file:
                    file = node.stmts[vma].file
                    break
    base = basename(file)
    best = 0
    for flp in node.nodes:
        if basename(flp.file) == base and flp.line > 0 and (best == 0 or flp.line < best):
            best = flp.line
    for loop in node.loops:
        if loop.base == base and loop.line > 0 and (best == 0 or loop.line < best):
            best = loop.line
    if best == 0:
        for stmt in node.stmts.values():
            if stmt.base == base and stmt.line > 0 and (best == 0 or stmt.line < best):
                best = stmt.line
    return _ScopeInfo(file, best)


def tree_scopes(root: TreeNode, scope_file: str, scope_line: int, call_tags: bool) -> list[Scope]:
    """doTreeNode: the hpcstruct scopes for one level of the tree, inside a file/line scope."""
    scope = _ScopeInfo(scope_file, scope_line)
    local_stmts: list[Stmt] = []
    local_loops: list[LoopInfo] = []
    alien_order: list[str] = []
    alien_stmts: dict[str, list[Stmt]] = {}
    alien_loops: dict[str, list[LoopInfo]] = {}
    alien_file: dict[str, str] = {}

    def needs_guard(base: str, line: int) -> bool:
        return line > 0 and (base != scope.base or line < scope.line)

    for vma in sorted(root.stmts):
        stmt = root.stmts[vma]
        if needs_guard(stmt.base, stmt.line):
            if stmt.base not in alien_file:
                alien_order.append(stmt.base)
                alien_file[stmt.base] = stmt.file
            alien_stmts.setdefault(stmt.base, []).append(stmt)
        else:
            local_stmts.append(stmt)
    for loop in root.loops:
        if needs_guard(loop.base, loop.line):
            if loop.base not in alien_file:
                alien_order.append(loop.base)
                alien_file[loop.base] = loop.file
            alien_loops.setdefault(loop.base, []).append(loop)
        else:
            local_loops.append(loop)

    out = _stmt_scopes(local_stmts, call_tags)
    for base in alien_order:
        file = alien_file[base]
        guard_node = TreeNode(
            {s.vma: s for s in alien_stmts.get(base, [])}, {}, list(alien_loops.get(base, []))
        )
        where = _locate(guard_node, _ScopeInfo(file, 0), use_file=True)
        guard = Scope(
            ALIEN,
            {"i": "0", "l": str(where.line), "f": file, "n": GUARD_NAME, "v": "{}"},
        )
        guard.children.extend(_stmt_scopes(alien_stmts.get(base, []), call_tags))
        guard.children.extend(_loop_scopes(alien_loops.get(base, []), call_tags))
        out.append(guard)
    out.extend(_loop_scopes(local_loops, call_tags))
    for flp, subtree in root.nodes.items():
        where = _locate(subtree, _ScopeInfo("", 0), use_file=False)
        outer = Scope(ALIEN, {"i": "0", "l": str(flp.line), "f": flp.file, "n": "", "v": "{}"})
        inner = Scope(
            ALIEN, {"i": "0", "l": str(where.line), "f": where.file, "n": flp.name, "v": "{}"}
        )
        inner.children.extend(tree_scopes(subtree, where.file, where.line, call_tags))
        outer.children.append(inner)
        out.append(outer)
    return out


def _loop_scopes(loops: list[LoopInfo], call_tags: bool) -> list[Scope]:
    out = []
    for loop in loops:
        scope = Scope(
            LOOP,
            {
                "i": "0",
                "l": str(loop.line),
                "f": loop.file,
                "v": format_ranges([(loop.entry_vma, loop.entry_vma + 1)]),
            },
        )
        scope.children.extend(tree_scopes(loop.node, loop.file, 0, call_tags))
        out.append(scope)
    return out
