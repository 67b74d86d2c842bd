"""GPU calling context reconstruction from PC samples and a ``+gpucfg`` call graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pyhpctk.analysis.compare import view_of_aggregate
from pyhpctk.analysis.gpu import CallGraph, Edge, apportion, strongly_connected
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


def test_tarjan_finds_cycles_and_orders_components() -> None:
    successors = {1: [2], 2: [3], 3: [2, 4], 4: []}
    component = strongly_connected([1, 2, 3, 4], successors)
    assert component[2] == component[3]
    assert len({component[1], component[2], component[4]}) == 3
    # reverse topological numbering: a callee's component comes before its caller's
    assert component[4] < component[2] < component[1]


def test_call_site_weights_split_a_callee_like_gprof() -> None:
    graph = CallGraph([Edge(KERN, DEV, 0x110), Edge(KERN, DEV, 0x118)])
    shares = apportion(graph, KERN, {KERN, DEV}, {0x110: 3.0, 0x118: 1.0})
    assert shares[KERN] == [((), 1.0)]
    assert sorted(shares[DEV]) == [((0x110,), 0.75), ((0x118,), 0.25)]


def test_unsampled_callers_get_weight_one_up_to_the_kernel() -> None:
    # KERN -> DEV (two unsampled sites) -> LEAF (one unsampled site); only LEAF was sampled.
    graph = CallGraph([Edge(KERN, DEV, 0x110), Edge(KERN, DEV, 0x118), Edge(DEV, LEAF, 0x210)])
    shares = apportion(graph, KERN, {LEAF}, {})
    assert sorted(shares[LEAF]) == [((0x110, 0x210), 0.5), ((0x118, 0x210), 0.5)]


def test_recursion_is_collapsed() -> None:
    # KERN -> DEV <-> LEAF (mutual recursion): both hang below the call site entering the cycle.
    graph = CallGraph([Edge(KERN, DEV, 0x110), Edge(DEV, LEAF, 0x210), Edge(LEAF, DEV, 0x310)])
    shares = apportion(graph, KERN, {DEV, LEAF}, {0x110: 2.0, 0x210: 5.0, 0x310: 5.0})
    assert shares[DEV] == [((0x110,), 1.0)]
    assert shares[LEAF] == [((0x110,), 1.0)]


def _scope(tag: str, children: list[Scope] | None = None, **attrs: str) -> Scope:
    return Scope(tag, dict(attrs), children or [])


def _gpu_structure(path: str) -> StructureFile:
    kern = _scope(
        "P",
        [
            _scope("S", l="2", v="{[0x100-0x110)}"),
            _scope("C", l="3", v="{[0x110-0x118)}", t="0x200", d="NVIDIA sm_80"),
            _scope("C", l="4", v="{[0x118-0x120)}", t="0x200", d="NVIDIA sm_80"),
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
