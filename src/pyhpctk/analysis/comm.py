"""The few collective operations pyprof's driver needs, over mpi4py or within one process.

:class:`Comm` is the interface the analysis driver (:mod:`.pipeline`) is written against;
:class:`SerialComm` is a world of one process (pyprof, and pyprof-mpi without MPI),
:class:`MpiComm` wraps an ``mpi4py`` communicator. Python objects travel pickled (mpi4py's
lower-case methods); integer arrays summed over ranks use ``Allreduce`` on the buffer. mpi4py is
imported only by :func:`world`, so nothing else here needs it installed.

:func:`on_all`, :func:`on_root` and :func:`agree` make an error met on one rank stop every rank
together, with the first rank's message (:class:`DistributedError` on the others).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import PyhpctkError

T = TypeVar("T")
S = TypeVar("S")
Arrays = tuple[npt.NDArray[Any], ...]

_INT_MAX = 2**31 - 1


class Comm(Protocol):
    """A communicator: ``rank`` in ``0..size-1``, collectives called by every rank in order."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def bcast(self, obj: T, root: int = 0) -> T:
        """``root``'s ``obj`` on every rank."""
        ...

    def gather(self, obj: T, root: int = 0) -> list[T] | None:
        """Every rank's ``obj`` in rank order on ``root``; None elsewhere."""
        ...

    def allgather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` in rank order, on every rank."""
        ...

    def alltoall(self, objs: list[T]) -> list[T]:
        """Element ``r`` of ``objs`` goes to rank ``r``; the result holds one from each rank."""
        ...

    def alltoall_columns(
        self, columns: Arrays, counts: npt.NDArray[np.int64]
    ) -> tuple[Arrays, npt.NDArray[np.int64]]:
        """Columns of values for every rank, as raw buffers: ``columns[f]`` holds the parts for
        ranks 0, 1, ... back to back, ``counts[rank, f]`` elements each. The result holds
        the parts from every rank back to back, in rank order, and their counts; the columns
        are the send buffers (no copy is made before sending)."""
        ...

    def send(self, obj: object, dest: int) -> None:
        """Point-to-point send (pickled)."""
        ...

    def recv(self, source: int) -> Any:
        """Point-to-point receive from ``source``."""
        ...

    def allreduce_sum(self, array: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The element-wise sum of every rank's ``array`` (same shape everywhere)."""
        ...

    def barrier(self) -> None:
        """Wait for every rank."""
        ...


class SerialComm:
    """A world of one rank: every collective is the identity."""

    rank = 0
    size = 1

    def bcast(self, obj: T, root: int = 0) -> T:
        return obj

    def gather(self, obj: T, root: int = 0) -> list[T] | None:
        return [obj]

    def allgather(self, obj: T) -> list[T]:
        return [obj]

    def alltoall(self, objs: list[T]) -> list[T]:
        if len(objs) != 1:
            raise ValueError("alltoall needs one object per rank")
        return list(objs)

    def alltoall_columns(
        self, columns: Arrays, counts: npt.NDArray[np.int64]
    ) -> tuple[Arrays, npt.NDArray[np.int64]]:
        return columns, counts.copy()

    def send(self, obj: object, dest: int) -> None:
        raise RuntimeError("a world of one rank has nobody to send to")

    def recv(self, source: int) -> Any:
        raise RuntimeError("a world of one rank has nobody to receive from")

    def allreduce_sum(self, array: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return array.copy()

    def barrier(self) -> None:
        return None


class MpiComm:
    """An ``mpi4py`` communicator seen through :class:`Comm`."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm

    @property
    def rank(self) -> int:
        return int(self._comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self._comm.Get_size())

    def bcast(self, obj: T, root: int = 0) -> T:
        result: T = self._comm.bcast(obj, root=root)
        return result

    def gather(self, obj: T, root: int = 0) -> list[T] | None:
        result: list[T] | None = self._comm.gather(obj, root=root)
        return result

    def allgather(self, obj: T) -> list[T]:
        result: list[T] = self._comm.allgather(obj)
        return result

    def alltoall(self, objs: list[T]) -> list[T]:
        result: list[T] = self._comm.alltoall(objs)
        return result

    def alltoall_columns(
        self, columns: Arrays, counts: npt.NDArray[np.int64]
    ) -> tuple[Arrays, npt.NDArray[np.int64]]:
        from mpi4py import MPI

        size = self.size
        counts = np.ascontiguousarray(counts, dtype=np.int64).reshape(size, len(columns))
        if size == 1:  # what MPI would copy to this rank itself: the columns as they are
            return tuple(columns), counts.copy()
        received = np.empty_like(counts)
        self._comm.Alltoall(counts, received)
        widths = np.array([c.dtype.itemsize for c in columns], dtype=np.int64)
        out_bytes, in_bytes = counts * widths, received * widths
        # Counts and displacements are C ints: pickle what would not fit.
        too_big = max(
            int(out_bytes.sum(axis=0).max(initial=0)), int(in_bytes.sum(axis=0).max(initial=0))
        )
        if self._comm.allreduce(too_big, op=MPI.MAX) > _INT_MAX:
            return self._alltoall_pickled(columns, counts)
        result = []
        for f, column in enumerate(columns):
            send = np.ascontiguousarray(column).view(np.uint8)
            recv = np.empty(int(in_bytes[:, f].sum()), dtype=np.uint8)
            self._comm.Alltoallv(
                [send, (out_bytes[:, f].tolist(), _starts(out_bytes[:, f])), MPI.BYTE],
                [recv, (in_bytes[:, f].tolist(), _starts(in_bytes[:, f])), MPI.BYTE],
            )
            result.append(recv.view(column.dtype))
        return tuple(result), received

    def _alltoall_pickled(
        self, columns: Arrays, counts: npt.NDArray[np.int64]
    ) -> tuple[Arrays, npt.NDArray[np.int64]]:
        starts = np.cumsum(counts, axis=0) - counts
        parts = [
            tuple(
                c[int(starts[r, f]) : int(starts[r, f] + counts[r, f])]
                for f, c in enumerate(columns)
            )
            for r in range(self.size)
        ]
        incoming = self.alltoall(parts)
        received = np.array([[len(a) for a in p] for p in incoming], dtype=np.int64)
        joined = tuple(np.concatenate([p[f] for p in incoming]) for f in range(len(columns)))
        return joined, received.reshape(self.size, len(columns))

    def send(self, obj: object, dest: int) -> None:
        self._comm.send(obj, dest=dest, tag=17)

    def recv(self, source: int) -> Any:
        return self._comm.recv(source=source, tag=17)

    def allreduce_sum(self, array: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        from mpi4py import MPI

        send = np.ascontiguousarray(array, dtype=np.int64)
        out = np.empty_like(send)
        self._comm.Allreduce(send, out, op=MPI.SUM)
        return out

    def barrier(self) -> None:
        self._comm.Barrier()

    def abort(self, code: int) -> None:
        """End every rank (after an error only some ranks saw)."""
        self._comm.Abort(code)


def _starts(counts: npt.NDArray[np.int64]) -> list[int]:
    """Exclusive prefix sums (MPI displacements)."""
    starts: list[int] = (np.cumsum(counts) - counts).tolist()
    return starts


def world() -> MpiComm:
    """``MPI.COMM_WORLD`` (initialises MPI on first use)."""
    from mpi4py import MPI

    return MpiComm(MPI.COMM_WORLD)


class DistributedError(PyhpctkError):
    """An error one rank met, raised on every rank so that all of them stop together."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def agree(comm: Comm, error: BaseException | None) -> None:
    """Raise the first rank's error on every rank (a collective: every rank must call it)."""
    report = None
    if error is not None:
        report = (getattr(error, "exit_code", 2), str(error))
    if comm.size == 1:
        if error is not None:
            raise error
        return
    reports = comm.allgather(report)
    first = next((r for r in reports if r is not None), None)
    if first is not None:
        if error is not None and reports.index(first) == comm.rank:
            raise error
        raise DistributedError(first[1], first[0])


def on_all(comm: Comm, function: Callable[[], T]) -> T:
    """``function()`` on every rank; an error on any rank is raised on all of them."""
    try:
        result = function()
    except (PyhpctkError, OSError) as error:
        agree(comm, error)
        raise  # not reached: agree raises
    agree(comm, None)
    return result


def on_all_shared(comm: Comm, function: Callable[[], tuple[T, S]]) -> tuple[T, list[S]]:
    """``function()`` on every rank, which gives ``(kept, shared)``: this rank's ``kept`` and
    every rank's ``shared``, in rank order, through one allgather, which also carries an
    error met on any rank to all of them (as :func:`on_all`, without a collective of its own)."""
    try:
        kept, shared = function()
    except (PyhpctkError, OSError) as error:
        if comm.size == 1:
            raise
        report = (getattr(error, "exit_code", 2), str(error))
        # the same allgather as the other ranks' below
        everyone = comm.allgather(cast(tuple[S | None, tuple[int, str] | None], (None, report)))
        first = next(rank for rank, (_, said) in enumerate(everyone) if said is not None)
        if first == comm.rank:
            raise
        code, message = cast(tuple[int, str], everyone[first][1])
        raise DistributedError(message, code) from None
    if comm.size == 1:
        return kept, [shared]
    everyone = comm.allgather(cast(tuple[S | None, tuple[int, str] | None], (shared, None)))
    for _, said in everyone:
        if said is not None:
            raise DistributedError(said[1], said[0])
    return kept, [cast(S, part) for part, _ in everyone]


def on_root(comm: Comm, function: Callable[[], T]) -> T:
    """``function()`` on rank 0, its result broadcast; its error is raised on every rank."""
    if comm.size == 1:
        return function()
    payload: tuple[T | None, tuple[int, str] | None] = (None, None)
    error: BaseException | None = None
    if comm.rank == 0:
        try:
            payload = (function(), None)
        except (PyhpctkError, OSError) as caught:
            error = caught
            payload = (None, (getattr(caught, "exit_code", 2), str(caught)))
    result, report = comm.bcast(payload)
    if report is not None:
        if error is not None:
            raise error
        raise DistributedError(report[1], report[0])
    return result  # type: ignore[return-value]


__all__ = [
    "Arrays",
    "Comm",
    "DistributedError",
    "MpiComm",
    "SerialComm",
    "agree",
    "on_all",
    "on_all_shared",
    "on_root",
    "world",
]
