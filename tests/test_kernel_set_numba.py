"""The benchmark's Numba kernel set computes what its CUDA C set computes (issue #34).

The Numba versions (benchmarks/kernel_set_numba.py) reuse the CUDA C set's inputs and truths,
so each must be the same algorithm. Numba's CUDA simulator runs each kernel on the host, at a
few blocks, against a NumPy reference: Needleman-Wunsch scores, histogram bins, BFS marks, the
matrix product, the stencil's interior (and untouched border), softmax rows, the reduction's
sum and k-means labels. The simulator must be chosen before numba is imported: a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

CHILD = r"""
import json
import numpy as np
import kernel_set_cupy as c
import kernel_set_numba as k
from numba import cuda

ks = {name: cuda.jit(function) for name, function in k.FUNCTIONS.items()}
rng = np.random.default_rng(34)
ok = {}

problems, length = 2, 8
a, b, score = c.nw_inputs(rng, problems, length)
want = score.copy()
for p in range(problems):
    for i in range(1, length + 1):
        for j in range(1, length + 1):
            match = want[p, i - 1, j - 1] + (1 if a[p, i - 1] == b[p, j - 1] else -1)
            want[p, i, j] = max(match, want[p, i - 1, j] - 1, want[p, i, j - 1] - 1)
got = score.ravel().copy()
ks["nw_wavefront"][problems, length](a.ravel(), b.ravel(), got, np.int32(length))
ok["nw_wavefront"] = bool(np.array_equal(got.reshape(want.shape), want))

n = 3000
x = rng.integers(0, 256, n).astype(np.uint8)
bins = np.zeros(256, np.uint32)
ks["histogram"][2, 256](x, bins, np.int32(n))
ok["histogram"] = bool(np.array_equal(bins, np.bincount(x, minlength=256)))

vertices = 300
offsets, edges = c.graph(rng, vertices, 3)
frontier = (rng.random(vertices) < 0.5).astype(np.int32)
visited = (rng.random(vertices) < 0.3).astype(np.int32)
marks = np.zeros(vertices, np.int32)
ks["bfs_step"][2, 256](offsets, edges, frontier, visited, marks, np.int32(vertices))
want = np.zeros(vertices, np.int32)
for v in np.flatnonzero(frontier):
    for w in edges[offsets[v]:offsets[v + 1]]:
        want[w] |= 1 - visited[w]
ok["bfs_step"] = bool(np.array_equal(marks, want))

m = 32
ma, mb = (rng.standard_normal((m, m)).astype(np.float32) for _ in range(2))
mc = np.zeros(m * m, np.float32)
ks["matmul_tiled"][(2, 2), (16, 16)](ma.ravel(), mb.ravel(), mc, np.int32(m))
ok["matmul_tiled"] = bool(np.allclose(mc.reshape(m, m), ma @ mb, atol=1e-4))

sa = rng.standard_normal((m, m)).astype(np.float32)
sb = np.zeros(m * m, np.float32)
ks["stencil"][(2, 2), (16, 16)](sa.ravel(), sb, np.int32(m))
sb = sb.reshape(m, m)
inner = 0.2 * (sa[1:-1, 1:-1] + sa[1:-1, :-2] + sa[1:-1, 2:] + sa[:-2, 1:-1] + sa[2:, 1:-1])
border = np.concatenate([sb[0], sb[-1], sb[:, 0], sb[:, -1]])
ok["stencil"] = bool(np.allclose(sb[1:-1, 1:-1], inner, atol=1e-5) and not border.any())

rows, cols = 2, 512
sx = rng.standard_normal((rows, cols)).astype(np.float32)
sy = np.zeros(rows * cols, np.float32)
ks["softmax_rows"][rows, 256](sx.ravel(), sy, np.int32(cols))
e = np.exp(sx - sx.max(1, keepdims=True))
ok["softmax_rows"] = bool(np.allclose(sy.reshape(rows, cols), e / e.sum(1, keepdims=True)))

size = 5000
rx = rng.random(size).astype(np.float32)
partial = np.zeros(2, np.float32)
ks["reduce_branchy"][2, 256](rx, partial, np.int32(size))
want = np.where(rx > 0.5, np.sqrt(rx) * rx, -0.5 * rx).sum()
ok["reduce_branchy"] = bool(np.isclose(partial.sum(), want, rtol=1e-4))

points, k_ = 300, 16
px = rng.standard_normal((points, 8)).astype(np.float32)
cx = rng.standard_normal((k_, 8)).astype(np.float32)
labels = np.zeros(points, np.int32)
ks["kmeans_assign"][2, 256](px.ravel(), cx.ravel(), labels, np.int32(points), np.int32(k_))
want = ((px[:, None, :] - cx[None]) ** 2).sum(-1).argmin(1)
ok["kmeans_assign"] = bool(np.array_equal(labels, want))
print(json.dumps(ok))
"""


@pytest.fixture(scope="module")
def simulated() -> dict[str, bool]:
    pytest.importorskip("numba.cuda", reason="numba-cuda (the dev extra) runs the simulator")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(BENCHMARKS))
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, bool] = json.loads(done.stdout.splitlines()[-1])
    return result


SET = ("stencil", "reduce_branchy", "matmul_tiled", "bfs_step", "nw_wavefront", "histogram",
       "softmax_rows", "kmeans_assign")  # fmt: skip


@pytest.mark.parametrize("name", SET)
def test_each_numba_kernel_computes_what_its_cuda_c_twin_does(
    simulated: dict[str, bool], name: str
) -> None:
    assert simulated[name], name


COMPILE = r"""
import json
import numpy as np
import kernel_set_numba as k
from numba import cuda, typeof

failed = {}
for launch in k.launches(np, scale=0.01):
    types = tuple(typeof(arg) for arg in launch.args)
    try:
        cuda.compile_ptx(k.FUNCTIONS[launch.kernel], types, cc=(9, 0))
    except Exception as error:  # the compiler's own error, one line of it
        failed[launch.kernel] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
print(json.dumps(failed))
"""


def test_each_numba_kernel_compiles_for_the_arguments_the_benchmark_launches_it_with() -> None:
    # The simulator runs the kernels as Python, where bool() and range() of a one-element array
    # work; Numba's compiler types them and refuses. The first device run of the set failed all
    # eight so: each scalar argument went in as a one-element array (numpy scalars have ravel()).
    # compile_ptx needs no GPU (NVVM from the dev extra), so the launch types are checked here.
    # (Without a driver, Numba's report of a typing error fails itself: before the fix every
    # kernel read "CudaSupportError: Error at driver init" here, TypingError on the device.)
    pytest.importorskip("numba.cuda", reason="numba-cuda (the dev extra) compiles the kernels")
    env = dict(os.environ, PYTHONPATH=str(BENCHMARKS))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {}
