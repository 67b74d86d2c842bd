"""``sleeper`` waits (wall time, no CPU); ``burner`` computes. Usage: realtime.py [SLEEP] [BURN]"""

import sys
import time


def sleeper(seconds: float) -> None:
    time.sleep(seconds)


def burner(seconds: float) -> int:
    total = 0
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for i in range(2000):
            total += i * i % 7
    return total


sleeper(float(sys.argv[1]) if len(sys.argv) > 1 else 0.3)
burner(float(sys.argv[2]) if len(sys.argv) > 2 else 0.1)
