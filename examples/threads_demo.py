"""A small CPU-bound program for the demo: a call chain, a loop, and three worker threads.

``func_hi`` calls ``func_mid`` calls ``func_lo``; the main thread runs the chain once, then three
threads run it side by side. ``heavy`` does three times the work of ``light`` so the profile
shows a known 1:3 split.
"""

from __future__ import annotations

import sys
import threading


def light(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def heavy(n: int) -> int:
    total = 0
    for _ in range(3):
        for i in range(n):
            total += i * i % 7
    return total


def func_lo(n: int) -> int:
    return light(n) + heavy(n)


def func_mid(n: int) -> int:
    return func_lo(n)


def func_hi(n: int) -> int:
    return func_mid(n)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    func_hi(n)
    workers = [threading.Thread(target=func_hi, args=(n,), name=f"worker-{k}") for k in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print("threads_demo: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
