"""Benchmark: pyprof-mpi's shares by measured speed against even shares, on ranks made unequal.

Each rank binds itself to its own CPU (rank i on the i-th usable CPU, whatever the MPI; the
benchmark stops if a rank ran elsewhere), and a busy loop is pinned to
the CPUs of ``--slow`` (default: the last rank's), so those ranks run at about half speed: what a
virtual machine's CPU shared with another guest, or a core shared with another job, does to a
rank. pyprof-mpi then runs alternately with ``PYHPCTK_PYPROF_SPEEDS=even`` (equal shares) and
without it (each rank's share of the input and of cct.db in proportion to its measured speed,
``pyhpctk.analysis.balance``), in pairs (AB, BA, ...), and the driver's walls are printed
(``benchmarks/pyprof.py``'s worker: ``pipeline.run`` between two barriers) with the medians'
ratio. ``--slow ''`` leaves every rank at full speed (what the probe costs when there is nothing
to balance). The input is ``benchmarks/pyprof.py``'s generator's unless ``--measurement`` names
one.

    PYTHONPATH=src python3 benchmarks/pyprof_balance.py --ranks 2 --pairs 5
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--slow", default=None, help="ranks slowed by a busy loop (default: last)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--measurement", default=None)
    parser.add_argument("--profiles", type=int, default=256, help="generated input's profiles")
    args = parser.parse_args()
    usable = sorted(os.sched_getaffinity(0))
    if args.ranks > len(usable):
        raise SystemExit(f"--ranks {args.ranks}: only {len(usable)} CPUs usable")
    cpus = usable[: args.ranks]
    slow = [args.ranks - 1] if args.slow is None else [int(r) for r in args.slow.split(",") if r]
    work = Path(tempfile.mkdtemp(prefix="pyprof-balance-"))
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        if args.measurement:
            measurement = Path(args.measurement)
        else:
            measurement = work / "bench.m"
            bench.generate(measurement, args.profiles, bench.SIZES["quick"]["nodes"])
        mpiexec = bench.launcher(bench.default_mpiexec())
        for rank in slow:
            loop = f"import os\nos.sched_setaffinity(0, {{{cpus[rank]}}})\nwhile True: pass"
            hogs.append(subprocess.Popen([sys.executable, "-c", loop]))
        time.sleep(0.5)
        print(f"# {args.ranks} ranks on cpus {cpus}; ranks {slow or 'none'} share theirs with a "
              f"busy loop; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        walls: dict[str, list[float]] = {"even": [], "measured": []}
        for pair in range(args.pairs):
            for how in ("even", "measured") if pair % 2 == 0 else ("measured", "even"):
                env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
                env["PYPROF_BENCH_PIN"] = ",".join(map(str, cpus))  # each rank pins itself
                env.pop("PYHPCTK_PYPROF_SPEEDS", None)
                if how == "even":
                    env["PYHPCTK_PYPROF_SPEEDS"] = "even"
                result = bench.launch(mpiexec, args.ranks, measurement, work / "db", None, env)
                shutil.rmtree(work / "db", ignore_errors=True)
                ran = result.get("cpus")
                if ran != [[cpu] for cpu in cpus]:
                    raise SystemExit(f"the ranks ran on {ran}, not one each on {cpus}")
                walls[how].append(float(result["wall"]))  # type: ignore[arg-type]
                print(f"pair {pair + 1}: {how} {walls[how][-1]:.2f} s", flush=True)
        even, measured = statistics.median(walls["even"]), statistics.median(walls["measured"])
        print(f"median wall: even shares {even:.2f} s, measured speeds {measured:.2f} s, "
              f"ratio {measured / even:.3f}")  # fmt: skip
        return 0
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
