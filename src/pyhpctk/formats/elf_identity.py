"""Which build a native load module is: its GNU build id, its size and its modification time.

pyrun records the identity of every load module its samples reach (docs/formats.md, "Loaded
modules"), and pyprof names the frames of a module from the file it finds at that path only when
the file is still that build: the same build id when the run recorded one (any copy of one build
is that build), else the same size and modification time. The build id is the note
``NT_GNU_BUILD_ID`` that ``ld --build-id`` (the default of most distributions' compilers) puts in
a ``PT_NOTE`` segment; it is read through the program headers with ``os.pread``, a few hundred
bytes, never the whole file.

Standard library only and cheap to import: the measured process imports it.
"""

from __future__ import annotations

import os
import stat
import struct

NT_GNU_BUILD_ID = 3
PT_NOTE = 4
_ELF_MAGIC = b"\x7fELF"
_MAX_NOTES = 1 << 16  # bytes of notes read per segment: build ids sit in the first few dozen


class FileIdentity:
    """A file's build id (lowercase hex, "" when it has none), size and mtime in nanoseconds.

    A value; not a dataclass, to import fast.
    """

    __slots__ = ("build_id", "mtime_ns", "size")

    def __init__(self, build_id: str, size: int, mtime_ns: int) -> None:
        self.build_id = build_id
        self.size = size
        self.mtime_ns = mtime_ns

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FileIdentity):
            return NotImplemented
        return (self.build_id, self.size, self.mtime_ns) == (
            other.build_id,
            other.size,
            other.mtime_ns,
        )

    def __hash__(self) -> int:
        return hash((self.build_id, self.size, self.mtime_ns))

    def __repr__(self) -> str:
        return f"FileIdentity({self.build_id!r}, {self.size}, {self.mtime_ns})"

    def same_build(self, now: FileIdentity) -> bool:
        """Whether ``now`` (the file as it is) is the build this identity recorded: the same
        build id when one was recorded, else the same size and modification time."""
        if self.build_id:
            return now.build_id == self.build_id
        return (now.size, now.mtime_ns) == (self.size, self.mtime_ns)


# Where the fields read live (ELF gABI): per class, (e_phoff, e_phentsize, e_phnum) in the
# header and (p_offset, p_filesz) in a program header, as (offset, struct code).
_HEADER = {1: ((28, "I"), (42, "H"), (44, "H")), 2: ((32, "Q"), (54, "H"), (56, "H"))}
_PHDR = {1: ((4, "I"), (16, "I"), 32), 2: ((8, "Q"), (32, "Q"), 56)}


def build_id_of(fd: int) -> str:
    """The GNU build id of the ELF file open as ``fd`` (lowercase hex), "" when it has none or
    is no ELF file."""
    head = os.pread(fd, 64, 0)
    if len(head) < 52 or not head.startswith(_ELF_MAGIC) or head[4] not in _HEADER:
        return ""
    end = "<" if head[5] == 1 else ">"
    phoff, phentsize, phnum = (
        struct.unpack_from(end + code, head, at)[0] for at, code in _HEADER[head[4]]
    )
    (offset_at, offset_code), (size_at, size_code), least = _PHDR[head[4]]
    if phentsize < least or not 0 < phnum <= 4096:
        return ""
    table = os.pread(fd, phentsize * phnum, phoff)
    for at in range(0, len(table) - phentsize + 1, phentsize):
        if struct.unpack_from(end + "I", table, at)[0] != PT_NOTE:
            continue
        offset = struct.unpack_from(end + offset_code, table, at + offset_at)[0]
        size = struct.unpack_from(end + size_code, table, at + size_at)[0]
        found = _build_id_note(os.pread(fd, min(size, _MAX_NOTES), offset), end)
        if found:
            return found
    return ""


def _build_id_note(notes: bytes, end: str) -> str:
    """The ``NT_GNU_BUILD_ID`` descriptor among ``notes`` (4-byte aligned entries), as hex."""
    at = 0
    while at + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from(end + "III", notes, at)
        name_at = at + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        if desc_at + descsz > len(notes):
            return ""
        if kind == NT_GNU_BUILD_ID and notes[name_at : name_at + namesz] == b"GNU\0":
            return notes[desc_at : desc_at + descsz].hex()
        at = desc_at + ((descsz + 3) & ~3)
    return ""


def open_regular_file(path: str) -> tuple[int, os.stat_result] | None:
    """``path`` opened for reading, without blocking (a FIFO waits for no writer), with its
    status: None when it cannot be opened or is no regular file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        info = None
    if info is None or not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    return fd, info


def identify(path: str) -> FileIdentity | None:
    """The identity of the regular file at ``path`` now, or None (none there, unreadable)."""
    opened = open_regular_file(path)
    if opened is None:
        return None
    fd, info = opened
    try:
        build_id = build_id_of(fd)
    except (OSError, struct.error):
        build_id = ""
    finally:
        os.close(fd)
    return FileIdentity(build_id, info.st_size, info.st_mtime_ns)
