"""What sampling costs a program, measured inside one process: phases with and without pyrun.

``pyrun_cpu.py`` compares separate processes, plain and measured, round after round. On a
machine whose speed drifts (a virtual machine whose neighbours come and go; the device machine
ran the same plain work 0.94-1.27x as fast in runs minutes apart, 2026-12-06) and where two
processes of the same program differ by their memory layout, a 2 % cost is below what that
comparison resolves: pyrun at 1 Hz, which samples almost nothing, came out 0.94x to 1.03x of
plain in four runs. Here one process alternates phases of the same work, each about
``--phase`` seconds, with pyrun's measurement stopped (``off``) and running (``on``, CPU time
sampled at ``--rate`` by the engine, native frames as ``PYHPCTK_PYRUN_NATIVE`` says, this
script's own knob (pyrun's ``--native``/``--no-native``): on unless "0"), in the order
off-on-on-off so that a drift in time hits both alike, and reports the median over pairs of
``on / off`` for the phase's wall time and its process CPU time. What it
measures is the cost of sampling itself (signals, the handler, the drain's work, the monitor);
what it leaves out is start-up and the end (writing the profiles), which ``pyrun_cpu.py``'s
command wall ratio shows, and any difference of memory layout that pyrun's imports make.

Beside it, each quartet also runs the work under a *bare* timer signal (one-thread and numpy:
a POSIX timer on the monotonic clock at the same rate, whose realtime signal goes to the main
thread and runs an empty C handler; built here with ``cc``, skipped without one; the thread
computes throughout, so the monotonic clock stands for its CPU clock, whose timers the kernel
fires at its scheduler tick at best): the price the machine itself
asks of any in-process sampler at that rate (on a virtual machine, tens of microseconds a
signal), so that pyrun's cost reads as that floor plus pyrun's own work.

``--routes`` compares the engine's routes of CPU samples in the same quartets (each route's
phases side by side, in reverse order in the quartet's second half): ``signal`` (perf counters
that signal through O_ASYNC and the engine's realtime signal, the default) and ``sigtrap`` (perf
counters that raise SIGTRAP, Linux 5.13+, ``PYHPCTK_PYRUN_CPU_TIMER=sigtrap``). A route the
engine could not take is marked so in the table.

Workloads: ``one-thread`` (a Python loop in one thread), ``three-threads`` (the same loop in
three threads at once; the phase ends when all three have done their share), ``numpy``
(``np.sort`` and a matrix product on one BLAS thread, and a Python loop). Rates in Hz.

    PYTHONPATH=src python3 benchmarks/pyrun_ab.py --rates 200,1000 --pairs 20
    PYTHONPATH=src python3 benchmarks/pyrun_ab.py --cpus 2-5 --workloads one-thread
    PYTHONPATH=src python3 benchmarks/pyrun_ab.py --routes sigtrap,signal --rates 1000,5000
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import shutil
import statistics
import subprocess
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

from pyhpctk.measure.events import EventSpec  # noqa: E402
from pyhpctk.measure.launch import runtime  # noqa: E402

# native frames in the measured phases (pyrun --native / --no-native): on unless "0"
NATIVE = os.environ.get("PYHPCTK_PYRUN_NATIVE", "1").strip() != "0"


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


BARE = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static volatile long count;
static timer_t timer;
static void handler(int s, siginfo_t *i, void *c) { (void)s; (void)i; (void)c; count++; }
/* A timer every `period_ns` of the monotonic clock (the thread runs throughout a phase, and a
 * timer on its CPU clock would fire at the scheduler's tick at best), its signal delivered to
 * the calling thread and to an empty handler. */
int bare_start(long period_ns) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = handler;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    if (sigaction(SIGRTMIN + 11, &action, 0) != 0) return -1;
    struct sigevent event;
    memset(&event, 0, sizeof(event));
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = SIGRTMIN + 11;
    event._sigev_un._tid = syscall(SYS_gettid);
    if (timer_create(CLOCK_MONOTONIC, &event, &timer) != 0) return -1;
    struct itimerspec spec = {{period_ns / 1000000000, period_ns % 1000000000},
                              {period_ns / 1000000000, period_ns % 1000000000}};
    return timer_settime(timer, 0, &spec, 0);
}
long bare_stop(void) { timer_delete(timer); long n = count; count = 0; return n; }
"""


