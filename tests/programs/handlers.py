"""The program's own signal handlers, timers and threads must keep working under pyrun.

Exits 0 when everything behaved as it would without pyrun, 1 (with a message) otherwise.
"""

import gc
import os
import signal
import sys
import threading
import time

problems = []
if threading.active_count() != 1:
    problems.append(f"threading.active_count() is {threading.active_count()}, expected 1")
if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
    problems.append(f"SIGTERM handler is {signal.getsignal(signal.SIGTERM)!r}, expected SIG_DFL")

if sys.getswitchinterval() != 0.005:
    problems.append(f"sys.getswitchinterval() is {sys.getswitchinterval()}, expected 0.005")
sys.setswitchinterval(0.002)
if sys.getswitchinterval() != 0.002:
    problems.append("sys.setswitchinterval(0.002) did not stick")

ticks = []
signal.signal(signal.SIGALRM, lambda signum, frame: ticks.append(signum))
signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
usr1 = []
signal.signal(signal.SIGUSR1, lambda signum, frame: usr1.append(signum))
os.kill(os.getpid(), signal.SIGUSR1)

results = []
worker = threading.Thread(target=lambda: results.append(sum(range(100_000))))
worker.start()
worker.join()

gc.disable()  # the program's: pyrun's own holds of the collector (3.11) must not undo it
end = time.monotonic() + 0.2
while time.monotonic() < end:
    sum(range(1000))
    cycle: list[object] = []
    cycle.append(cycle)  # garbage only a collection frees
signal.setitimer(signal.ITIMER_REAL, 0, 0)
if gc.isenabled():
    problems.append("gc.isenabled() is True after gc.disable()")
if gc.get_count()[0] <= gc.get_threshold()[0]:
    problems.append(f"the collector ran while the program had it disabled: {gc.get_count()}")
gc.enable()
if not gc.isenabled():
    problems.append("gc.enable() did not stick")

if len(ticks) < 5:
    problems.append(f"only {len(ticks)} SIGALRM ticks")
if usr1 != [signal.SIGUSR1]:
    problems.append(f"SIGUSR1 handler saw {usr1}")
if results != [sum(range(100_000))]:
    problems.append("the worker thread did not run")
if problems:
    print("; ".join(problems))
    sys.exit(1)
