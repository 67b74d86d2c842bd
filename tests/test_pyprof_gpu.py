"""GPU calling context reconstruction from PC samples and a ``+gpucfg`` call graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pyhpctk.analysis.compare import view_of_aggregate
from pyhpctk.analysis.device_calls import (
    CallGraph,
    Edge,
    acyclic_callers,
    call_paths,
    component_roots,
    shares,
)
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import aggregate
from pyhpctk.formats import hpcrun, hpcstruct
from pyhpctk.formats.hpcrun_model import (
    CCT_NODE_DTYPE,
    ID_TUPLE_ELEMENT_DTYPE,
    INTERP_LOGIC_LOCAL,
    INTERP_LOGIC_ONLY,
    KIND_NODE,
    KIND_THREAD,
    METRIC_VALUE_DTYPE,
    NODE_START_DTYPE,
    HpcrunProfile,
    LoadModule,
    MetricDescriptor,
    metric_flags,
    placeholder_ip,
)
from pyhpctk.formats.hpcstruct_model import Scope, StructureFile

KERN, DEV, LEAF = 0x100, 0x200, 0x300
K, K2, A, B, C, D = 0x1000, 0x2000, 0xA000, 0xB000, 0xC000, 0xD000


def test_a_cycles_root_is_the_member_the_reversed_search_reaches_first() -> None:
    # File order K, A, B; K -> B, A <-> B: the search starts at A (first of the cycle in file
    # order), so A is the root.
    graph = CallGraph([K, A, B], [Edge(K, B, 0x110), Edge(A, B, 0xA10), Edge(B, A, 0xB10)])
    assert component_roots(graph) == {K: K, A: A, B: A}
    # A leaf L listed first is searched first, and a function's callers are visited newest call
    # site first (hpcprof's unordered_multimap): L is called by A at 0xA20, then by B at 0xB20,
    # so the search reaches B before A and B is the root.
    L = 0x500
    graph = CallGraph(
        [L, K, A, B],
        [
            Edge(K, B, 0x110),
            Edge(A, B, 0xA10),
            Edge(A, L, 0xA20),
            Edge(B, A, 0xB10),
            Edge(B, L, 0xB20),
        ],
    )
    roots = component_roots(graph)
    assert roots[A] == roots[B] == B and roots[L] == L and roots[K] == K


def test_an_edge_into_the_root_brings_the_cycle_an_edge_into_another_member_only_it() -> None:
    # K calls A (the root) at 0x110 and B at 0x120; A <-> B.
    graph = CallGraph(
        [K, A, B],
        [Edge(K, A, 0x110), Edge(K, B, 0x120), Edge(A, B, 0xA10), Edge(B, A, 0xB10)],
    )
    callers = acyclic_callers(graph)
    assert call_paths(callers, A) == [(K, (0x110,))]
    assert call_paths(callers, B) == [(K, (0x110,)), (K, (0x120,))]


def test_a_cycle_entered_away_from_its_root_leaves_the_root_uncalled_and_unplaced() -> None:
    # K calls B only; A, first in file order, is the root: no edge is left into it, so it is an
    # entry of its own, never launched: its samples get no share anywhere (hpcprof drops them).
    graph = CallGraph([K, A, B], [Edge(K, B, 0x120), Edge(A, B, 0xA10), Edge(B, A, 0xB10)])
    callers = acyclic_callers(graph)
    assert call_paths(callers, B) == [(K, (0x120,))]
    assert call_paths(callers, A) == [(A, ())]
    assert shares(call_paths(callers, A), {K}, {}) == [0.0]
    assert shares(call_paths(callers, B), {K}, {}) == [1.0]


def test_direct_recursion_adds_no_level() -> None:
    graph = CallGraph([K, A], [Edge(K, A, 0x110), Edge(A, A, 0xA10)])
    assert call_paths(acyclic_callers(graph), A) == [(K, (0x110,))]


def test_a_sample_is_split_by_the_call_sites_samples_level_by_level() -> None:
    # D is reached by K -> A -> C -> D, K -> B -> C -> D (both through C's call 0xC10) and
    # K -> D; K2, never launched, also calls D.
    graph = CallGraph(
        [K, K2, A, B, C, D],
        [
            Edge(K, A, 0x110),
            Edge(K, B, 0x120),
            Edge(K, D, 0x130),
            Edge(K2, D, 0x210),
            Edge(A, C, 0xA10),
            Edge(B, C, 0xB10),
            Edge(C, D, 0xC10),
        ],
    )
    paths = call_paths(acyclic_callers(graph), D)
    assert paths == [
        (K, (0x130,)),
        (K2, (0x210,)),
        (K, (0x110, 0xA10, 0xC10)),
        (K, (0x120, 0xB10, 0xC10)),
    ]
    # First split by the call into D: 0x130 and 0xC10 have 4 samples each (K2's 100 do not
    # count: K2 was not launched); then 0xC10's half by the calls into C, 3:1.
    samples = {0x130: 4.0, 0xC10: 4.0, 0x210: 100.0, 0xA10: 3.0, 0xB10: 1.0}
    assert shares(paths, {K}, samples) == [0.5, 0.0, 0.375, 0.125]
    # With no samples at the calls, evenly at each level: 1/2, then 1/4 and 1/4 (not 1/3 each).
    assert shares(paths, {K}, {}) == [0.5, 0.0, 0.25, 0.25]
    # Both entries launched: three ways at the first level.
    assert shares(paths, {K, K2}, {}) == [1 / 3, 1 / 3, 1 / 6, 1 / 6]


def test_a_call_to_no_function_entry_makes_the_graph_corrupt() -> None:
    assert CallGraph([K, A], [Edge(K, A, 0x110)]).valid
    assert not CallGraph([K, A], [Edge(K, A + 4, 0x110)]).valid


def _scope(tag: str, children: list[Scope] | None = None, **attrs: str) -> Scope:
    return Scope(tag, dict(attrs), children or [])


def _gpu_structure(path: str, target: str = "0x200") -> StructureFile:
    kern = _scope(
        "P",
        [
            _scope("S", l="2", v="{[0x100-0x110)}"),
            _scope("C", l="3", v="{[0x110-0x118)}", t="0x200", d="NVIDIA sm_80"),
            _scope("C", l="4", v="{[0x118-0x120)}", t=target, d="NVIDIA sm_80"),
            _scope("S", l="5", v="{[0x120-0x130)}"),
        ],
        n="kern()",
        l="1",
        v="{[0x100-0x101)}",
    )
    dev = _scope(
        "P", [_scope("S", l="11", v="{[0x200-0x240)}")], n="dev()", l="10", v="{[0x200-0x201)}"
    )
    module = _scope("LM", [_scope("F", [kern, dev], n="/src/k.cu")], n=path, v="{}")
    module.attrs["has-calls"] = "1"
    return StructureFile(modules=[module])


def _pc_profile(gpubin: str) -> HpcrunProfile:
    # id, parent, lm, ip, flags (1 = unwound)
    nodes = [
        (12, 0, 0, placeholder_ip("^Primary"), 1),
        (14, 12, 0, placeholder_ip("| Main  "), 1),
        (16, 14, 1, 0x40, 1),
        (18, 16, 0, placeholder_ip("GPUKernl"), 1),
        (20, 18, 2, KERN, 1),
        (22, 18, 2, 0x110, 0),
        (24, 18, 2, 0x118, 0),
        (26, 18, 2, 0x204, 0),
        (28, 18, 2, 0x124, 0),
    ]
    cct = np.array(nodes, dtype=CCT_NODE_DTYPE)
    samples = {22: 3.0, 24: 1.0, 26: 8.0, 28: 2.0}
    values = np.zeros(len(samples), dtype=METRIC_VALUE_DTYPE)
    values["value_bits"] = np.array(list(samples.values()), dtype=np.float64).view(np.uint64)
    values["metric"] = 0
    starts = np.zeros(len(samples), dtype=NODE_START_DTYPE)
    starts["node_id"] = list(samples)
    starts["start"] = np.arange(len(samples))
    id_tuple = np.array(
        [
            (KIND_NODE | INTERP_LOGIC_LOCAL << 14, 7, 0),
            (KIND_THREAD | INTERP_LOGIC_ONLY << 14, 0, 0),
        ],
        dtype=ID_TUPLE_ELEMENT_DTYPE,
    )
    return HpcrunProfile(
        nvpairs=[("program-name", "app"), ("thread-id", "0")],
        load_modules=[LoadModule(1, "/bin/app"), LoadModule(2, gpubin)],
        cct=cct,
        metrics=[MetricDescriptor("GINS", "instructions", metric_flags(value_type=0))],
        id_tuple=id_tuple,
        values=values,
        node_starts=starts,
    )


def test_pc_samples_follow_the_device_call_graph(tmp_path: Path) -> None:
    measurement = tmp_path / "m"
    (measurement / "structs").mkdir(parents=True)
    gpubin = "/gpu/k.gpubin"
    hpcstruct.write(
        _gpu_structure(gpubin), measurement / "structs" / "k.gpubin-gpucfg-yes.hpcstruct"
    )
    hpcrun.write(_pc_profile(gpubin), measurement / "app-000000-000-00000007-1-0.hpcrun")
    db = aggregate(ProfOptions.build([measurement]))
    view = view_of_aggregate(db)
    paths = view.paths()
    names = {
        ident: [
            label[2][0]
            if label[0] != "entry" and label[2]
            else (f"line {label[4]}" if label[0] != "entry" and label[1] == 2 else label[1])
            for label in paths[ident]
        ]
        for ident in view.contexts
    }
    execution = {
        int(c): v
        for c, m, v in zip(
            view.profiles[1].ctx, view.profiles[1].metric, view.profiles[1].value, strict=True
        )
        if m == 3
    }
    by_name = {tuple(map(str, names[i])): execution.get(i, 0.0) for i in view.contexts}
    kern = ("1", "3", "<gpu kernel>", "kern()")
    # 3 samples on the line-3 call plus 3/4 of dev()'s 8; 1 plus 1/4 of 8 on line 4.
    assert by_name[(*kern, "line 3")] == 3.0 + 6.0
    assert by_name[(*kern, "line 4")] == 1.0 + 2.0
    assert by_name[(*kern, "line 3", "dev()")] == 6.0
    assert by_name[(*kern, "line 4", "dev()")] == 2.0
    assert by_name[kern] == 14.0
    # dev() exists only below its call sites: nothing was left directly under the placeholder.
    assert (*kern[:3], "dev()") not in by_name


def test_a_corrupt_call_graph_puts_samples_below_an_unknown_function(tmp_path: Path) -> None:
    """hpcprof's "Missing callee": a call to an address that is no function's entry makes the
    binary's graph corrupt; each sample goes below an unknown function, at its own function."""
    measurement = tmp_path / "m"
    (measurement / "structs").mkdir(parents=True)
    gpubin = "/gpu/k.gpubin"
    hpcstruct.write(
        _gpu_structure(gpubin, target="0x208"),
        measurement / "structs" / "k.gpubin-gpucfg-yes.hpcstruct",
    )
    hpcrun.write(_pc_profile(gpubin), measurement / "app-000000-000-00000007-1-0.hpcrun")
    view = view_of_aggregate(aggregate(ProfOptions.build([measurement])))
    paths = view.paths()
    below = {
        tuple(
            label[2][0] if label[2] else "unknown" if label[1] == 0 else "-"
            for label in paths[i][3:]
        )
        for i in view.contexts
        if len(paths[i]) > 3 and paths[i][2][2] and paths[i][2][2][0] == "<gpu kernel>"
    }
    assert ("unknown", "dev()") in below and ("unknown", "kern()") in below
    assert not any(names[:1] == ("kern()",) and "dev()" in names for names in below)


