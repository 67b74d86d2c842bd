"""Issue #34 item 4 on the device: per-warp traces of a Triton kernel with a data-dependent loop.

    python3 tests/data/gpu/traces_device.py OUT_DIR [--launches N] [--quick]

Run from anywhere (it puts the checkout's ``src`` first on ``sys.path``); needs CuPy and Triton
(Python 3.12 image: torch, triton, cupy). The kernel, ``frontier``, is a BFS step: each program
whose vertex is on the frontier loops over the vertex's edges (a trip count set by the graph)
and marks unvisited neighbours, counting each mark with an atomic add, so its output
accumulates: a counting pass whose writes were not undone would double it. (The chunk pools
are sized for a chunk per warp: 64 events, 2 KiB, each.) For each check one
line, then a summary:

1. plain: Triton's PTX, assembled (ptxas of the nvcc wheel, else Triton's own) and loaded with
   CuPy; its outputs are the reference.
2. counts: the PTX pass in ``blocks`` mode (every block's warp count); outputs bit-identical.
3. traces, both strategies (``exact``: counting pass, memory restored, traced pass; ``chunks``:
   one run): outputs bit-identical to plain; no event lost; per block, the events at its site
   equal its warp count from 2; per warp (exact), its events equal its counting-pass tally;
   ``exact`` without the saved memory doubles the marks (why it saves and restores).
4. overhead: kernel time (CUDA events around each pass; exact = both passes) and wall time of a
   traced launch (host work included), median over ``--launches`` launches, against plain in
   the same run, on a larger graph.
5. recordings for CI: ``OUT_DIR/traces_exact.npz`` and ``traces_chunks.npz`` (two launches
   each, small graph), read back and checked; copy them to tests/data/gpu/ to replay them with
   ``pyrun -e gpu=simulated,traces=FILE`` (tests/test_warp_traces.py).

``--quick`` (about a minute on an H100): smaller graphs for 1 and 4 and 11 launches unless
``--launches`` says; the same checks and the same recordings (5 is the same in both).

A step that fails (an exception) says so in one line (``ERR step: ...``; its traceback goes to
the JSON) and the next step runs. Writes what it prints to ``OUT_DIR/traces_device.log`` too,
the checks, timings and failures to ``OUT_DIR/traces_device.json`` (whatever failed); exit
status 1 when a check or a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from pyhpctk.instrument.ptx import (  # noqa: E402
    Mode,
    SiteKind,
    Sites,
    Strategy,
    assemble,
    derive,
    find_ptxas,
    instrument,
    instrument_traces,
    parse,
)
from pyhpctk.instrument.tracing import recording  # noqa: E402
from pyhpctk.instrument.tracing.buffers import dim3  # noqa: E402
from pyhpctk.instrument.tracing.launcher import LaunchTrace, TracedLauncher  # noqa: E402
from pyhpctk.instrument.tracing.memory import CudaMemory, writable_regions  # noqa: E402

RESULTS: list[dict[str, Any]] = []
FAILURES: list[str] = []
TRACEBACKS: dict[str, str] = {}  # step: its traceback (the JSON's, not the log's)


def check(what: str, got: object, expected: object) -> bool:
    ok = got == expected
    RESULTS.append(
        {"check": what, "ok": ok, "got": repr(got)[:200], "expected": repr(expected)[:200]}
    )
    if not ok:
        FAILURES.append(what)
    shown = repr(got)[:300] + ("" if ok else f" (expected {repr(expected)[:300]})")
    print(f"{'ok ' if ok else 'FAIL'} {what}: {shown}")
    return ok


@triton.jit
def frontier(row_ptr, col_ptr, level_ptr, next_ptr, hits_ptr, current):
    v = tl.program_id(0)
    if tl.load(level_ptr + v) == current:
        e = tl.load(row_ptr + v)
        end = tl.load(row_ptr + v + 1)
        while e < end:  # as many trips as the vertex has edges
            w = tl.load(col_ptr + e)
            if tl.load(level_ptr + w) < 0:
                tl.store(next_ptr + w, 1)
                tl.atomic_add(hits_ptr + w, 1)  # accumulates: a second run would double it
            e += 1


SIGNATURE = {"row_ptr": "*i32", "col_ptr": "*i32", "level_ptr": "*i32", "next_ptr": "*i32",
             "hits_ptr": "*i32", "current": "i32"}  # fmt: skip


def compile_frontier(capability: int) -> tuple[str, str, int, int]:
    """(PTX, kernel name, warps, dynamic shared bytes)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=frontier, signature=SIGNATURE, constexprs={})
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
    meta = compiled.metadata
    return str(compiled.asm["ptx"]), str(meta.name), int(meta.num_warps), int(meta.shared)


