"""Symbols a stripped binary keeps elsewhere: a separate debug file, or its MiniDebugInfo.

A distribution strips its libraries to their exported symbols (``.dynsym``) and ships the full
symbol table apart, in two places a debugger looks too:

* a **separate debug file** named by the binary's GNU build id,
  ``/usr/lib/debug/.build-id/ab/cdef….debug`` (Debian's ``-dbg``/``-dbgsym`` packages, Fedora's
  ``debuginfo``). It is used only when its own build-id note is the binary's: any copy of one
  build is that build, and a file of another build would name the wrong code;
* **MiniDebugInfo** (Fedora, RHEL): a ``.gnu_debugdata`` section holding an xz-compressed ELF
  whose ``.symtab`` lists the functions ``.dynsym`` lacks. It is decompressed with a cap
  (:data:`MINIDEBUGINFO_MAX`) so that a damaged or hostile section cannot take the memory.

:func:`read_separate_symtab` reads the ELF file whose ``.symtab`` names the binary's code;
:mod:`.elfimage` reads them with the binary's own ``.dynsym`` when the binary has no ``.symtab``.
Standard library and pyelftools only.
"""

from __future__ import annotations

import io
import lzma
import os
from collections.abc import Callable
from typing import Any, TypeVar

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

#: Where separate debug files are looked for, as gdb's ``debug-file-directory``.
DEBUG_DIRECTORIES: tuple[str, ...] = ("/usr/lib/debug",)
#: The most bytes a ``.gnu_debugdata`` section may decompress to (Fedora's libc: about 200 kB).
MINIDEBUGINFO_MAX = 64 << 20

R = TypeVar("R")


def build_id(elf: Any) -> str:
    """The binary's GNU build id in lowercase hex, "" without one."""
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOTE":
            continue
        for note in section.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID" and isinstance(note["n_desc"], str):
                return note["n_desc"].lower()
    return ""


def debug_file(identity: str) -> str | None:
    """The separate debug file of the build ``identity`` (a build id), if one is installed
    and its own note says it is that build."""
    if len(identity) < 4:
        return None
    for directory in DEBUG_DIRECTORIES:
        path = os.path.join(directory, ".build-id", identity[:2], identity[2:] + ".debug")
        try:
            with open(path, "rb") as stream:
                if build_id(ELFFile(stream)) == identity:
                    return path
        except (OSError, ELFError, ValueError, KeyError):
            continue
    return None


def minidebuginfo(elf: Any) -> bytes | None:
    """The ELF image a ``.gnu_debugdata`` section holds, None without one, when it is not
    xz, or when it would decompress to more than :data:`MINIDEBUGINFO_MAX` bytes."""
    section = elf.get_section_by_name(".gnu_debugdata")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        data = decompressor.decompress(section.data(), max_length=MINIDEBUGINFO_MAX)
    except lzma.LZMAError:
        return None
    if not decompressor.eof:
        return None  # truncated, or larger than the cap
    return data


def read_separate_symtab(elf: Any, read: Callable[[Any], R]) -> R | None:
    """``read`` of the ELF file whose ``.symtab`` names this binary's code: its separate debug
    file (kept open only while ``read`` runs: a debug file can be large), else its
    MiniDebugInfo; None when it has neither, or neither has a ``.symtab``."""
    path = debug_file(build_id(elf))
    if path is not None:
        try:
            with open(path, "rb") as stream:
                found = ELFFile(stream)
                if found.get_section_by_name(".symtab") is not None:
                    return read(found)
        except (OSError, ELFError, ValueError, KeyError):
            pass
    mini = minidebuginfo(elf)
    if mini is None:
        return None
    try:
        inner = ELFFile(io.BytesIO(mini))
        if inner.get_section_by_name(".symtab") is not None:
            return read(inner)
    except (ELFError, ValueError, KeyError):
        pass
    return None
