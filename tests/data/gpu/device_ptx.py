"""Issue #34 on the device: the PTX pass's instrumented kernels against the plain ones.

    PYTHONPATH=src python3 tests/data/gpu/device_ptx.py OUT_DIR

For each kernel (tests/data/ptx/kernels.cu compiled here by nvcc, the hand-written shapes.ptx,
and Triton kernels of tests/data/ptx/triton_kernels.py compiled here by Triton), in both probe
modes: instrument, assemble with ptxas, load the cubin with CuPy, run on the same inputs as the
plain kernel and check (1) the outputs are bit-identical, (2) the counts the kernel's own
arithmetic implies (threads launched, stores, atomics, loop trips: computed here from the
inputs) equal the derived counts, (3) both modes give the same thread count for every block.
Prints one line per check and a summary; writes OUT_DIR/ptx_device.json.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cupy as cp
import numpy as np
from ptx_checks import FAILURES, RESULTS, check, executed

from pyhpctk.instrument.ptx import Counts, Mode, assemble, build, derive, find_loops, instrument
from pyhpctk.instrument.ptx import parse as parse_ptx

ROOT = Path(__file__).resolve().parents[3]
PTX_DIR = ROOT / "tests" / "data" / "ptx"


class Kernel:
    """One kernel's PTX and how to launch it with fresh inputs."""

    def __init__(self, ptx: str, name: str, arch: str) -> None:
        self.ptx, self.name, self.arch = ptx, name, arch

    def load(self, ptx: str) -> tuple[Any, dict[str, int]]:
        assembled = assemble(ptx, self.arch)
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(assembled.cubin)
        module = cp.RawModule(path=f.name)
        return module.get_function(self.name), assembled.registers

    def run(
        self, launch: Callable[[Any, tuple[Any, ...]], list[Any]], mode: Mode | None
    ) -> tuple[list[np.ndarray], Counts | None, int]:
        """Outputs (host copies), counts and registers per thread."""
        counts_buffer: tuple[Any, ...] = ()
        plan = None
        ptx = self.ptx
        if mode is not None:
            result = instrument(self.ptx, mode, kernels={self.name})
            ptx, plan = result.ptx, result.plans[self.name]
            counts_buffer = (cp.zeros(2 * plan.counters, dtype=cp.uint64),)
        function, registers = self.load(ptx)
        outputs = [cp.asnumpy(o) for o in launch(function, counts_buffer)]
        cp.cuda.Device().synchronize()
        counts = None
        if plan is not None:
            counts = derive(plan, cp.asnumpy(counts_buffer[0]).reshape(-1, 2))
        return outputs, counts, registers[self.name]


def compare(kernel: Kernel, launch: Callable[..., list[Any]], truths: dict[str, Callable]) -> None:  # type: ignore[type-arg]
    plain, _, plain_regs = kernel.run(launch, None)
    by_mode: dict[Mode, Counts] = {}
    for mode in Mode:
        outputs, counts, regs = kernel.run(launch, mode)
        assert counts is not None
        by_mode[mode] = counts
        same = all(a.tobytes() == b.tobytes() for a, b in zip(plain, outputs, strict=True))
        check(f"{kernel.name} {mode.value}: outputs bit-identical", same, True)
        print(f"    {kernel.name} {mode.value}: registers {regs} (plain {plain_regs}), "
              f"{counts.plan.counters} counters for {counts.plan.blocks} blocks")  # fmt: skip
        RESULTS.append({"kernel": kernel.name, "mode": mode.value, "registers": regs,
                        "plain_registers": plain_regs,
                        "counters": counts.plan.counters, "blocks": counts.plan.blocks,
                        "block_threads": list(counts.block_threads),
                        "block_warps": list(counts.block_warps or [])})  # fmt: skip
        for what, truth in truths.items():
            pair = truth(counts)
            if pair is not None:  # None: this truth needs the other mode's counts
                check(f"{kernel.name} {mode.value}: {what}", *pair)
    check(f"{kernel.name}: thread counts of both modes agree",
          by_mode[Mode.EDGES].block_threads, by_mode[Mode.BLOCKS].block_threads)  # fmt: skip


