"""Benchmark: peak memory of ``pyprof`` and ``pyhpctk verify`` against the size of their input.

For each ``--sizes`` (bytes of measurement: ``1G,2G,7G``), benchmarks/pyprof.py's generator
writes a measurement directory of that size (profiles of ``--nodes`` call-path nodes, a quarter
of them GPU streams, a trace beside each), then in fresh processes:

* ``pyprof -o DB MEAS`` once per ``--limits`` entry (``default``: no option, half the memory
  available; ``none``: no limit; or a size such as ``1G``);
* ``pyhpctk verify DB`` on the database the first of those wrote;
* a process that only imports what they import (the baseline of every ratio).

Each process reports its own peak resident memory (``VmHWM`` at exit: ``ru_maxrss`` of a child
would count the launcher's memory at the fork). The table gives peak MB, the peak over the
input's size, (peak − baseline) over the input's size and the wall time. Every process runs
under ``--cap`` of address space (``RLIMIT_AS``, default 4G; ``0``: none), so that a run that
does not keep to its memory fails instead of taking the machine. The measurement and database
of a size are removed before the next size (``--keep`` keeps them).

Example (the table of benchmarks/RESULTS.md)::

    .venv/bin/python benchmarks/memory.py --sizes 1G --limits default,512M

Disk: the measurement, about twice as much for each database (a second ``--limits`` run writes
another while the first is kept) and under a limit pyprof's scratch file in ``$TMPDIR`` (about
the size of profile.db): ~6x the largest size, one size at a time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import pyprof as generator  # noqa: E402  (benchmarks/pyprof.py)

from pyhpctk.cli.pyprof import parse_size  # noqa: E402

CHILD = """\
import atexit, sys

def peak():
    with open("/proc/self/status") as status:
        hwm = next(line for line in status if line.startswith("VmHWM:"))
    sys.stderr.write(f"\\npeak {{int(hwm.split()[1]) * 1024}}\\n")

atexit.register(peak)
{body}
"""
BASELINE = "import numpy, pyhpctk.cli.main, pyhpctk.cli.pyprof, pyhpctk.formats.crosscheck"
TOOL = "from {module} import main\nsys.exit(main(sys.argv[1:]))"


def measured(body: str, arguments: list[str], cap: int) -> tuple[int, float, str]:
    """Run ``body`` in a fresh Python: (peak resident bytes, wall seconds, stderr)."""

    def limit() -> None:
        if cap:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(body=body), *arguments],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
        env=env,
    )
    wall = time.perf_counter() - start
    *err, last = done.stderr.rstrip("\n").split("\n")
    if done.returncode != 0 or not last.startswith("peak "):
        raise SystemExit(f"{arguments[:3]}...: exit status {done.returncode}:\n{done.stderr}")
    return int(last.split()[1]), wall, "\n".join(err)


def generate(where: Path, size: int, nodes: int) -> int:
    """A measurement directory of about ``size`` bytes; returns its size."""
    probe = where.with_name(where.name + "-probe")
    per_profile = generator.generate(probe, 4, nodes) / 4
    shutil.rmtree(probe)
    return generator.generate(where, max(1, round(size / per_profile)), nodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1G", help="measurement sizes, e.g. 1G,2G,7G")
    parser.add_argument("--limits", default="default", help="pyprof's --memory-limit runs")
    parser.add_argument("--nodes", type=int, default=40_000, help="call-path nodes a profile")
    parser.add_argument("--cap", default="4G", help="address space of every process (0: none)")
    parser.add_argument("--dir", default=None, help="where the inputs go (default $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the inputs")
    args = parser.parse_args()
    cap = 0 if args.cap == "0" else parse_size(args.cap)
    work = Path(tempfile.mkdtemp(prefix="memory-bench-", dir=args.dir))
    base, _, _ = measured(BASELINE, [], cap)
    mb = 1 << 20
    print(f"baseline (imports only): {base / mb:.0f} MB; cap {args.cap}; nodes {args.nodes}")
    print(
        "| tool | input | input MB | peak MB | peak / input | (peak - baseline) / input | wall s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    try:
        for text in args.sizes.split(","):
            measurement, database = work / f"m-{text}", work / f"d-{text}"
            size = generate(measurement, parse_size(text), args.nodes)
            for n, limit in enumerate(args.limits.split(",")):
                out = database if n == 0 else work / f"d-{text}-{limit}"
                option = [] if limit == "default" else ["--memory-limit", limit]
                command = [*option, "-o", str(out), str(measurement)]
                peak, wall, _ = measured(TOOL.format(module="pyhpctk.cli.pyprof"), command, cap)
                row = (f"pyprof --memory-limit {limit}", f"measurement {text}", size, peak, wall)
                print(_row(*row, base))
                if n:
                    shutil.rmtree(out)
            db_size = sum(p.stat().st_size for p in database.glob("*.db"))
            verify = ["verify", str(database)]
            peak, wall, _ = measured(TOOL.format(module="pyhpctk.cli.main"), verify, cap)
            print(_row("pyhpctk verify", f"its database ({text})", db_size, peak, wall, base))
            if not args.keep:
                shutil.rmtree(measurement)
                shutil.rmtree(database)
            sys.stdout.flush()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _row(tool: str, what: str, size: int, peak: int, wall: float, base: int) -> str:
    mb = 1 << 20
    return (
        f"| {tool} | {what} | {size / mb:,.0f} | {peak / mb:,.0f} | {peak / size:.2f} | "
        f"{(peak - base) / size:.3f} | {wall:.1f} |"
    )


if __name__ == "__main__":
    sys.exit(main())
