"""func_hi -> func_mid -> func_lo, CPU-bound; with argument ``threads`` three threads run it.

Usage: call_chain.py [SECONDS] [threads]
"""

import sys
import threading
import time


def func_lo(seconds: float) -> int:
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(2000):
            total += i * i % 7
    return total


def func_mid(seconds: float) -> int:
    return func_lo(seconds)


def func_hi(seconds: float) -> int:
    return func_mid(seconds)


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.3
if len(sys.argv) > 2 and sys.argv[2] == "threads":
    workers = [threading.Thread(target=func_hi, args=(seconds,)) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
else:
    func_hi(seconds)
