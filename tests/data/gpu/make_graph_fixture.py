"""Write ``graphs_synthetic.json``: a HAND-MADE CUDA-graph recording for CI (no GPU made it).

    PYTHONPATH=src python3 tests/data/gpu/make_graph_fixture.py tests/data/gpu/graphs_synthetic.json

It has the shape CUPTI reports for a captured graph replayed several times (the real one is
recorded on the device by ``record_graphs.py`` into ``graphs_h200.json`` and replaces this
one as the acceptance): one ordinary launch (site 0); a stream capture of three kernels from
three lines (sites 1-3: each a captured launch, answered by no activity, and the graph node it
made); the instantiation (exec nodes 2001-2003 cloned from nodes 1001-1003); five launches of
the graph from one line (site 4), each answered by three kernel activities carrying the graph
launch's correlation id and the exec node's id.
"""

from __future__ import annotations

import sys

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.simulated.recording import OPERATION_DTYPE, Recording, save

REPLAYS = 5


def build() -> Recording:
    ops: list[tuple[int, int, int, int]] = [(0, 1, act.KERNEL, 0)]  # (thread, corr, kind, site)
    for k in range(3):
        ops.append((0, 10 + k, act.KERNEL, 1 + k))  # the captured launch (never executes)
        ops.append((0, 1001 + k, act.GRAPH_NODE, 1 + k))  # the node it made
    ops += [(0, 100 + r, act.GRAPH, 4) for r in range(REPLAYS)]
    operations = np.zeros(len(ops), dtype=OPERATION_DTYPE)
    for index, op in enumerate(ops):
        operations[index] = op
    rows = act.empty_activities(1 + 3 * REPLAYS)
    rows["kind"] = act.KERNEL
    rows["correlation"][0] = 1
    rows["function"][0] = 0
    for r in range(REPLAYS):
        part = slice(1 + 3 * r, 4 + 3 * r)
        rows["correlation"][part] = 100 + r
        rows["graph"][part] = 7
        rows["graph_node"][part] = [2001, 2002, 2003]
        rows["function"][part] = [0, 1, 2]
    rows["start"] = 10**9 + 1000 * np.arange(len(rows))
    rows["end"] = rows["start"] + 400 + 100 * rows["function"]
    rows["stream"] = 13
    rows["block_threads"] = 256
    rows["grid_blocks"] = 16
    return Recording(
        act.DeviceLimits(name="synthetic"),
        ["k_scale", "k_add", "k_reduce"],
        operations,
        rows,
        [4, 6, 6],
        note="SYNTHETIC: hand-made by tests/data/gpu/make_graph_fixture.py, not recorded on a"
        " GPU (the real recording is graphs_h200.json, from record_graphs.py)",
        clones={2001 + k: 1001 + k for k in range(3)},
    )


if __name__ == "__main__":
    save(build(), sys.argv[1])
