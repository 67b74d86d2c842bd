"""GPU calling context reconstruction for PC-sampled kernels (Zhou et al., 2021).

PC samples of a GPU kernel arrive flat: non-unwound ``gpubin@pc`` frames directly below the
``<gpu kernel>`` placeholder (formats.md §1.5), with no record of the device call chain that led
to each instruction. When the kernel's binary has a ``+gpucfg`` structure file (``LM
has-calls="1"`` and ``C`` call-site elements with targets, formats.md §4.4), the chains are
rebuilt in four steps:

1. *Call graph weights*: an edge caller → callee per call site, weighted by the samples taken at
   that call instruction (the ``GINS`` metric, or one per sampled instruction without it).
2. *Unsampled callers*: a sampled function none of whose incoming call sites was sampled gets
   weight 1 on every incoming edge, and the same is propagated up to its callers, so every
   sampled function stays reachable from the kernel entry.
3. *Recursion*: strongly connected components (Tarjan) are collapsed into single nodes; calls
   inside a component are not expanded (its functions hang below the call site entering it).
4. *Apportioning*: like gprof, each function's cost is split among the call paths reaching it in
   proportion to the weights of the edges along them.

Each sample then lands on one context chain per call path — kernel function, call-site lines,
callee functions, down to the sampled instruction — with its values scaled by that path's share.
The result is expressed as *splits* of raw frames (node, leaf context, call context, fraction).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

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
from pyhpctk.core.context import ContextTree
from pyhpctk.formats.hpcstruct_model import PROCEDURE

WEIGHT_METRIC = "GINS"
MAX_PATHS = 4096  # per function: beyond this, the smallest shares are merged into the largest


@dataclass(frozen=True, slots=True)
class Edge:
    """A call site: ``caller`` and ``callee`` are function entry addresses."""

    caller: int
    callee: int
    site: int


@dataclass(slots=True)
class CallGraph:
    """The static device call graph of one GPU binary (from ``C`` elements)."""

    edges: list[Edge] = field(default_factory=list)

    @classmethod
    def of(cls, index: StructureIndex) -> CallGraph:
        return cls(
            [
                Edge(c.caller_entry, c.target, c.address)
                for c in index.call_sites
                if c.target is not None
            ]
        )

    def incoming(self) -> dict[int, list[Edge]]:
        result: dict[int, list[Edge]] = defaultdict(list)
        for edge in self.edges:
            result[edge.callee].append(edge)
        return result


def strongly_connected(nodes: list[int], successors: dict[int, list[int]]) -> dict[int, int]:
    """Tarjan's algorithm, iterative: node -> component (numbered in reverse topological order)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    component: dict[int, int] = {}
    counter = 0
    n_components = 0
    for start in nodes:
        if start in index:
            continue
        work: list[tuple[int, int]] = [(start, 0)]
        while work:
            node, child_pos = work.pop()
            if child_pos == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = successors.get(node, [])
            if child_pos < len(children):
                work.append((node, child_pos + 1))
                child = children[child_pos]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = n_components
                    if member == node:
                        break
                n_components += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return component


Path = tuple[int, ...]  # call-site addresses from the kernel entry down


def apportion(
    graph: CallGraph,
    entry: int,
    sampled: set[int],
    site_weight: dict[int, float],
) -> dict[int, list[tuple[Path, float]]]:
    """Call paths (and their shares) of every sampled function reachable from ``entry``.

    ``sampled``: functions (entry addresses) with samples; ``site_weight``: samples per call-site
    address. Steps 1-4 of the module docstring. Unreachable functions are absent.
    """
    incoming = graph.incoming()
    weight: dict[Edge, float] = {e: float(site_weight.get(e.site, 0.0)) for e in graph.edges}
    # Step 2: make every sampled function reachable, propagating weight 1 upwards.
    pending = [f for f in sampled if f != entry]
    seen: set[int] = set()
    while pending:
        function = pending.pop()
        if function in seen or function == entry:
            continue
        seen.add(function)
        edges = incoming.get(function, [])
        if edges and all(weight[e] <= 0 for e in edges):
            for edge in edges:
                weight[edge] = 1.0
                pending.append(edge.caller)
        elif edges:
            pending.extend(e.caller for e in edges if weight[e] > 0)
    # Step 3: SCCs over the positive-weight graph.
    successors: dict[int, list[int]] = defaultdict(list)
    nodes: set[int] = {entry}
    for edge in graph.edges:
        if weight[edge] > 0:
            successors[edge.caller].append(edge.callee)
            nodes.update((edge.caller, edge.callee))
    component = strongly_connected(sorted(nodes), successors)
    # Incoming positive edges of each component from outside it.
    into: dict[int, list[Edge]] = defaultdict(list)
    for edge in graph.edges:
        if weight[edge] > 0 and component[edge.caller] != component[edge.callee]:
            into[component[edge.callee]].append(edge)
    # Step 4: shares, components in topological order (Tarjan numbers them in reverse).
    paths: dict[int, list[tuple[Path, float]]] = {component[entry]: [((), 1.0)]}
    for comp in sorted(set(component.values()), reverse=True):
        if comp == component[entry]:
            continue
        edges = into.get(comp, [])
        total = sum(weight[e] for e in edges)
        found: list[tuple[Path, float]] = []
        for edge in edges:
            for path, share in paths.get(component[edge.caller], []):
                found.append(((*path, edge.site), share * weight[edge] / total))
        if found:
            paths[comp] = _cap(found)
    result: dict[int, list[tuple[Path, float]]] = {}
    for function in sampled | {entry}:
        found_comp = component.get(function)
        if found_comp is not None and found_comp in paths:
            result[function] = paths[found_comp]
    return result