def bare_library(where: Path) -> ctypes.CDLL | None:
    """The bare timer signal, compiled with ``cc`` (None without one)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    (where / "bare.c").write_text(BARE)
    built = subprocess.run(
        [compiler, "-O1", "-shared", "-fPIC", "-o", str(where / "bare.so"), str(where / "bare.c"),
         "-lrt"],
        capture_output=True,
    )  # fmt: skip
    if built.returncode != 0:
        return None
    library = ctypes.CDLL(str(where / "bare.so"))
    library.bare_start.argtypes = [ctypes.c_long]
    library.bare_stop.restype = ctypes.c_long
    return library


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


ROUTES = {"signal": "signal", "sigtrap": "sigtrap"}  # --routes: PYHPCTK_PYRUN_CPU_TIMER for each
NOT_TAKEN: set[str] = set()  # routes the engine fell back from


def measured_phase(
    work: Callable[[int], None], size: int, rate: int, route: str = "signal"
) -> tuple[float, float]:
    """One phase with pyrun measuring (the session started before and stopped after it)."""
    out = tempfile.mkdtemp(prefix="pyrun-ab-")
    os.environ["PYHPCTK_PYRUN_CPU_TIMER"] = ROUTES[route]
    events = (EventSpec("CPUTIME", max(1, 1_000_000 // rate)),)
    session = runtime.start(out, events=events, native=NATIVE)
    if session.engine is None:
        raise SystemExit("pyrun_ab.py: the sampling engine is not built here (make env)")
    try:
        before = session.engine.module.stats()["samples"]
        took = timed(work, size)
        stats = session.engine.module.stats()
        SAMPLES.append(stats["samples"] - before)
        if (route == "sigtrap") != bool(stats.get("sigtrap", 0)):
            NOT_TAKEN.add(route)
        return took
    finally:
        runtime.stop(session)
        shutil.rmtree(out, ignore_errors=True)


def bare_phase(
    work: Callable[[int], None], size: int, rate: int, bare: ctypes.CDLL
) -> tuple[float, float]:
    """One phase under the bare timer signal at ``rate``."""
    if bare.bare_start(max(1, 1_000_000_000 // rate)) != 0:
        raise SystemExit("pyrun_ab.py: the bare timer could not be armed")
    try:
        return timed(work, size)
    finally:
        BARE_SIGNALS.append(bare.bare_stop())


BARE_SIGNALS: list[int] = []  # signals a bare phase took


def run(
    workload: str,
    rate: int,
    pairs: int,
    phase: float,
    bare: ctypes.CDLL | None,
    routes: list[str],
) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float]]:
    """``pairs`` quartets off-on-on-off (off-on-bare-bare-on-off with the bare signal; each
    ``on`` one phase per route): by route, the ratios of wall and of CPU to the neighbouring
    off phase (two a quartet), and of the bare phases' wall."""
    work = WORKLOADS[workload]
    size = sized(work, phase)
    for route in routes:  # warm: the engine loaded, pyrun's modules imported
        measured_phase(work, size, rate, route)
    walls: dict[str, list[float]] = {route: [] for route in routes}
    cpus: dict[str, list[float]] = {route: [] for route in routes}
    bares: list[float] = []
    for _ in range(pairs):
        off1 = timed(work, size)
        first = {route: measured_phase(work, size, rate, route) for route in routes}
        if bare is not None:
            bare1 = bare_phase(work, size, rate, bare)
            bare2 = bare_phase(work, size, rate, bare)
        second = {route: measured_phase(work, size, rate, route) for route in routes[::-1]}
        off2 = timed(work, size)
        for route in routes:
            walls[route] += [first[route][0] / off1[0], second[route][0] / off2[0]]
            cpus[route] += [first[route][1] / off1[1], second[route][1] / off2[1]]
        if bare is not None:
            bares += [bare1[0] / off1[0], bare2[0] / off2[0]]
    return walls, cpus, bares


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
    parser.add_argument(
        "--routes", default="signal", help="routes of CPU samples side by side: signal,sigtrap"
    )
    args = parser.parse_args()
    routes = [r for r in args.routes.split(",") if r]
    if not routes or any(r not in ROUTES for r in routes):
        parser.error(f"--routes: one or more of {', '.join(ROUTES)}")
    if args.cpus:
        pin_cpus(args.cpus)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}")
    rates = [int(r) for r in args.rates.split(",") if r]
    rows = []
    with tempfile.TemporaryDirectory(prefix="pyrun-ab-bare-") as where:
        bare = bare_library(Path(where))
        for workload in workloads:
            for rate in rates:
                SAMPLES.clear()
                BARE_SIGNALS.clear()
                # the bare timer follows the main thread only: not for three-threads
                floor = bare if workload != "three-threads" else None
                walls, cpus, bares = run(workload, rate, args.pairs, args.phase, floor, routes)
                signals = statistics.median(BARE_SIGNALS) if BARE_SIGNALS else None
                for route in routes:
                    rows.append((workload, rate, route, walls[route], cpus[route],
                                 statistics.median(SAMPLES), bares, signals))  # fmt: skip
                    print(
                        f"{workload} {rate} Hz {route}: wall {statistics.median(walls[route]):.3f}x"
                        f" cpu {statistics.median(cpus[route]):.3f}x"
                        + (f" bare signal {statistics.median(bares):.3f}x" if bares else ""),
                        file=sys.stderr,
                    )
    native = NATIVE
    print(
        f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; pinned to {sorted(os.sched_getaffinity(0))}; native "
        f"frames {'on' if native else 'off'}; {args.pairs} quartets of {args.phase} s phases;"
        f" bare signal {'with cc' if bare is not None else 'not built (no cc)'}\n"
    )
    print(
        "| workload | rate (Hz) | route | samples a phase | wall on/off, median | quartiles |"
        " process CPU on/off, median | quartiles | bare signal: wall/off, median (signals) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for workload, rate, route, walls, cpus, samples, bares, signals in rows:
        floor_cell = f"{statistics.median(bares):.3f} ({signals:.0f})" if bares else "n/a"
        # the workers' slots are gone (and their counts with them) when a phase ends
        counted = "n/a" if workload == "three-threads" else f"{samples:.0f}"
        print(
            f"| {workload} | {rate} | {route}{' (not taken)' if route in NOT_TAKEN else ''} | "
            f"{counted} | {statistics.median(walls):.3f} | "
            f"{quartiles(walls)} | {statistics.median(cpus):.3f} | {quartiles(cpus)} | "
            f"{floor_cell} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
