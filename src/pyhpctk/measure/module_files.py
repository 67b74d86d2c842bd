"""The native load modules one process's samples reached: the ``modules/`` side file.

A profile's load map names a native module by its path only, so the session records, when a
module is first sampled, which build the file at that path is: its GNU build id, size and
modification time (:mod:`pyhpctk.formats.elf_identity`), in ``MEAS/modules/PID.TAG.txt``
(docs/formats.md, "Loaded modules"). pyprof names the module's frames from the file at that path
only while it is still that build. A module whose file is no longer the one mapped (the loader
shows the mapping ``(deleted)`` in ``/proc/self/maps``: replaced or removed since it was loaded)
is recorded without an identity, and pyprof names none of its frames. Rewritten whole through a
temporary name whenever it grows.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import os

from pyhpctk.formats.elf_identity import FileIdentity, identify
from pyhpctk.formats.hpcrun_constants import MODULES_MAGIC

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Iterable

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_DELETED = " (deleted)"


def encode_modules(entries: Iterable[tuple[str, FileIdentity | None]]) -> bytes:
    """The bytes of a loaded-modules file: ``entries`` are ``(path, identity)``;
    :func:`pyhpctk.formats.modules.to_bytes` writes the same."""
    lines = []
    for path, identity in entries:
        if identity is None:
            fields = "-\t-\t-"
        else:
            fields = f"{identity.build_id or '-'}\t{identity.size}\t{identity.mtime_ns}"
        lines.append(f"{fields}\t{path.translate(_ESCAPES)}\n")
    return MODULES_MAGIC + "".join(lines).encode("utf-8", "surrogateescape")


def replaced_paths(paths: Iterable[str], maps: str = "/proc/self/maps") -> set[str]:
    """Those of ``paths`` that this process maps only as ``(deleted)``: the file it loaded is
    gone from the path (replaced or removed since)."""
    wanted = set(paths)
    mapped: set[str] = set()
    deleted: set[str] = set()
    try:
        with open(maps, encoding="utf-8", errors="surrogateescape") as stream:
            for line in stream:
                fields = line.rstrip("\n").split(None, 5)
                if len(fields) < 6:
                    continue
                name = fields[5]
                if name in wanted:
                    mapped.add(name)
                elif name.endswith(_DELETED) and name[: -len(_DELETED)] in wanted:
                    deleted.add(name[: -len(_DELETED)])
    except OSError:
        return set()
    return deleted - mapped


class ModuleRecorder:
    """The native modules sampled so far, with their identities, and the file they make."""

    __slots__ = ("_identities", "_pending", "_written", "path")

    def __init__(self, tag: str, pid: int) -> None:
        self.path = os.path.join("modules", f"{pid}.{tag}.txt")
        self._identities: dict[str, FileIdentity | None] = {}  # path -> identity, in order
        self._pending: list[str] = []  # noted, not identified yet
        self._written = 0  # entries in the file last written

    def note(self, path: str) -> None:
        """A native module was sampled for the first time (identified at :meth:`identify`)."""
        if path.startswith("/") and path not in self._identities and path not in self._pending:
            self._pending.append(path)

    def identify(self) -> None:
        """Record the identity of every module noted since the last call (one read of
        ``/proc/self/maps`` for them all)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        gone = replaced_paths(pending)
        for path in pending:
            self._identities[path] = None if path in gone else identify(path)

    def encode(self) -> bytes | None:
        """The file's new bytes when it has new entries, else None (any thread: the session
        adds entries under its lock, and this reads a copy)."""
        entries = list(self._identities.items())
        if len(entries) == self._written:
            return None
        return encode_modules(entries)

    def written(self, data: bytes) -> None:
        self._written = data.count(b"\n") - 1  # the lines after the first
