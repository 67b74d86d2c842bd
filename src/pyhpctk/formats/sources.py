"""Read and write the loaded-sources table: pyhpctk's side file of the sources a program loaded.

A name in a measurement (a ``logical/`` file's, a structure file's) says nothing about whether
the program ever read that file: ``exec(compile(code, "/etc/shadow", "exec"))`` names
``/etc/shadow``. So pyrun records, per measured process, the source files it saw the program
load (a module's ``__file__``, the script), each with the sha256 of its bytes as the run had
them, in ``MEAS/sources/PID.TAG.txt`` (``TAG``: that of the process's ``logical/`` file), and
pyprof copies a Python source into ``DB/src`` only when it is listed there with the hash it has
now (docs/formats.md, "Loaded sources"; :mod:`pyhpctk.analysis.sources`).

The file is UTF-8 text (``surrogateescape``: any bytes round-trip): a first line
``pyhpctk-sources 1``, then one line per file ``SHA256<TAB>PATH``, ``SHA256`` 64 lowercase hex
digits, ``PATH`` escaped as in the thread-names file (a backslash, a tab, a newline and a
carriage return written ``\\\\``, ``\\t``, ``\\n``, ``\\r``). pyrun's encoder
(:func:`pyhpctk.measure.source_files.encode_sources`) writes the same bytes as :func:`to_bytes`.
This module must never raise anything but :class:`~pyhpctk.errors.FormatError` on bad input.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcrun_constants import SOURCES_MAGIC
from pyhpctk.formats.threads import escape, unescape
from pyhpctk.formats.whole import Source, read_whole

__all__ = [
    "MAGIC",
    "MEASUREMENT_DIRECTORY",
    "LoadedSource",
    "LoadedSources",
    "dump",
    "dumps",
    "read",
    "sniff",
    "to_bytes",
    "verify",
    "write",
]

MAGIC = SOURCES_MAGIC
MEASUREMENT_DIRECTORY = "sources"  # MEAS/sources/PID.TAG.txt
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class LoadedSource:
    """A file the program loaded, and the sha256 (hex) of its bytes in the run."""

    sha256: str
    path: str


@dataclass(slots=True)
class LoadedSources:
    """A whole loaded-sources file, entries in file order."""

    entries: list[LoadedSource] = field(default_factory=list)


def sniff(head: bytes) -> bool:
    """Is this the start of a loaded-sources file?"""
    return head.startswith(MAGIC)


def read(source: Source) -> LoadedSources:
    """Read a loaded-sources file from a path, a buffer or a binary stream."""
    whole, path = read_whole(source)
    data = bytes(whole)
    if not data.startswith(MAGIC):
        raise FormatError(path, "header", f"bad magic {data[:18]!r}, not a loaded-sources file")
    text = data[len(MAGIC) :].decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    if lines[-1]:
        raise FormatError(path, f"line {len(lines) + 1}", "truncated: no newline at the end")
    entries = []
    for number, line in enumerate(lines[:-1], start=2):
        digest, tab, name = line.partition("\t")
        if not tab or not _DIGEST.fullmatch(digest):
            raise FormatError(path, f"line {number}", "not SHA256<TAB>PATH (64 hex digits)")
        try:
            entries.append(LoadedSource(digest, unescape(name)))
        except ValueError as error:
            raise FormatError(path, f"line {number}", str(error)) from None
    return LoadedSources(entries)


def to_bytes(table: LoadedSources) -> bytes:
    lines = [f"{e.sha256}\t{escape(e.path)}\n" for e in table.entries]
    return MAGIC + "".join(lines).encode("utf-8", "surrogateescape")


def write(table: LoadedSources, dest: str | os.PathLike[str] | BinaryIO) -> None:
    """Write ``table`` to a path or a binary stream."""
    write_to(to_bytes(table), dest)


def write_to(data: bytes, dest: str | os.PathLike[str] | BinaryIO) -> None:
    """Write a side file's ``data`` to a path or a binary stream (this one's and
    :mod:`.modules`')."""
    if isinstance(dest, str | os.PathLike):
        Path(dest).write_bytes(data)
    else:
        dest.write(data)


def path_problems(paths: Iterable[str]) -> list[str]:
    """Problems of a side file's list of paths (this one's and :mod:`.modules`'): each must be
    absolute and listed once."""
    problems = []
    seen: set[str] = set()
    for i, path in enumerate(paths):
        where = f"entry {i} ({path!r})"
        if path in seen:
            problems.append(f"{where}: listed more than once")
        seen.add(path)
        if not path.startswith("/"):
            problems.append(f"{where}: not an absolute path")
    return problems


def verify(table: LoadedSources) -> list[str]:
    """Problems of the file alone (pyrun never writes them); empty when clean."""
    return path_problems(e.path for e in table.entries)


def dump(table: LoadedSources, out: TextIO) -> None:
    """Write the entries as readable text, one per line, in file order."""
    out.write(f"loaded sources, {len(table.entries)} files\n")
    for e in table.entries:
        shown = e.path if e.path.isprintable() else repr(e.path)
        out.write(f"  {shown}: sha256 {e.sha256}\n")


def dumps(table: LoadedSources) -> str:
    """:func:`dump` into a string."""
    text = io.StringIO()
    dump(table, text)
    return text.getvalue()
