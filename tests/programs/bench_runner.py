"""A benchmark runner in pyperf's manner: worker processes run the benchmark (issue #21).

Usage: bench_runner.py WORKERS SECONDS [--worker K]

The runner starts WORKERS processes of this script with --worker K, one after another, through
subprocess (as pyperf's Runner does, with a fresh interpreter each). Each worker spends SECONDS
of CPU time in bench_time_func() -> task() -> inner(); the first one calibrates first (as
pyperf's first worker calibrates the loop count), so it meets the functions in another order
than the others and numbers them otherwise. After pyprof the workers' call paths are one tree.
"""

import subprocess
import sys
import time


def inner(seconds: float) -> int:
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(500):
            total += i * i % 7
    return total


def task(seconds: float) -> int:
    return inner(seconds)


def calibrate() -> int:
    return inner(0.05)


def bench_time_func(seconds: float, first: bool) -> int:
    if first:
        calibrate()
    return task(seconds)


def main() -> None:
    workers, seconds = int(sys.argv[1]), float(sys.argv[2])
    if "--worker" in sys.argv:
        bench_time_func(seconds, sys.argv[-1] == "0")
        return
    for k in range(workers):
        command = [sys.executable, __file__, str(workers), str(seconds), "--worker", str(k)]
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