def ptxas() -> Path | None:
    found = find_ptxas()
    if found is not None:
        return found
    import triton.backends.nvidia as nv

    bundled = Path(nv.__file__).parent / "bin" / "ptxas"
    return bundled if bundled.is_file() else None


class Loaded:
    """A PTX module assembled and loaded with CuPy: its kernel, registers, and its globals."""

    def __init__(self, ptx: str, name: str, arch: str) -> None:
        assembled = assemble(ptx, arch, ptxas())
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(assembled.cubin)
        self.module = cp.RawModule(path=f.name)  # loaded from the file when first used
        self.function = self.module.get_function(name)
        os.unlink(f.name)
        self.registers = assembled.registers.get(name, -1)

    def global_address(self, symbol: str) -> int:
        return int(self.module.get_global(symbol).ptr)


class Graph:
    """A random CSR graph on the device, with the levels of a BFS in progress."""

    def __init__(self, rng: np.random.Generator, v: int, max_degree: int) -> None:
        degree = rng.integers(0, max_degree + 1, v)
        row = np.concatenate([[0], np.cumsum(degree)]).astype(np.int32)
        self.col = rng.integers(0, v, int(row[-1])).astype(np.int32)
        self.level = rng.choice(np.array([-1, 0, 1], dtype=np.int32), v)
        self.row, self.v = row, v
        self.d = tuple(cp.asarray(a) for a in (row, self.col, self.level))

    def outputs(self) -> tuple[Any, Any]:
        return cp.zeros(self.v, cp.int32), cp.zeros(self.v, cp.int32)

    def marks(self, current: int) -> int:
        """How many atomic adds the step makes (the sum of hits)."""
        frontier_ = np.flatnonzero(self.level == current)
        return sum(int((self.level[self.col[self.row[u] : self.row[u + 1]]] < 0).sum())
                   for u in frontier_)  # fmt: skip


class Kernel:
    """The frontier kernel, compiled once, launched as the program would (grid: a program per
    vertex)."""

    def __init__(self, capability: int) -> None:
        self.ptx, self.name, self.warps, self.shared = compile_frontier(capability)
        self.arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
        params = parse(self.ptx).function(self.name).params
        self.scratch = tuple(np.uint64(0) for _ in range(len(params) - len(SIGNATURE)))
        self.block = dim3(32 * self.warps)

    def args(self, graph: Graph, out: tuple[Any, Any], current: int) -> tuple[Any, ...]:
        return (*graph.d, *out, np.int32(current), *self.scratch)

    def runner(self, f: Any, graph: Graph, out: tuple[Any, Any], current: int,
               extra: tuple[Any, ...] = (),
               timer: list[float] | None = None) -> Callable[[], None]:  # fmt: skip
        args = (*self.args(graph, out, current), *extra)

        def run() -> None:
            if timer is None:
                f((graph.v,), self.block, args, shared_mem=self.shared)
                return
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            f((graph.v,), self.block, args, shared_mem=self.shared)
            end.record()
            end.synchronize()
            timer.append(cp.cuda.get_elapsed_time(start, end))

        return run


