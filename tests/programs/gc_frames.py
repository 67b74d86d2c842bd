"""Collections that start inside the sampler's reading of this program's frames, and hand the GIL
back to this program while they run.

Usage: gc_frames.py SECONDS

CPython 3.11 starts a collection inside whichever allocation crosses the threshold: on the
Python sampler's thread that is often the frame object ``sys._current_frames()`` or ``f_back``
makes for a frame of this program's thread. This program makes that happen at every sample:
each collection leaves two objects alive until the next one starts, so that the next allocation
of a tracked object, anywhere, collects again (threshold 1), and its ``gc.callbacks`` entry
sleeps a moment when a collection runs on a thread other than its own, as a callback that
writes a log does, so that this thread runs on meanwhile, returning from the frame being made
an object of and calling others into its memory (``small`` and ``big`` have frames of two
sizes). Prints "done" at the end.
"""

import gc
import sys
import threading
import time

OWN = threading.get_ident()
kept: list[object] = []


class Survivor:
    pass


def hand_over(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        kept.clear()
        if threading.get_ident() != OWN:
            time.sleep(0.0002)  # releases the GIL: this program's thread takes it
    else:
        kept.extend((Survivor(), Survivor()))


def leaf(n: int) -> int:
    return n + 1


def small(n: int) -> int:
    return leaf(n)


def big(n: int) -> int:
    a = b = c = d = e = f = n
    return leaf(a) + leaf(b) + leaf(c) + leaf(d) + leaf(e) + leaf(f)


def main() -> None:
    deadline = time.monotonic() + float(sys.argv[1])
    gc.callbacks.append(hand_over)
    gc.set_threshold(1)
    while time.monotonic() < deadline:
        for i in range(100):
            small(i)
            big(i)
    gc.set_threshold(700)
    gc.callbacks.remove(hand_over)
    print("done")


main()
