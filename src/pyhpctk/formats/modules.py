"""Read and write the loaded-modules table: which build each native load module of a run was.

A profile's load map names a native module by its path alone (formats.md §1.4), and a path says
nothing about the file found there later: a library rebuilt or upgraded since the run would
name the run's frames wrongly. So pyrun records, per measured process, the identity of every
native module its samples reach, when one is first sampled: its GNU build id, its size and its
modification time (:mod:`pyhpctk.formats.elf_identity`), in ``MEAS/modules/PID.TAG.txt``
(``TAG``: that of the process's ``logical/`` file). pyprof names a module's frames from the file
at its path only when the file is still that build (docs/formats.md, "Loaded modules";
:mod:`pyhpctk.analysis.native_modules`).

The file is UTF-8 text (``surrogateescape``: any bytes round-trip): a first line
``pyhpctk-modules 1``, then one line per module ``BUILD_ID<TAB>SIZE<TAB>MTIME_NS<TAB>PATH``:
``BUILD_ID`` lowercase hex or ``-`` (the file has none), ``SIZE`` and ``MTIME_NS`` decimal,
``PATH`` escaped as in the thread-names file. A module whose file was gone from its path when
it was first sampled (replaced or deleted while the program ran) has ``-`` in all three fields:
nothing vouches for any file there. pyrun's encoder
(:func:`pyhpctk.measure.module_files.encode_modules`) writes the same bytes as
:func:`to_bytes`. This module must never raise anything but
:class:`~pyhpctk.errors.FormatError` on bad input.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, field
from typing import BinaryIO, TextIO

from pyhpctk.errors import FormatError
from pyhpctk.formats.elf_identity import FileIdentity
from pyhpctk.formats.hpcrun_constants import MODULES_MAGIC
from pyhpctk.formats.sources import path_problems, write_to
from pyhpctk.formats.threads import escape, unescape
from pyhpctk.formats.whole import Source, read_whole

__all__ = [
    "MAGIC",
    "MEASUREMENT_DIRECTORY",
    "SampledModule",
    "SampledModules",
    "dump",
    "dumps",
    "read",
    "sniff",
    "to_bytes",
    "verify",
    "write",
]

MAGIC = MODULES_MAGIC
MEASUREMENT_DIRECTORY = "modules"  # MEAS/modules/PID.TAG.txt
UNKNOWN = "-"
_BUILD_ID = re.compile(r"[0-9a-f]{2,128}")
_NUMBER = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True, slots=True)
class SampledModule:
    """A native module the run sampled, and the identity of its file then (None: the file
    that was loaded was no longer at its path)."""

    path: str
    identity: FileIdentity | None


@dataclass(slots=True)
class SampledModules:
    """A whole loaded-modules file, entries in file order."""

    entries: list[SampledModule] = field(default_factory=list)


def sniff(head: bytes) -> bool:
    """Is this the start of a loaded-modules file?"""
    return head.startswith(MAGIC)


def _identity(build_id: str, size: str, mtime: str) -> FileIdentity | None:
    """The identity three fields give; ValueError when they are not one."""
    if (build_id, size, mtime) == (UNKNOWN, UNKNOWN, UNKNOWN):
        return None
    if build_id != UNKNOWN and not _BUILD_ID.fullmatch(build_id):
        raise ValueError("BUILD_ID is neither lowercase hex nor -")
    if not _NUMBER.fullmatch(size) or not _NUMBER.fullmatch(mtime):
        raise ValueError("SIZE and MTIME_NS must be decimal numbers")
    return FileIdentity("" if build_id == UNKNOWN else build_id, int(size), int(mtime))


def read(source: Source) -> SampledModules:
    """Read a loaded-modules file from a path, a buffer or a binary stream."""
    whole, path = read_whole(source)
    data = bytes(whole)
    if not data.startswith(MAGIC):
        raise FormatError(path, "header", f"bad magic {data[:18]!r}, not a loaded-modules file")
    lines = data[len(MAGIC) :].decode("utf-8", "surrogateescape").split("\n")
    if lines[-1]:
        raise FormatError(path, f"line {len(lines) + 1}", "truncated: no newline at the end")
    entries = []
    for number, line in enumerate(lines[:-1], start=2):
        fields = line.split("\t", 3)
        if len(fields) != 4:
            raise FormatError(path, f"line {number}", "not BUILD_ID<TAB>SIZE<TAB>MTIME_NS<TAB>PATH")
        try:
            entries.append(SampledModule(unescape(fields[3]), _identity(*fields[:3])))
        except ValueError as error:
            raise FormatError(path, f"line {number}", str(error)) from None
    return SampledModules(entries)


def line_of(entry: SampledModule) -> str:
    """One entry's line, newline included."""
    identity = entry.identity
    if identity is None:
        fields = [UNKNOWN, UNKNOWN, UNKNOWN]
    else:
        fields = [identity.build_id or UNKNOWN, str(identity.size), str(identity.mtime_ns)]
    return "\t".join([*fields, escape(entry.path)]) + "\n"


def to_bytes(table: SampledModules) -> bytes:
    return MAGIC + "".join(map(line_of, table.entries)).encode("utf-8", "surrogateescape")


def write(table: SampledModules, dest: str | os.PathLike[str] | BinaryIO) -> None:
    """Write ``table`` to a path or a binary stream."""
    write_to(to_bytes(table), dest)


def verify(table: SampledModules) -> list[str]:
    """Problems of the file alone (pyrun never writes them); empty when clean."""
    return path_problems(e.path for e in table.entries)


def dump(table: SampledModules, out: TextIO) -> None:
    """Write the entries as readable text, one per line, in file order."""
    out.write(f"loaded modules, {len(table.entries)} files\n")
    for e in table.entries:
        shown = e.path if e.path.isprintable() else repr(e.path)
        identity = e.identity
        if identity is None:
            out.write(f"  {shown}: gone from its path when first sampled\n")
            continue
        build = f"build id {identity.build_id}" if identity.build_id else "no build id"
        out.write(f"  {shown}: {build}, {identity.size} bytes, mtime_ns {identity.mtime_ns}\n")


def dumps(table: SampledModules) -> str:
    """:func:`dump` into a string."""
    text = io.StringIO()
    dump(table, text)
    return text.getvalue()