def same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(
        cp.asnumpy(x).tobytes() == cp.asnumpy(y).tobytes() for x, y in zip(a, b, strict=True)
    )


def traced(kernel: Kernel, strategy: Strategy, cap: int) -> tuple[Loaded, Any, TracedLauncher]:
    module = instrument_traces(kernel.ptx, strategy, Sites.BLOCKS, kernels={kernel.name})
    plan = module.plans[kernel.name]
    loaded = Loaded(module.ptx, kernel.name, kernel.arch)
    launcher = TracedLauncher(CudaMemory(), loaded.global_address(plan.control), plan, cap)
    return loaded, plan, launcher


def correctness(kernel: Kernel, graph: Graph, current: int) -> dict[str, LaunchTrace]:
    plain = Loaded(kernel.ptx, kernel.name, kernel.arch)
    reference = graph.outputs()
    kernel.runner(plain.function, graph, reference, current)()
    cp.cuda.Device().synchronize()
    hits, marks = int(cp.asnumpy(reference[1]).sum()), graph.marks(current)
    # a scalar atomic is issued by one thread of the program, or by each (Triton's choice)
    check("plain: the hits are a whole multiple of the graph's marks",
          hits > 0 and marks > 0 and hits % marks == 0, True)  # fmt: skip
    print(f"    plain: {marks} marks, {hits} hits ({hits // max(marks, 1)} per mark)")

    counted = instrument(kernel.ptx, Mode.BLOCKS, kernels={kernel.name})
    cplan = counted.plans[kernel.name]
    cloaded = Loaded(counted.ptx, kernel.name, kernel.arch)
    counters = cp.zeros(2 * cplan.counters, cp.uint64)
    out = graph.outputs()
    kernel.runner(cloaded.function, graph, out, current, (counters,))()
    cp.cuda.Device().synchronize()
    check("counts: outputs bit-identical", same(out, reference), True)
    counts = derive(cplan, cp.asnumpy(counters).reshape(-1, 2))
    assert counts.block_warps is not None
    print(f"    registers: plain {plain.registers}, counted {cloaded.registers}")

    traces: dict[str, LaunchTrace] = {}
    for strategy in Strategy:
        loaded, plan, launcher = traced(kernel, strategy, 256 << 20)
        out = graph.outputs()
        run = kernel.runner(loaded.function, graph, out, current)
        # every array argument, as a tool that does not know which ones the kernel writes
        trace = launcher.launch(
            run, dim3(graph.v), kernel.block, writable_regions((*graph.d, *out))
        )
        name = strategy.value
        check(f"{name}: outputs bit-identical", same(out, reference), True)
        check(f"{name}: no event lost", trace.lost, 0)
        rows = trace.decode().rows
        check(f"{name}: events recorded (none would make the next checks vacuous)",
              len(rows) > 0, True)  # fmt: skip
        per_site = np.bincount(rows["site"].astype(np.int64), minlength=len(plan.sites))
        heads = [s for s in plan.sites if s.kind in (SiteKind.ENTRY, SiteKind.BLOCK)]
        check(f"{name}: events per block = its warp count (blocks mode)",
              [int(per_site[s.id]) for s in heads],
              [int(counts.block_warps[s.block]) for s in heads])  # fmt: skip
        if trace.counted is not None:
            per_warp = np.bincount(rows["warp"].astype(np.int64), minlength=len(trace.counted))
            differ = int((per_warp != trace.counted.astype(np.int64)).sum())
            check(f"{name}: events per warp = the counting pass's tally (warps that differ, "
                  f"of {len(per_warp)})", differ, 0)  # fmt: skip
        print(f"    {name}: registers {loaded.registers}, {len(rows)} events, "
              f"{len(np.unique(rows['sm']))} SMs, saved {trace.saved_bytes} bytes")  # fmt: skip
        traces[name] = trace
        if strategy is Strategy.EXACT:  # without the saved memory: the marks counted twice
            out = graph.outputs()
            launcher.launch(kernel.runner(loaded.function, graph, out, current), dim3(graph.v),
                            kernel.block, writable=())  # fmt: skip
            check("exact without save/restore: hits doubled", int(cp.asnumpy(out[1]).sum()),
                  2 * hits)  # fmt: skip
    return traces


