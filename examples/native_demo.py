"""Native frames under Python lines: a numpy matrix product on two OpenBLAS threads.

    OPENBLAS_NUM_THREADS=2 pyrun -o m python native_demo.py
    pystruct m          # the native libraries the samples reached: functions, loops, lines
    pyprof -o d m && pyview d

pyview shows the product's line, then numpy's C functions, then OpenBLAS's driver and kernel
(``dgemm_kernel_*``) with their loops, in the main thread and in OpenBLAS's own thread, which
Python never started (docs/pyrun.md, "Native frames").
"""

from __future__ import annotations

import sys

import numpy as np


def product(a: np.ndarray, rounds: int) -> float:
    total = 0.0
    for _ in range(rounds):
        total += float((a @ a).sum())  # the line the BLAS time is under
    return total


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    a = np.random.default_rng(0).random((500, 500))
    print(f"native_demo: {product(a, rounds):.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
