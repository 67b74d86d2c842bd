"""Dump and verify files, measurement directories and databases (``pyhpctk dump`` / ``verify``).

A path is one of: a single file of any known format; a measurement directory (``*.hpcrun``,
``*.hpctrace``, ``logical/``, ``structs/``, ``gpubins/``) as pyrun or hpcrun writes it; or a
database directory (``meta.db`` with ``profile.db``, ``cct.db`` and maybe ``trace.db``).
Verification checks each file alone, then what ties the files of a directory together.
This module reads; it never writes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from pyhpctk import formats
from pyhpctk.errors import FormatError
from pyhpctk.formats import metadb

DATABASE_FILES = ("meta.db", "profile.db", "cct.db", "trace.db")


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
_MEASUREMENT_FORMATS = ("hpcrun", "hpctrace", "logical")
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
    if name in _DATABASE_FORMATS:
        directory = where.parent
        return (
            f"this is the {where.name} of the database {directory}; pyview shows it "
            f"(pyview {directory})"
        )
    if name in _MEASUREMENT_FORMATS:
        directory = where.parent.parent if name == "logical" else where.parent
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
    files += sorted((path / "structs").glob("*.hpcstruct"))
    return files


def database_files(path: Path) -> list[Path]:
    return [path / name for name in DATABASE_FILES if (path / name).is_file()]


def files_of(path: Path) -> list[Path]:
    kind = kind_of(path)
    if kind == "file":
        return [path]
    return measurement_files(path) if kind == "measurements" else database_files(path)


def dump_path(path: str | os.PathLike[str], out: TextIO) -> None:
    """Write the readable text of a file, or of every file of a directory, to ``out``."""
    root = Path(path)
    kind = kind_of(root)
    files = files_of(root)
    if kind == "measurements":
        others = sorted(p.name for p in (root / "gpubins").glob("*") if p.is_file())
        if others:
            out.write(f"# gpubins: {', '.join(others)}\n")
    for file in files:
        name = formats.detect_file(file)
        if kind != "file":
            out.write(f"=== {file.relative_to(root)} ({name})\n")
        formats.module(name).dump(formats.module(name).read(file), out)


def _read_checked(file: Path, report: Report) -> tuple[str, object] | None:
    try:
        name = formats.detect_file(file)
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
        _verify_measurement_links(read, report)
    elif kind == "database":
        _verify_database_links(root, read, report)
    return report


def _verify_measurement_links(read: dict[Path, tuple[str, object]], report: Report) -> None:
    """Each trace must name only nodes of its sibling profile (formats.md §2); each profile's
    ``logical/`` load module (a path relative to the directory, pyrun's Python frames) must exist.
    """
    verify_trace: Callable[[object, object], list[str]] = formats.module("hpctrace").verify_trace
    for file, (name, profile) in read.items():
        if name != "hpcrun":
            continue
        for module in getattr(profile, "load_modules", ()):
            rel = str(module.path)
            if rel.startswith("logical/") and not (file.parent / rel).is_file():
                report.problems.append(f"{file}: load module {rel} is missing")
    for file, (name, trace) in read.items():
        if name != "hpctrace":
            continue
        sibling = read.get(file.with_suffix(".hpcrun"))
        if sibling is None:
            report.problems.append(f"{file}: trace without a readable sibling .hpcrun profile")
            continue
        report.problems.extend(f"{file}: {p}" for p in verify_trace(trace, sibling[1]))


def _verify_database_links(
    root: Path, read: dict[Path, tuple[str, object]], report: Report
) -> None:
    """profile.db and cct.db hold the same values; traces name contexts of meta.db (§3.4, §3.5)."""
    missing = [n for n in DATABASE_FILES[:3] if not (root / n).is_file()]
    report.problems.extend(f"{root}: missing {n}" for n in missing)
    parts = {name: obj for name, obj in read.values()}
    meta, profiles, contexts = parts.get("metadb"), parts.get("profiledb"), parts.get("cctdb")
    if profiles is not None and contexts is not None:
        check = formats.module("cctdb").verify_against_profiles
        report.problems.extend(f"{root}: {p}" for p in check(contexts, profiles))
    traces = parts.get("tracedb")
    if isinstance(meta, metadb.MetaDB) and traces is not None:
        known = meta.index().table["ctx_id"]
        check = formats.module("tracedb").verify_contexts
        report.problems.extend(f"{root / 'trace.db'}: {p}" for p in check(traces, known))
