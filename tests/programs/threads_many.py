"""Start short threads one after another (thread idents get reused); each burns a little CPU.

Usage: threads_many.py [COUNT]
"""

import sys
import threading
import time


def func_lo(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))


def func_hi(seconds: float) -> None:
    func_lo(seconds)


for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    worker = threading.Thread(target=func_hi, args=(0.03,))
    worker.start()
    worker.join()
