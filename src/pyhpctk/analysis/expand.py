"""Calling context expansion: turn each unified frame into database contexts.

A frame ``(module, offset)`` becomes a chain of contexts below its caller's innermost context
(formats.md §3.7, §3.8, §4.3, §5):

* with a structure file covering the offset: ``-call> [function] P``, then for each enclosing
  loop ``-lexical> [loop]``, for each inlined call a ``-lexical> [line]`` at the call site and an
  ``-inlined> [function]`` for the callee, then ``-lexical> [line]`` of the statement and finally
  ``-lexical> [instruction]`` at the offset — which meta.db elides, though it keeps its values;
* with ELF symbols only (binaries copied into the measurement directory, e.g. the vDSO):
  ``-call> [function] symbol`` then the elided instruction;
* with nothing: ``-call> [instruction] module+offset``;
* Python logical frames (``<logical python>``): the function / line pair of formats.md §3.8;
* placeholders: entry points for the ``| Main`` / ``| Thread`` fences, the global context for
  ``^Primary`` and ``NoActvty``, pseudo-functions (``<gpu kernel>``...) for the others.

The first context of a frame's chain is its *call context*: relation metrics (``move2proc``) and
call-trace records land there. The last is its *leaf*: point values land there and callees hang
below it. Classifications are cached per (module, offset).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.context import (
    ContextBuilder,
    ContextKey,
    EntryPoint,
    FunctionKey,
    LexicalType,
    Relation,
)
from pyhpctk.analysis.python_loops import PythonLoops
from pyhpctk.analysis.structmap import Chain, StructureIndex
from pyhpctk.analysis.unify import RawTree
from pyhpctk.core.ids import ROOT
from pyhpctk.formats.hpcrun_constants import (
    MAIN_FENCE,
    NO_ACTIVITY,
    PARTIAL_ROOT,
    PLACEHOLDER_NAMES,
    PRIMARY_ROOT,
    THREAD_FENCE,
    UNNORMALIZED,
    placeholder_text,
)
from pyhpctk.formats.hpcstruct_model import ALIEN, CALL, FILE, LOOP, PROCEDURE, STATEMENT, Scope

Steps = tuple[ContextKey, ...]
Classifier = Callable[[int], Steps]

LOGICAL_PYTHON = "<logical python>"
UNKNOWN_FUNCTION = ContextKey(Relation.CALL, LexicalType.FUNCTION, function=None)
_CALL, _INSTRUCTION = Relation.CALL, LexicalType.INSTRUCTION


def raw_steps(module: str, offset: int) -> Steps:
    """No structure, no symbols: one ``-call> [instruction]`` context (formats.md §3.7)."""
    return (ContextKey(Relation.CALL, LexicalType.INSTRUCTION, module=module, offset=offset),)


def _instruction(module: str, offset: int) -> ContextKey:
    return ContextKey(Relation.LEXICAL, LexicalType.INSTRUCTION, module=module, offset=offset)


def _line(file: str | None, line: int) -> ContextKey:
    return ContextKey(Relation.LEXICAL, LexicalType.LINE, file=file or "", line=line)


def _entry(scope_ranges: list[tuple[int, int]]) -> int:
    return scope_ranges[0][0] if scope_ranges else 0


def struct_steps(module: str, chain: Chain, offset: int) -> Steps:
    """The contexts of an instruction from the chain of scopes enclosing it (formats.md §4.3)."""
    steps: list[ContextKey] = []
    file: str | None = None
    alien_roles: dict[int, str] = {}  # id(A) -> "site" | "callee" | "guard"
    previous: Scope | None = None
    for scope in chain:
        tag = scope.tag
        if tag == FILE:
            file = scope.name
        elif tag == PROCEDURE:
            function = FunctionKey(
                name=scope.name,
                module=module,
                offset=_entry(scope.ranges),
                file=file,
                line=scope.line,
                token=("P", module, id(scope)),
            )
            steps.append(ContextKey(Relation.CALL, LexicalType.FUNCTION, function=function))
        elif tag == LOOP:
            loop_file = scope.file if scope.file is not None else file
            steps.append(
                ContextKey(
                    Relation.LEXICAL,
                    LexicalType.LOOP,
                    file=loop_file or "",
                    line=scope.line,
                    module=module,
                    offset=_entry(scope.ranges),
                )
            )
        elif tag == ALIEN:
            parent_role = alien_roles.get(id(previous)) if previous is not None else None
            if parent_role == "site":
                alien_roles[id(scope)] = "callee"
                callee = FunctionKey(
                    name=scope.name,
                    module=module,
                    offset=0,
                    file=scope.file,
                    line=scope.line,
                    token=("A", module, id(scope)),
                )
                steps.append(ContextKey(Relation.INLINED, LexicalType.FUNCTION, function=callee))
                file = scope.file
            elif scope.name == "" and any(c.tag == ALIEN for c in scope.children):
                alien_roles[id(scope)] = "site"
                steps.append(_line(scope.file, scope.line))
            else:
                alien_roles[id(scope)] = "guard"  # formats.md §4.3: only switches the file
                file = scope.file if scope.file is not None else file
        elif tag in (STATEMENT, CALL):
            steps.append(_line(file, scope.line))
        previous = scope
    if not steps or steps[0].relation is not Relation.CALL:
        # An instruction outside every procedure: hpcprof keeps it as a bare call instruction.
        return raw_steps(module, offset)
    steps.append(_instruction(module, offset))
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class Symbol:
    """An ELF function symbol: ``[start, end)`` in the module, and its name."""

    start: int
    end: int
    name: str


SymbolTable = tuple[list[Symbol], npt.NDArray[np.uint64]]


def symbol_steps(
    module: str, symbols: list[Symbol], starts: npt.NDArray[np.uint64], offset: int
) -> Steps:
    """A frame named by ELF symbols: the function, then the elided instruction."""
    where = int(np.searchsorted(starts, np.uint64(offset), side="right")) - 1
    if where >= 0:
        symbol = symbols[where]
        if symbol.start <= offset < symbol.end:
            function = FunctionKey(name=symbol.name, module=module, offset=symbol.start)
            return (
                ContextKey(Relation.CALL, LexicalType.FUNCTION, function=function),
                _instruction(module, offset),
            )
    return raw_steps(module, offset)


@dataclass(frozen=True, slots=True)
class LogicalFunction:
    """One stanza of a logical metadata file (formats.md §1.10)."""

    name: str | None
    file: str | None
    line: int


def logical_steps(
    stanzas: Mapping[int, LogicalFunction],
    offset: int,
    python_loops: Mapping[str, PythonLoops] | None = None,
) -> Steps:
    """formats.md §3.8: a Python frame ``lm_ip = fid << 32 | line`` as function / line contexts.

    With the structure of the function's source file (``python_loops``, from pystruct), the line
    goes inside the loops that enclose it: function → loop … → line, as for compiled code.
    """
    fid, line = offset >> 32, offset & 0xFFFFFFFF
    stanza = stanzas.get(fid) if fid else None
    if stanza is None:
        return (ContextKey(Relation.CALL, LexicalType.FUNCTION, function=None),)
    if stanza.name is None:  # module-level code: a bare line
        return (ContextKey(Relation.CALL, LexicalType.LINE, file=stanza.file or "", line=line),)
    # A function is what it is, not its fid: each process writes its own logical file and numbers
    # its functions in the order it meets them, so the same function in a spawned worker or a
    # subprocess has another (module, fid) than in its parent. Keyed by name, file and first
    # line, it is one function and its frames one context in every process (issue #21), as
    # hpcprof unifies native frames by load module and address.
    function = FunctionKey(
        name=stanza.name,
        module=LOGICAL_PYTHON,
        offset=0,
        file=stanza.file,
        line=stanza.line,
        token=("logical", stanza.name, stanza.file, stanza.line),
    )
    call = ContextKey(Relation.CALL, LexicalType.FUNCTION, function=function)
    if stanza.file is None or line == 0:
        return (call,)
    structure = python_loops.get(stanza.file) if python_loops else None
    if structure is None:
        return (call, _line(stanza.file, line))
    loops = tuple(
        ContextKey(
            Relation.LEXICAL,
            LexicalType.LOOP,
            file=stanza.file,
            line=header,
            module=LOGICAL_PYTHON,
            offset=header,  # lines are a Python source's addresses (structure.python_source)
        )
        for header in structure.loops(stanza.name, stanza.line, line)
    )
    return (call, *loops, _line(stanza.file, line))


@dataclass(slots=True)
class ModuleClassifiers:
    """How to classify the frames of each load module path (structure, symbols, logical, raw)."""

    structures: dict[str, StructureIndex] = field(default_factory=dict)
    symbols: dict[str, tuple[list[Symbol], npt.NDArray[np.uint64]]] = field(default_factory=dict)
    #: For a module with a structure file, what names the offsets outside its procedures: its
    #: ELF symbols (:func:`.symbols.library_functions`), read at the first such offset.
    symbol_fallback: dict[str, Callable[[], SymbolTable | None]] = field(default_factory=dict)
    fallback_tables: dict[str, SymbolTable | None] = field(default_factory=dict)
    logical: dict[str, Mapping[int, LogicalFunction]] = field(default_factory=dict)
    python_loops: dict[str, PythonLoops] = field(default_factory=dict)  # by source path
    presented_path: dict[str, str] = field(default_factory=dict)
    call_graphs: dict[str, bool] = field(default_factory=dict)  # cache of :meth:`reconstructs`

    def reconstructs(self, module: str) -> bool:
        """Whether non-unwound samples of ``module`` wait for GPU reconstruction (:mod:`.gpu`).

        As for hpcprof, a structure has a call graph when its ``LM`` says ``has-calls="1"`` (a
        ``+gpucfg`` analysis, even of a binary without calls) or any ``C`` names a target.
        """
        found = self.call_graphs.get(module)
        if found is None:
            index = self.structures.get(module)
            found = index is not None and (
                index.has_calls or any(c.target is not None for c in index.call_sites)
            )
            self.call_graphs[module] = found
        return found

    def plain(self, module: str) -> str | None:
        """The name ``module``'s frames show when nothing classifies them (each frame one
        :func:`raw_steps` context), else None."""
        if module in self.logical or module in self.structures or module in self.symbols:
            return None
        return self.presented_path.get(module, module)

    def fallback_symbols(self, module: str) -> SymbolTable | None:
        """The ELF symbols of a module with a structure file, for the offsets its structure
        places in no procedure (read once, when first needed), if pyprof may read them."""
        if module not in self.fallback_tables:
            load = self.symbol_fallback.get(module)
            self.fallback_tables[module] = None if load is None else load()
        return self.fallback_tables[module]

    def steps(self, module: str, offset: int) -> Steps:
        shown = self.presented_path.get(module, module)
        if module in self.logical:
            return logical_steps(self.logical[module], offset, self.python_loops)
        index = self.structures.get(module)
        if index is not None:
            chain = index.lookup(offset)
            if chain is not None:
                return struct_steps(shown, chain, offset)
            fallback = self.fallback_symbols(module)
            if fallback is not None:  # the structure has no procedure there: never worse
                return symbol_steps(shown, fallback[0], fallback[1], offset)
            return raw_steps(shown, offset)
        table = self.symbols.get(module)
        if table is not None:
            return symbol_steps(shown, table[0], table[1], offset)
        return raw_steps(shown, offset)


_FENCES: dict[str, EntryPoint] = {
    MAIN_FENCE: EntryPoint.MAIN_THREAD,
    THREAD_FENCE: EntryPoint.APPLICATION_THREAD,
    PARTIAL_ROOT: EntryPoint.UNKNOWN_ENTRY,
}
_GLOBAL = (PRIMARY_ROOT, NO_ACTIVITY)
_RANGE_TREES = ("<gpu root>", "<gpu context>", "<gpu range>")


def _empty_int() -> npt.NDArray[np.int64]:
    return np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class Expansion:
    """Where every raw frame landed: its call context and its leaf context.

    A frame whose cost is shared among several contexts (GPU samples reached by several device
    call paths, :mod:`.gpu`) also has *splits*: rows (node, leaf, call context, fraction) that
    replace its single placement for values; ``leaf_ctx``/``call_ctx`` then hold its first path.
    """

    tree: ContextBuilder
    call_ctx: npt.NDArray[np.int64]
    leaf_ctx: npt.NDArray[np.int64]
    split_node: npt.NDArray[np.int64] = field(default_factory=_empty_int)
    split_leaf: npt.NDArray[np.int64] = field(default_factory=_empty_int)
    split_call: npt.NDArray[np.int64] = field(default_factory=_empty_int)
    split_fraction: npt.NDArray[np.float64] = field(
        default_factory=lambda: np.zeros(0, dtype=np.float64)
    )

    def add_splits(
        self,
        node: npt.NDArray[np.int64],
        leaf: npt.NDArray[np.int64],
        call: npt.NDArray[np.int64],
        fraction: npt.NDArray[np.float64],
    ) -> None:
        """Record shared placements, keeping the table sorted by node."""
        nodes = np.concatenate([self.split_node, node])
        order = np.argsort(nodes, kind="stable")
        self.split_node = nodes[order]
        self.split_leaf = np.concatenate([self.split_leaf, leaf])[order]
        self.split_call = np.concatenate([self.split_call, call])[order]
        self.split_fraction = np.concatenate([self.split_fraction, fraction])[order]

    def place(
        self,
        node: npt.NDArray[np.int64],
        metric_moves: npt.NDArray[np.bool_],
        value: npt.NDArray[np.float64],
    ) -> tuple[npt.NDArray[np.int64] | None, npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Contexts of value rows (call context for relation metrics, else leaf), splits applied.

        Returns (row index into the inputs, context, value) — split rows appear once per share;
        the row index is None when every row appears once, in order.
        """
        if not metric_moves.any():
            ctx = self.leaf_ctx[node]
        elif metric_moves.all():
            ctx = self.call_ctx[node]
        else:
            ctx = np.where(metric_moves, self.call_ctx[node], self.leaf_ctx[node])
        if not len(self.split_node) or not len(node):
            return None, ctx, value
        first = np.searchsorted(self.split_node, node, side="left")
        last = np.searchsorted(self.split_node, node, side="right")
        count = last - first
        shared = count > 0
        if not np.any(shared):
            return None, ctx, value
        rows = np.arange(len(node), dtype=np.int64)
        keep = ~shared
        rep = count[shared]
        src = np.repeat(rows[shared], rep)
        offsets = np.arange(int(rep.sum())) - np.repeat(np.cumsum(rep) - rep, rep)
        split_row = np.repeat(first[shared], rep) + offsets
        split_ctx = np.where(
            metric_moves[src], self.split_call[split_row], self.split_leaf[split_row]
        )
        split_value = value[src] * self.split_fraction[split_row]
        return (
            np.concatenate([rows[keep], src]),
            np.concatenate([ctx[keep], split_ctx]),
            np.concatenate([value[keep], split_value]),
        )


