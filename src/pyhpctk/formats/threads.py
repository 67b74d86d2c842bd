"""Read and write thread names: pyhpctk's side file of measurements and databases.

hpcrun's profile header has no place for a thread's name, so pyrun records the name of every
thread it measured (threading's name as the thread ended or was last written, or for a thread
that never ran Python the kernel's ``comm`` name, e.g. OpenBLAS's) in a side file that hpcprof
and hpcviewer never read (docs/formats.md, "Thread names"):

- ``MEAS/threads/PID.TAG.txt``, one per measured process (``TAG``: that of its ``logical/``
  file), keyed by the profile's file stem (``by-file``);
- ``DB/threads.txt``, written by pyprof and pyprof-mpi, keyed by profile.db index
  (``by-profile``).

The file is UTF-8 text (``surrogateescape``: any bytes round-trip): a first line
``pyhpctk-threads 1 KEYED-BY``, then one line per thread ``KEY<TAB>PID<TAB>PROGRAM<TAB>NAME``
(``PROGRAM``: the basename of the process's ``sys.argv[0]``), where a backslash, a tab, a
newline and a carriage return in a field are written ``\\\\``, ``\\t``, ``\\n``, ``\\r``.
pyrun's encoder (:func:`pyhpctk.measure.encode.encode_threads`) writes the same bytes as
:func:`to_bytes`. This module must never raise anything but
:class:`~pyhpctk.errors.FormatError` on bad input.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcrun_constants import THREADS_BY_FILE, THREADS_BY_PROFILE, THREADS_MAGIC
from pyhpctk.formats.whole import Source, read_whole

__all__ = [
    "BY_FILE",
    "BY_PROFILE",
    "DATABASE_FILE",
    "MAGIC",
    "MEASUREMENT_DIRECTORY",
    "ThreadEntry",
    "ThreadNamesFile",
    "dump",
    "dumps",
    "escape",
    "read",
    "sniff",
    "to_bytes",
    "unescape",
    "verify",
    "write",
]

MAGIC = THREADS_MAGIC
MEASUREMENT_DIRECTORY = "threads"  # MEAS/threads/PID.TAG.txt, by file
DATABASE_FILE = "threads.txt"  # DB/threads.txt, by profile
BY_FILE, BY_PROFILE = THREADS_BY_FILE, THREADS_BY_PROFILE
FIELDS = 4
_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {v[1]: k for k, v in _ESCAPES.items()}
_SPECIAL = re.compile(r"[\\\t\n\r]")
_ESCAPED = re.compile(r"\\(.?)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ThreadEntry:
    """One measured thread: ``key`` names its profile (a file stem, or a profile.db index)."""

    key: str
    pid: int
    program: str
    name: str


@dataclass(slots=True)
class ThreadNamesFile:
    """A whole thread-names file: what its keys are, and its entries in file order."""

    keyed_by: str
    entries: list[ThreadEntry] = field(default_factory=list)

    def by_key(self) -> dict[str, ThreadEntry]:
        """Entries by key (the last one wins if a key repeats)."""
        return {entry.key: entry for entry in self.entries}

    def by_profile(self) -> dict[int, ThreadEntry]:
        """Entries of a ``by-profile`` file by profile.db index (keys that are none: left out)."""
        return {int(e.key): e for e in self.entries if e.key.isdigit() and e.key.isascii()}


def escape(text: str) -> str:
    return _SPECIAL.sub(lambda m: _ESCAPES[m.group(0)], text)


def unescape(text: str) -> str:
    """The field ``text`` stands for; ValueError on a backslash that starts no escape."""

    def one(match: re.Match[str]) -> str:
        found = _UNESCAPES.get(match.group(1))
        if found is None:
            raise ValueError(f"unknown escape {match.group(0)!r}")
        return found

    return _ESCAPED.sub(one, text)


def sniff(head: bytes) -> bool:
    """Is this the start of a thread-names file?"""
    return head.startswith(MAGIC)


def read(source: Source) -> ThreadNamesFile:
    """Read a thread-names file from a path, a buffer or a binary stream."""
    whole, path = read_whole(source)
    text = bytes(whole).decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    header = lines[0]
    if not header.encode("utf-8", "surrogateescape").startswith(MAGIC):
        raise FormatError(path, "header", f"bad magic {header[:24]!r}, not a thread-names file")
    keyed_by = header[len(MAGIC) :]
    if keyed_by not in (BY_FILE, BY_PROFILE):
        raise FormatError(path, "header", f"unknown key kind {keyed_by!r}")
    if lines[-1]:
        raise FormatError(path, f"line {len(lines)}", "truncated: no newline at the end")
    entries = []
    for number, line in enumerate(lines[1:-1], start=2):
        fields = line.split("\t")
        if len(fields) != FIELDS:
            raise FormatError(
                path, f"line {number}", f"{len(fields)} tab-separated fields, not {FIELDS}"
            )
        key, pid, program, name = fields
        if not (pid.isascii() and pid.isdigit()):
            raise FormatError(path, f"line {number}", f"process id {pid!r} is not a number")
        try:
            entries.append(ThreadEntry(unescape(key), int(pid), unescape(program), unescape(name)))
        except ValueError as error:
            raise FormatError(path, f"line {number}", str(error)) from None
    return ThreadNamesFile(keyed_by, entries)


def to_bytes(names: ThreadNamesFile) -> bytes:
    lines = [MAGIC.decode("ascii") + names.keyed_by]
    for e in names.entries:
        lines.append(f"{escape(e.key)}\t{e.pid}\t{escape(e.program)}\t{escape(e.name)}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def write(names: ThreadNamesFile, dest: str | os.PathLike[str] | BinaryIO) -> None:
    """Write ``names`` to a path or a binary stream."""
    data = to_bytes(names)
    if isinstance(dest, str | os.PathLike):
        Path(dest).write_bytes(data)
    else:
        dest.write(data)


def verify(names: ThreadNamesFile) -> list[str]:
    """Problems of the file alone (pyrun and pyprof never write them); empty when clean."""
    problems = []
    seen: set[str] = set()
    for i, e in enumerate(names.entries):
        where = f"entry {i} ({e.key!r})"
        if e.key in seen:
            problems.append(f"{where}: key listed more than once")
        seen.add(e.key)
        if not e.key:
            problems.append(f"{where}: empty key")
        elif names.keyed_by == BY_PROFILE and not (
            e.key.isascii() and e.key.isdigit() and int(e.key) >= 1
        ):
            problems.append(f"{where}: not a profile.db index of a thread profile (1, 2, ...)")
        if e.pid == 0:
            problems.append(f"{where}: process id 0")
        if not e.name:
            problems.append(f"{where}: empty thread name")
    return problems


def _show(text: str) -> str:
    return text if text.isprintable() else repr(text)


def dump(names: ThreadNamesFile, out: TextIO) -> None:
    """Write the entries as readable text, one per line, in file order."""
    what = "profile" if names.keyed_by == BY_PROFILE else "file"
    out.write(f"thread names by {what}, {len(names.entries)} threads\n")
    for e in names.entries:
        out.write(f"  {_show(e.key)}: {_show(e.name)} (pid {e.pid}, {_show(e.program)})\n")


def dumps(names: ThreadNamesFile) -> str:
    """:func:`dump` into a string."""
    text = io.StringIO()
    dump(names, text)
    return text.getvalue()
