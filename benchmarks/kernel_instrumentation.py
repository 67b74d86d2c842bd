"""Kernel-time overhead of pyhpctk's PTX instrumentation (issue #34's Done-when), on the device.

    python3 benchmarks/kernel_instrumentation.py OUT [--frameworks triton,cupy,numba]
                                                 [--reps 15] [--scale 1.0]
                                                 [--variants counts,counts-registers]
                                                 [--kernels stencil,softmax_rows]

Eight kernels after Rodinia and HeCBench (``kernel_set_cupy.py``, ``kernel_set_triton.py``,
``kernel_set_numba.py``:
stencil, reduction with divergent branches, tiled matrix product, BFS step, Needleman-Wunsch
wavefront, histogram with atomics, softmax, k-means assignment), each run in ONE process:

- ``plain``: the framework's own kernel;
- ``counts`` (edges mode, every probe an atomic: ``instrument()``'s default),
  ``counts-registers`` (the same counters, a loop's kept in registers and added at the kernel's
  exits: ``instrument(registers=True)``, what ``gpu=nvidia,blocks`` does under pyrun) and
  ``counts-warps`` (blocks mode with atomic probes; pyrun's ``blocks=warps`` keeps a loop's in
  registers too): compiled through the framework hooks, the program's launch unchanged;
- ``trace-chunks`` and ``trace-exact``: traced through the same hooks, each launch run by
  :class:`~pyhpctk.instrument.tracing.launcher.TracedLauncher` (exact: both passes, the
  launch's writable memory saved and restored between them).

Kernel time: CUDA events around each launch (exact: around both passes, summed), the median of
``--reps`` launches (traced: at most 5, each reads its buffers back); each kernel is sized to
run about a millisecond or more on an H100, so the launch's own cost does not dominate. Whole
program: the wall time of those launches with what each variant does on the host per launch
(counts: a synchronize, the counters read and zeroed, as pyrun does; traces: the buffers made,
zeroed, read back and freed, as the tracing launcher does: pyrun's reader zeroes only the
chunks handed out), against plain's over ``--reps`` launches, per launch. ``--variants`` and
``--kernels`` measure only those (plain always, first: the ratios' baseline). Printed
per kernel and variant as ratios to plain, then the median over the set; targets: counts ≤
1.15×, traces ≤ 1.3× kernel time, whole program ≤ 1.2×.

Checks (one ``PASS``/``FAIL`` line each): every instrumented output bit-identical to plain's;
the counts equal what each kernel's arithmetic implies (thread executions of the instruction
kinds ``truths`` names, or its loop body's runs); no trace event lost. Writes OUT/kernels.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "data" / "gpu"))

from kernel_set_cupy import Launch  # noqa: E402

from pyhpctk.instrument.frameworks import FRAMEWORKS, Collector, LoadedModule  # noqa: E402
from pyhpctk.instrument.ptx import Mode, Strategy, build, find_loops, parse  # noqa: E402

VARIANTS = ("plain", "counts", "counts-registers", "counts-warps", "trace-chunks", "trace-exact")
TARGETS = {"counts": 1.15, "counts-registers": 1.15, "counts-warps": 1.15, "trace-chunks": 1.3,
           "trace-exact": 1.3}  # fmt: skip
#: The trace buffers' cap (``--trace-gib``). Every warp takes at least one chunk of 64 events
#: (2 KiB): CuPy's stencil runs 8.4 Mi warps of a few events, 17 GiB of chunks.
TRACE_GIB = [20]
TRACED_REPS = 5  # traced launches timed at most (each reads its buffers back)
CHECKS: list[dict[str, Any]] = []


def check(what: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
    CHECKS.append({"check": what, "ok": ok, "detail": detail})


def collector_for(variant: str) -> Collector | None:
    if variant == "plain":
        return None
    if variant.startswith("trace-"):
        return Collector(traces=Strategy(variant.removeprefix("trace-")))
    mode = Mode.BLOCKS if variant == "counts-warps" else Mode.EDGES
    return Collector(mode, registers=variant == "counts-registers")


def executions(counts: Any, ptx: str, kernel: str, prefix: str) -> int | list[int]:
    """Thread executions of the instructions starting with ``prefix``; ``loop``: the thread
    counts of the blocks inside loops (the truth must be one of them: the loop body's)."""
    cfg = build(parse(ptx).function(kernel))
    if prefix == "loop":
        inside = {b for loop in find_loops(cfg).loops for b in loop.blocks}
        return sorted({counts.block_threads[b] for b in inside})
    total = 0
    for block, threads in zip(cfg.blocks, counts.block_threads, strict=True):
        total += threads * sum(
            1 for i in block.instructions if cfg.statement(i).opcode.startswith(prefix)
        )
    return total


def check_truths(tag: str, loaded: LoadedModule, launch: Launch, kernel: str) -> None:
    counts = loaded.counts(kernel)
    for what, (prefix, expected) in launch.truths.items():
        got = executions(counts, loaded.instrumented.source, kernel, prefix)
        ok = expected in got if isinstance(got, list) else got == expected
        check(f"{tag}: {what}", ok, f"{expected}" + ("" if ok else f" (counted {got})"))


class Runner:
    """One framework's launches, events and hook."""

    def __init__(
        self,
        framework: str,
        cp: Any,
        launches: list[Launch],
        launch: Callable[[Launch, Any], None],
        fresh: Callable[[], Any],
        entry: Callable[[str, Collector], str] = lambda name, _: name,
    ) -> None:
        self.framework, self.cp, self.launches = framework, cp, launches
        self.launch = launch  # (launch, kernels) -> None: the program's own launch
        self.fresh = fresh  # the kernels compiled anew (CuPy: a new RawModule; Triton: None)
        self.entry = entry  # a kernel's PTX entry name, once loaded (Numba's are mangled)

    def outputs(self, launch: Launch) -> list[bytes]:
        self.cp.cuda.runtime.deviceSynchronize()
        return [
            bytes(np.asarray(o.cpu() if hasattr(o, "cpu") else o.get()).tobytes())
            for o in launch.outputs
        ]

    def timed(self, body: Callable[[], None]) -> float:
        start, end = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record()
        body()
        end.record()
        end.synchronize()
        return float(self.cp.cuda.get_elapsed_time(start, end))


Measured = tuple[list[bytes], list[float], float, int]  # outputs, kernel ms, wall ms, lost


def measure_traced(
    runner: Runner, launch: Launch, kernels: Any, module: LoadedModule, reps: int, kernel: str
) -> Measured:
    """Traced launches through the tracing launcher: kernel time of its passes (both, exact)."""
    from pyhpctk.instrument.tracing.launcher import TracedLauncher
    from pyhpctk.instrument.tracing.memory import CudaMemory, writable_regions

    assert module.traced is not None and module.locate is not None
    plan = module.traced.plans[kernel]
    launcher = TracedLauncher(CudaMemory(), module.locate(plan.control), plan, TRACE_GIB[0] << 30)
    grid, block = (*launch.grid, 1, 1)[:3], (*launch.block, 1, 1)[:3]
    regions = writable_regions(launch.args) if plan.strategy is Strategy.EXACT else []

    def one(passes: list[float]) -> int:
        def program_launch() -> None:
            passes.append(runner.timed(lambda: runner.launch(launch, kernels)))

        return launcher.launch(program_launch, grid, block, regions).lost

    launch.reset()
    lost = one([])
    got = runner.outputs(launch)
    times: list[float] = []
    wall0 = time.perf_counter()
    for _ in range(min(reps, TRACED_REPS)):
        passes: list[float] = []
        lost += one(passes)
        times.append(sum(passes))
    return got, times, 1e3 * (time.perf_counter() - wall0) / len(times), lost


def measure_counted(
    runner: Runner,
    launch: Launch,
    kernels: Any,
    module: LoadedModule | None,
    reps: int,
    tag: str,
    kernel: str,
) -> Measured:
    """Plain or counted launches, the program's own; counts checked against the truths."""
    if module is not None:
        module.reset()
    launch.reset()
    runner.launch(launch, kernels)
    got = runner.outputs(launch)
    if module is not None:
        check_truths(tag, module, launch, kernel)
    times = [runner.timed(lambda: runner.launch(launch, kernels)) for _ in range(reps)]
    wall0 = time.perf_counter()
    for _ in range(reps):
        runner.launch(launch, kernels)
        if module is not None:  # what pyrun does after each counted launch
            runner.cp.cuda.runtime.deviceSynchronize()
            module.counters(kernel)
            module.reset()
    runner.cp.cuda.runtime.deviceSynchronize()
    return got, times, 1e3 * (time.perf_counter() - wall0) / reps, 0


def run_kernel(runner: Runner, variant: str, launch: Launch, kernels: Any, reps: int,
               collector: Collector | None, plain: dict[str, list[bytes]],
               results: dict[str, Any]) -> None:  # fmt: skip
    tag = f"{runner.framework} {launch.kernel} {variant}"
    launch.reset()
    runner.launch(launch, kernels)  # compiles and loads: the warm-up
    runner.cp.cuda.runtime.deviceSynchronize()
    kernel = runner.entry(launch.kernel, collector) if collector else launch.kernel
    modules = collector.find(kernel) if collector else []
    if collector is not None and len(modules) != 1:
        detail = f"{len(modules)} loaded; skips {collector.skips}"
        check(f"{tag}: one instrumented module", False, detail)
        return
    module = modules[0] if modules else None
    if module is not None and module.traced is not None:
        got, times, wall, lost = measure_traced(runner, launch, kernels, module, reps, kernel)
        check(f"{tag}: no trace event lost", lost == 0, f"{lost} lost")
    else:
        got, times, wall, _ = measure_counted(runner, launch, kernels, module, reps, tag, kernel)
    if variant == "plain":
        plain[launch.kernel] = got
    else:
        check(f"{tag}: outputs bit-identical", got == plain.get(launch.kernel))
    median = statistics.median(times)
    results.setdefault(launch.kernel, {})[variant] = {"kernel_ms": median, "wall_ms": wall}
    print(f"    {tag}: kernel {median:.3f} ms, wall {wall:.3f} ms a launch", flush=True)


def run_variant(
    runner: Runner, variant: str, reps: int, plain: dict[str, list[bytes]], results: dict[str, Any]
) -> None:
    collector = collector_for(variant)
    hook = FRAMEWORKS[runner.framework]() if collector is not None else None
    if hook is not None:
        hook.install(collector)
    try:
        kernels = runner.fresh()
        for launch in runner.launches:
            try:
                run_kernel(runner, variant, launch, kernels, reps, collector, plain, results)
            except Exception as error:  # one kernel's failure: the next runs
                check(
                    f"{runner.framework} {launch.kernel} {variant}: ran", False, repr(error)[:300]
                )
                traceback.print_exc()
    finally:
        if hook is not None:
            hook.uninstall()


def summary(framework: str, results: dict[str, Any]) -> dict[str, Any]:
    """Per kernel and variant the ratios to plain; the medians over the set."""
    out: dict[str, Any] = {}
    for variant in VARIANTS[1:]:
        kernel_ratios, wall_ratios = [], []
        for kernel, by in results.items():
            if variant in by and "plain" in by:
                kernel_ratios.append(by[variant]["kernel_ms"] / by["plain"]["kernel_ms"])
                wall_ratios.append(by[variant]["wall_ms"] / by["plain"]["wall_ms"])
                print(
                    f"  {framework:7} {kernel:15} {variant:13} kernel {kernel_ratios[-1]:6.3f}x"
                    f"  whole {wall_ratios[-1]:6.3f}x"
                )
        if kernel_ratios:
            median, whole = statistics.median(kernel_ratios), statistics.median(wall_ratios)
            out[variant] = {
                "median_kernel": median,
                "median_whole": whole,
                "kernels": len(kernel_ratios),
            }
            target = TARGETS[variant]
            print(
                f"  {framework:7} MEDIAN {variant:13} kernel {median:.3f}x (target <= {target}x)"
                f"  whole {whole:.3f}x (target <= 1.2x)"
            )
    return out


def triton_runner(scale: float) -> Runner:
    import cupy as cp
    import kernel_set_triton
    import torch

    launches = kernel_set_triton.launches(torch, scale)
    return Runner(
        "triton", cp, launches, lambda launch, _: kernel_set_triton.run(launch), lambda: None
    )


def cupy_runner(scale: float) -> Runner:
    import cupy as cp
    import kernel_set_cupy

    def fresh() -> Any:
        return cp.RawModule(code=kernel_set_cupy.SOURCE, options=("-lineinfo",))

    def launch(one: Launch, module: Any) -> None:
        module.get_function(one.kernel)(one.grid, one.block, one.args)

    return Runner("cupy", cp, kernel_set_cupy.launches(cp, scale), launch, fresh)


def numba_runner(scale: float) -> Runner:
    import cupy as cp
    import kernel_set_numba

    def entry(name: str, collector: Collector) -> str:
        loaded = (k for m in collector.loaded_modules for k in m.rewritten.plans)
        return kernel_set_numba.entry(name, loaded) or name

    launches = kernel_set_numba.launches(cp, scale)
    return Runner("numba", cp, launches, kernel_set_numba.run, kernel_set_numba.kernels, entry)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--frameworks", default="triton,cupy,numba")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--scale", type=float, default=1.0, help="problem sizes (1: ~1 ms+)")
    parser.add_argument("--trace-gib", type=int, default=20, help="trace buffers' cap, GiB")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS[1:]),
        help="instrumented variants to measure (plain is always measured)",
    )
    parser.add_argument("--kernels", default="", help="kernels of the set to run (default all)")
    args = parser.parse_args(argv)
    variants = ["plain", *(v for v in args.variants.split(",") if v and v != "plain")]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}: say some of {', '.join(VARIANTS[1:])}")
    chosen = [k for k in args.kernels.split(",") if k]
    TRACE_GIB[0] = args.trace_gib
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"reps": args.reps, "scale": args.scale}
    runners = {"triton": triton_runner, "cupy": cupy_runner, "numba": numba_runner}
    for framework in args.frameworks.split(","):
        if framework == "numba":
            try:
                import numba.cuda  # noqa: F401
            except Exception as error:
                print(
                    f"SKIP numba: numba-cuda does not import here ({error!r:.200}); "
                    "its kernels are not measured"
                )
                continue
        try:
            runner = runners[framework](args.scale)
        except Exception as error:
            check(f"{framework}: set up", False, repr(error)[:300])
            continue
        missing = sorted(set(chosen) - {launch.kernel for launch in runner.launches})
        if missing:
            parser.error(f"{framework} has no kernel {missing[0]!r} in its set")
        runner.launches = [x for x in runner.launches if not chosen or x.kernel in chosen]
        results: dict[str, Any] = {}
        plain: dict[str, list[bytes]] = {}
        for variant in variants:
            run_variant(runner, variant, args.reps, plain, results)
        report[framework] = {"per_kernel": results, "medians": summary(framework, results)}
        report["checks"] = CHECKS
        (args.out / "kernels.json").write_text(json.dumps(report, indent=1))  # as it goes
        del runner
        if "torch" in sys.modules:  # the next framework gets the memory PyTorch cached
            sys.modules["torch"].cuda.empty_cache()
    report["checks"] = CHECKS
    (args.out / "kernels.json").write_text(json.dumps(report, indent=1))
    failed = [c["check"] for c in CHECKS if not c["ok"]]
    print(f"{len(CHECKS) - len(failed)} of {len(CHECKS)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
