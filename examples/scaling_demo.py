"""A program with a scalability bug, for pymodel: run it at several "rank counts" P.

Each phase spins on the CPU as long as its communication pattern would take on P ranks, so that
CPU-time sampling measures known behaviour: ``compute`` is constant, ``halo_exchange`` grows like
log2(P), ``allreduce`` like P and ``all_to_all`` like P² — the bug pymodel should rank first.

    for p in 2 4 8 16 32; do pyrun -e CPUTIME@200 -o m$p python scaling_demo.py $p; done
    for p in 2 4 8 16 32; do pyprof -o d$p m$p; done
    pymodel d2 d4 d8 d16 d32 --param p=2,4,8,16,32
"""

from __future__ import annotations

import math
import sys
import time


def spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def compute(p: int) -> None:
    spin(0.080)


# Each pattern also has a fixed cost (latency, set-up): 10 ms, large against sampling error.
def halo_exchange(p: int) -> None:
    spin(0.010 + 0.020 * math.log2(p))


def allreduce(p: int) -> None:
    spin(0.010 + 0.006 * p)


def all_to_all(p: int) -> None:
    spin(0.010 + 0.0008 * p * p)


def step(p: int) -> None:
    compute(p)
    halo_exchange(p)
    allreduce(p)
    all_to_all(p)


def main() -> int:
    p = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    step(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
