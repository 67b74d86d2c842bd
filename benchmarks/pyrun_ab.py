"""What sampling costs a program, measured inside one process: phases with and without pyrun.

``pyrun_cpu.py`` compares separate processes, plain and measured, round after round. On a
machine whose speed drifts (a virtual machine whose neighbours come and go; the device machine
ran the same plain work 0.94-1.27x as fast in runs minutes apart, 2026-12-06) and where two
processes of the same program differ by their memory layout, a 2 % cost is below what that
comparison resolves: pyrun at 1 Hz, which samples almost nothing, came out 0.94x to 1.03x of
plain in four runs. Here one process alternates phases of the same work, each about
``--phase`` seconds, with pyrun's measurement stopped (``off``) and running (``on``, CPU time
sampled at ``--rate`` by the engine, native frames as ``PYHPCTK_PYRUN_NATIVE`` says: on unless
"0"), in the order off-on-on-off so that a drift in time hits both alike, and reports the
median over pairs of ``on / off`` for the phase's wall time and its process CPU time. What it
measures is the cost of sampling itself (signals, the handler, the drain's work, the monitor);
what it leaves out is start-up and the end (writing the profiles), which ``pyrun_cpu.py``'s
command wall ratio shows, and any difference of memory layout that pyrun's imports make.

Workloads: ``one-thread`` (a Python loop in one thread), ``three-threads`` (the same loop in
three threads at once; the phase ends when all three have done their share), ``numpy``
(``np.sort`` and a matrix product on one BLAS thread, and a Python loop). Rates in Hz.

    PYTHONPATH=src python3 benchmarks/pyrun_ab.py --rates 200,1000 --pairs 20
    PYTHONPATH=src python3 benchmarks/pyrun_ab.py --cpus 2-5 --workloads one-thread
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
for path in (SRC, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pyrun_cpu import pin_cpus  # noqa: E402  (beside this script)

from pyhpctk.measure import runtime  # noqa: E402
from pyhpctk.measure.events import EventSpec  # noqa: E402


def python_loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def one_thread(size: int) -> None:
    python_loop(size)


def three_threads(size: int) -> None:
    threads = [threading.Thread(target=python_loop, args=(size,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def numpy_work(size: int) -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    a = rng.random((160, 160))
    for _ in range(max(1, size // 20000)):
        np.sort(rng.random(4000))
        a @ a
    python_loop(size // 2)


WORKLOADS: dict[str, Callable[[int], None]] = {
    "one-thread": one_thread,
    "three-threads": three_threads,
    "numpy": numpy_work,
}


def timed(work: Callable[[int], None], size: int) -> tuple[float, float]:
    """Wall and process CPU seconds of one phase."""
    wall, cpu = time.perf_counter(), time.process_time()
    work(size)
    return time.perf_counter() - wall, time.process_time() - cpu


def sized(work: Callable[[int], None], seconds: float) -> int:
    """The size that takes about ``seconds`` unmeasured (measured twice, the second kept)."""
    size = 20000
    for _ in range(2):
        took, _ = timed(work, size)
        size = max(20000, int(size * seconds / max(took, 1e-4)))
    return size


SAMPLES: list[int] = []  # samples a measured phase took in the threads alive at its end


def measured_phase(work: Callable[[int], None], size: int, rate: int) -> tuple[float, float]:
    """One phase with pyrun measuring (the session started before and stopped after it)."""
    out = tempfile.mkdtemp(prefix="pyrun-ab-")
    session = runtime.start(out, events=(EventSpec("CPUTIME", max(1, 1_000_000 // rate)),))
    if session.engine is None:
        raise SystemExit("pyrun_ab.py: the sampling engine is not built here (make env)")
    try:
        before = session.engine.module.stats()["samples"]
        took = timed(work, size)
        SAMPLES.append(session.engine.module.stats()["samples"] - before)
        return took
    finally:
        runtime.stop(session)
        shutil.rmtree(out, ignore_errors=True)


def run(workload: str, rate: int, pairs: int, phase: float) -> tuple[list[float], list[float]]:
    """``pairs`` off-on-on-off quartets' ratios (wall, CPU), two a quartet."""
    work = WORKLOADS[workload]
    size = sized(work, phase)
    measured_phase(work, size, rate)  # warm: the engine loaded, pyrun's modules imported
    walls, cpus = [], []
    for _ in range(pairs):
        off1, on1, on2, off2 = (
            timed(work, size),
            measured_phase(work, size, rate),
            measured_phase(work, size, rate),
            timed(work, size),
        )
        walls += [on1[0] / off1[0], on2[0] / off2[0]]
        cpus += [on1[1] / off1[1], on2[1] / off2[1]]
    return walls, cpus


def quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{q[0]:.3f}-{q[2]:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="one-thread,three-threads,numpy")
    parser.add_argument("--rates", default="200,1000", help="Hz, comma-separated")
    parser.add_argument("--pairs", type=int, default=10, help="off-on-on-off quartets")
    parser.add_argument("--phase", type=float, default=0.3, help="seconds of work a phase")
    parser.add_argument("--cpus", default="", help="pin this process, e.g. 2-5")
    args = parser.parse_args()
    if args.cpus:
        pin_cpus(args.cpus)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}")
    rates = [int(r) for r in args.rates.split(",") if r]
    rows = []
    for workload in workloads:
        for rate in rates:
            SAMPLES.clear()
            walls, cpus = run(workload, rate, args.pairs, args.phase)
            rows.append((workload, rate, walls, cpus, statistics.median(SAMPLES)))
            print(
                f"{workload} {rate} Hz: wall {statistics.median(walls):.3f}x "
                f"cpu {statistics.median(cpus):.3f}x",
                file=sys.stderr,
            )
    native = os.environ.get("PYHPCTK_PYRUN_NATIVE", "1").strip() != "0"
    print(
        f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; pinned to {sorted(os.sched_getaffinity(0))}; native "
        f"frames {'on' if native else 'off'}; {args.pairs} off-on-on-off quartets of "
        f"{args.phase} s phases\n"
    )
    print(
        "| workload | rate (Hz) | samples of live threads a phase | wall on/off, median |"
        " quartiles | process CPU on/off, median | quartiles |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for workload, rate, walls, cpus, samples in rows:
        print(
            f"| {workload} | {rate} | {samples:.0f} | {statistics.median(walls):.3f} | "
            f"{quartiles(walls)} | {statistics.median(cpus):.3f} | {quartiles(cpus)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
