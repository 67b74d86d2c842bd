"""The call chain as an importable module (for multiprocessing children)."""

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
