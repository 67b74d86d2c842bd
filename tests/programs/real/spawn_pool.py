"""A multiprocessing Pool started with ``spawn`` (issue #36's process pool).

Usage: spawn_pool.py TRUTH.json SCALE

Two worker processes take tasks; each task smooths (``Kernel.smooth``), reduces
(``Kernel.reduce``) and scores (``Score.rank``) a signal and sends back the self times it
measured, which the parent adds up.
"""

import multiprocessing
import sys

from selftime import clock, dump, merge, spent, taken


class Kernel:
    def smooth(self, signal: list[float]) -> list[float]:
        start = clock()
        out = [signal[0]]
        for i in range(1, len(signal)):
            out.append((signal[i] + signal[i - 1]) / 2)
        spent("Kernel.smooth", start)
        return out

    def reduce(self, signal: list[float]) -> float:
        start = clock()
        total = 0.0
        for _ in range(2):
            total = 0.0
            for v in signal:
                total += v * v
        spent("Kernel.reduce", start)
        return total


class Score:
    def rank(self, signal: list[float]) -> int:
        start = clock()
        above = below = 0
        for v in signal + signal:
            if v > 3.0:
                above += 1
            elif v < 1.0:
                below += 1
        spent("Score.rank", start)
        return above - below


SIGNAL = [float(i % 7) for i in range(3000)]


def task(seed: int) -> dict[str, float]:
    signal = SIGNAL[seed % 7 :] + SIGNAL[: seed % 7]
    kernel = Kernel()
    smooth = kernel.smooth(signal)
    kernel.reduce(smooth)
    Score().rank(smooth)
    return taken()


def main(scale: int) -> None:
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        merge(pool.map(task, range(scale)))


if __name__ == "__main__":
    main(int(sys.argv[2]))
    dump(sys.argv[1])
