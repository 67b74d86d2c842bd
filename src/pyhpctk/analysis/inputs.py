"""Input acquisition: find the profiles of measurement directories and read them.

A measurement directory holds one ``.hpcrun`` per thread or GPU stream, an optional ``.hpctrace``
beside each, ``structs/*.hpcstruct`` (formats.md §0.1) and, from pyrun, ``threads/*.txt`` (the
thread names, docs/formats.md). This module lists them, checks the directories exist and are not
empty; reading is the format modules' job (:mod:`pyhpctk.formats.hpcrun`,
:mod:`pyhpctk.formats.hpctrace`, :mod:`pyhpctk.formats.threads`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from pyhpctk.errors import FormatError, FormatWarning, PyhpctkError, UsageError
from pyhpctk.formats import threads
from pyhpctk.formats.inspect import misplaced_input


class InputError(PyhpctkError):
    """A measurement directory is missing, empty or unreadable."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class ProfileSource:
    """One profile to aggregate: its ``.hpcrun``, its ``.hpctrace`` (if any), its directory."""

    measurement: Path
    profile: Path
    trace: Path | None

    @property
    def name(self) -> str:
        return self.profile.name


def discover(measurements: tuple[Path, ...] | list[Path]) -> list[ProfileSource]:
    """Every profile of every measurement directory, in a stable order (directory, then name)."""
    sources: list[ProfileSource] = []
    seen: set[Path] = set()
    for directory in measurements:
        if not directory.exists():
            raise InputError(f"{directory}: no such measurement directory")
        if not directory.is_dir():
            advice = misplaced_input(directory) or "pyprof reads measurement directories"
            raise InputError(f"{directory}: not a directory: {advice}")
        real = directory.resolve()
        if real in seen:
            raise UsageError(f"{directory}: measurement directory given twice")
        seen.add(real)
        try:
            names = sorted(os.listdir(directory))
        except OSError as error:
            raise InputError(f"{directory}: cannot list: {error.strerror or error}") from error
        profiles = [name for name in names if name.endswith(".hpcrun")]
        if not profiles:
            if "meta.db" in names:
                raise InputError(
                    f"{directory}: a database, not measurements (pyview shows it; pyprof reads "
                    "the directory pyrun or hpcrun wrote)"
                )
            raise InputError(f"{directory}: no .hpcrun profiles in this measurement directory")
        for name in profiles:
            trace = directory / (name[: -len(".hpcrun")] + ".hpctrace")
            sources.append(
                ProfileSource(directory, directory / name, trace if trace.is_file() else None)
            )
    return sources


def structure_files(measurement: Path) -> list[Path]:
    """The hpcstruct files pystruct/hpcstruct left in ``MEAS/structs/`` (sorted)."""
    directory = measurement / "structs"
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.endswith(".hpcstruct"))


def thread_names(sources: list[ProfileSource]) -> dict[int, threads.ThreadEntry]:
    """The name pyrun recorded for each profile (by index in ``sources``) that has one.

    Measurements without ``threads/`` (hpcrun's, an older pyrun's) name nothing; a names file
    that cannot be read is a warning: the profiles are still aggregated, without its names.
    """
    by_file: dict[Path, threads.ThreadEntry] = {}
    for measurement in dict.fromkeys(source.measurement for source in sources):
        directory = measurement / threads.MEASUREMENT_DIRECTORY
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.txt")):
            try:
                names = threads.read(path)
            except FormatError as error:
                warnings.warn(f"{error}: these thread names are left out", FormatWarning, 2)
                continue
            if names.keyed_by != threads.BY_FILE:
                continue
            for entry in names.entries:
                by_file[measurement / (entry.key + ".hpcrun")] = entry
    return {
        index: by_file[source.profile]
        for index, source in enumerate(sources)
        if source.profile in by_file
    }
