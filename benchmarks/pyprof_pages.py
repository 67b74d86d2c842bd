"""Benchmark: pyprof with 4 KiB pages (its default) against numpy's huge pages, in pairs.

The analysis turns numpy's ``madvise(MADV_HUGEPAGE)`` of large arrays off while it runs
(``pyhpctk.analysis.state.small_pages``); ``NUMPY_MADVISE_HUGEPAGE=1`` in the environment puts
it back, so the same sources measure both. Serial pyprof on the whole input runs in a child
process pinned to one CPU (``--cpu``, default: the fastest of a short probe on each, since the
CPUs of a virtual machine may differ), alternately with huge pages and without (AB, BA, ...),
and prints each run's wall, user and system seconds and the medians' ratios. ``--ranks N`` adds
N-rank pyprof-mpi runs in pairs the same way (``benchmarks/pyprof.py``'s launcher: wall between
two barriers). The input is ``benchmarks/pyprof.py``'s generated ``--quick`` one unless
``--measurement`` names one.

    PYTHONPATH=src python3 benchmarks/pyprof_pages.py --pairs 3 --ranks 16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pyprof as bench  # noqa: E402  (benchmarks/pyprof.py: generator and launcher)

CHILD = """
import json, os, resource, shutil, sys, time
from pathlib import Path
os.sched_setaffinity(0, {int(sys.argv[3])})
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
output = Path(sys.argv[2])
t0 = time.perf_counter()
run(ProfOptions.build([Path(sys.argv[1])], output=output, copy_sources=False))
wall = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
shutil.rmtree(output)
print("RESULT " + json.dumps({"wall": wall, "user": usage.ru_utime, "sys": usage.ru_stime,
                              "faults": usage.ru_minflt}))
"""

PROBE = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
t0 = time.perf_counter()
total = 0
for i in range(3_000_000):
    total += i * i & 0xFF
print(time.perf_counter() - t0)
"""


def fastest_cpu() -> tuple[int, str]:
    walls = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(cpu)], capture_output=True, text=True
        )
        walls[cpu] = float(done.stdout)
    best = min(walls, key=walls.__getitem__)
    spread = ", ".join(f"cpu{c} {w / walls[best]:.2f}x" for c, w in walls.items())
    return best, spread


def serial(measurement: Path, work: Path, cpu: int, huge: bool) -> dict[str, float]:
    env = dict(os.environ)
    if huge:
        env["NUMPY_MADVISE_HUGEPAGE"] = "1"
    else:
        env.pop("NUMPY_MADVISE_HUGEPAGE", None)
    os.sync()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(measurement), str(work / "db"), str(cpu)],
        env=env,
        capture_output=True,
        text=True,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"serial pyprof failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(line[len("RESULT ") :])
    return result


def ranks(measurement: Path, work: Path, n: int, huge: bool) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if huge:
        env["NUMPY_MADVISE_HUGEPAGE"] = "1"
    else:
        env.pop("NUMPY_MADVISE_HUGEPAGE", None)
    mpiexec = bench.launcher(bench.default_mpiexec())
    result = bench.launch(mpiexec, n, measurement, work / "db-mpi", None, env)
    shutil.rmtree(work / "db-mpi", ignore_errors=True)
    return float(result["wall"])  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measurement", default=None, help="default: generate the quick input")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=None, help="the serial runs' CPU")
    parser.add_argument("--ranks", type=int, default=0, help="also N-rank pyprof-mpi pairs")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pyprof-pages-", dir=args.dir))
    try:
        if args.measurement:
            measurement = Path(args.measurement)
        else:
            measurement = work / "bench.m"
            size = bench.SIZES["quick"]
            bench.generate(measurement, size["profiles"], size["nodes"])
        if args.cpu is None:
            cpu, spread = fastest_cpu()
            print(f"# serial runs on cpu{cpu}, the fastest of: {spread}")
        else:
            cpu = args.cpu
        print(f"# load average {os.getloadavg()[0]:.2f}; {args.pairs} pairs, alternating order")
        runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        walls: dict[bool, list[float]] = {True: [], False: []}
        print("| pair | pages | wall (s) | user (s) | sys (s) | minor faults |")
        print("| --- | --- | --- | --- | --- | --- |")
        for pair in range(args.pairs):
            for huge in (True, False) if pair % 2 == 0 else (False, True):
                r = serial(measurement, work, cpu, huge)
                runs[huge].append(r)
                print(
                    f"| {pair + 1} | {'2 MiB' if huge else '4 KiB'} | {r['wall']:.2f} | "
                    f"{r['user']:.2f} | {r['sys']:.2f} | {int(r['faults'])} |",
                    flush=True,
                )
        for key in ("wall", "user", "sys"):
            big = statistics.median(r[key] for r in runs[True])
            small = statistics.median(r[key] for r in runs[False])
            print(f"serial {key}: 2 MiB {big:.2f} s, 4 KiB {small:.2f} s, ratio {small / big:.3f}")
        if args.ranks:
            for pair in range(args.pairs):
                for huge in (True, False) if pair % 2 == 0 else (False, True):
                    walls[huge].append(ranks(measurement, work, args.ranks, huge))
                    time.sleep(0.5)
            big, small = statistics.median(walls[True]), statistics.median(walls[False])
            print(
                f"{args.ranks} ranks wall: 2 MiB {big:.2f} s "
                f"({', '.join(f'{w:.2f}' for w in walls[True])}), 4 KiB {small:.2f} s "
                f"({', '.join(f'{w:.2f}' for w in walls[False])}), ratio {small / big:.3f}"
            )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
