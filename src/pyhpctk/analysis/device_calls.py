"""hpcprof's device call graph: cycles removed, call paths to a function, a sample's shares.

A ``+gpucfg`` structure file (formats.md §4.4) lists each GPU function (``P``) and each call
site (``C`` with ``t=`` the callee's entry). hpcprof's struct finalizer turns that into a reversed
call graph without cycles, and its context reconstruction splits each PC sample among the call
paths that reach the sampled function. This module reproduces both, rule for rule, on plain
addresses; :mod:`.gpu` builds the contexts.

**Cycles** (recursion). Strongly connected components are found by Tarjan's algorithm run on the
*reversed* graph (callee → callers), starting from every function in file order and visiting a
function's callers in the reverse file order of their call sites (hpcprof keeps them in an
``unordered_multimap``, which lists equal keys newest first). The *root* of a component is the
member that search reached first. Then:

1. every edge between two members of one component is dropped, so the graph is a DAG;
2. an edge from outside into a component's root is also taken as an edge into each other member
   (hpcprof: "pretend every call could call all other functions in the callee's SCC") — but only
   an edge into the root: an edge entering the component at another member stays that member's
   alone. A member no outside edge reaches, directly or through the root, has no caller left.

**Call paths** of a function: every chain of call sites from a function nobody calls (an
*entry*) down to it, in that DAG. A sample is placed once per path.

**Shares** of a sample among its paths (hpcprof's ``ContextReconstruction`` rescaling factors
times ``ContextFlowGraph`` interior factors): a path whose entry was not launched under the
sample's ``<gpu kernel>`` placeholder gets 0. The others are grouped by their last call site
(the one calling the sampled function), each group weighted by the ``GINS`` samples at that call
instruction, evenly when none of the groups has any; each group is split again by the call site
before, and so on, until a group holds one path. So a sample reaching no launched entry gets 0
everywhere: hpcprof drops its values (and still creates its contexts).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

CallPath = tuple[int, ...]  # call-site addresses from the entry down
MAX_PATHS = 4096  # per function; hpcprof enumerates them all (pyhpctk: a bound on memory)


@dataclass(frozen=True, slots=True)
class Edge:
    """A call site: ``caller`` and ``callee`` are function entry addresses, ``site`` the call."""

    caller: int
    callee: int
    site: int


@dataclass(slots=True)
class CallGraph:
    """The static device call graph of one GPU binary: functions and call sites in file order."""

    functions: list[int] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """Whether every call site's target is a function's entry.

        hpcprof marks a graph with a target that is not ("Missing callee") as corrupt and
        reconstructs nothing in that binary.
        """
        known = set(self.functions)
        return all(edge.callee in known and edge.caller in known for edge in self.edges)

    def callers(self) -> dict[int, list[Edge]]:
        """Callee -> its incoming call sites, newest (last in the file) first."""
        result: dict[int, list[Edge]] = defaultdict(list)
        for edge in reversed(self.edges):
            result[edge.callee].append(edge)
        return result


def component_roots(graph: CallGraph) -> dict[int, int]:
    """Function -> the root of its strongly connected component (see the module docstring).

    Tarjan's algorithm on the reversed graph, iterative but in the exact order of hpcprof's
    recursive search, since the order decides which member is a component's root.
    """
    callers = graph.callers()
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    active: set[int] = set()
    stack: list[int] = []
    root: dict[int, int] = {}

    def enter(function: int) -> None:
        index[function] = low[function] = len(index)
        stack.append(function)
        active.add(function)

    for start in graph.functions:
        if start in index:
            continue
        enter(start)
        work: list[list[int]] = [[start, 0]]  # (function, next caller to visit)
        while work:
            frame = work[-1]
            function, position = frame
            incoming = callers.get(function, [])
            if position < len(incoming):
                frame[1] += 1
                caller = incoming[position].caller
                if caller not in index:
                    enter(caller)
                    work.append([caller, 0])
                elif caller in active:
                    low[function] = min(low[function], index[caller])
                continue
            work.pop()
            if low[function] == index[function]:
                while True:
                    member = stack.pop()
                    active.discard(member)
                    root[member] = function
                    if member == function:
                        break
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[function])
    return root


def acyclic_callers(graph: CallGraph) -> dict[int, list[Edge]]:
    """Callee -> incoming call sites once cycles are removed (rules 1 and 2 of the docstring).

    An edge summarising a component keeps the call site and caller of the edge into the root.
    """
    root = component_roots(graph)
    members: dict[int, list[int]] = defaultdict(list)
    for function in graph.functions:
        members[root.get(function, function)].append(function)
    result: dict[int, list[Edge]] = defaultdict(list)
    for callee, incoming in graph.callers().items():
        outside = [e for e in incoming if root.get(e.caller) != root.get(callee)]
        result[callee].extend(outside)
        if root.get(callee) == callee:  # into the root: into every member
            for member in members[callee]:
                if member != callee:
                    result[member].extend(outside)
    return result


def call_paths(
    callers: Mapping[int, list[Edge]], function: int, limit: int = MAX_PATHS
) -> list[tuple[int, CallPath]]:
    """(entry, call sites from the entry down) of every path reaching ``function``, sorted.

    At most ``limit`` paths (the first found); a function nothing calls is its own entry with
    the empty path.
    """
    found: list[tuple[int, CallPath]] = []
    pending: list[tuple[int, CallPath]] = [(function, ())]
    while pending and len(found) < limit:
        current, below = pending.pop()
        incoming = callers.get(current)
        if not incoming:
            found.append((current, below))
            continue
        pending.extend((edge.caller, (edge.site, *below)) for edge in incoming)
    return sorted(found, key=lambda entry_path: entry_path[1][::-1])


def shares(
    paths: list[tuple[int, CallPath]],
    launched: set[int] | frozenset[int],
    site_samples: Mapping[int, float],
) -> list[float]:
    """A sample's share on each of ``paths`` (from :func:`call_paths`), as hpcprof splits it.

    ``launched``: entries launched under the sample's placeholder; ``site_samples``: ``GINS``
    samples per call-site address under it. See the module docstring.
    """
    result = [0.0] * len(paths)
    live = [i for i, (entry, _) in enumerate(paths) if entry in launched]
    if len(live) <= 1:
        for i in live:
            result[i] = 1.0
        return result
    groups: list[tuple[list[int], float]] = [(live, 1.0)]
    depth = 1  # the call site at position -depth of every path in a group decides its split
    while groups:
        split: list[tuple[list[int], float]] = []
        for group, share in groups:
            parts: list[list[int]] = []
            for i in group:  # paths are sorted from their end: equal call sites are adjacent
                if parts and paths[parts[-1][0]][1][-depth] == paths[i][1][-depth]:
                    parts[-1].append(i)
                else:
                    parts.append([i])
            weights = [float(site_samples.get(paths[part[0]][1][-depth], 0.0)) for part in parts]
            total = sum(weights)
            for part, weight in zip(parts, weights, strict=True):
                split.append((part, share * weight / total if total > 0 else share / len(parts)))
        groups = []
        for part, share in split:
            if share == 0 or len(part) == 1 or len(paths[part[0]][1]) == depth:
                for i in part:
                    result[i] = share
            else:
                groups.append((part, share))
        depth += 1
    return result
