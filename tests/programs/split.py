"""A known 1:3 split of CPU time: ``heavy`` does three times the work of ``light``.

Usage: split.py OUT_FILE [ROUNDS]. Writes the process's CPU time (seconds) to OUT_FILE at the
end, so a test can compare it with the CPU time pyrun attributed. ROUNDS ``cpu=SECONDS`` runs
whole rounds until the process has used that much CPU time (workloads sized by measuring, the
same on fast and slow machines).
"""

import sys
import time


def work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def light(n: int) -> int:
    return work(n)


def heavy(n: int) -> int:
    return work(n) + work(n) + work(n)


def main() -> None:
    argument = sys.argv[2] if len(sys.argv) > 2 else "40"
    if argument.startswith("cpu="):
        until = float(argument[4:])
        while time.process_time() < until:
            light(20_000)
            heavy(20_000)
    else:
        for _ in range(int(argument)):
            light(20_000)
            heavy(20_000)
    with open(sys.argv[1], "w") as out:
        out.write(repr(time.process_time()))


main()
