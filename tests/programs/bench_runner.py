"""A benchmark runner in pyperf's manner: worker processes run the benchmark (issue #21).

Usage: bench_runner.py WORKERS SECONDS [--worker]

The runner starts WORKERS processes of this script with --worker, one after another, through
subprocess (as pyperf's Runner does, with a fresh interpreter each); each worker calibrates,
then spends SECONDS of CPU time in bench_time_func() -> task() -> inner(). After pyprof the
workers' call paths are one tree.
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
    return inner(0.005)


def bench_time_func(seconds: float) -> int:
    calibrate()
    return task(seconds)


def main() -> None:
    workers, seconds = int(sys.argv[1]), float(sys.argv[2])
    if "--worker" in sys.argv:
        bench_time_func(seconds)
        return
    for _ in range(workers):
        command = [sys.executable, __file__, str(workers), str(seconds), "--worker"]
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
