"""Each hot function's own CPU time, measured by the function itself: the truth the view tests
check pyview's screen against (issue #36).

A hot function calls ``spent(NAME, start)`` with the thread CPU clock it read on entry; it calls
nothing else of Python's in between, so its thread CPU time is its self time. ``dump`` writes
the totals (seconds, by qualified name) as JSON.
"""

import gc
import json
import threading
import time

SELF: dict[str, float] = {}
_LOCK = threading.Lock()
clock = time.thread_time


def spent(name: str, start: float) -> None:
    elapsed = clock() - start
    with _LOCK:
        SELF[name] = SELF.get(name, 0.0) + elapsed


def taken() -> dict[str, float]:
    """The totals so far, and start again from zero (one task of a process pool)."""
    with _LOCK:
        out = dict(SELF)
        SELF.clear()
    return out


def merge(parts: list[dict[str, float]]) -> None:
    for part in parts:
        for name, seconds in part.items():
            SELF[name] = SELF.get(name, 0.0) + seconds


def time_collections() -> list[float]:
    """Time every garbage collection from now on, on the collecting thread's CPU clock: the
    list's first item is their total so far, in seconds (the truth of ``<gc>``)."""
    total = [0.0, 0.0]  # the total, and the clock when the current collection began

    def phase(name: str, info: dict[str, int]) -> None:
        if name == "start":
            total[1] = clock()
        else:
            total[0] += clock() - total[1]

    gc.callbacks.append(phase)
    return total


def dump(path: str) -> None:
    with open(path, "w") as out:
        json.dump(SELF, out, indent=1, sort_keys=True)
