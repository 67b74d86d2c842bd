"""Where a rank's time goes: seconds per stage, split into work and time inside collectives.

A rank that waits in a collective for slower ranks sees their work in its own stage time, and
MPI polls while it waits, so neither wall-clock nor CPU seconds alone say which stage holds the
critical path. :class:`TimedComm` wraps the driver's communicator and adds up the wall-clock and
CPU seconds this rank spends inside collectives; :func:`timed` runs a stage and records in the
run's ``timings``:

* ``NAME``: the stage's wall-clock seconds (what the critical path sees);
* ``mpi: NAME``: of which inside collectives (waiting for the others, and moving data);
* ``cpu: NAME``: CPU seconds of this process outside collectives, every thread (the work
  itself: on an oversubscribed machine, where wall-clock time means little, a stage whose work
  summed over ranks grows with the rank count is parallel overhead);
* ``alloc: NAME``: bytes this process allocated during the stage, every thread, when a counter
  was given to :func:`count_allocations` (benchmarks/pyprof.py's ``--allocations`` preloads one
  into ``malloc``; the bytes of fresh arrays a stage makes, a measure of the memory it touches).

:class:`Laps` splits one stage into parts: wall-clock seconds as ``NAME`` and, given the
communicator, ``lap cpu: NAME``, the CPU seconds of the calling thread outside collectives (not
the stage's other threads: the work of the part itself). Only benchmarks/pyprof.py reads these;
they change nothing a run writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.comm import Arrays, Comm

T = TypeVar("T")

_allocated: Callable[[], int] | None = None


def count_allocations(counter: Callable[[], int] | None) -> None:
    """Record ``alloc: NAME`` per stage: ``counter()`` is the bytes this process has allocated
    so far (None: stop recording)."""
    global _allocated
    _allocated = counter


class TimedComm:
    """A :class:`~.comm.Comm` that adds up the seconds spent in its collectives on this rank:
    ``wall`` (perf counter) and ``cpu`` (the calling thread's CPU time: MPI's polling)."""

    def __init__(self, inner: Comm) -> None:
        self.inner = inner
        self.wall = 0.0
        self.cpu = 0.0

    @contextmanager
    def _clock(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.wall += time.perf_counter() - wall
            self.cpu += time.thread_time() - cpu

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def size(self) -> int:
        return self.inner.size

    def bcast(self, obj: T, root: int = 0) -> T:
        with self._clock():
            return self.inner.bcast(obj, root)

    def gather(self, obj: T, root: int = 0) -> list[T] | None:
        with self._clock():
            return self.inner.gather(obj, root)

    def allgather(self, obj: T) -> list[T]:
        with self._clock():
            return self.inner.allgather(obj)

    def alltoall(self, objs: list[T]) -> list[T]:
        with self._clock():
            return self.inner.alltoall(objs)

    def alltoall_columns(
        self, columns: Arrays, counts: npt.NDArray[np.int64]
    ) -> tuple[Arrays, npt.NDArray[np.int64]]:
        with self._clock():
            return self.inner.alltoall_columns(columns, counts)

    def send(self, obj: object, dest: int) -> None:
        with self._clock():
            self.inner.send(obj, dest)

    def recv(self, source: int) -> Any:
        with self._clock():
            return self.inner.recv(source)

    def allreduce_sum(self, array: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        with self._clock():
            return self.inner.allreduce_sum(array)

    def barrier(self) -> None:
        with self._clock():
            self.inner.barrier()


def timed(timings: dict[str, float], name: str, comm: Comm, stage: Callable[[], T]) -> T:
    """``stage()``, its seconds recorded in ``timings`` as ``NAME``, ``mpi: NAME`` and
    ``cpu: NAME`` (module docstring; the last two only when ``comm`` is a :class:`TimedComm`),
    and ``alloc: NAME`` while :func:`count_allocations` has a counter."""
    counter = _allocated
    allocated = counter() if counter is not None else 0
    wall, cpu = time.perf_counter(), time.process_time()
    in_mpi = (comm.wall, comm.cpu) if isinstance(comm, TimedComm) else None
    try:
        return stage()
    finally:
        timings[name] = round(time.perf_counter() - wall, 3)
        if counter is not None:
            timings["alloc: " + name] = float(counter() - allocated)
        if in_mpi is not None:
            assert isinstance(comm, TimedComm)
            timings["mpi: " + name] = round(comm.wall - in_mpi[0], 3)
            work = time.process_time() - cpu - (comm.cpu - in_mpi[1])
            timings["cpu: " + name] = round(max(work, 0.0), 3)


class Laps:
    """Seconds spent in each part of a stage, added up over its rounds into ``timings``
    (module docstring; the CPU seconds only when ``comm`` is a :class:`TimedComm`)."""

    def __init__(self, timings: dict[str, float], prefix: str, comm: Comm | None = None) -> None:
        self.timings = timings
        self.prefix = prefix
        self.comm = comm if isinstance(comm, TimedComm) else None
        self.last = time.perf_counter()
        self.last_cpu = self._cpu()

    def _cpu(self) -> float:
        return time.thread_time() - (self.comm.cpu if self.comm is not None else 0.0)

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        key = self.prefix + name
        self.timings[key] = round(self.timings.get(key, 0.0) + now - self.last, 3)
        self.last = now
        if self.comm is not None:
            cpu = self._cpu()
            key = "lap cpu: " + key
            self.timings[key] = round(self.timings.get(key, 0.0) + cpu - self.last_cpu, 4)
            self.last_cpu = cpu


__all__ = ["Laps", "TimedComm", "count_allocations", "timed"]
