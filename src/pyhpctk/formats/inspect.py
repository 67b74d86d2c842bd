"""Dump and verify files, measurement directories and databases (``pyhpctk dump`` / ``verify``).

A path is one of: a single file of any known format; a measurement directory (``*.hpcrun``,
``*.hpctrace``, ``logical/``, ``threads/``, ``sources/``, ``modules/``, ``kernel_symbols/``,
``structs/``, ``gpubins/``) as pyrun or hpcrun writes it; or a database directory (``meta.db`` with
``profile.db``, ``cct.db`` and maybe ``trace.db`` and ``threads.txt``).
Verification checks each file alone, then what ties the files of a directory together.
This module reads; it never writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from pyhpctk import formats
from pyhpctk.errors import FormatError
from pyhpctk.formats import crosscheck, kallsyms, modules, sources, threads
from pyhpctk.formats.crosscheck import DATABASE_FILES
from pyhpctk.formats.whole import open_regular


@dataclass(slots=True)
class Report:
    """What verification found: problems (data is inconsistent) and unreadable files."""

    problems: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def exit_code(self) -> int:
        """``verify``'s status: 0 clean, 1 problems found, 2 something could not be read."""
        if self.unreadable:
            return 2
        return 1 if self.problems else 0


def kind_of(path: Path) -> str:
    """``file``, ``measurements`` or ``database``; a FormatError for anything else."""
    if path.is_file():
        return "file"
    if not path.exists():
        raise FormatError(path, "path", "no such file or directory")
    if not path.is_dir():
        raise FormatError(path, "path", "neither a regular file nor a directory")
    if (path / "meta.db").is_file():
        return "database"
    if any(path.glob("*.hpcrun")) or any(path.glob("*.hpctrace")):
        return "measurements"
    raise FormatError(
        path,
        "directory",
        "neither a database (no meta.db) nor a measurement directory (no .hpcrun)",
    )


# Formats by the directory they belong to (formats.md §0.1), for :func:`misplaced_input`.
_MEASUREMENT_FORMATS = ("hpcrun", "hpctrace", "logical", "threads", "sources", "modules")
_SUBDIRECTORY_FORMATS = ("logical", "threads", "sources", "modules")  # MEAS/logical/, ...
_DATABASE_FORMATS = ("metadb", "profiledb", "cctdb", "tracedb")


