"""The same function in the parent, in spawned workers and in a subprocess (issue #21 item 1).

Usage: same_code.py SECONDS [child]

Every process spends SECONDS of CPU time in spin(). The parent and the subprocess call it from
main() on the same line, so their call paths are the same; the two spawned pool workers call it
through the pool's machinery, one path for both. The subprocess first spends a little time in
warm_up(), so that pyrun meets its functions in another order than the parent's and gives them
other fids (formats.md §1.10): only their file, name and first line are the same.
"""

import multiprocessing
import subprocess
import sys
import time


def spin(seconds: float) -> int:
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(2000):
            total += i * i % 7
    return total


def warm_up() -> int:
    return spin(0.05)


def main(seconds: float, child: bool) -> None:
    if child:
        warm_up()
    spin(seconds)  # the same line in the parent and in the subprocess
    if child:
        return
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(spin, [seconds, seconds], chunksize=1)
    subprocess.run([sys.executable, __file__, str(seconds), "child"], check=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), len(sys.argv) > 2)
