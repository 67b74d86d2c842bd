"""Measurement directories written with pyhpctk's own hpcrun writer, node by node.

A test names its CCT as rows ``(id, parent, load module id, offset or placeholder, unwound)``
and its values as ``{node id: {metric index: value}}``; :func:`cpu_profile` makes the
``HpcrunProfile`` hpcrun would have written (one thread of rank 0 on host ``host``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np

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
)

Node = tuple[int, int, int, int, int]  # id, parent, lm id, lm_ip, unwound (1) or not (0)


def cpu_profile(
    load_modules: list[LoadModule],
    nodes: list[Node],
    values: dict[int, dict[int, float]],
    metrics: list[MetricDescriptor],
    host: int = 0x1234ABCD,
    thread: int = 0,
) -> HpcrunProfile:
    """One thread's profile: the CCT rows as given, real values sorted by node and metric."""
    cct = np.array(nodes, dtype=CCT_NODE_DTYPE)
    rows = [
        (node, metric, value)
        for node in sorted(values)
        for metric, value in sorted(values[node].items())
    ]
    sparse = np.zeros(len(rows), dtype=METRIC_VALUE_DTYPE)
    sparse["value_bits"] = np.array([v for _, _, v in rows], dtype=np.float64).view(np.uint64)
    sparse["metric"] = [m for _, m, _ in rows]
    ids = sorted(values)
    starts = np.zeros(len(ids), dtype=NODE_START_DTYPE)
    starts["node_id"] = ids
    starts["start"] = np.cumsum([0] + [len(values[n]) for n in ids[:-1]]) if ids else []
    id_tuple = np.array(
        [
            (KIND_NODE | INTERP_LOGIC_LOCAL << 14, host, 0),
            (KIND_THREAD | INTERP_LOGIC_ONLY << 14, thread, thread),
        ],
        dtype=ID_TUPLE_ELEMENT_DTYPE,
    )
    return HpcrunProfile(
        nvpairs=[
            ("program-name", "app"),
            ("host-id", f"{host:08x}"),
            ("thread-id", str(thread)),
        ],
        load_modules=load_modules,
        cct=cct,
        metrics=metrics,
        id_tuple=id_tuple,
        values=sparse,
        node_starts=starts,
    )


def profile_name(host: int = 0x1234ABCD, thread: int = 0, pid: int = 4321) -> str:
    """hpcrun's file name of that thread's profile (``app-RANK-THREAD-HOSTID-PID-GEN``)."""
    return f"app-000000-{thread:03d}-{host:08x}-{pid}-0.hpcrun"


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark_module(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module (its generators write test inputs at scale)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