def overhead(kernel: Kernel, graph: Graph, launches: int) -> dict[str, float]:
    """Median kernel and wall time per launch, plain and each strategy, in the same run."""
    plain = Loaded(kernel.ptx, kernel.name, kernel.arch)
    results: dict[str, float] = {}
    kernel_ms: list[float] = []
    wall: list[float] = []
    out = graph.outputs()
    run = kernel.runner(plain.function, graph, out, 0, timer=kernel_ms)
    for _ in range(3):
        run()
    kernel_ms.clear()
    for _ in range(launches):
        t = time.perf_counter()
        run()
        wall.append(time.perf_counter() - t)
    results["plain kernel ms"] = statistics.median(kernel_ms)
    results["plain wall ms"] = 1e3 * statistics.median(wall)
    for strategy in Strategy:
        loaded, _, launcher = traced(kernel, strategy, 1 << 30)
        passes: list[float] = []
        run = kernel.runner(loaded.function, graph, out, 0, timer=passes)
        per_launch, wall, lost = [], [], 0
        for n in range(launches + 2):
            passes.clear()
            t = time.perf_counter()
            trace = launcher.launch(run, dim3(graph.v), kernel.block, writable_regions(out))
            if n >= 2:  # the first two warm up
                wall.append(time.perf_counter() - t)
                per_launch.append(sum(passes))
                lost += trace.lost
        name = strategy.value
        results[f"{name} kernel ms"] = statistics.median(per_launch)
        results[f"{name} wall ms"] = 1e3 * statistics.median(wall)
        results[f"{name} kernel ratio"] = results[f"{name} kernel ms"] / results["plain kernel ms"]
        results[f"{name} wall ratio"] = results[f"{name} wall ms"] / results["plain wall ms"]
        results[f"{name} events lost"] = lost
        kernel_text = (f"kernel {results[f'{name} kernel ms']:.4f} ms "
                       f"({results[f'{name} kernel ratio']:.2f}x plain "
                       f"{results['plain kernel ms']:.4f} ms)")  # fmt: skip
        wall_text = (f"wall {results[f'{name} wall ms']:.3f} ms "
                     f"({results[f'{name} wall ratio']:.2f}x plain "
                     f"{results['plain wall ms']:.3f} ms)")  # fmt: skip
        print(f"    {name}: {kernel_text}, {wall_text}, lost {lost}")
    return results


def record(kernel: Kernel, graph: Graph, out_dir: Path, device: dict[str, Any]) -> None:
    for strategy in Strategy:
        loaded, _, launcher = traced(kernel, strategy, 64 << 20)  # a chunk for each warp
        launches = []
        for current in (0, 1):
            out = graph.outputs()
            run = kernel.runner(loaded.function, graph, out, current)
            launches.append(launcher.launch(run, dim3(graph.v), kernel.block,
                                            writable_regions(out)))  # fmt: skip
        rec = recording.TraceRecording(kernel.name, kernel.ptx, strategy, Sites.BLOCKS, (),
                                       launches, device)  # fmt: skip
        path = out_dir / f"traces_{strategy.value}.npz"
        recording.save(rec, path)
        back = recording.load(path)
        check(f"recording {path.name}: no event lost", [launch.lost for launch in launches],
              [0] * len(launches))  # fmt: skip
        check(f"recording {path.name}: read back, {len(back.launches)} launches",
              [len(launch.decode().rows) for launch in back.launches],
              [len(launch.decode().rows) for launch in launches])  # fmt: skip
        print(f"    {path} ({path.stat().st_size} bytes)")


