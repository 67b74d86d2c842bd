"""A known 1:3 split of CPU time: ``heavy`` does three times the work of ``light``.

Usage: split.py OUT_FILE [ROUNDS | --cpu-seconds S]. Runs ROUNDS rounds (default 40), or whole
rounds until the rounds have used S seconds of the process's CPU time, so a test asks for an
amount of work that holds on a fast machine and a slow one alike. Writes the process's CPU time
(seconds) to OUT_FILE at the end, so a test can compare it with the CPU time pyrun attributed.
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
    if len(sys.argv) > 3 and sys.argv[2] == "--cpu-seconds":
        rounds, budget = sys.maxsize, float(sys.argv[3])
    else:
        rounds, budget = (int(sys.argv[2]) if len(sys.argv) > 2 else 40), float("inf")
    start = time.process_time()
    done = 0
    while done < rounds and time.process_time() - start < budget:
        light(20_000)  # whole rounds only: the split stays exactly 1:3
        heavy(20_000)
        done += 1
    with open(sys.argv[1], "w") as out:
        out.write(repr(time.process_time()))


main()
