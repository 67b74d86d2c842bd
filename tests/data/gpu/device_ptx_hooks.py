"""Issue #34 item 2 on the device: a Triton kernel, a CuPy RawKernel and a Numba kernel, each
with a data-dependent loop, run plain, then instrumented through pyhpctk's framework hooks
(the program unchanged: same calls, same arguments), then plain again after uninstall.

    PYTHONPATH=src python3 tests/data/gpu/device_ptx_hooks.py OUT_DIR

Checks, per framework and mode: the outputs are bit-identical to the plain run's; the hook
loaded exactly one instrumented module with the kernel; the counts equal what the kernel's own
arithmetic implies (threads entering, loop-body loads or FMAs, stores), computed here from the
inputs; after uninstall the kernel runs uninstrumented. Writes OUT_DIR/ptx_hooks.json.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from ptx_checks import FAILURES, RESULTS, check, executed

from pyhpctk.instrument.frameworks import FRAMEWORKS, Collector, FrameworkError, LoadedModule
from pyhpctk.instrument.ptx import Mode


def measured(
    name: str,
    mode: Mode,
    run: Callable[[], np.ndarray],
    truths: Callable[[LoadedModule, str], dict[str, tuple[int, int]]],
) -> None:
    """Plain, instrumented and plain-again runs of ``run`` for framework ``name``."""
    plain = run()
    hook, collector = FRAMEWORKS[name](), Collector(mode)
    hook.install(collector)
    try:
        counted = run()
    finally:
        hook.uninstall()
    after = run()
    tag = f"{name} {mode.value}"
    check(f"{tag}: outputs bit-identical", counted.tobytes() == plain.tobytes(), True)
    check(f"{tag}: after uninstall bit-identical", after.tobytes() == plain.tobytes(), True)
    check(f"{tag}: one instrumented module loaded", len(collector.loaded_modules), 1)
    print(f"    skipped: {collector.skips}")
    if len(collector.loaded_modules) != 1:
        return
    (loaded,) = collector.loaded_modules
    (kernel,) = loaded.kernels
    counts = loaded.counts(kernel)
    RESULTS.append({"framework": name, "mode": mode.value, "kernel": kernel,
                    "counters": loaded.instrumented.plans[kernel].counters,
                    "block_threads": list(counts.block_threads)})  # fmt: skip
    for what, (got, expected) in truths(loaded, kernel).items():
        check(f"{tag}: {what}", got, expected)
    loaded.reset()
    check(f"{tag}: counters zeroed by reset", int(loaded.counters(kernel).sum()), 0)


def triton_case(mode: Mode) -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def ragged(x_ptr, trips_ptr, y_ptr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        acc = tl.load(x_ptr + offs)
        for _ in range(tl.load(trips_ptr + pid)):
            acc = acc * 1.5 + 1.0
        tl.store(y_ptr + offs, acc)

    rng = np.random.default_rng(34)
    grid, block = 64, 128
    x = torch.tensor(rng.standard_normal(grid * block, dtype=np.float32), device="cuda")
    trips_host = rng.integers(0, 9, grid).astype(np.int32)
    trips = torch.tensor(trips_host, device="cuda")

    def run() -> np.ndarray:
        y = torch.zeros_like(x)
        ragged[(grid,)](x, trips, y, BLOCK=block, num_warps=4)
        torch.cuda.synchronize()
        return y.cpu().numpy()

    def truths(loaded: LoadedModule, kernel: str) -> dict[str, tuple[int, int]]:
        c, src = loaded.counts(kernel), loaded.instrumented.source
        return {
            "threads entering": (c.block_threads[0], grid * block),
            "fma (one per element and trip)": (executed(c, src, kernel, "fma.rn.f32"),
                                               block * int(trips_host.sum())),
            "stores": (executed(c, src, kernel, "st.global"), grid * block),
        }  # fmt: skip

    measured("triton", mode, run, truths)


def loop_truths(threads: int, n: int, period: int) -> Callable[[LoadedModule, str], dict[str, Any]]:
    """A kernel whose thread i loads once per trip of a loop of i % period trips, and stores
    once if i < n."""

    def truths(loaded: LoadedModule, kernel: str) -> dict[str, tuple[int, int]]:
        c, src = loaded.counts(kernel), loaded.instrumented.source
        trips = int((np.arange(threads) % period).sum())
        return {
            "threads entering": (c.block_threads[0], threads),
            "loads (one per trip)": (executed(c, src, kernel, "ld.global"), trips),
            "stores": (executed(c, src, kernel, "st.global"), n),
        }

    return truths


CUPY_SOURCE = r"""
extern "C" __global__ void clamp_sum(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = 0.0f;
    for (int k = 0; k < (i % 7); ++k) {
        s += x[(i + k) % n];
    }
    if (i < n) y[i] = s > 1.0f ? 1.0f : s;
}
"""


def cupy_case(mode: Mode) -> None:
    import cupy as cp

    n, block = 100_000, 256
    grid = (n + block - 1) // block
    x = cp.asarray(np.random.default_rng(7).standard_normal(n, dtype=np.float32))

    def run() -> np.ndarray:
        kernel = cp.RawKernel(CUPY_SOURCE, "clamp_sum")  # a new object: compiles when called
        y = cp.zeros(n, cp.float32)
        kernel((grid,), (block,), (x, y, np.int32(n)))
        cp.cuda.Device().synchronize()
        return cp.asnumpy(y)

    measured("cupy", mode, run, loop_truths(grid * block, n, 7))


def numba_case(mode: Mode) -> None:
    from numba import cuda

    @cuda.jit
    def ragged(x, y, n):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        s = 0.0
        for j in range(i % 5):
            s += x[(i + j) % n]
        if i < n:
            y[i] = s

    n, block = 50_000, 128
    grid = (n + block - 1) // block
    x = cuda.to_device(np.random.default_rng(5).standard_normal(n).astype(np.float32))

    def run() -> np.ndarray:
        y = cuda.device_array(n, np.float32)
        ragged[grid, block](x, y, np.int32(n))
        cuda.synchronize()
        return np.asarray(y.copy_to_host())

    measured("numba", mode, run, loop_truths(grid * block, n, 5))


def main(out: Path) -> int:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    cases = {"triton": triton_case, "cupy": cupy_case, "numba": numba_case}
    for name, case in cases.items():
        for mode in Mode:
            try:
                case(mode)
            except FrameworkError as e:
                check(f"{name} {mode.value}: hook installed", str(e), "installed")
            except Exception:  # a device script: report and go on
                traceback.print_exc()
                check(f"{name} {mode.value}: ran", "raised", "ran")
    checks = sum(1 for r in RESULTS if "check" in r)
    print(f"{checks - len(FAILURES)} checks passed, {len(FAILURES)} failed")
    (out / "ptx_hooks.json").write_text(json.dumps(RESULTS, indent=1))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
