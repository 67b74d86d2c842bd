"""Load for pyrun's sampling engine: many threads, fork, dlopen/dlclose, fresh extensions, signals.

Usage: engine_stress.py WORK_DIR THREADS. WORK_DIR holds ``looper.so`` (a C loop, loaded and
unloaded with ctypes in a loop), ``thrower.so`` (C++ exceptions thrown through 20 frames and
caught, in a loop) and ``fresh*/fresh.so`` (one extension module per directory,
each imported once: every import is a new dlopen). The program starts THREADS short threads in
waves while other threads dlopen/dlclose, import, fork children that measure themselves and
exit with os._exit, and signal the process (SIGUSR1 from a thread, SIGALRM from an interval
timer). Halfway through the waves it sets a handler of its own for SIGTRAP and raises three,
one at a time: the handler must get exactly its three, whether pyrun's CPU samples come through
its realtime signal (the default) or through SIGTRAP (``PYHPCTK_PYRUN_CPU_TIMER=sigtrap``), where
the engine's handler stays first and passes the program's on while threads come and go. It
exits 0 when every piece did its work; anything else is a failure.
"""

import _ctypes
import ctypes
import importlib.util
import os
import signal
import sys
import threading
import time

WORK_DIR, THREADS = sys.argv[1], int(sys.argv[2])
received = {"usr1": 0, "alrm": 0, "trap": 0}
NAMES = {signal.SIGUSR1: "usr1", signal.SIGALRM: "alrm", signal.SIGTRAP: "trap"}


def on_signal(signum: int, frame: object) -> None:
    received[NAMES[signum]] += 1


def spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def short_thread(index: int, results: list[int]) -> None:
    results[index] = spin(2000 + 50 * (index % 20))
    if index % 7 == 0:
        time.sleep(0.001)


def dlopen_loop(stop: threading.Event, counts: dict[str, int]) -> None:
    path = os.path.join(WORK_DIR, "looper.so")
    while not stop.is_set():
        library = ctypes.CDLL(path)
        library.looper.restype = ctypes.c_long
        assert library.looper(20000) == 20000
        handle = library._handle
        del library
        _ctypes.dlclose(handle)
        counts["dlopen"] += 1


def throw_loop(stop: threading.Event, counts: dict[str, int]) -> None:
    library = ctypes.CDLL(os.path.join(WORK_DIR, "thrower.so"))
    library.thrower.restype = ctypes.c_long
    library.thrower.argtypes = [ctypes.c_long]
    while not stop.is_set():
        assert library.thrower(200) == 200
        counts["throws"] += 200


def import_fresh(counts: dict[str, int]) -> None:
    for name in sorted(os.listdir(WORK_DIR)):
        path = os.path.join(WORK_DIR, name, "fresh.so")
        if not name.startswith("fresh") or not os.path.exists(path):
            continue
        spec = importlib.util.spec_from_file_location("fresh", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.answer() == 42
        counts["imports"] += 1


def signaller(stop: threading.Event) -> None:
    while not stop.is_set():
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.002)


def forks(counts: dict[str, int]) -> None:
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            children = [threading.Thread(target=spin, args=(20000,)) for _ in range(4)]
            for child in children:
                child.start()
            for child in children:
                child.join()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        counts["forks"] += 1


def main() -> None:
    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGALRM, on_signal)
    signal.setitimer(signal.ITIMER_REAL, 0.003, 0.003)
    stop = threading.Event()
    counts = {"dlopen": 0, "imports": 0, "forks": 0, "throws": 0}
    helpers = [
        threading.Thread(target=dlopen_loop, args=(stop, counts)),
        threading.Thread(target=throw_loop, args=(stop, counts)),
        threading.Thread(target=signaller, args=(stop,)),
    ]
    for helper in helpers:
        helper.start()
    try:
        results = run_waves(counts)
    finally:
        stop.set()
        for helper in helpers:
            helper.join()
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
    assert all(results), "every thread did its work"
    assert counts["dlopen"] > 0 and counts["imports"] > 0 and counts["forks"] == 3, counts
    assert counts["throws"] > 0, counts
    assert received["usr1"] > 0 and received["alrm"] > 0, received
    assert received["trap"] == 3, received
    print("stress ok", counts, received, flush=True)


def raise_traps(count: int) -> None:
    """Raise SIGTRAP ``count`` times, each once the handler has run for the one before.

    Traps raised back to back may merge: a standard signal already pending (sent to the process
    while the thread that will take it is busy or has it blocked) is not queued twice, and
    Python runs a handler once for all the signals of one number that arrived before the main
    thread got to them (CI saw 2 of 3 under load). One at a time, each must reach the handler
    within 10 s, or it was lost.
    """
    signal.signal(signal.SIGTRAP, on_signal)
    for sent in range(1, count + 1):
        os.kill(os.getpid(), signal.SIGTRAP)
        deadline = time.monotonic() + 10
        while received["trap"] < sent and time.monotonic() < deadline:
            time.sleep(0.001)


def run_waves(counts: dict[str, int]) -> list[int]:
    results = [0] * THREADS
    wave = 25
    for start in range(0, THREADS, wave):
        threads = [
            threading.Thread(target=short_thread, args=(i, results))
            for i in range(start, min(THREADS, start + wave))
        ]
        for thread in threads:
            thread.start()
        if start == 0:
            import_fresh(counts)
        if start == (wave if wave < THREADS else 0):
            forks(counts)
        if start == wave * (THREADS // wave // 2):
            raise_traps(3)
        for thread in threads:
            thread.join()
    return results


main()