def _entry_key(kind: EntryPoint) -> ContextKey:
    return ContextKey(Relation.CALL, LexicalType.FUNCTION, entry_point=kind)


def expand(
    raw: RawTree,
    classifiers: ModuleClassifiers,
    tree: ContextBuilder | None = None,
    start: int = 0,
    previous: Expansion | None = None,
) -> Expansion:
    """Expand raw frames ``start..`` (parents first) into ``tree``.

    Frames before ``start`` keep their placement from ``previous`` (incremental expansion when
    more profiles are unified later).
    """
    tree = tree if tree is not None else ContextBuilder()
    n = len(raw)
    # Python lists and bound methods in the loop: it runs once per frame, on rank 0 alone while
    # the other ranks wait for its result (numpy scalars would cost more than the work).
    call_ctx = [0] * n
    leaf_ctx = [0] * n
    if previous is not None and start:
        call_ctx[:start] = previous.call_ctx[:start].tolist()
        leaf_ctx[:start] = previous.leaf_ctx[:start].tolist()
    cache: dict[tuple[str, int], tuple[int, ...]] = {}
    plain: dict[str, str | None] = {}  # per module: ModuleClassifiers.plain
    intern, child_interned = tree.intern, tree.child_interned
    steps, reconstructs = classifiers.steps, classifiers.reconstructs
    unknown = intern(UNKNOWN_FUNCTION)
    parents, keys = raw.parent, raw.keys
    for ident in range(start, n):
        parent = parents[ident]
        module, offset, _unwound = keys[ident]
        anchor: int = ROOT if parent < 0 else leaf_ctx[parent]
        if module is None:
            code = placeholder_text(offset)
            if code in _GLOBAL:
                call_ctx[ident] = leaf_ctx[ident] = ROOT
                continue
            if code in _FENCES:
                call_ctx[ident] = leaf_ctx[ident] = tree.child(ROOT, _entry_key(_FENCES[code]))
                continue
            if anchor == ROOT:
                anchor = tree.child(ROOT, _entry_key(EntryPoint.UNKNOWN_ENTRY))
            if code == UNNORMALIZED:
                key = ContextKey(Relation.CALL, LexicalType.FUNCTION, function=None)
            else:
                name = PLACEHOLDER_NAMES.get(code, f"<{code.strip()}>")
                key = ContextKey(
                    Relation.CALL,
                    LexicalType.FUNCTION,
                    function=FunctionKey(name=name, token=("placeholder", code)),
                )
            call_ctx[ident] = leaf_ctx[ident] = tree.child(anchor, key)
            continue
        if module in _RANGE_TREES:
            # formats.md §1.5, GPU range trees: the root maps to the global context, contexts and
            # ranges to pseudo-functions named after their ids (hpcprof's handling is unknown).
            if module == "<gpu root>":
                call_ctx[ident] = leaf_ctx[ident] = ROOT
                continue
            if anchor == ROOT:
                anchor = tree.child(ROOT, _entry_key(EntryPoint.UNKNOWN_ENTRY))
            name = f"{module[:-1]} {offset}>"
            function = FunctionKey(name=name, token=("range", module, offset))
            key = ContextKey(Relation.CALL, LexicalType.FUNCTION, function=function)
            call_ctx[ident] = leaf_ctx[ident] = tree.child(anchor, key)
            continue
        if anchor == ROOT:
            anchor = tree.child(ROOT, _entry_key(EntryPoint.UNKNOWN_ENTRY))
        if not _unwound and reconstructs(module):
            call_ctx[ident] = leaf_ctx[ident] = anchor  # placed by gpu.reconstruct_gpu_contexts
            continue
        key_ids = cache.get((module, offset))
        if key_ids is None:
            if module in plain:
                shown = plain[module]
            else:
                shown = plain[module] = classifiers.plain(module)
            if shown is not None:  # raw_steps, without the classifiers' lookups
                key_ids = (intern(ContextKey(_CALL, _INSTRUCTION, module=shown, offset=offset)),)
            else:
                key_ids = tuple([intern(key) for key in steps(module, offset)])
            cache[(module, offset)] = key_ids
        if not _unwound:
            # A non-unwound GPU PC sample with no call graph to rebuild its calling context:
            # hpcprof files it under an unknown function below the kernel placeholder, then at its
            # function and line if a structure (one without --gpucfg) knows them, else as the
            # bare instruction (loops-cuda-nvidiapc-t.nostruct.d); the call context is the one
            # below the unknown function.
            anchor = child_interned(anchor, unknown)
        ctx = child_interned(anchor, key_ids[0])
        call_ctx[ident] = ctx
        for key_id in key_ids[1:]:
            ctx = child_interned(ctx, key_id)
        leaf_ctx[ident] = ctx
    return Expansion(tree, np.asarray(call_ctx, np.int64), np.asarray(leaf_ctx, np.int64))
