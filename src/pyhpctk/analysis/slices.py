"""A rank's own slice of a database file, written at its offsets while other ranks write theirs.

Ranks write disjoint byte ranges of one profile.db and one cct.db (:mod:`.write_stages`). With
``os.pwrite`` the kernel takes the file's inode lock for every buffered write (ext4, XFS, tmpfs
alike), so the ranks of one machine copy their bytes into the page cache one at a time: on 16
ranks writing profile.db took as long as on one. Through a memory map of its slice a rank
copies its bytes in parallel with the others instead (:class:`FileSlice`, ``mapped``), but a
mapped byte costs it about 2.5 times a written one (a page fault, the page zeroed first), and
on the 16-core device machine 16 ranks' maps of cct.db took as long as one rank's ``pwritev``
of the whole file: the analysis writes with ``pwritev`` on threads (:mod:`.write_stages`).

A map is safe only when every rank runs on one machine (:func:`one_machine`), whose page cache
they share: across machines (NFS, Lustre) pages shared by two ranks' slices would not be
coherent. The slice is first reserved with ``posix_fallocate``, so that a full disk is an
``OSError`` (one error on every rank) and never a ``SIGBUS`` in the middle of a copy; a file
system that cannot reserve space gets ``os.pwrite``. At most :data:`WINDOW` bytes are mapped at
a time, so the pages a map holds stay far below ``--memory-limit``. Either way the file gets the
same bytes.
"""

from __future__ import annotations

import errno
import mmap
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.comm import Comm
from pyhpctk.analysis.planes import pwrite_all

WINDOW = 8 << 20
"""Bytes mapped at a time (the resident pages of a map count in a rank's memory)."""

_CANNOT_RESERVE = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV}

Buffer = bytes | memoryview | npt.NDArray[Any]


def one_machine(comm: Comm) -> bool:
    """Whether more than one rank runs and all run on this machine (one kernel, one page cache;
    a collective). The boot id tells apart machines that share a host name (containers)."""
    if comm.size == 1:
        return False
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as stream:
            boot = stream.read().strip()
    except OSError:
        boot = ""
    places = comm.allgather((socket.gethostname(), boot))
    return len(set(places)) == 1


class FileSlice:
    """Bytes ``[start, stop)`` of the file ``path``, which this rank alone writes.

    ``mapped``: copy through memory maps of at most :data:`WINDOW` bytes (module docstring),
    else ``os.pwrite``. Use as a context manager; offsets are the file's.
    """

    def __init__(self, path: Path, start: int, stop: int, mapped: bool) -> None:
        self.start, self.stop = start, max(stop, start)
        self.fd = os.open(path, os.O_RDWR if mapped else os.O_WRONLY)
        self.window: mmap.mmap | None = None
        self.window_at = 0
        self.mapped = mapped and self.stop > self.start
        if self.mapped:
            try:
                os.posix_fallocate(self.fd, self.start, self.stop - self.start)
            except OSError as error:
                if error.errno not in _CANNOT_RESERVE:
                    os.close(self.fd)
                    raise
                self.mapped = False

    def __enter__(self) -> FileSlice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.window is not None:
            self.window.close()
            self.window = None
        os.close(self.fd)

    def write(self, offset: int, data: Buffer) -> None:
        """``data`` at ``offset`` (inside the slice)."""
        view = _bytes_of(data)
        if not len(view):
            return
        if offset < self.start or offset + len(view) > self.stop:
            raise ValueError(f"bytes {offset}..{offset + len(view)} outside the slice")
        if not self.mapped:
            pwrite_all(self.fd, np.frombuffer(view, np.uint8), offset)
            return
        while len(view):
            window = self._window_over(offset)
            at = offset - self.window_at
            n = min(len(view), len(window) - at)
            window[at : at + n] = view[:n]
            view = view[n:]
            offset += n

    def write_back_to_back(self, offset: int, pieces: Sequence[memoryview]) -> None:
        """``pieces`` one after another from ``offset`` (``os.pwritev``, 1024 at a time, when
        not mapped)."""
        if self.mapped:
            for piece in pieces:
                self.write(offset, piece)
                offset += len(piece)
            return
        for start in range(0, len(pieces), 1024):
            batch = pieces[start : start + 1024]
            want = sum(len(p) for p in batch)
            done = os.pwritev(self.fd, batch, offset)
            if done != want:  # a short write: finish piece by piece
                for piece in batch:
                    pwrite_all(self.fd, np.frombuffer(piece, np.uint8), offset)
                    offset += len(piece)
            else:
                offset += done

    def _window_over(self, offset: int) -> mmap.mmap:
        """The map holding ``offset``, moved there if it does not."""
        window = self.window
        if window is not None and self.window_at <= offset < self.window_at + len(window):
            return window
        if window is not None:
            window.close()
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        length = min(WINDOW, self.stop - base)
        self.window = mmap.mmap(self.fd, length, access=mmap.ACCESS_WRITE, offset=base)
        self.window_at = base
        return self.window


def _bytes_of(data: Buffer) -> memoryview:
    if isinstance(data, np.ndarray):
        return memoryview(np.ascontiguousarray(data).view(np.uint8).data).cast("B")
    return memoryview(data).cast("B")


__all__ = ["WINDOW", "FileSlice", "one_machine"]
