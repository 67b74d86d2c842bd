"""Writing outputs so that nothing is lost: a temporary name beside the output, renamed into
place when complete; an existing output replaced only when asked; write errors in one line.

Every command that writes a file or a directory a user names goes through here: pyprof's and
pyprof-mpi's database directory, pyview's ``--csv/--json/--html/--trace-export``, pymodel's
``--json/--extrap/--plot``, pystruct's structure files. A full disk (ENOSPC), a full quota
(EDQUOT) or a failing device (EIO) then never leaves a truncated file under the name the user
asked for, and an existing output is never replaced by half of a new one.

* Files: :func:`open_text` / :func:`open_binary` (or :func:`write_bytes`) write to
  ``.NAME.PID.RANDOM.tmp`` in the output's own directory (one file system, so the rename is
  atomic), created with ``O_EXCL`` so that a symbolic link planted under that name is never
  followed. Without ``force`` the finished file is linked to its name (``link`` fails when the
  name appeared meanwhile: nothing is replaced, even in a race); with ``force`` it is renamed
  over the old file, whose permission bits it takes. A symbolic link under the output's name is
  replaced, never followed (as ``os.replace`` does; an input directory may hold a planted one).
  Devices and FIFOs (themselves, not links to them) and ``/dev/std*`` / ``/proc/*/fd`` names
  are streams: written in place, never refused (unless the output lies in a directory that came
  with an input: ``streams=False``).
* Directories: :func:`make_staging` and :func:`commit_directory` (pyprof assembles the database
  in a staging directory and renames it; an old database is moved aside first and removed only
  once the new one holds the name).

An ``OSError`` while writing becomes :class:`OutputError` naming the output, the reason and what
was left; callers that write inside a staging directory convert theirs with :func:`write_error`.
This module imports nothing but the standard library and :mod:`pyhpctk.errors`, so that pyrun's
measured processes may use it too.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, TextIO

from pyhpctk.errors import PyhpctkError

__all__ = [
    "OutputError",
    "already_exists",
    "check_new",
    "commit_directory",
    "is_stream",
    "make_staging",
    "open_binary",
    "open_text",
    "write_bytes",
    "write_error",
]

StrPath = str | os.PathLike[str]

# Names of an open file descriptor (``--csv /dev/stdout``), whatever the descriptor is.
_STANDARD_STREAM = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|\d+)/fd/\d+")

# Longest part (bytes) of the output's name kept in a temporary name (NAME_MAX: 255 bytes).
_NAME_KEPT = 200


# A file system that refused data this way will refuse the next file too.
FILE_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


class OutputError(PyhpctkError):
    """An output cannot be written: it exists (without ``force``), its directory is missing or
    unwritable, or writing failed (full disk, quota, I/O error); ``errno`` is the ``OSError``'s."""

    exit_code = 2

    def __init__(self, message: str, number: int | None = None) -> None:
        super().__init__(message)
        self.errno = number

    @property
    def file_system_failed(self) -> bool:
        """Full, over quota, read-only or failing: writing more outputs there is pointless."""
        return self.errno in FILE_SYSTEM_ERRNOS


def already_exists(dest: StrPath, option: str) -> OutputError:
    """The refusal every command gives for an existing output (pyprof's wording)."""
    return OutputError(
        f"{os.fspath(dest)}: already exists; choose another {option} or pass --force"
    )


def write_error(dest: StrPath, error: OSError, kept: str) -> OutputError:
    """``DEST: cannot write: REASON (KEPT)`` for an ``OSError`` met while writing ``dest``."""
    reason = error.strerror or str(error)
    return OutputError(f"{os.fspath(dest)}: cannot write: {reason} ({kept})", error.errno)


def is_stream(dest: StrPath) -> bool:
    """Is ``dest`` written in place: a device, a FIFO, a socket, or stdout named as a file?"""
    text = os.fspath(dest)
    if _STANDARD_STREAM.fullmatch(text):
        return True
    try:
        mode = os.lstat(text).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


def check_new(dest: StrPath, force: bool, option: str, streams: bool = True) -> None:
    """Refuse ``dest`` before any work is done: it exists (and ``force`` is off), it is a
    directory, or its directory does not exist. Streams are accepted unless ``streams`` is off
    (outputs inside a directory an input came with: a FIFO planted there would hang us)."""
    path = Path(dest)
    if streams and is_stream(path):
        return
    if path.is_dir():
        raise OutputError(f"{path}: is a directory; {option} needs a file name")
    if os.path.lexists(path):
        if not force:
            raise already_exists(path, option)
        return
    parent = path.parent
    if not parent.is_dir():
        problem = "does not exist" if not os.path.lexists(parent) else "is not a directory"
        raise OutputError(f"{path}: cannot write: directory {parent} {problem}")


def _temporary_name(target: Path, suffix: str) -> Path:
    kept = os.fsencode(target.name)[:_NAME_KEPT]  # bytes: NAME_MAX counts bytes, not characters
    name = b"." + kept + f".{os.getpid()}.{secrets.token_hex(4)}{suffix}".encode()
    return target.with_name(os.fsdecode(name))


