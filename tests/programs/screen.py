"""A program whose whole calling context tree does not fit a screen (issue #21 item 3).

Usage: screen.py WORKDIR SECONDS

Writes two modules into WORKDIR and imports them: ``heavy`` spends SECONDS at import time (its
module-level code runs under the import system's frames), ``many`` defines 150 small functions.
Then main() spends 5 x SECONDS in hot() and calls each of the 150 functions for SECONDS / 50.
"""

import os
import sys
import time

BURN = """
import time


def burn(seconds):
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(500):
            total += i * i % 7
    return total
"""


def write_modules(where: str, seconds: float) -> None:
    with open(os.path.join(where, "heavy.py"), "w") as f:
        f.write(BURN + f"\nburn({seconds})\n")
    with open(os.path.join(where, "many.py"), "w") as f:
        f.write(BURN)
        for k in range(150):
            f.write(f"\n\ndef f{k}(seconds):\n    return burn(seconds)\n")


def hot(seconds: float) -> int:
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(500):
            total += i * i % 7
    return total


def main(where: str, seconds: float) -> None:
    write_modules(where, seconds)
    sys.path.insert(0, where)
    import heavy  # noqa: F401  (its import costs SECONDS)
    import many

    hot(5 * seconds)
    for k in range(150):
        getattr(many, f"f{k}")(seconds / 50)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