def entry(threads: int) -> Callable[[Counts], tuple[int, int]]:
    return lambda c: (c.block_threads[0], threads)


def one_output(
    shape: int | tuple[int, ...],
    dtype: Any,
    grid: tuple[int, ...],
    block: tuple[int, ...],
    before: tuple[Any, ...],
    after: tuple[Any, ...] = (),
    shared: int = 0,
) -> Callable[[Any, tuple[Any, ...]], list[Any]]:
    """A launch writing one zeroed output, passed between the ``before`` and ``after`` args."""

    def launch(f: Any, extra: tuple[Any, ...]) -> list[Any]:
        result = cp.zeros(shape, dtype=dtype)
        f(grid, block, (*before, result, *after, *extra), shared_mem=shared)
        return [result]

    return launch


def random_graph(rng: np.random.Generator, v: int) -> tuple[tuple[Any, ...], int, int]:
    """A CSR graph of ``v`` vertices on the device (row, col, level), the sum of the frontier's
    degrees (level 0) and how many of their neighbours are unvisited (level -1)."""
    degree = rng.integers(0, 9, v)
    row = np.concatenate([[0], np.cumsum(degree)]).astype(np.int32)
    col = rng.integers(0, v, int(row[-1])).astype(np.int32)
    level = rng.choice(np.array([-1, 0, 1], dtype=np.int32), v)
    frontier = np.flatnonzero(level == 0)
    trips = int(degree[frontier].sum())
    marks = sum(int((level[col[row[u] : row[u + 1]]] < 0).sum()) for u in frontier)
    return (cp.asarray(row), cp.asarray(col), cp.asarray(level)), trips, marks


