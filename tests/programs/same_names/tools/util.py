"""CPU time spent for the test programs."""

import time


def burn(seconds: float) -> int:
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(2000):
            total += i * i % 7
    return total
