"""Burn CPU in func_hi -> func_mid -> func_lo, then end in the way argv[1] says.

Usage: ending.py exception|exit|sigint|sigterm|os_exit|own_sigterm|kill9|crash_kill|crash_segv|
crash_abort [SECONDS]

The ``crash_*`` ways die at once after the burn, of SIGKILL, a SIGSEGV (a read of address 0)
or ``abort()``, and print the burn's CPU time (the thread's own clock) first.
"""

import os
import signal
import sys
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


def main() -> None:
    how = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
    if how == "own_sigterm":

        def handler(signum: int, frame: object) -> None:
            print("own handler ran", flush=True)
            sys.exit(7)

        previous = signal.signal(signal.SIGTERM, handler)
        assert previous == signal.SIG_DFL, previous
        assert signal.getsignal(signal.SIGTERM) is handler
    began = time.thread_time()
    func_hi(seconds)
    if how.startswith("crash_"):
        print(f"burned {time.thread_time() - began:.6f} s", flush=True)
    if how == "crash_kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "crash_segv":
        import ctypes

        ctypes.string_at(0)
    if how == "crash_abort":
        os.abort()
    if how == "exception":
        raise RuntimeError("the program failed")
    if how == "exit":
        sys.exit(3)
    if how == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    if how in ("sigterm", "own_sigterm"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    if how == "os_exit":
        os._exit(5)
    if how == "kill9":
        time.sleep(1.5)  # a checkpoint happens meanwhile
        os.kill(os.getpid(), signal.SIGKILL)


main()