def nvcc_kernels(arch: str, out: Path) -> None:
    ptx_path = out / "kernels_device.ptx"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    subprocess.run([nvcc, "-ptx", f"-arch={arch}", "-lineinfo", "-o", str(ptx_path),
                    str(PTX_DIR / "kernels.cu")], check=True)  # fmt: skip
    ptx = ptx_path.read_text()
    rng = np.random.default_rng(34)

    def k(name: str) -> Kernel:
        return Kernel(ptx, name, arch)

    def count(name: str, prefix: str) -> Callable[[Counts], int]:
        return lambda c: executed(c, ptx, name, prefix)

    # stencil: interior points store once
    n = 100_000
    x = cp.asarray(rng.standard_normal(n, dtype=np.float32))
    grid = (n + 255) // 256

    stencil = one_output(n, cp.float32, (grid,), (256,), (x,), (np.int32(n),))
    compare(k("stencil"), stencil, {
        "threads entering": entry(grid * 256),
        "stores": lambda c: (count("stencil", "st.global")(c), n - 2),
    })  # fmt: skip

    # reduce: every thread stores its element, then t < stride adds: 255 adds per CTA
    n = 256 * 64 + 100
    grid = (n + 255) // 256
    x = cp.asarray(rng.standard_normal(n, dtype=np.float32))

    reduce = one_output(grid, cp.float32, (grid,), (256,), (x,), (np.int32(n),))
    compare(k("reduce"), reduce, {
        "threads entering": entry(grid * 256),
        "shared stores": lambda c: (count("reduce", "st.shared")(c), grid * 256 + grid * 255),
        "global stores": lambda c: (count("reduce", "st.global")(c), grid),
    })  # fmt: skip

    # matmul: one fma per thread and k
    n = 128
    a = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))

    matmul = one_output((n, n), cp.float32, (n // 16, n // 16), (16, 16), (a, b), (np.int32(n),))
    compare(k("matmul"), matmul, {
        "threads entering": entry(n * n),
        "fma per thread and k": lambda c: (count("matmul", "fma.rn.f32")(c), n * n * n),
    })  # fmt: skip

    # bfs: a random CSR graph; the frontier walks its lists, unvisited neighbours are marked
    v = 5000
    graph, trips, marks = random_graph(rng, v)
    grid = (v + 255) // 256
    bfs = one_output(v, cp.int32, (grid,), (256,), graph, (np.int32(v), np.int32(0)))

    bfs_cfg = build(parse_ptx(ptx).function("bfs"))
    (bfs_loop,) = find_loops(bfs_cfg).loops
    compare(k("bfs"), bfs, {
        "threads entering": entry(grid * 256),
        "loop trips (sum of frontier degrees)": lambda c: (c.block_threads[bfs_loop.header], trips),
        "marks (unvisited neighbours)": lambda c: (count("bfs", "st.global")(c), marks),
    })  # fmt: skip

    # wavefront: all 2n-1 diagonals, one launch each; every cell is written once
    n = 64
    sim = cp.asarray(rng.integers(-3, 4, (n, n)).astype(np.int32))

    def wavefront(f: Any, extra: tuple[Any, ...]) -> list[Any]:
        score = cp.zeros((n + 1, n + 1), dtype=cp.int32)
        score[0, :] = cp.arange(n + 1, dtype=cp.int32) * -2
        score[:, 0] = cp.arange(n + 1, dtype=cp.int32) * -2
        for diag in range(1, 2 * n):
            f((1,), (n,), (score, sim, np.int32(n), np.int32(diag), np.int32(2), *extra))
        return [score]

    compare(k("wavefront"), wavefront, {
        "threads entering": entry(n * (2 * n - 1)),
        "cells written": lambda c: (count("wavefront", "st.global")(c), n * n),
    })  # fmt: skip

    # histogram: one shared atomic per element; one global atomic per (CTA, non-empty bin)
    n, nbins, grid = 100_000, 256, 64
    values = rng.integers(0, 1000, n).astype(np.int32)
    d_values = cp.asarray(values)
    cta = (np.arange(n) // 256) % grid
    merges = len(set(zip(cta.tolist(), (values % nbins).tolist(), strict=True)))

    histogram = one_output(
        nbins, cp.uint32, (grid,), (256,), (d_values, np.int32(n)), (np.int32(nbins),)
    )

    def atomics(space: str) -> Callable[[Counts], int]:
        return lambda c: (
            count("histogram", f"atom.{space}")(c) + count("histogram", f"red.{space}")(c)
        )

    compare(k("histogram"), histogram, {
        "threads entering": entry(grid * 256),
        "shared atomics": lambda c: (atomics("shared")(c), n),
        "global atomics": lambda c: (atomics("global")(c), merges),
    })  # fmt: skip

    # softmax: one warp a row; every element stored once
    rows, cols = 128, 1000
    x2 = cp.asarray(rng.standard_normal((rows, cols), dtype=np.float32))

    softmax = one_output((rows, cols), cp.float32, (rows,), (32,), (x2,), (np.int32(cols),))

    compare(k("softmax"), softmax, {
        "threads entering": entry(rows * 32),
        "stores": lambda c: (count("softmax", "st.global")(c), rows * cols),
    })  # fmt: skip


def shapes_kernels(arch: str) -> None:
    ptx = (PTX_DIR / "shapes.ptx").read_text()
    n = 100
    labels = {lab: b.index for b in build(parse_ptx(ptx).function("shapes")).blocks
              for lab in b.labels}  # fmt: skip
    case = [sum(1 for t in range(n) if t % 4 == r) for r in range(4)]
    loop_visits = 0
    for t in range(n):  # the loop block runs until k > t or the sum passes 100
        total, k = 0, 0
        while True:
            loop_visits += 1
            if k > t:
                break
            total += k
            if total > 100:
                break
            k += 1

    shapes = one_output(128, cp.uint32, (1,), (128,), (), (np.uint32(n),))

    compare(Kernel(ptx, "shapes", arch), shapes, {
        "threads entering": entry(128),
        "case0": lambda c: (c.block_threads[labels["case0"]], case[0]),
        "case1": lambda c: (c.block_threads[labels["case1"]], case[1]),
        "case2 (its own and case1's)": lambda c: (c.block_threads[labels["case2"]],
                                                  case[1] + case[2]),
        "case3": lambda c: (c.block_threads[labels["case3"]], case[3]),
        "loop visits": lambda c: (c.block_threads[labels["loop"]], loop_visits),
        "done": lambda c: (c.block_threads[labels["done"]], n),
    })  # fmt: skip
    cfg = build(parse_ptx(ptx).function("twoswitch"))
    two = {lab: b.index for b in cfg.blocks for lab in b.labels}
    for b in cfg.blocks:  # the switches' blocks have no label a branch names: find their brx
        if b.terminator is not None and cfg.statement(b.terminator).base_opcode == "brx":
            table = cfg.statement(b.terminator).operands[-1]
            two[{"tx": "first", "ty": "second"}[table]] = b.index

    twoswitch = one_output(128, cp.uint32, (1,), (128,), ())

    compare(Kernel(ptx, "twoswitch", arch), twoswitch, {
        "first switch": lambda c: (c.block_threads[two["first"]], 32),
        "second switch": lambda c: (c.block_threads[two["second"]], 96),
        "even": lambda c: (c.block_threads[two["even"]], 64),
        "odd": lambda c: (c.block_threads[two["odd"]], 64),
        "warps through the second switch": lambda c: (
            (c.block_warps[two["second"]], 3) if c.block_warps else None),
    })  # fmt: skip


def triton_kernels_on_device(capability: int) -> None:
    sys.path.insert(0, str(PTX_DIR))
    import triton_kernels as tk

    rng = np.random.default_rng(35)
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    scratch = (np.uint64(0), np.uint64(0))  # Triton's global and profile scratch: unused here

    ptx, name, warps, shared = tk.compile_kernel("bfs", capability)
    v = 3000
    graph, _, marks = random_graph(rng, v)
    bfs = one_output(v, cp.int32, (v,), (32 * warps,), graph, (np.int32(0), *scratch), shared)

    threads = 32 * warps
    compare(Kernel(ptx, name, arch), bfs, {
        "threads entering": entry(v * threads),
        "marks (every thread issues the store)":
            lambda c: (executed(c, ptx, name, "st.global"), threads * marks),
    })  # fmt: skip

    ptx, name, warps, shared = tk.compile_kernel("matmul", capability)
    n = 128
    a = cp.asarray(rng.standard_normal((n, n)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((n, n)).astype(np.float16))
    loops = find_loops(build(parse_ptx(ptx).function(name))).loops

    matmul = one_output(
        (n, n), cp.float32, (n // 32, n // 32), (32 * warps,), (a, b), (np.int32(n), *scratch),
        shared,
    )  # fmt: skip

    programs = (n // 32) ** 2
    compare(Kernel(ptx, name, arch), matmul, {
        "threads entering": entry(programs * 32 * warps),
        "one loop": lambda c: (len(loops), 1),
        # Triton pipelines the tile loop (how many trips it peels is its choice): every thread
        # of every program runs its header the same number of times
        "loop header runs a whole number of times per thread": lambda c: (
            c.block_threads[loops[0].header] % (programs * 32 * warps), 0),
    })  # fmt: skip


def main() -> int:
    out = Path(sys.argv[1])
    props = cp.cuda.runtime.getDeviceProperties(0)
    capability = props["major"] * 10 + props["minor"]
    print(f"device {props['name'].decode()} sm_{capability}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}")  # fmt: skip
    arch = f"sm_{capability}"
    for part, fn in (
        ("nvcc kernels", lambda: nvcc_kernels(arch, out)),
        ("hand-written PTX", lambda: shapes_kernels(arch)),
        ("Triton kernels", lambda: triton_kernels_on_device(capability)),
    ):
        print(f"== {part}")
        try:
            fn()
        except Exception as e:  # one part failing must not hide the others
            FAILURES.append(f"{part}: {type(e).__name__}: {e}")
            print(f"ERR {part}: {type(e).__name__}: {e}")
    (out / "ptx_device.json").write_text(json.dumps(RESULTS, indent=1))
    checks = [r for r in RESULTS if "check" in r]
    print(f"== {len(checks) - len(FAILURES)} of {len(checks)} checks passed; failures: {FAILURES}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
