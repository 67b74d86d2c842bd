"""GPU calling context reconstruction for PC-sampled kernels, as hpcprof does it.

PC samples of a GPU kernel arrive flat: non-unwound ``gpubin@pc`` frames directly below the
``<gpu kernel>`` placeholder (formats.md §1.5), with no record of the device call chain that led
to each instruction. When the kernel's binary has a ``+gpucfg`` structure file (``LM
has-calls="1"`` and ``C`` call-site elements with targets, formats.md §4.4), each sample is placed
once on every call path that reaches its function, with a share of its values
(:mod:`.device_calls`: cycles removed as hpcprof removes them, paths from every function nobody
calls, shares weighted by the ``GINS`` samples at the call instructions). Contexts are made for
every path, a share of 0 included, and for every path's entry function below the placeholder, as
hpcprof makes them. Entries *launched* under a placeholder are the functions of the unwound
frames beside its samples (the kernel's own frame); a sample no launched entry reaches keeps its
contexts but no values, and is reported.

A binary whose call graph names a callee that is no function's entry is corrupt for hpcprof:
its samples go below an unknown function, each at its own function and line.

The result is expressed as *splits* of raw frames (node, leaf context, call context, fraction).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.context import ContextBuilder, ContextKey
from pyhpctk.analysis.device_calls import (
    CallGraph,
    CallPath,
    Edge,
    acyclic_callers,
    call_paths,
    shares,
)
from pyhpctk.analysis.expand import (
    UNKNOWN_FUNCTION,
    Expansion,
    ModuleClassifiers,
    Steps,
    raw_steps,
    struct_steps,
)
from pyhpctk.analysis.structmap import StructureIndex
from pyhpctk.analysis.unify import ProfileData, RawTree
from pyhpctk.formats.hpcstruct_model import PROCEDURE

WEIGHT_METRIC = "GINS"


def call_graph(index: StructureIndex) -> CallGraph:
    """The device call graph of a ``+gpucfg`` structure: procedures and call sites, file order."""
    return CallGraph(
        list(index.procedures),
        [
            Edge(c.caller_entry, c.target, c.address)
            for c in index.call_sites
            if c.target is not None
        ],
    )


def _function_entry(index: StructureIndex, pc: int) -> int | None:
    chain = index.lookup(pc)
    if chain is None:
        return None
    for scope in chain:
        if scope.tag == PROCEDURE and scope.ranges:
            return scope.ranges[0][0]
    return None


def node_weights(raw: RawTree, profiles: list[tuple[int, ProfileData]]) -> npt.NDArray[np.float64]:
    """The ``GINS`` samples of ``profiles`` per raw node (what :func:`.device_calls.shares` weighs
    call sites by)."""
    total = np.zeros(len(raw), dtype=np.float64)
    for _, data in profiles:
        names = [m.name for m in data.metrics]
        if WEIGHT_METRIC not in names:
            continue
        metric = names.index(WEIGHT_METRIC)
        keep = data.value_metric == metric
        total += np.bincount(data.value_node[keep], weights=data.value[keep], minlength=len(raw))
    return total


@dataclass(slots=True)
class _Splits:
    """Rows (raw node, leaf context, call context, fraction) for :meth:`.Expansion.add_splits`."""

    node: list[int] = field(default_factory=list)
    leaf: list[int] = field(default_factory=list)
    call: list[int] = field(default_factory=list)
    fraction: list[float] = field(default_factory=list)

    def add(self, node: int, leaf: int, call: int, fraction: float) -> None:
        self.node.append(node)
        self.leaf.append(leaf)
        self.call.append(call)
        self.fraction.append(fraction)

    def into(self, expansion: Expansion) -> None:
        expansion.add_splits(
            np.asarray(self.node, dtype=np.int64),
            np.asarray(self.leaf, dtype=np.int64),
            np.asarray(self.call, dtype=np.int64),
            np.asarray(self.fraction, dtype=np.float64),
        )


@dataclass(slots=True)
class _Binary:
    """What reconstruction needs of one GPU binary, computed once."""

    index: StructureIndex
    shown: str
    callers: dict[int, list[Edge]] | None  # None: a corrupt call graph
    paths: dict[int, list[tuple[int, CallPath]]] = field(default_factory=dict)
    dropped: list[tuple[int, float]] = field(default_factory=list)  # (function, GINS)

    def paths_to(self, function: int) -> list[tuple[int, CallPath]]:
        found = self.paths.get(function)
        if found is None:
            assert self.callers is not None
            found = self.paths[function] = call_paths(self.callers, function)
        return found

    def name(self, function: int) -> str:
        chain = self.index.procedure_at(function)
        return chain[-1].name if chain else f"{function:#x}"


def reconstruct_gpu_contexts(
    raw: RawTree,
    expansion: Expansion,
    classifiers: ModuleClassifiers,
    profiles: list[tuple[int, ProfileData]],
    weights: npt.NDArray[np.float64] | None = None,
    problems: list[str] | None = None,
) -> Expansion:
    """Re-attach non-unwound GPU samples along reconstructed device call paths (see module doc).

    ``weights`` (the ``GINS`` sample count per raw node, summed over every profile) may be given
    instead of computing them from ``profiles``: pyprof-mpi sums them over its ranks. Samples
    that reach no launched kernel are reported in ``problems``.
    """
    if not any(classifiers.reconstructs(module) for module in classifiers.structures):
        return expansion
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)  # (placeholder, binary)
    launched: dict[tuple[int, str], set[int]] = defaultdict(set)  # unwound pcs beside samples
    for ident, (module, offset, unwound) in enumerate(raw.keys):
        if module is None or raw.parent[ident] < 0 or not classifiers.reconstructs(module):
            continue
        if unwound:
            launched[(raw.parent[ident], module)].add(offset)
        else:
            groups[(raw.parent[ident], module)].append(ident)
    if not groups:
        return expansion
    if weights is None:
        weights = node_weights(raw, profiles)
    binaries: dict[str, _Binary] = {}
    splits = _Splits()
    for (parent, module), members in groups.items():
        binary = binaries.get(module)
        if binary is None:
            index = classifiers.structures[module]
            graph = call_graph(index)
            shown = classifiers.presented_path.get(module, module)
            callers = acyclic_callers(graph) if graph.valid else None
            binary = binaries[module] = _Binary(index, shown, callers)
        anchor = int(expansion.leaf_ctx[parent])
        if binary.callers is None:
            for m in members:
                leaf, call = _instantiate(expansion.tree, anchor, binary, (), raw.keys[m][1], True)
                expansion.leaf_ctx[m], expansion.call_ctx[m] = leaf, call
            continue
        entries = {
            f
            for f in (_function_entry(binary.index, pc) for pc in launched[(parent, module)])
            if f is not None
        }
        site_samples: dict[int, float] = defaultdict(float)
        for m in members:
            site_samples[raw.keys[m][1]] += float(weights[m])
        _place_group(
            expansion, raw, members, anchor, binary, entries, site_samples, weights, splits
        )
    splits.into(expansion)
    if problems is not None:
        for binary in binaries.values():
            if binary.dropped:
                problems.append(_dropped_message(binary))
    return expansion


def _place_group(
    expansion: Expansion,
    raw: RawTree,
    members: list[int],
    anchor: int,
    binary: _Binary,
    entries: set[int],
    site_samples: dict[int, float],
    weights: npt.NDArray[np.float64],
    splits: _Splits,
) -> None:
    """The samples of one placeholder: contexts on every call path, values by the shares."""
    tree = expansion.tree
    factors: dict[int, list[float]] = {}
    for m in members:
        pc = raw.keys[m][1]
        function = _function_entry(binary.index, pc)
        if function is None:  # outside every function: an unknown function, the instruction
            leaf, call = _instantiate(tree, anchor, binary, (), pc)
            expansion.leaf_ctx[m], expansion.call_ctx[m] = leaf, call
            continue
        paths = binary.paths_to(function)
        fractions = factors.get(function)
        if fractions is None:
            fractions = factors[function] = shares(paths, entries, site_samples)
            for entry, _ in paths:  # hpcprof makes every entry's context below the placeholder
                tree.child(anchor, _function_key(binary, entry))
        placed = False
        for number, ((_, path), fraction) in enumerate(zip(paths, fractions, strict=True)):
            leaf, call = _instantiate(tree, anchor, binary, path, pc)
            if number == 0:
                expansion.leaf_ctx[m], expansion.call_ctx[m] = leaf, call
            if fraction > 0:
                splits.add(m, leaf, call, fraction)
                placed = True
        if not placed:  # no launched entry reaches it: contexts, no values (a 0 split row)
            splits.add(m, int(expansion.leaf_ctx[m]), int(expansion.call_ctx[m]), 0.0)
            binary.dropped.append((function, float(weights[m])))


def _dropped_message(binary: _Binary) -> str:
    functions = sorted({binary.name(f) for f, _ in binary.dropped})
    gins = sum(w for _, w in binary.dropped)
    return (
        f"{binary.shown}: the GPU samples of {len(binary.dropped)} instruction(s) "
        f"({gins:g} {WEIGHT_METRIC}) in {', '.join(functions)} reach no launched kernel through "
        "the device call graph; as hpcprof, their contexts have no values"
    )


def _function_key(binary: _Binary, entry: int) -> ContextKey:
    chain = binary.index.procedure_at(entry)
    assert chain is not None
    return struct_steps(binary.shown, chain, entry)[0]


def _instantiate(
    tree: ContextBuilder,
    anchor: int,
    binary: _Binary,
    path: CallPath,
    pc: int,
    unknown_caller: bool = False,
) -> tuple[int, int]:
    """Create the chain kernel -> call sites -> sampled instruction; (leaf, call context).

    A sample outside every function, or any sample of a binary with a corrupt call graph
    (``unknown_caller``), goes below an unknown function; its call context is the one below it.
    """
    ctx = anchor
    for address in path:
        ctx = _chain(tree, ctx, _steps(binary, address))
    chain = binary.index.lookup(pc)
    if chain is None or unknown_caller:
        ctx = tree.child(ctx, UNKNOWN_FUNCTION)
    steps = _steps(binary, pc)
    call = tree.child(ctx, steps[0])
    return _chain(tree, call, steps[1:]), call


def _steps(binary: _Binary, address: int) -> Steps:
    chain = binary.index.lookup(address)
    if chain is None:
        return raw_steps(binary.shown, address)
    return struct_steps(binary.shown, chain, address)


def _chain(tree: ContextBuilder, ctx: int, steps: Steps) -> int:
    for key in steps:
        ctx = tree.child(ctx, key)
    return ctx
