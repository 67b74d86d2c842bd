"""A thread pool: the workers do the work, the main thread waits (issue #21 item 8).

Usage: thread_pool.py SECONDS

Two ThreadPoolExecutor workers spend SECONDS of CPU time each in work(); the main thread spends
SECONDS / 4 in its own loop, then waits for them.
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor


def work(seconds: float) -> int:
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(500):
            total += i * i % 7
    return total


def main(seconds: float) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(work, seconds) for _ in range(2)]
        work(seconds / 4)
        for future in futures:
            future.result()


if __name__ == "__main__":
    main(float(sys.argv[1]))
