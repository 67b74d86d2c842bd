"""What native frames cost per sample: the engine's own count of the time it spends unwinding.

pyrun's engine times each native unwind in its handler (the monotonic clock around it; an unwind
that took 200 us or more was preempted and is left out of the time) and counts the frames it
found; ``PYHPCTK_PYRUN_DEBUG=1`` prints both at exit. This script runs a numpy
workload (a matrix product under 20 Python frames; one BLAS thread, so the main thread does the
work) under ``pyrun --native`` ROUNDS times at each rate and reports, per sample, the median
unwinding time and frames, and what that time is as a share of a thread's CPU time at the rate
(time per sample x samples per second). It is a lower bound of the cost of native frames (the
drain's extra work and the larger records are not in it) that a shared machine's load disturbs
far less than end-to-end ratios (benchmarks/pyrun_cpu.py ``--tools plain,pyrun,pyrun-nonative``
measures those).

    python benchmarks/pyrun_native_cost.py --rounds 5 --rates 200,1000
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = """
import sys, time
import numpy as np
a = np.random.default_rng(0).random((200, 200))
def deep(n):
    if n:
        return deep(n - 1)
    stop = time.thread_time() + float(sys.argv[1])
    while time.thread_time() < stop:
        a @ a
deep(20)
"""


def one_run(program: Path, out: Path, rate: int, seconds: float) -> dict[str, int]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYHPCTK_PYRUN_DEBUG="1")
    period = 1_000_000 // rate
    command = [sys.executable, "-m", "pyhpctk.cli.pyrun", "--native", "-e", f"CPUTIME@{period}"]
    done = subprocess.run(
        [*command, "-o", str(out), sys.executable, str(program), str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(line for line in done.stderr.splitlines() if "sampling engine in pid" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+) (\d+)", line.split(": ", 2)[2])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rates", default="200,1000")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pyrun-native-cost-") as work:
        program = Path(work) / "workload.py"
        program.write_text(WORKLOAD)
        for rate in (int(r) for r in args.rates.split(",")):
            per_sample, frames = [], []
            for index in range(args.rounds):
                stats = one_run(program, Path(work) / f"m{rate}-{index}", rate, args.seconds)
                samples = max(stats["samples"], 1)
                per_sample.append(stats["native_ns"] / max(stats["native_timed"], 1) / 1000)
                frames.append(stats["native_frames"] / samples)
            us = statistics.median(per_sample)
            rows.append((rate, us, statistics.median(frames), us * rate / 1e4))
    python = platform.python_version()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {python}")
    print(f"load average: {os.getloadavg()[0]:.2f}; rounds: {args.rounds}\n")
    print("| rate (Hz) | unwind time per sample (us) | native frames per sample | share of CPU |")
    print("| --- | --- | --- | --- |")
    for rate, us, count, share in rows:
        print(f"| {rate} | {us:.1f} | {count:.1f} | {share:.2f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
