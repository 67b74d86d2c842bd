"""What pyrun's early checkpoints cost a short program (issue #32, item 7).

pyrun writes its first checkpoint 0.25 s after measuring began and backs off (each next one
after a quarter of the time measured so far, on the wall or the CPU clock, at least 100 times
the CPU time the last one took, and every ``--checkpoint`` seconds at most), so that a crash
keeps most of a short run. This
measures, inside one process measured through :mod:`pyhpctk.measure.launch.runtime` (the default
``--checkpoint 10``), how many checkpoints a run of ``--seconds`` makes and the CPU time they
take (each ``Session.checkpoint`` timed on its thread's CPU clock), against the process's CPU
time over the run: the cost the early checkpoints add, since a run shorter than 10 s wrote
none before. Workloads: THREADS threads of a Python loop (each thread is a profile to encode
and write at every checkpoint).

    PYTHONPATH=src python3 benchmarks/pyrun_checkpoints.py --seconds 2,10 --threads 1,16,64
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from pyhpctk.measure.launch import runtime  # noqa: E402


def python_loop(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for i in range(2000):
            total += i * i % 7


def measure(seconds: float, threads: int) -> tuple[int, float, float]:
    """(checkpoints, their CPU seconds, the process's CPU seconds) over one run."""
    with tempfile.TemporaryDirectory() as out:
        session = runtime.start(out, checkpoint_s=10.0, install_hooks=False)
        spent = [0.0]
        count = [0]
        checkpoint = session.checkpoint

        def timed() -> None:
            began = time.thread_time()
            checkpoint()
            spent[0] += time.thread_time() - began
            count[0] += 1

        session.checkpoint = timed  # type: ignore[method-assign]
        began = time.process_time()
        stop = threading.Event()
        workers = [threading.Thread(target=python_loop, args=(stop,)) for _ in range(threads)]
        for worker in workers:
            worker.start()
        time.sleep(seconds)
        stop.set()
        for worker in workers:
            worker.join()
        used = time.process_time() - began
        runtime.stop(session)
        return count[0], spent[0], used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", default="2,10")
    parser.add_argument("--threads", default="1,16,64")
    args = parser.parse_args()
    print(f"# {platform.node()} {platform.machine()} Python {platform.python_version()}")
    print("| run (s) | threads | checkpoints | their CPU (ms) | process CPU (s) | share |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for seconds in (float(s) for s in args.seconds.split(",")):
        for threads in (int(t) for t in args.threads.split(",")):
            count, spent, used = measure(seconds, threads)
            print(
                f"| {seconds:g} | {threads} | {count} | {spent * 1e3:.1f} | {used:.2f} |"
                f" {spent / used:.2%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
