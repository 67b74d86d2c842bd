"""Garbage collection as a calling context (issue #36 item 4): ``<gc>`` under the allocating line.

A collection runs when an allocation crosses the collector's threshold, on whichever thread
allocated, with the GIL held; without pyrun telling it apart, its time is that of the line that
allocated. The interpreter announces each collection to ``gc.callbacks`` ("start", then
"stop", on the collecting thread), and pyrun listens there (docs/pyrun.md, "Garbage
collection"):

- under the engine, its C callback (``_engine.gc_callback``) marks the collecting thread and
  the Python frame running when the collection began; a sample the thread takes until "stop"
  gets a ``<gc>`` frame right under that frame, above whatever the collection runs (finalizers,
  a native module's deallocators). The time is sampled like any other.
- the Python sampler cannot sample inside a collection (its thread needs the GIL the collection
  holds; the time lands in the delta of the thread's next sample). :class:`Collections` times
  each collection on the collecting thread's own CPU and wall clocks, with the stack that
  triggered it, and the sampler moves that much of the thread's next delta to ``<gc>`` under
  that stack (:meth:`~.sampling.python.PythonSampler.sample`).

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import _thread
import gc
import sys
import time

from pyhpctk.formats.hpcrun_constants import LOGICAL_FID_SHIFT as FID_SHIFT
from pyhpctk.measure.cct import python_frame_ips

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

    from pyhpctk.measure.cct import FunctionTable

#: The function name of a collection's frame (a frame that is no code object, like
#: ``<unknown code>``).
GC_FUNCTION = "<gc>"


def listen(callback: Callable[[str, dict[str, Any]], object]) -> None:
    """Have ``callback`` told of every collection (first, so that it sees the others' time)."""
    if callback not in gc.callbacks:
        gc.callbacks.insert(0, callback)


def stop_listening(callback: Callable[[str, dict[str, Any]], object]) -> None:
    while callback in gc.callbacks:
        gc.callbacks.remove(callback)


class Collections:
    """Each thread's collections since the sampler last took them: CPU and wall time, by the
    stack that triggered them (the Python sampler's view; see the module docstring)."""

    __slots__ = ("_functions", "_started", "gc_ip", "pending")

    def __init__(self, functions: FunctionTable) -> None:
        self._functions = functions
        self._started: dict[int, tuple[float, float, tuple[int, ...]]] = {}
        #: thread ident -> {the collection's path, innermost first: [cpu s, wall s]}
        self.pending: dict[int, dict[tuple[int, ...], list[float]]] = {}
        self.gc_ip = functions.named(GC_FUNCTION) << FID_SHIFT

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        ident = _thread.get_ident()
        if phase == "start":
            functions = self._functions
            try:
                caller: FrameType | None = sys._getframe(1)
            except ValueError:  # started outside any Python frame (a thread's start or end in C)
                caller = None
            ips = python_frame_ips(caller, functions, functions.fid_of)
            path = (self.gc_ip, *ips)
            self._started[ident] = (time.thread_time(), time.monotonic(), path)
            return
        started = self._started.pop(ident, None)
        if started is None:
            return
        cpu, wall, path = started
        spent = self.pending.setdefault(ident, {}).setdefault(path, [0.0, 0.0])
        spent[0] += time.thread_time() - cpu
        spent[1] += time.monotonic() - wall

    def take(
        self, ident: int, cpu: float, wall: float
    ) -> dict[tuple[int, ...], list[float]] | None:
        """The collections of thread ``ident`` since the last call (None: none), its CPU clock
        reading ``cpu`` and the wall clock ``wall`` now. A collection under way counts up to
        now (the sampler takes the GIL while the program's own Python callbacks run inside
        one); the rest of it goes to the next call."""
        started = self._started.get(ident)
        if started is not None:
            began_cpu, began_wall, path = started
            spent = self.pending.setdefault(ident, {}).setdefault(path, [0.0, 0.0])
            spent[0] += max(0.0, cpu - began_cpu)
            spent[1] += max(0.0, wall - began_wall)
            self._started[ident] = (cpu, wall, path)
        return self.pending.pop(ident, None) if self.pending else None

    def reset(self) -> None:
        """A forked child: the parent's collections are not its own."""
        self._started.clear()
        self.pending.clear()


__all__ = ["GC_FUNCTION", "Collections", "listen", "stop_listening"]
