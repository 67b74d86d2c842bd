"""Burn CPU in func_hi -> func_mid -> func_lo, print ``ready PID``, then wait to be signalled.

Usage: signals.py wait|own_usr1|restored_usr1

- ``wait``: block (``threading.Event().wait()``, as a program waiting for work) until a signal
  ends the process.
- ``own_usr1``: the program handles SIGUSR1 itself; after the signal it burns a little more and
  exits 0 (its handler must run, and run once).
- ``restored_usr1``: the program installs a SIGUSR1 handler, then restores the default; it must
  see ``SIG_DFL`` and die of SIGUSR1 as it would without pyrun.
"""

import os
import signal
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


def main() -> None:
    how = sys.argv[1]
    received = []

    def handler(signum: int, frame: object) -> None:
        # No Event.set() here: the handler runs in the main thread between two bytecodes, and
        # Event.wait() holds the event's (non-reentrant) lock around some of them; setting the
        # event from there deadlocks the program (seen once in 60 runs under load).
        received.append(signum)

    if how == "own_usr1":
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
        signal.signal(signal.SIGUSR1, handler)
        assert signal.getsignal(signal.SIGUSR1) is handler
    if how == "restored_usr1":
        signal.signal(signal.SIGUSR1, handler)
        previous = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert previous is handler, previous
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    func_hi(0.15)
    print(f"ready {os.getpid()}", flush=True)
    if how == "own_usr1":
        deadline = time.monotonic() + 30
        while not received and time.monotonic() < deadline:
            time.sleep(0.005)
        if not received:
            sys.exit("no SIGUSR1 arrived")
        func_hi(0.05)
        print(f"handled {received}", flush=True)
        return
    threading.Event().wait(30)
    sys.exit("still alive 30 s after ready")


main()