def _unlink_quietly(path: Path) -> None:
    with suppress(OSError):
        os.unlink(path)


@contextmanager
def _staged_file(dest: StrPath, force: bool, option: str, streams: bool) -> Iterator[int]:
    """A file descriptor to write ``dest``'s contents to: a temporary file beside it, or the
    stream itself. The caller closes the descriptor (or the file object wrapping it) before the
    block ends; the temporary file then takes ``dest``'s name."""
    path = Path(dest)
    if streams and is_stream(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        except OSError as error:
            raise write_error(path, error, "nothing was written") from None
        try:
            yield fd
        except OSError as error:
            raise write_error(path, error, "the output is incomplete") from None
        return
    check_new(path, force, option, streams)
    target = path  # a symbolic link is replaced, never followed: it may have been planted
    try:
        old: os.stat_result | None = os.stat(target, follow_symlinks=False)
    except OSError:
        old = None
    kept = f"{path} is unchanged" if old is not None else "nothing was left under that name"
    temporary = _temporary_name(target, ".tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as error:
        raise write_error(path, error, kept) from None
    try:
        if old is not None and stat.S_ISREG(old.st_mode):
            try:
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
            except OSError:
                os.close(fd)
                raise
        yield fd
        if force:
            os.replace(temporary, target)
        else:
            _link_new(temporary, target, path, option)
    except OSError as error:
        _unlink_quietly(temporary)
        raise write_error(path, error, kept) from None
    except BaseException:
        _unlink_quietly(temporary)
        raise


def _link_new(temporary: Path, target: Path, dest: Path, option: str) -> None:
    """Give ``temporary`` the name ``target`` unless that name exists by now."""
    try:
        os.link(temporary, target)
    except FileExistsError:
        _unlink_quietly(temporary)
        raise already_exists(dest, option) from None
    except OSError:  # a file system without hard links: rename (the check was just made)
        if os.path.lexists(target):
            _unlink_quietly(temporary)
            raise already_exists(dest, option) from None
        os.replace(temporary, target)
        return
    _unlink_quietly(temporary)


@contextmanager
def open_text(
    dest: StrPath, force: bool = False, option: str = "-o", streams: bool = True
) -> Iterator[TextIO]:
    """A UTF-8 text stream whose contents become the file ``dest`` when the block completes.

    Without ``force`` an existing ``dest`` is refused (``already exists; choose another OPTION
    or pass --force``). Text that came from bytes that are not UTF-8 (``surrogateescape``) is
    written back as those bytes. On any error nothing is left under ``dest`` (or the old file
    stays as it was) and an ``OSError`` becomes :class:`OutputError`. A stream (a device, a FIFO,
    ``/dev/stdout``) is written in place unless ``streams`` is off; then it is an existing file.
    """
    with (
        _staged_file(dest, force, option, streams) as fd,
        open(fd, "w", encoding="utf-8", errors="surrogateescape", newline="") as stream,
    ):
        yield stream  # closing flushes: a full disk may only show there, and is caught


@contextmanager
def open_binary(
    dest: StrPath, force: bool = False, option: str = "-o", streams: bool = True
) -> Iterator[BinaryIO]:
    """:func:`open_text` for bytes."""
    with _staged_file(dest, force, option, streams) as fd, open(fd, "wb") as stream:
        yield stream


def write_bytes(
    dest: StrPath, data: bytes, force: bool = False, option: str = "-o", streams: bool = True
) -> None:
    """Write ``data`` as the file ``dest`` through a temporary name (see :func:`open_binary`)."""
    with open_binary(dest, force, option, streams) as stream:
        stream.write(data)


# --------------------------------------------------------------------------------------------
# Directories


def make_staging(output: Path, what: str = "it") -> Path:
    """A new empty directory beside ``output`` to assemble ``what`` in (``.NAME.PID.RANDOM``).

    Created by ``mkdir`` so that it gets the user's umask (0755 usually), as hpcprof's
    directories do: ``tempfile.mkdtemp`` would make it 0700, and the renamed database would be
    unreadable for the rest of a project group.
    """
    while True:
        staging = _temporary_name(output, "")
        try:
            staging.mkdir()
        except FileExistsError:
            continue
        except OSError as error:  # e.g. no write permission in the parent directory
            raise OutputError(
                f"{output}: cannot create {what} here: {error.strerror or error}"
            ) from None
        return staging


def commit_directory(staging: Path, output: Path) -> None:
    """Rename the finished ``staging`` directory to ``output``.

    An existing ``output`` (the caller decided it may be replaced) is renamed aside first and
    removed after, so that ``output`` names a whole directory at every moment.
    """
    if not os.path.lexists(output):
        os.rename(staging, output)
        return
    aside = _temporary_name(output, ".old")
    os.rename(output, aside)
    try:
        os.rename(staging, output)
    except BaseException:
        os.rename(aside, output)
        raise
    shutil.rmtree(aside, ignore_errors=True)
