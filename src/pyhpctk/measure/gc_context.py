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

On CPython 3.11 the Python sampler also holds automatic collections off while it reads the other
threads' frames (:class:`HeldOff`): a collection that started there could let the program run
on and free the frame being read (a SIGSEGV of the measured program).

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


#: CPython 3.11 starts a collection inside the allocation that crosses the threshold, the
#: allocation of a frame object that ``sys._current_frames()`` or ``f_back`` makes for another
#: thread's frame included; from 3.12 on, collections start only between two bytecodes
#: (python/cpython#97922), never inside those calls.
COLLECTS_IN_ALLOCATIONS = sys.version_info < (3, 12)

# The interpreter's own switches: hooks.py hands the program HeldOff's in their place.
_real_enable = gc.enable
_real_disable = gc.disable
_real_isenabled = gc.isenabled


class HeldOff:
    """Automatic collections held off while the Python sampler reads other threads' frames: a
    context manager (nested and concurrent holds share one; it does nothing unless ``needed``).

    Why (CPython 3.11, :data:`COLLECTS_IN_ALLOCATIONS`): the frame object that
    ``sys._current_frames()`` or ``f_back`` makes for a frame of another thread can start a
    collection, and a collection runs Python code (``gc.callbacks``: the sampler's own
    :class:`Collections` first; finalizers), which hands the GIL over when another thread asks
    for it. That thread runs on meanwhile: it returns from the frame being made an object of
    and calls another into the same memory, and when the collection ends the interpreter
    takes whatever that memory holds for the frame's object (``frame_obj``) and gives it back
    as a frame: ``'int' object has no attribute 'f_code'``, or a SIGSEGV of the program.

    The program keeps its own say: hooks.py replaces ``gc.enable``, ``gc.disable`` and
    ``gc.isenabled`` with :meth:`enable`, :meth:`disable` and :meth:`isenabled`. While a hold
    lasts, what the program asks takes effect when it ends, and ``gc.isenabled()`` tells the
    program what it asked. (A C extension's ``PyGC_Disable`` during a hold is undone by its
    end.) The lock is reentrant: a signal handler may call them inside one of them.
    """

    __slots__ = ("_depth", "_enable_after", "_lock", "needed")

    def __init__(self, needed: bool = COLLECTS_IN_ALLOCATIONS) -> None:
        self.needed = needed
        self._lock = _thread.RLock()
        self._depth = 0  # holds under way
        self._enable_after = False  # what the program wants once the holds end

    def __enter__(self) -> None:
        if self.needed:
            with self._lock:
                if not self._depth:
                    self._enable_after = _real_isenabled()
                    _real_disable()
                self._depth += 1

    def __exit__(self, *exc_info: object) -> None:
        if self.needed:
            with self._lock:
                self._depth -= 1
                if not self._depth and self._enable_after:
                    _real_enable()

    def enable(self) -> None:
        """The program's ``gc.enable()``."""
        self._switch(True)

    def disable(self) -> None:
        """The program's ``gc.disable()``."""
        self._switch(False)

    def _switch(self, on: bool) -> None:
        with self._lock:
            if self._depth:
                self._enable_after = on
            elif on:
                _real_enable()
            else:
                _real_disable()

    def isenabled(self) -> bool:
        """The program's ``gc.isenabled()``: what it asked, a hold under way or not."""
        with self._lock:
            return self._enable_after if self._depth else _real_isenabled()

    def forked(self) -> None:
        """In a forked child: no hold goes on (a thread that held one is not there), and the
        lock may have been taken by a thread of the parent."""
        self._lock = _thread.RLock()
        if self._depth:
            self._depth = 0
            if self._enable_after:
                _real_enable()


#: The process's holds (the Python sampler's, and the program's gc switches through hooks.py).
held_off = HeldOff()

__all__ = [
    "COLLECTS_IN_ALLOCATIONS",
    "GC_FUNCTION",
    "Collections",
    "HeldOff",
    "held_off",
    "listen",
    "stop_listening",
]
