"""The source files one process loaded: the ``sources/`` side file of its measurements.

A code object's file name is whatever ``compile()`` was given, so the ``logical/`` file's names
do not say which files the program read. The session records, among the files its
``logical/`` file names, those the program loaded: the ``__file__`` of a module in
``sys.modules`` (the script run is ``__main__``'s), and only a regular file, with the sha256
of its bytes when first written, in ``MEAS/sources/PID.TAG.txt`` (docs/formats.md, "Loaded
sources"). pyprof copies a Python source into the database only when it is listed there with
the hash it still has. Rewritten whole through a temporary name whenever it grows.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import os
import sys

from pyhpctk.formats.elf_identity import open_regular_file
from pyhpctk.formats.hpcrun_constants import SOURCES_MAGIC

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from pyhpctk.measure.cct import FunctionStanza

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_CHUNK = 1 << 20


def encode_sources(entries: Iterable[tuple[str, str]]) -> bytes:
    """The bytes of a loaded-sources file: ``entries`` are ``(sha256 hex, path)``;
    :func:`pyhpctk.formats.sources.to_bytes` writes the same."""
    lines = [f"{digest}\t{path.translate(_ESCAPES)}\n" for digest, path in entries]
    return SOURCES_MAGIC + "".join(lines).encode("utf-8", "surrogateescape")


def loaded_files() -> set[str]:
    """The file names of the modules the program has loaded, now: each one's ``__file__`` and
    the path its loader read (the interpreter deletes ``__main__.__file__`` once the script
    has run, when pyrun writes its files; its loader keeps the path)."""
    names: set[str] = set()
    for module in list(sys.modules.values()):
        try:
            found = (module.__dict__.get("__file__"), getattr(module.__loader__, "path", None))
        except Exception:  # not a module, or one without a loader: it names no file of its own
            continue
        names.update(name for name in found if isinstance(name, str))
    return names


def file_digest(path: str) -> str | None:
    """The sha256 of a regular file's bytes (hex), or None (not one, unreadable)."""
    import hashlib  # only once a file is hashed: every measured process imports this module

    opened = open_regular_file(path)
    if opened is None:
        return None
    fd = opened[0]
    try:
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


class SourceRecorder:
    """The loaded files named so far, with their hashes, and the file they make."""

    __slots__ = ("_digests", "_looked", "_pending", "_written", "path")

    def __init__(self, tag: str, pid: int) -> None:
        self.path = os.path.join("sources", f"{pid}.{tag}.txt")
        self._digests: dict[str, str] = {}  # path -> sha256, in the order found
        self._pending: set[str] = set()  # names no module had loaded when last looked at
        self._looked = 0  # stanzas looked at (the function table only grows)
        self._written = 0  # entries in the file last written

    def record(self, stanzas: Sequence[FunctionStanza]) -> bytes | None:
        """Look at the file names of the stanzas not seen yet, and again at those no module
        had loaded (yet); the file's new bytes when it has new entries, else None. A loaded
        file is hashed once."""
        fresh = stanzas[self._looked :]
        self._looked += len(fresh)
        self._pending.update(
            s.filename
            for s in fresh
            if s.filename.startswith("/") and s.filename not in self._digests
        )
        if self._pending:
            loaded = loaded_files() & self._pending
            self._pending -= loaded
            for name in sorted(loaded):
                digest = file_digest(name)
                if digest is not None:
                    self._digests[name] = digest
        if len(self._digests) == self._written:
            return None
        return encode_sources((digest, name) for name, digest in self._digests.items())

    def written(self, data: bytes) -> None:
        self._written = data.count(b"\n") - 1  # the lines after the first
