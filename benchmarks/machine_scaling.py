"""Benchmark: what N processes that share nothing but the machine get from it, against one alone.

pyprof-mpi's parallel efficiency (``benchmarks/pyprof.py``) can be no better than what the
machine gives N independent processes of the same kind of work. This measures that bound
with no pyhpctk code at all: small probes, each a fixed amount of work, run by one process
alone and then by N processes at once (each pinned to its own logical CPU, started together
through a barrier after their set-up). For each probe it prints the walls alone and at once
and ``bound = alone / slowest at once``: the efficiency N ranks doing that work would reach if
they never waited for each other and split it perfectly.

The probes, from the least to the most memory-bound:

* ``python``: an interpreter loop over small integers (the CPU's core alone: no memory traffic);
* ``gather``: numpy fancy indexing of a 256 MiB table at random positions (cache misses,
  latency-bound, like the call-path merges and the statistics' scatters);
* ``stream``: numpy ``a = b + s * c`` over 64 MiB arrays (memory bandwidth);
* ``fresh``: numpy arrays of 32 MiB allocated, written and freed (page faults and zeroing of new
  memory: what numpy temporaries above malloc's mmap threshold cost each time); numpy asks the
  kernel for transparent huge pages for them (``madvise``), so each fault zeroes 2 MiB;
* ``fresh-4k``: the same with numpy's huge-page request turned off (4 KiB faults).

``--per-cpu`` also runs the ``python`` probe alone on each logical CPU in turn: a spread there
means some CPUs are slower than others (hardware threads sharing a core under the hypervisor,
or another guest's load). It prints the CPU topology the guest sees and the steal time
(``/proc/stat``) accumulated while the N ran at once.

    python3 benchmarks/machine_scaling.py --processes 16 --seconds 2 --per-cpu
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path

import numpy as np

MIB = 1 << 20


def probe_python(rounds: int) -> None:
    total = 0
    for _ in range(rounds):
        for i in range(10_000):
            total += i * i & 0xFF
    if total < 0:  # pragma: no cover - keeps the loop from being optimised away
        print(total)


class Gather:
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.table = rng.random(32 * MIB)  # 256 MiB of float64
        self.where = rng.integers(0, len(self.table), 2 * MIB)

    def __call__(self, rounds: int) -> None:
        for _ in range(rounds):
            self.table[self.where].sum()


class Stream:
    def __init__(self) -> None:
        n = 8 * MIB  # 64 MiB of float64 each
        self.a, self.b, self.c = np.zeros(n), np.ones(n), np.full(n, 2.0)

    def __call__(self, rounds: int) -> None:
        for _ in range(rounds):
            np.multiply(self.c, 3.0, out=self.a)
            np.add(self.a, self.b, out=self.a)


def probe_fresh(rounds: int) -> None:
    for _ in range(rounds):
        array = np.empty(4 * MIB)  # 32 MiB: above glibc's mmap threshold, so new pages each time
        array.fill(1.0)
        del array


def small_pages() -> Callable[[int], None]:
    """``fresh`` with numpy's ``madvise(MADV_HUGEPAGE)`` of large arrays turned off (what
    ``NUMPY_MADVISE_HUGEPAGE=0`` does): new memory comes in 4 KiB pages, not 2 MiB ones."""
    multiarray = getattr(np, "_core", getattr(np, "core", None)).multiarray  # type: ignore[union-attr]
    multiarray._set_madvise_hugepage(False)
    return probe_fresh


PROBES: dict[str, Callable[[], Callable[[int], None]]] = {
    "python": lambda: probe_python,
    "gather": Gather,
    "stream": Stream,
    "fresh": lambda: probe_fresh,
    "fresh-4k": small_pages,
}


def child(
    name: str, rounds: int, cpu: int | None, barrier: Barrier, results: mp.Queue[object]
) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    work = PROBES[name]()
    work(1)  # warm: pages touched, code paths taken
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    work(rounds)
    results.put((cpu, time.perf_counter() - t0, time.process_time() - c0))


def run(name: str, rounds: int, cpus: list[int | None]) -> list[tuple[int | None, float, float]]:
    """``rounds`` of probe ``name`` in one process per entry of ``cpus``, started together."""
    context = mp.get_context("fork")
    barrier = context.Barrier(len(cpus))
    results: mp.Queue[object] = context.Queue()
    processes = [
        context.Process(target=child, args=(name, rounds, cpu, barrier, results)) for cpu in cpus
    ]
    for process in processes:
        process.start()
    out = [results.get() for _ in processes]
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise SystemExit(f"probe {name} failed in a child ({process.exitcode})")
    return out  # type: ignore[return-value]


def size(name: str, seconds: float, cpu: int | None) -> int:
    """Rounds of probe ``name`` that take about ``seconds`` alone."""
    rounds = 1
    while True:
        ((_, wall, _),) = run(name, rounds, [cpu])
        if wall >= 0.2 * seconds or rounds >= 1 << 20:
            return max(1, round(rounds * seconds / wall))
        rounds *= 4


def steal_ticks() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) if len(fields) > 8 else 0


def topology(cpus: list[int]) -> str:
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((base / "physical_package_id").read_text(), (base / "core_id").read_text()))
        except OSError:
            return f"{len(cpus)} logical CPUs (cores unknown)"
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    try:
        huge = f"; huge pages {(thp / 'enabled').read_text().split('[')[1].split(']')[0]}"
        huge += f", defrag {(thp / 'defrag').read_text().split('[')[1].split(']')[0]}"
    except (OSError, IndexError):
        huge = ""
    return f"{len(cpus)} logical CPUs on {len(cores)} cores as the guest sees them, {model}{huge}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=0, help="N (default: every usable CPU)")
    parser.add_argument("--seconds", type=float, default=2.0, help="work of one probe alone")
    parser.add_argument("--probes", default=",".join(PROBES), help="which probes, in order")
    parser.add_argument("--rounds", type=int, default=3, help="alone/at-once pairs per probe")
    parser.add_argument("--per-cpu", action="store_true", help="the python probe on each CPU")
    args = parser.parse_args()
    usable = sorted(os.sched_getaffinity(0))
    n = args.processes or len(usable)
    if n > len(usable):
        raise SystemExit(f"--processes {n}: only {len(usable)} CPUs usable")
    cpus: list[int | None] = list(usable[:n])
    hz = os.sysconf("SC_CLK_TCK")
    print(f"# {topology(usable)}; load average {os.getloadavg()[0]:.2f}")
    print(f"# {n} processes, one a CPU; each probe ~{args.seconds:g} s alone, {args.rounds} pairs")
    print()
    print("| probe | alone (s) | at once: mean (s) | at once: slowest (s) | CPU s at once / alone "
          "| steal during (CPU s) | bound |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    by_cpu: list[tuple[int | None, float]] = []
    for name in [p for p in args.probes.split(",") if p]:
        if name not in PROBES:
            raise SystemExit(f"unknown probe {name!r}: one of {', '.join(PROBES)}")
        rounds = size(name, args.seconds, cpus[0])
        alone, mean, slowest, cpu_ratio, steal = [], [], [], [], []
        for _ in range(args.rounds):
            ((_, wall, cpu),) = run(name, rounds, [cpus[0]])
            s0 = steal_ticks()
            together = run(name, rounds, cpus)
            steal.append((steal_ticks() - s0) / hz)
            alone.append(wall)
            mean.append(sum(r[1] for r in together) / n)
            slowest.append(max(r[1] for r in together))
            cpu_ratio.append(sum(r[2] for r in together) / n / cpu)
        if name == "python":
            by_cpu = sorted((r[0], r[1]) for r in together)  # the last pair's, for --per-cpu
        a, m, s = np.median(alone), np.median(mean), np.median(slowest)
        print(
            f"| {name} | {a:.2f} | {m:.2f} | {s:.2f} | {np.median(cpu_ratio):.2f} | "
            f"{np.median(steal):.2f} | {a / s:.0%} |"
        )
    if args.per_cpu:
        rounds = size("python", min(args.seconds, 1.0), usable[0])
        speeds = []
        for cpu in usable:
            ((_, wall, _),) = run("python", rounds, [cpu])
            speeds.append((cpu, wall))
        fastest = min(w for _, w in speeds)
        print()
        print("python probe alone on each CPU (wall s, and against the fastest):")
        print(", ".join(f"cpu{c} {w:.2f} ({w / fastest:.2f}x)" for c, w in speeds))
        if by_cpu:
            print("python probe at once, the last pair (wall s on each CPU):")
            print(", ".join(f"cpu{c} {w:.2f}" for c, w in by_cpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
