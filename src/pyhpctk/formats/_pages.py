"""Bounding the resident pages of a memory-mapped database file while it is read block by block.

``_db.FileBlocks`` (profile.db's and cct.db's blocks) and trace.db's lines hand out views of a
file mapped whole; :class:`MappedPages` drops the pages behind them every :data:`MAPPED_BUDGET`
bytes, so that one pass over a 7 GB file (``pyhpctk verify``) holds tens of MB of it, not 7 GB.
Imports nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import mmap

MAPPED_BUDGET = 16 << 20
"""Bytes of blocks a reader hands out from a memory-mapped file before it drops the file's
pages from the process (:class:`MappedPages`)."""


class MappedPages:
    """Keeps the pages a reader has touched in a memory-mapped file from piling up.

    A file-backed page stays in the process (its resident memory) for as long as the map
    lives, so reading every block of a 7 GB file once would hold 7 GB. Once
    :data:`MAPPED_BUDGET` bytes of blocks have been handed out, the map's pages are dropped
    (``madvise(MADV_DONTNEED)``): they stay in the page cache, and a view still in use maps
    its pages again when next read, so nothing changes but the memory held. A buffer that is
    not a map is left alone.
    """

    __slots__ = ("_buf", "_held")

    def __init__(self, buf: object) -> None:
        self._buf = buf if isinstance(buf, mmap.mmap) else None
        self._held = 0

    def touch(self, nbytes: int) -> None:
        """``nbytes`` of the file are about to be read."""
        if self._buf is None:
            return
        self._held += nbytes
        if self._held > MAPPED_BUDGET:
            self._held = nbytes
            with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, or no madvise
                self._buf.madvise(mmap.MADV_DONTNEED)