def test_without_a_call_graph_samples_go_below_an_unknown_function_at_their_own(
    tmp_path: Path,
) -> None:
    """A structure made without ``--gpucfg`` (``has-calls="0"``, no call targets): hpcprof
    cannot rebuild device calling contexts and files each sample below an unknown function,
    then at its function and line."""
    structure = _gpu_structure("/gpu/k.gpubin")
    module = structure.modules[0]
    module.attrs["has-calls"] = "0"
    for scope in module.walk():
        scope.attrs.pop("t", None)
    measurement = tmp_path / "m"
    (measurement / "structs").mkdir(parents=True)
    hpcstruct.write(structure, measurement / "structs" / "k.gpubin.hpcstruct")
    hpcrun.write(_pc_profile("/gpu/k.gpubin"), measurement / "app-000000-000-00000007-1-0.hpcrun")
    view = view_of_aggregate(aggregate(ProfOptions.build([measurement])))
    paths = view.paths()
    execution = {
        int(c): v
        for c, m, v in zip(
            view.profiles[1].ctx, view.profiles[1].metric, view.profiles[1].value, strict=True
        )
        if m == 3
    }
    below = {
        tuple(
            label[2][0] if label[2] else f"line {label[4]}" if label[1] == 2 else "unknown"
            for label in paths[i][3:]
        ): execution.get(i)
        for i in view.contexts
        if len(paths[i]) == 5 and paths[i][2][2] and paths[i][2][2][0] == "<gpu kernel>"
    }
    # 3 + 1 + 2 samples in kern() (its calls and line 5), 8 in dev(); kern()'s own frame too.
    assert below == {
        ("unknown", "kern()"): 6.0,
        ("unknown", "dev()"): 8.0,
        ("kern()", "line 2"): None,
    }


def test_gpu_range_trees_do_not_lose_the_profile(tmp_path: Path) -> None:
    profile = _pc_profile("/gpu/k.gpubin")
    nodes = [tuple(row) for row in profile.cct.tolist()]
    nodes += [
        (30, 0, 65533, 0, 1),  # GPU_ROOT, a second root
        (32, 30, 65531, 1, 1),  # GPU_CONTEXT 1
        (34, 32, 65532, 5, 1),  # GPU_RANGE 5
        (36, 34, 2, 0x120, 0),
    ]
    profile.cct = np.array(nodes, dtype=CCT_NODE_DTYPE)
    measurement = tmp_path / "m"
    measurement.mkdir()
    hpcrun.write(profile, measurement / "app-000000-000-00000007-1-0.hpcrun")
    db = aggregate(ProfOptions.build([measurement]))
    assert db.problems == []
    names = {k.function.name for k in db.tree.keys if k.function is not None}
    assert {"<gpu context 1>", "<gpu range 5>"} <= names
