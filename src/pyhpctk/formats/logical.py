"""Read and write logical-frame metadata files (``MEASDIR/logical/python.XXXXXXXX``).

formats.md §1.10: hpcrun (and pyrun) give every Python function a *fid* and record it in a
metadata file whose relative path is a load-map entry; a Python frame is then the CCT node
``(lm_id of that file, fid << 32 | line)``. The file is the 10 ASCII bytes ``HPCLOGICAL`` then,
until end of file, stanzas ``{ u32 fid; str funcname; u8 mangling; str filename; u32 lineno }``
(big-endian; ``str`` is a u32 length then the bytes; an empty string stands for NULL).

Stanzas are kept in file order (hpcrun writes them in hash-table order, not by fid), so
``write(read(f)) == f`` byte for byte. Strings are decoded as UTF-8 with ``surrogateescape``
so any bytes round-trip, except NUL (hpcrun's names are C strings: a NUL in one is damage, and
no database could hold the name). The files are small, so they are parsed with :mod:`struct`.
This module must never raise anything but :class:`~pyhpctk.errors.FormatError` on bad input.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcrun_constants import LOGICAL_MAGIC, UNKNOWN_FID
from pyhpctk.formats.whole import Source, read_whole

__all__ = [
    "MAGIC",
    "LogicalMetadata",
    "LogicalStanza",
    "dump",
    "dumps",
    "read",
    "sniff",
    "to_bytes",
    "verify",
    "write",
]

MAGIC = LOGICAL_MAGIC  # formats.md §1.10 (.hpcrun_constants)
MANGLING_NONE, MANGLING_CXX = 0, 1
MANGLING_NAMES = {MANGLING_NONE: "none", MANGLING_CXX: "C++"}


@dataclass(frozen=True, slots=True)
class LogicalStanza:
    """One function (or module, or C function) known to the logical unwinder.

    A Python function has ``funcname`` = ``co_name``, ``filename`` = ``co_filename`` and
    ``lineno`` = ``co_firstlineno``; module-level code has no ``funcname``; a C function called
    from Python has no ``filename`` and ``lineno`` 0 (formats.md §1.10). "" stands for NULL.
    """

    fid: int
    funcname: str
    mangling: int = MANGLING_NONE
    filename: str = ""
    lineno: int = 0


@dataclass(slots=True)
class LogicalMetadata:
    """A whole logical metadata file: its stanzas in file order."""

    stanzas: list[LogicalStanza] = field(default_factory=list)

    def by_fid(self) -> dict[int, LogicalStanza]:
        """Stanzas keyed by fid (the first one wins if a fid repeats)."""
        found: dict[int, LogicalStanza] = {}
        for stanza in self.stanzas:
            found.setdefault(stanza.fid, stanza)
        return found


def sniff(head: bytes) -> bool:
    """Is this the start of a logical metadata file?"""
    return head.startswith(MAGIC)


def read(source: Source) -> LogicalMetadata:
    """Read a logical metadata file from a path, a buffer or a binary stream."""
    whole, path = read_whole(source)
    buf = bytes(whole)
    if not buf.startswith(MAGIC):
        raise FormatError(path, "header", f"bad magic {buf[:10]!r}, not a logical metadata file")
    pos, end = len(MAGIC), len(buf)
    stanzas: list[LogicalStanza] = []

    def take(size: int, what: str, index: int) -> int:
        nonlocal pos
        start = pos
        if start + size > end:
            raise FormatError(
                path,
                f"stanza {index}",
                f"truncated: {what} needs {size} bytes at offset {start:#x}, file ends at {end:#x}",
            )
        pos = start + size
        return start

    def string(what: str, index: int) -> str:
        (length,) = struct.unpack_from(">I", buf, take(4, f"length of {what}", index))
        start = take(length, what, index)
        raw = buf[start : start + length]
        if b"\0" in raw:  # C strings in hpcrun, names a database holds as C strings
            raise FormatError(path, f"stanza {index}", f"{what} holds a NUL byte")
        return raw.decode("utf-8", "surrogateescape")

    while pos < end:
        i = len(stanzas)
        (fid,) = struct.unpack_from(">I", buf, take(4, "fid", i))
        funcname = string("funcname", i)
        mangling = buf[take(1, "mangling", i)]
        filename = string("filename", i)
        (lineno,) = struct.unpack_from(">I", buf, take(4, "lineno", i))
        stanzas.append(LogicalStanza(fid, funcname, mangling, filename, lineno))
    return LogicalMetadata(stanzas)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    if b"\0" in raw:
        raise ValueError(f"logical names are C strings and cannot hold NUL: {text!r}")
    return struct.pack(">I", len(raw)) + raw


def to_bytes(metadata: LogicalMetadata) -> bytes:
    """The file as hpcrun's ``cleanup_metadata_store`` writes it."""
    parts = [MAGIC]
    for s in metadata.stanzas:
        parts.append(
            struct.pack(">I", s.fid)
            + _string(s.funcname)
            + struct.pack(">B", s.mangling)
            + _string(s.filename)
            + struct.pack(">I", s.lineno)
        )
    return b"".join(parts)


def write(metadata: LogicalMetadata, dest: str | os.PathLike[str] | BinaryIO) -> None:
    """Write ``metadata`` to a path or a binary stream."""
    data = to_bytes(metadata)
    if isinstance(dest, str | os.PathLike):
        Path(dest).write_bytes(data)
    else:
        dest.write(data)


def verify(metadata: LogicalMetadata) -> list[str]:
    """Consistency problems (as hpcrun would never write them); empty when clean."""
    problems = []
    seen: set[int] = set()
    for i, s in enumerate(metadata.stanzas):
        where = f"stanza {i} (fid {s.fid})"
        if s.fid == UNKNOWN_FID:
            problems.append(f"{where}: fid 0 is reserved for unknown frames")
        if s.fid in seen:
            problems.append(f"{where}: fid appears more than once")
        seen.add(s.fid)
        if not s.funcname and not s.filename:
            problems.append(f"{where}: neither a function name nor a file name")
        if not s.funcname and s.lineno:
            problems.append(f"{where}: module-level code has lineno {s.lineno}, hpcrun writes 0")
        if s.mangling not in MANGLING_NAMES:
            problems.append(f"{where}: unknown mangling {s.mangling}")
    return problems


def _show(text: str) -> str:
    return text if text.isprintable() else repr(text)


def dump(metadata: LogicalMetadata, out: TextIO) -> None:
    """Write the stanzas as readable text, one per line, in file order."""
    out.write(f"logical metadata, {len(metadata.stanzas)} stanzas\n")
    for s in metadata.stanzas:
        name = _show(s.funcname) if s.funcname else "<module>"
        where = f"{_show(s.filename)}:{s.lineno}" if s.filename else "<no file>"
        mangling = MANGLING_NAMES.get(s.mangling, str(s.mangling))
        out.write(f"  fid {s.fid}: {name} at {where} mangling={mangling}\n")


def dumps(metadata: LogicalMetadata) -> str:
    """:func:`dump` into a string."""
    text = io.StringIO()
    dump(metadata, text)
    return text.getvalue()
