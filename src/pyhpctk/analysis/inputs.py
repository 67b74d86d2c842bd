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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from pyhpctk.errors import FormatError, FormatWarning, PyhpctkError, UsageError
from pyhpctk.formats import threads


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


class Listing(Sequence[ProfileSource]):
    """Every profile of the measurement directories (:func:`discover`), in a compact form that
    pickles small and makes a :class:`ProfileSource` only when one is asked for: rank 0 lists,
    every rank gets the listing, and each makes the sources of its own profiles."""

    def __init__(
        self,
        measurements: list[Path],
        which: list[int],
        stems: list[str],
        traced: list[bool],
        sizes: list[int],
    ) -> None:
        self.measurements = measurements
        self.which = which  # per profile: its measurement directory
        self.stems = stems  # its file name without .hpcrun
        self.traced = traced  # whether an .hpctrace is beside it
        self.sizes = sizes  # bytes of the profile and its trace

    def __len__(self) -> int:
        return len(self.stems)

    @overload
    def __getitem__(self, index: int) -> ProfileSource: ...

    @overload
    def __getitem__(self, index: slice) -> list[ProfileSource]: ...

    def __getitem__(self, index: int | slice) -> ProfileSource | list[ProfileSource]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        directory = self.measurements[self.which[index]]
        stem = self.stems[index]
        trace = directory / (stem + ".hpctrace") if self.traced[index] else None
        return ProfileSource(directory, directory / (stem + ".hpcrun"), trace)

    def measurement(self, index: int) -> Path:
        """The measurement directory of profile ``index`` (no :class:`ProfileSource` made)."""
        return self.measurements[self.which[index]]

    def __reduce__(self) -> tuple[object, ...]:
        return (Listing, (self.measurements, self.which, self.stems, self.traced, self.sizes))


def discover(measurements: tuple[Path, ...] | list[Path]) -> Listing:
    """Every profile of every measurement directory, in a stable order (directory, then name),
    with its size (one ``stat`` each; the directory entries say which are files)."""
    listing = Listing([], [], [], [], [])
    seen: set[Path] = set()
    for directory in measurements:
        if not directory.exists():
            raise InputError(f"{directory}: no such measurement directory")
        if not directory.is_dir():
            from pyhpctk.formats.inspect import misplaced_input  # every format: only here

            advice = misplaced_input(directory) or "pyprof reads measurement directories"
            raise InputError(f"{directory}: not a directory: {advice}")
        real = directory.resolve()
        if real in seen:
            raise UsageError(f"{directory}: measurement directory given twice")
        seen.add(real)
        try:
            with os.scandir(directory) as entries:
                found = {entry.name: entry for entry in entries}
            names = sorted(found)
            profiles = [name for name in names if name.endswith(".hpcrun")]
            if not profiles:
                if "meta.db" in found:
                    raise InputError(
                        f"{directory}: a database, not measurements (pyview shows it; pyprof "
                        "reads the directory pyrun or hpcrun wrote)"
                    )
                raise InputError(f"{directory}: no .hpcrun profiles in this measurement directory")
            number = len(listing.measurements)
            listing.measurements.append(directory)
            for name in profiles:
                stem = name[: -len(".hpcrun")]
                trace = found.get(stem + ".hpctrace")
                size = found[name].stat().st_size
                traced = trace is not None and trace.is_file()
                if trace is not None and traced:
                    size += trace.stat().st_size
                listing.which.append(number)
                listing.stems.append(stem)
                listing.traced.append(traced)
                listing.sizes.append(size)
        except OSError as error:
            raise InputError(f"{directory}: cannot list: {error.strerror or error}") from error
    return listing


def structure_files(measurement: Path) -> list[Path]:
    """The hpcstruct files pystruct/hpcstruct left in ``MEAS/structs/`` (sorted)."""
    directory = measurement / "structs"
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.endswith(".hpcstruct"))


def thread_names(sources: Listing) -> dict[int, threads.ThreadEntry]:
    """The name pyrun recorded for each profile (by index in ``sources``) that has one.

    Measurements without ``threads/`` (hpcrun's, an older pyrun's) name nothing; a names file
    that cannot be read is a warning: the profiles are still aggregated, without its names.
    """
    by_file: dict[Path, threads.ThreadEntry] = {}
    for measurement in sources.measurements:
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
    if not by_file:
        return {}
    return {
        index: by_file[source.profile]
        for index, source in enumerate(sources)
        if source.profile in by_file
    }
