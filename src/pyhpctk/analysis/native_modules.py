"""Which native libraries of a measurement pyprof may name from the file at their path.

pyrun records, in ``MEAS/modules/*.txt`` (:mod:`pyhpctk.formats.modules`), which build each
native module its samples reached was: its GNU build id, size and modification time. A file found
at that path later is named from (:func:`.symbols.library_functions`) only when every process of
every measurement that sampled it recorded that very build (:meth:`~pyhpctk.formats.elf_identity.
FileIdentity.same_build`: the build id when there was one, else size and modification time);
otherwise its frames stay ``library+offset`` and :func:`refusal` says why in one line. A
measurement without the table (hpcrun's, an older pyrun's) vouches for no file: its native frames
wait for pystruct, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from pyhpctk.errors import PyhpctkError
from pyhpctk.formats import modules
from pyhpctk.formats.elf_identity import FileIdentity, identify

Identities = Mapping[str, list[FileIdentity | None]]


def recorded_identities(measurements: Iterable[Path], problems: list[str]) -> Identities:
    """Every identity the measurements' ``modules/`` tables record, by module path (a table
    that cannot be read is a problem, and vouches for nothing)."""
    found: dict[str, list[FileIdentity | None]] = {}
    for measurement in dict.fromkeys(measurements):
        directory = measurement / modules.MEASUREMENT_DIRECTORY
        for path in sorted(directory.glob("*.txt")) if directory.is_dir() else []:
            try:
                table = modules.read(path)
            except (PyhpctkError, OSError) as error:
                problems.append(f"{path}: unreadable module identities ({error}); ignored")
                continue
            for entry in table.entries:
                found.setdefault(entry.path, []).append(entry.identity)
    return found


def _short(build_id: str) -> str:
    return build_id[:12] if build_id else "none"


def refusal(module: str, recorded: list[FileIdentity | None]) -> str | None:
    """Why the file at ``module`` must not name the run's frames (one line), or None when it
    is the build every process recorded."""
    shown = "their frames are shown as library+offset"
    if any(identity is None for identity in recorded):
        return f"{module}: replaced or removed while the program ran; {shown}"
    now = identify(module)
    if now is None:
        return f"{module}: not found on this machine; {shown}"
    for identity in recorded:
        assert identity is not None
        if identity.same_build(now):
            continue
        if identity.build_id:
            change = f"build id {_short(identity.build_id)}… then, {_short(now.build_id)}… now"
        else:
            change = (
                f"{identity.size} bytes modified at {identity.mtime_ns} ns then, "
                f"{now.size} bytes modified at {now.mtime_ns} ns now"
            )
        return f"{module}: not the build the run measured ({change}); {shown}"
    return None


__all__ = ["Identities", "recorded_identities", "refusal"]
