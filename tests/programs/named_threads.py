"""Threads with names (issue #21 item 7): a ThreadPoolExecutor's two workers, a thread named
``loader`` that renames itself ``loader-done`` before it ends, and the main thread.

Usage: named_threads.py SECONDS [term]

Each worker and the loader spend SECONDS of CPU time in work(), the main thread SECONDS / 4.
With ``term`` the process ends by SIGTERM (at its default action) once the threads are done.
"""

import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def work(seconds: float) -> int:
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(500):
            total += i * i % 7
    return total


def load(seconds: float) -> None:
    work(seconds)
    threading.current_thread().name = "loader-done"  # the name as the thread ends counts


def main(seconds: float, term: bool) -> None:
    loader = threading.Thread(target=load, args=(seconds,), name="loader")
    loader.start()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(work, seconds) for _ in range(2)]
        work(seconds / 4)
        for future in futures:
            future.result()
    loader.join()
    if term:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # never reached: SIGTERM's default action ends the process


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2:] == ["term"])
