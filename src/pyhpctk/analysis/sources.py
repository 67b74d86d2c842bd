"""Which source files go into ``DB/src``, and copying them without publishing what they are not.

A measurement is untrusted input: a program names any file it likes as the source of its code
(``exec(compile(code, "/etc/shadow", "exec"))``), and anyone can edit a measurement. So a file
is copied only when something vouches for it (:class:`Warrants`):

* pyrun's loaded-sources table (``MEAS/sources/``, :mod:`pyhpctk.formats.sources`) lists it,
  with the sha256 it had in the run, and it still has that hash (else: "changed since the
  run"); a symbolic link is followed only then, the hash proving what is behind it;
* or a structure file used for the analysis names it (an ``F`` scope or an ``f`` attribute of a
  binary's ``LM``: sources of native code, as hpcprof copies them; hpcrun's measurements have
  no table, so only these); such a name is never followed through a symbolic link.

What is copied must be a regular file outside ``/proc``, ``/sys`` and ``/dev`` (checked on the
name before opening and on the open descriptor after, so a link or a rename in between cannot
redirect the copy), that pyprof can read; the copy never has a permission bit the original
lacks, and no group bit for a group other than the original's unless others had it too. Every
file not copied is counted, under its reason, for the run's summary (:class:`SourcesReport`).
No name read from a measurement chooses where anything is written: copies land inside ``src/``
whatever their names hold.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import re
import stat
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import gpu_memory
from pyhpctk.formats import sources as loaded_sources

NOT_LOADED = "not loaded by the program"
NOT_STRUCTURED = "named by no structure file (the measurement records no loaded sources)"
CHANGED = "changed since the run"
SPECIAL = "in /proc, /sys or /dev"
LINK = "a symbolic link"
NOT_REGULAR = "not a regular file"
UNREADABLE = "cannot be read"
MISSING = "not found"
NO_PLACE = "no place in src/"
SPECIAL_TREES = ("/proc", "/sys", "/dev")
_CHUNK = 1 << 20
_SHOWN = 3  # names shown per reason in the summary


@dataclass(frozen=True, slots=True)
class Warrants:
    """What vouches for a source file: pyrun's loaded-sources tables (path -> the sha256s it
    had in the runs) and the files structure files name."""

    loaded: dict[str, frozenset[str]] = field(default_factory=dict)
    structured: frozenset[str] = frozenset()
    tables: bool = False  # some measurement had a loaded-sources table


def read_tables(measurements: Iterable[Path]) -> tuple[dict[str, frozenset[str]], bool]:
    """Every ``MEAS/sources/*.txt`` of the measurements: path -> recorded hashes, and whether
    there was any table. A table that cannot be read is a warning and vouches for nothing."""
    hashes: dict[str, set[str]] = {}
    found = False
    for measurement in measurements:
        directory = measurement / loaded_sources.MEASUREMENT_DIRECTORY
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.txt")):
            found = True
            try:
                table = loaded_sources.read(path)
            except (FormatError, OSError) as error:
                warnings.warn(f"{error}: these sources are not copied", FormatWarning, 2)
                continue
            for entry in table.entries:
                hashes.setdefault(entry.path, set()).add(entry.sha256)
    return {path: frozenset(digests) for path, digests in hashes.items()}, found


@dataclass(slots=True)
class SourcesReport:
    """How many sources were copied, and each one that was not, by reason."""

    copied: int = 0
    refused: dict[str, list[str]] = field(default_factory=dict)
    skipped: bool = False  # --no-sources

    def refuse(self, name: str, reason: str) -> None:
        self.refused.setdefault(reason, []).append(name)

    def line(self) -> str:
        """One line for pyprof's summary."""
        if self.skipped:
            return "sources: not copied (--no-sources)"
        text = f"sources: {self.copied} copied"
        missed = sum(len(names) for names in self.refused.values())
        if missed:
            parts = []
            for reason, names in self.refused.items():
                shown = ", ".join(names[:_SHOWN])
                more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
                parts.append(f"{len(names)} {reason}: {shown}{more}")
            text += f", {missed} not copied ({'; '.join(parts)})"
        return text


def copy_sources(
    files: Iterable[str], directory: Path, warrants: Warrants
) -> tuple[set[str], SourcesReport]:
    """Copy the source files named ``files`` that are vouched for into ``directory/src``; the
    names copied and the report. ``/a/b.py`` goes to ``src/a/b.py``, as hpcprof places it (the
    name normalised first: ``..`` above the root stays at the root). Names that are no absolute
    path (``<frozen ...>``, ``<string>``) are no files and are passed over; an error writing
    a copy (a full disk) is raised."""
    root = directory / "src"
    report = SourcesReport()
    placed: dict[str, str] = {}  # where in src/ -> the real path of the source copied there
    copied: set[str] = set()
    special = _special_devices()
    for name in files:
        if not name.startswith("/") or "\0" in name:
            continue
        relative = posixpath.normpath(name).lstrip("/")
        if not relative:
            continue
        digests = warrants.loaded.get(name)
        if digests is None and name not in warrants.structured:
            report.refuse(name, NOT_LOADED if warrants.tables else NOT_STRUCTURED)
            continue
        reason = _copy_one(name, relative, root, digests, special, placed)
        if reason is None:
            copied.add(name)
        else:
            report.refuse(name, reason)
    report.copied = len(copied)
    return copied, report


#: The files pyrun writes into ``gpumem/`` (docs/formats.md, "GPU memory"): what pyprof copies.
GPU_MEMORY_NAME = re.compile(r"(memory-(\d+)(?:-\d+)?\.json|oom-(\d+)-\d+\.txt)")


def copy_gpu_memory(measurements: Iterable[Path], database: Path) -> int:
    """Copy the measurements' ``gpumem/`` timelines and out-of-memory reports into the
    database's ``gpumem/``; how many were copied. Only the names pyrun gives them, only regular
    files, never through a symbolic link, never wider than their own mode (as sources are
    copied); a name taken twice (one pid in two measurements, as on two hosts) is numbered on."""
    copied = 0
    for measurement in measurements:
        folder = measurement / gpu_memory.DIRECTORY
        if folder.is_symlink() or not folder.is_dir():
            continue
        for name in sorted(os.listdir(folder)):
            if GPU_MEMORY_NAME.fullmatch(name):
                copied += _copy_gpu_memory_file(folder / name, database)
    return copied


def _copy_gpu_memory_file(path: Path, database: Path) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError:
        return 0  # gone, unreadable or a link
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return 0
        found = GPU_MEMORY_NAME.fullmatch(path.name)
        assert found is not None
        pid = found.group(2) or found.group(3)
        pattern = "memory-{}-{}.json" if found.group(2) else "oom-{}-{}.txt"
        for name in [path.name, *(pattern.format(pid, n) for n in range(2, 1000))]:
            if not (database / gpu_memory.DIRECTORY / name).exists():
                relative = f"{gpu_memory.DIRECTORY}/{name}"
                return int(_copy_into(database, relative, fd, status, None) is None)
        return 0
    finally:
        os.close(fd)


def _special_devices() -> set[int]:
    devices = set()
    for tree in SPECIAL_TREES:
        with contextlib.suppress(OSError):
            devices.add(os.stat(tree).st_dev)
    return devices


def _in_special_tree(path: str) -> bool:
    return any(path == tree or path.startswith(tree + "/") for tree in SPECIAL_TREES)


def _copy_one(
    name: str,
    relative: str,
    root: Path,
    digests: frozenset[str] | None,
    special: set[int],
    placed: dict[str, str],
) -> str | None:
    """Copy one vouched-for file; why not, or None when copied."""
    if _in_special_tree(posixpath.normpath(name)) or _in_special_tree(os.path.realpath(name)):
        return SPECIAL  # never opened: opening some devices does something
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if digests is None:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(name, flags)
    except OSError as error:
        if error.errno == errno.ELOOP and digests is None:
            return LINK
        return MISSING if error.errno in (errno.ENOENT, errno.ENOTDIR) else UNREADABLE
    try:
        status = os.fstat(fd)
        real = _opened_path(fd, name)
        if status.st_dev in special or _in_special_tree(real):
            return SPECIAL
        if not stat.S_ISREG(status.st_mode):
            return NOT_REGULAR
        if relative in placed:
            return None if placed[relative] == real else NO_PLACE
        problem = _copy_into(root, relative, fd, status, digests)
        if problem is None:
            placed[relative] = real
        return problem
    finally:
        os.close(fd)


def _opened_path(fd: int, name: str) -> str:
    """The path of the file open as ``fd`` (what a link or a rename led to)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(name)


def _copy_into(
    root: Path, relative: str, source: int, status: os.stat_result, digests: frozenset[str] | None
) -> str | None:
    """Copy the open file ``source`` to ``root/relative``, making plain directories on the way;
    why not, or None when written. Never follows a symbolic link, never replaces a file, and
    removes a copy whose hash is not one of ``digests``."""
    *parents, leaf = relative.split("/")
    where = root
    for part in ["", *parents]:
        where = where / part if part else where
        try:
            os.mkdir(where)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(where).st_mode):
                return NO_PLACE
    target = where / leaf
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(target, flags, status.st_mode & 0o666)
    except FileExistsError:
        return NO_PLACE
    try:
        _narrow_group(fd, status)
        digest = hashlib.sha256()
        while chunk := _read(source):
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
    except _Unreadable:
        os.unlink(target)
        return UNREADABLE
    finally:
        os.close(fd)
    if digests is not None and digest.hexdigest() not in digests:
        os.unlink(target)
        return CHANGED
    return None


class _Unreadable(Exception):
    pass


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _CHUNK)
    except OSError as error:
        raise _Unreadable from error


def _narrow_group(fd: int, original: os.stat_result) -> None:
    """A copy owned by another group than the original's keeps a group bit only where the
    original gave it to everyone (others): its group's members had no such right."""
    mine = os.fstat(fd)
    if mine.st_gid == original.st_gid:
        return
    others = original.st_mode & 0o007
    mode = stat.S_IMODE(mine.st_mode)
    narrowed = (mode & ~0o070) | (mode & 0o070 & (others << 3))
    if narrowed != mode:
        os.fchmod(fd, narrowed)


__all__ = [
    "CHANGED",
    "LINK",
    "MISSING",
    "NOT_LOADED",
    "NOT_REGULAR",
    "NOT_STRUCTURED",
    "NO_PLACE",
    "SPECIAL",
    "UNREADABLE",
    "SourcesReport",
    "Warrants",
    "copy_sources",
    "read_tables",
]
