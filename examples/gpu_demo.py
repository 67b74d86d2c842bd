"""A small GPU program for the demo: a time-step loop of kernels, copies and syncs.

With CuPy and an NVIDIA GPU it runs real kernels (measure it with ``pyrun -e gpu=nvidia``);
without one it drives pyrun's simulated GPU runtime (``pyrun -e gpu=simulated``), which answers
each call with activity recorded on an H200, so the same Python lines own the same GPU work.
"""

from __future__ import annotations

import sys


def real_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return False


def run_real(steps: int) -> None:
    import cupy

    grid = cupy.random.random((512, 512), dtype=cupy.float32)
    for _ in range(steps):
        grid = stencil(grid)
        halo = cupy.asnumpy(grid[0])  # copy device -> host
        grid[-1] = cupy.asarray(halo)  # copy host -> device
    cupy.cuda.runtime.deviceSynchronize()


def stencil(grid: object) -> object:
    import cupy

    g = cupy.asarray(grid)
    return 0.25 * (
        cupy.roll(g, 1, 0) + cupy.roll(g, -1, 0) + cupy.roll(g, 1, 1) + cupy.roll(g, -1, 1)
    )


def run_simulated(steps: int) -> None:
    from pyhpctk.errors import UsageError
    from pyhpctk.measure.gpu import simulated_runtime

    try:
        gpu = simulated_runtime()
    except UsageError as error:
        sys.exit(f"gpu_demo: {error}")
    for _ in range(steps):
        simulated_stencil(gpu)
        gpu.copy()  # halo exchange: device -> host
        gpu.copy()  # and back
    gpu.synchronize()


def simulated_stencil(gpu: object) -> None:
    for _ in range(4):
        gpu.launch()  # type: ignore[attr-defined]


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if "--simulated" in sys.argv or not real_gpu():
        run_simulated(steps)
        print("gpu_demo: simulated GPU done")
    else:
        run_real(steps)
        print("gpu_demo: real GPU done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
