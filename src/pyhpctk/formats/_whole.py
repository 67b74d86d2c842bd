"""Reading a measurement file whole: the shared input step of ``.hpcrun``, ``.hpctrace`` and
``logical/`` files.

These files are read into memory, not memory-mapped like the database files (``_db``): pyprof
opens thousands of them, and every live map keeps a file descriptor open. Imports nothing but
the standard library and :mod:`pyhpctk.errors`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from pyhpctk.errors import FormatError

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO
Buffer = bytes | bytearray | memoryview


def read_whole(source: Source) -> tuple[Buffer, str | None]:
    """The whole file as a buffer, and its name for error messages (None for a buffer)."""
    if isinstance(source, bytes | bytearray | memoryview):
        return source, None
    if isinstance(source, str | os.PathLike):
        try:
            return Path(source).read_bytes(), os.fspath(source)
        except OSError as error:
            raise FormatError(source, "file", error.strerror or str(error)) from None
    name = getattr(source, "name", None)
    return source.read(), name if isinstance(name, str) else None
