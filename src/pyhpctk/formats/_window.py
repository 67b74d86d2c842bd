"""A database file read through memory-mapped windows, never mapped whole.

A map takes address space of its whole length, however little of it is read: mapped whole, the
files of a 7 GB database asked for 7 GB of address space, and under an address-space limit
(``ulimit -v``, ``RLIMIT_AS``, which some clusters set) ``pyhpctk verify`` could not open them.
:class:`MappedFile` maps a window of :data:`WINDOW` bytes (or of one request, when larger) where
a reader asks for bytes, and keeps the last :data:`KEPT` windows for the next requests. A window
that neither the file nor a view handed out still holds is unmapped, and its pages leave the
process with it (they stay in the page cache). So the address space and the resident memory of
a reader follow the windows and the arrays it keeps, a small multiple of the largest block it
reads at once, not the size of the file.

A reader reaches the bytes of any ``Buffer`` (a ``MappedFile``, or ``bytes``/``bytearray``/
``memoryview``) through :func:`span`, :func:`frombuffer` or :func:`bytes_at` (a ``MappedFile``
has no buffer protocol of its own), after checking the bounds itself (``_db``'s checked
helpers). Imports nothing but the standard library, numpy and :mod:`pyhpctk.errors`.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import weakref
from typing import TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError

WINDOW = 16 << 20
"""Bytes mapped at a time, at least (a request larger than this gets a window of its own size)."""

KEPT = 4
"""Windows kept mapped for the next requests (the most recent ones)."""


class MappedFile:
    """The bytes of a read-only regular file, handed out as views of memory-mapped windows.

    ``len()`` is the file's size when opened; :meth:`place` finds (mapping it when needed) the
    window that holds a range of bytes, :meth:`view` gives the range itself. A view stays valid
    for as long as it is held (it keeps its window mapped), whatever the file maps next; the
    pages of a window no longer kept are dropped from the process all the same
    (``MADV_DONTNEED``: a view still in use maps them again from the page cache when next read).
    ``name`` names the file in error messages.
    """

    __slots__ = ("__weakref__", "_at", "_fd", "_length", "_size", "_window", "_windows", "name")

    def __init__(self, fd: int, name: str) -> None:
        """Read the open descriptor ``fd`` (of a regular file), which this object now owns."""
        self._fd = fd
        self._size = os.fstat(fd).st_size
        self.name = name
        weakref.finalize(self, os.close, fd)
        # The window of the last request, and every window kept: (file offset, map, bytes).
        self._at, self._length, self._window = 0, 0, memoryview(b"")
        self._windows: list[tuple[int, mmap.mmap, memoryview]] = []

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"MappedFile({self.name!r}, {self._size} bytes)"

    def place(self, offset: int, size: int) -> tuple[memoryview, int]:
        """The window that holds bytes ``[offset, offset + size)`` of the file, and where they
        start in it (a ValueError when they lie past the end of the file).

        Out of address space for a new window, a MemoryError; a window the system will not map
        for another reason, a FormatError naming the file.
        """
        at = offset - self._at
        if at >= 0 and at + size <= self._length:  # most requests: the last window again
            return self._window, at
        if offset < 0 or size < 0 or offset + size > self._size:
            raise ValueError(f"bytes [{offset}, {offset + size}) lie outside {self!r}")
        if size == 0:
            return memoryview(b""), 0
        for entry in self._windows:
            if entry[0] <= offset and offset + size <= entry[0] + len(entry[2]):
                break
        else:
            entry = self._map(offset, size)
            for _, dropped, _ in self._windows[KEPT - 1 :]:
                with contextlib.suppress(OSError, AttributeError):  # no madvise here
                    dropped.madvise(mmap.MADV_DONTNEED)
            self._windows = [entry, *self._windows[: KEPT - 1]]
        base, _, window = entry
        self._at, self._length, self._window = base, len(window), window
        return window, offset - base

    def view(self, offset: int, size: int) -> memoryview:
        """Bytes ``[offset, offset + size)`` of the file (as :meth:`place`)."""
        window, at = self.place(offset, size)
        return window[at : at + size]

    def _map(self, offset: int, size: int) -> tuple[int, mmap.mmap, memoryview]:
        """A new window holding ``[offset, offset + size)``: it runs on from the request, or
        back from it when the reader moves towards the start of the file."""
        base = max(0, min(offset, offset + size - WINDOW)) if offset < self._at else offset
        base -= base % mmap.ALLOCATIONGRANULARITY
        length = min(max(offset + size - base, WINDOW), self._size - base)
        try:
            window = mmap.mmap(self._fd, length, access=mmap.ACCESS_READ, offset=base)
        except OSError as error:
            if error.errno == errno.ENOMEM:
                raise MemoryError(
                    f"{self.name}: mapping {length} bytes of the file: {error.strerror}"
                ) from None
            raise FormatError(self.name, "file", f"cannot map: {error.strerror}") from None
        return base, window, memoryview(window)


Buffer: TypeAlias = bytes | bytearray | memoryview | MappedFile
"""The bytes of a whole file, as the readers take them."""

ScalarT = TypeVar("ScalarT", bound=np.generic)


def span(buf: Buffer, offset: int, size: int) -> memoryview:
    """Bytes ``[offset, offset + size)`` of ``buf``, not bounds-checked (the caller has)."""
    if isinstance(buf, MappedFile):
        return buf.view(offset, size)
    return memoryview(buf).cast("B")[offset : offset + size]


def frombuffer(
    buf: Buffer, dtype: np.dtype[ScalarT], count: int, offset: int
) -> npt.NDArray[ScalarT]:
    """A zero-copy view of ``count`` ``dtype`` records at ``offset`` (``np.frombuffer``), not
    bounds-checked."""
    if isinstance(buf, MappedFile):
        window, at = buf.place(offset, count * dtype.itemsize)
        return np.frombuffer(window, dtype, count, at)
    return np.frombuffer(buf, dtype, count, offset)


def bytes_at(buf: Buffer, start: int, stop: int) -> npt.NDArray[np.uint8]:
    """Bytes ``[start, stop)`` as a ``uint8`` view (index it with offsets less ``start``), not
    bounds-checked."""
    return np.frombuffer(span(buf, start, stop - start), np.uint8)