class Tee:
    """stdout, copied into the log file."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (open for the run)
        self.stdout = sys.stdout

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        return self.stdout.write(text)

    def flush(self) -> None:
        self.stdout.flush()


def steps(
    opts: argparse.Namespace, state: dict[str, Any]
) -> Iterator[tuple[str, Callable[[], object]]]:
    """(name, what it does) of each step, in order; each after the first reads ``state``."""
    rng = np.random.default_rng(34)
    small, large = (4_096, 16_384) if opts.quick else (20_000, 65_536)
    launches = opts.launches if opts.launches is not None else (11 if opts.quick else 51)

    def compile_kernel() -> None:
        state["kernel"] = kernel = Kernel(state["device"]["capability"])
        print(f"kernel {kernel.name}: {kernel.warps} warps a program, ptxas {ptxas()}")

    yield "compile", compile_kernel
    yield "correctness", lambda: correctness(state["kernel"], Graph(rng, small, 16), 0)
    yield (
        "overhead",
        lambda: state["timings"].update(overhead(state["kernel"], Graph(rng, large, 16), launches)),
    )
    yield "recordings", lambda: record(state["kernel"], Graph(rng, 3_000, 8), opts.out,
                                       state["device"])  # fmt: skip


def describe_device() -> dict[str, Any]:
    props = cp.cuda.runtime.getDeviceProperties(0)
    return {"name": props["name"].decode(), "capability": props["major"] * 10 + props["minor"],
            "sm_count": int(props["multiProcessorCount"]),
            "clock_khz": int(props.get("clockRate", 0)),  # CUDA 13 has none
            "triton": triton.__version__, "cupy": cp.__version__, "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}  # fmt: skip


def run_steps(opts: argparse.Namespace, state: dict[str, Any]) -> None:
    """Each step in turn; one that fails is one line, and the next runs (a step that needs
    what a failed one made fails on its own, one line too)."""
    for part, fn in steps(opts, state):
        print(f"== {part}")
        began = time.monotonic()
        try:
            fn()
        except Exception as e:  # one part failing must not hide the others
            line = f"{part}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            FAILURES.append(line)
            TRACEBACKS[part] = traceback.format_exc()
            print(f"ERR {line}")
        print(f"   {part}: {time.monotonic() - began:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--launches", type=int, default=None, help="51 (--quick: 11)")
    parser.add_argument("--quick", action="store_true", help="smaller graphs, fewer launches")
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    sys.stdout = sys.stderr = Tee(opts.out / "traces_device.log")  # type: ignore[assignment]
    began = time.monotonic()
    state: dict[str, Any] = {"device": {}, "timings": {}}
    try:
        state["device"] = describe_device()
        print(f"device {state['device']}")
        run_steps(opts, state)
    except Exception as e:  # no device: still one line and the JSON
        FAILURES.append(f"device: {type(e).__name__}: {e}")
        TRACEBACKS["device"] = traceback.format_exc()
        print(f"ERR device: {type(e).__name__}: {e}")
    summary = {"device": state["device"], "quick": opts.quick, "checks": RESULTS,
               "timings": state["timings"], "failures": FAILURES, "tracebacks": TRACEBACKS,
               "seconds": round(time.monotonic() - began, 1)}  # fmt: skip
    (opts.out / "traces_device.json").write_text(json.dumps(summary, indent=1))
    passed = sum(1 for r in RESULTS if r["ok"])
    print(f"== {passed} of {len(RESULTS)} checks passed, {len(FAILURES)} failures in "
          f"{summary['seconds']} s{' (--quick)' if opts.quick else ''}: {FAILURES}")  # fmt: skip
    return 1 if FAILURES else 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    # after a kernel faulted, the context is gone: CuPy's modules, unloaded at exit, would each
    # print the fault again (a screenful); everything is written by now
    os._exit(status)