def _cap(paths: list[tuple[Path, float]]) -> list[tuple[Path, float]]:
    if len(paths) <= MAX_PATHS:
        return paths
    paths = sorted(paths, key=lambda p: -p[1])
    kept = paths[:MAX_PATHS]
    rest = sum(share for _, share in paths[MAX_PATHS:])
    kept[0] = (kept[0][0], kept[0][1] + rest)
    return kept


def _function_entry(index: StructureIndex, pc: int) -> int | None:
    chain = index.lookup(pc)
    if chain is None:
        return None
    for scope in chain:
        if scope.tag == PROCEDURE and scope.ranges:
            return scope.ranges[0][0]
    return None


def node_weights(raw: RawTree, profiles: list[tuple[int, ProfileData]]) -> npt.NDArray[np.float64]:
    """The ``GINS`` samples of ``profiles`` per raw node (the call-edge weights of step 1)."""
    total = np.zeros(len(raw), dtype=np.float64)
    for _, data in profiles:
        names = [m.name for m in data.metrics]
        if WEIGHT_METRIC not in names:
            continue
        metric = names.index(WEIGHT_METRIC)
        keep = data.value_metric == metric
        total += np.bincount(data.value_node[keep], weights=data.value[keep], minlength=len(raw))
    return total


def reconstruct_gpu_contexts(
    raw: RawTree,
    expansion: Expansion,
    classifiers: ModuleClassifiers,
    profiles: list[tuple[int, ProfileData]],
    weights: npt.NDArray[np.float64] | None = None,
) -> Expansion:
    """Re-attach non-unwound GPU samples along reconstructed device call paths (see module doc).

    ``weights`` (the ``GINS`` sample count per raw node, summed over every profile) may be given
    instead of computing them from ``profiles``: pyprof-mpi sums them over its ranks.
    """
    if not any(classifiers.reconstructs(module) for module in classifiers.structures):
        return expansion
    groups: dict[int, list[int]] = defaultdict(list)
    launched: dict[tuple[int, str], int] = {}  # (placeholder, module) -> unwound kernel entry
    for ident, (module, offset, unwound) in enumerate(raw.keys):
        if module is None or raw.parent[ident] < 0 or not classifiers.reconstructs(module):
            continue
        if unwound:
            launched.setdefault((raw.parent[ident], module), offset)
        else:
            groups[raw.parent[ident]].append(ident)
    if not groups:
        return expansion
    if weights is None:
        weights = node_weights(raw, profiles)
    tree = expansion.tree
    split_node: list[int] = []
    split_leaf: list[int] = []
    split_call: list[int] = []
    split_fraction: list[float] = []
    for parent, members in groups.items():
        module = raw.keys[members[0]][0]
        assert module is not None
        index = classifiers.structures[module]
        shown = classifiers.presented_path.get(module, module)
        graph = CallGraph.of(index)
        anchor = int(expansion.leaf_ctx[parent])
        functions = {m: _function_entry(index, raw.keys[m][1]) for m in members}
        sampled = {f for f in functions.values() if f is not None}
        site_weight: dict[int, float] = defaultdict(float)
        has_weights = bool(np.any(weights[members] > 0))
        for m in members:
            site_weight[raw.keys[m][1]] += float(weights[m]) if has_weights else 1.0
        entry = launched.get((parent, module), _uncalled(graph, sampled))
        shares = apportion(graph, entry, sampled, site_weight) if entry is not None else {}
        for m in members:
            function = functions[m]
            pc = raw.keys[m][1]
            if function is None or function not in shares:
                # No call path known: the sample's own chain, right below the kernel placeholder.
                leaf, call = _instantiate(tree, anchor, index, shown, (), pc)
                expansion.leaf_ctx[m], expansion.call_ctx[m] = leaf, call
                continue
            first = True
            for path, share in shares[function]:
                leaf, call = _instantiate(tree, anchor, index, shown, path, pc)
                if first:
                    expansion.leaf_ctx[m], expansion.call_ctx[m] = leaf, call
                    first = False
                split_node.append(m)
                split_leaf.append(leaf)
                split_call.append(call)
                split_fraction.append(share)
    expansion.add_splits(
        np.asarray(split_node, dtype=np.int64),
        np.asarray(split_leaf, dtype=np.int64),
        np.asarray(split_call, dtype=np.int64),
        np.asarray(split_fraction, dtype=np.float64),
    )
    return expansion


def _uncalled(graph: CallGraph, sampled: set[int]) -> int | None:
    """Without an unwound kernel frame: the one sampled function nothing calls, if unique."""
    callees = {e.callee for e in graph.edges}
    roots = sorted(f for f in sampled if f not in callees)
    return roots[0] if len(roots) == 1 else None


def _instantiate(
    tree: ContextTree,
    anchor: int,
    index: StructureIndex,
    module: str,
    path: tuple[int, ...],
    pc: int,
) -> tuple[int, int]:
    """Create the chain kernel -> call sites -> sampled instruction; (leaf, call context)."""
    ctx = anchor
    call = anchor
    for address in (*path, pc):
        chain = index.lookup(address)
        steps: Steps = (
            struct_steps(module, chain, address)
            if chain is not None
            else (UNKNOWN_FUNCTION, *raw_steps(module, address))
        )
        for position, key in enumerate(steps):
            ctx = tree.child(ctx, key)
            if position == 0:
                call = ctx
    return ctx, call
