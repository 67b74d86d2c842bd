"""Reading a measurement file whole: the shared input step of ``.hpcrun``, ``.hpctrace`` and
``logical/`` files.

These files are read into memory, not memory-mapped like the database files (``_db``): pyprof
opens thousands of them, and every live map keeps a file descriptor open. Imports nothing but
the standard library and :mod:`pyhpctk.errors`.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from pyhpctk.errors import FormatError

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO
Buffer = bytes | bytearray | memoryview


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading, or a FormatError when it is not a regular file.

    Opened without blocking and checked on the open descriptor: a FIFO would otherwise wait for
    a writer forever, and a device such as /dev/zero never ends.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise FormatError(path, "file", f"cannot open: {error.strerror or error}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
        raise FormatError(path, "file", f"is {kind}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_whole(source: Source) -> tuple[Buffer, str | None]:
    """The whole file as a buffer, and its name for error messages (None for a buffer)."""
    if isinstance(source, bytes | bytearray | memoryview):
        return source, None
    if isinstance(source, str | os.PathLike):
        with open_regular(source) as stream:
            try:
                return stream.read(), os.fspath(source)
            except OSError as error:
                raise FormatError(source, "file", error.strerror or str(error)) from None
    name = getattr(source, "name", None)
    return source.read(), name if isinstance(name, str) else None
