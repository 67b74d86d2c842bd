"""A real workload for ``benchmarks/pyrun_gpu_fine.py --workload stencil`` (issue #7, item 6).

    python3 benchmarks/gpu_stencil.py [--n 4096] [--steps 200] [--profiler-start]

A 2-D Jacobi relaxation in CuPy: a 5-point stencil kernel (``cupy.RawKernel``, one thread per
interior point) applied ``--steps`` times, swapping the two grids, after one warm-up step.
Prints ``{"sampled_wall_s": ..., "checksum": ...}``: the timed steps plus a synchronize.
``--profiler-start`` calls ``cudaProfilerStart()`` just before the warm-up step, with nothing
on the GPU in between. That is where ``pyrun -e gpu=nvidia,inst`` starts counting, so the
stencil kernel is the one counted (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

SOURCE = r"""
extern "C" __global__ void jacobi(const float *a, float *b, int n) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x > 0 && y > 0 && x < n - 1 && y < n - 1) {
        int i = y * n + x;
        b[i] = 0.25f * (a[i - 1] + a[i + 1] + a[i - n] + a[i + n]);
    }
}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="grid points per side")
    parser.add_argument("--steps", type=int, default=200, help="timed stencil steps")
    parser.add_argument("--profiler-start", action="store_true")
    args = parser.parse_args(argv)
    import cupy as cp

    kernel = cp.RawKernel(SOURCE, "jacobi")
    kernel.compile()
    a = cp.random.random((args.n, args.n), dtype=cp.float32)
    b = a.copy()
    block = (32, 8)
    grid = (-(-args.n // block[0]), -(-args.n // block[1]))
    n = cp.int32(args.n)
    cp.cuda.runtime.deviceSynchronize()
    if args.profiler_start:
        cp.cuda.runtime.profilerStart()
    kernel(grid, block, (a, b, n))  # warm-up (with --profiler-start: the counted kernel)
    a, b = b, a
    cp.cuda.runtime.deviceSynchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        kernel(grid, block, (a, b, n))
        a, b = b, a
    cp.cuda.runtime.deviceSynchronize()
    wall = time.perf_counter() - start
    print(json.dumps({"sampled_wall_s": wall, "checksum": float(a[1:-1, 1:-1].mean())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