def misplaced_input(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is, and which tool reads it: the sentence a tool adds when it was handed
    another tool's input (``this is a measurement directory; run pyprof on it ...``).

    None when ``path`` is none of the toolchain's inputs (missing, or something else): the
    tool's own message then stands alone. Reads at most a file's first bytes.
    """
    where = Path(path)
    if where.is_dir():
        if (where / "meta.db").is_file():
            return f"this is a database; pyview shows it (pyview {where})"
        if any(where.glob("*.hpcrun")) or any(where.glob("gpubins/*.gpubin")):
            return (
                f"this is a measurement directory; run pyprof on it (pyprof {where}), then "
                "pyview on the database pyprof writes"
            )
        return None
    if not where.is_file():
        return None
    if where.suffix in (".py", ".pyw"):
        return f"this is a Python source; measure it with pyrun (pyrun python {where})"
    try:
        name = formats.detect_file(where)
    except FormatError:
        return None
    names_of = where.parent.name == threads.MEASUREMENT_DIRECTORY  # MEAS/threads/, not DB/
    if name in _DATABASE_FORMATS or (name == "threads" and not names_of):
        directory = where.parent
        return (
            f"this is the {where.name} of the database {directory}; pyview shows it "
            f"(pyview {directory})"
        )
    if name in _MEASUREMENT_FORMATS:
        directory = where.parent.parent if name in _SUBDIRECTORY_FORMATS else where.parent
        return (
            f"this is a measurement file of {directory}; the tools read the whole directory "
            f"(pystruct {directory}, pyprof {directory})"
        )
    return (
        "this is a structure file; pyprof reads it from MEASUREMENTS/structs/ or with -S "
        f"(pyprof -S {where} MEASUREMENTS)"
    )


def measurement_files(path: Path) -> list[Path]:
    """Every file of a measurement directory that has a format we read, in a stable order."""
    files = sorted(path.glob("*.hpcrun")) + sorted(path.glob("*.hpctrace"))
    files += sorted(p for p in (path / "logical").glob("*") if p.is_file())
    files += sorted(p for p in (path / threads.MEASUREMENT_DIRECTORY).glob("*") if p.is_file())
    files += sorted(p for p in (path / sources.MEASUREMENT_DIRECTORY).glob("*") if p.is_file())
    files += sorted(p for p in (path / modules.MEASUREMENT_DIRECTORY).glob("*") if p.is_file())
    symbols = path / kallsyms.KERNEL_SYMBOLS_DIRECTORY
    files += sorted(p for p in symbols.glob("*") if p.is_file())
    files += sorted((path / "structs").glob("*.hpcstruct"))
    return files


def format_of_file(file: Path) -> str:
    """The format of ``file``: from its content, except a kernel symbol file (an xz stream or
    text, no magic of its own), known by its directory ``kernel_symbols/`` or, elsewhere, as
    the only xz stream of the toolchain."""
    if file.parent.name == kallsyms.KERNEL_SYMBOLS_DIRECTORY:
        return "kallsyms"
    try:
        return formats.detect_file(file)
    except FormatError:
        with open_regular(file) as stream:  # a regular file, or a FormatError again
            if stream.read(len(kallsyms.XZ_MAGIC)) == kallsyms.XZ_MAGIC:
                return "kallsyms"
        raise


def database_files(path: Path) -> list[Path]:
    return [path / name for name in DATABASE_FILES if (path / name).is_file()]


def files_of(path: Path) -> list[Path]:
    kind = kind_of(path)
    if kind == "file":
        return [path]
    return measurement_files(path) if kind == "measurements" else database_files(path)


def dump_path(path: str | os.PathLike[str], out: TextIO) -> None:
    """Write the readable text of a file, or of every file of a directory, to ``out``.

    What is wrong in a file that can be read is shown, marked ``# problem:``; a file that
    cannot be read at all is a FormatError, raised once every other file of a directory has
    been shown (each unreadable one marked ``# unreadable:`` in its place).
    """
    root = Path(path)
    kind = kind_of(root)
    files = files_of(root)
    if kind == "measurements":
        others = sorted(p.name for p in (root / "gpubins").glob("*") if p.is_file())
        if others:
            out.write(f"# gpubins: {', '.join(others)}\n")
    if kind == "file":
        _dump_file(files[0], format_of_file(files[0]), out)
        return
    unreadable: list[FormatError] = []
    for file in files:
        try:
            name = format_of_file(file)
            out.write(f"=== {file.relative_to(root)} ({name})\n")
            _dump_file(file, name, out)
        except FormatError as error:
            out.write(f"# unreadable: {error}\n")
            unreadable.append(error)
    if unreadable:
        raise unreadable[0]


def _dump_file(file: Path, name: str, out: TextIO) -> None:
    module = formats.module(name)
    # A profile hpcprof could not use is still shown (dump marks what is wrong).
    obj = module.read(file, strict=False) if name == "hpcrun" else module.read(file)
    module.dump(obj, out)


def _read_checked(file: Path, report: Report) -> tuple[str, object] | None:
    try:
        name = format_of_file(file)
        obj = formats.module(name).read(file)
    except FormatError as error:
        report.unreadable.append(str(error))
        return None
    report.checked += 1
    report.problems.extend(f"{file}: {p}" for p in formats.module(name).verify(obj))
    return name, obj


def verify_path(path: str | os.PathLike[str]) -> Report:
    """Check a file or directory; unreadable files and problems are collected, not raised."""
    root = Path(path)
    report = Report()
    try:
        kind = kind_of(root)
    except FormatError as error:
        report.unreadable.append(str(error))
        return report
    read: dict[Path, tuple[str, object]] = {}
    for file in files_of(root):
        result = _read_checked(file, report)
        if result is not None:
            read[file] = result
    if kind == "measurements":
        report.problems.extend(crosscheck.measurement_problems(read))
    elif kind == "database":
        report.problems.extend(crosscheck.database_problems(root, read))
    return report
