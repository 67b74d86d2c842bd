"""Writing measurement files so that a crash never leaves half of one.

Every file is written whole to a temporary name and renamed into place (:func:`atomic_write`);
a profile's name is claimed with an exclusive link (:func:`reserve_stem`), so two processes
with one pid (``exec``) never share one.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import os
import threading


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: never half a file.

    On failure (a full disk) the temporary file is removed and ``path`` keeps what it held.
    """
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        try:
            write_new(temporary, data)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_new(temporary, data)
        os.replace(temporary, path)
    except BaseException:
        unlink_quietly(temporary)
        raise


def write_new(path: str, data: bytes) -> None:
    with open(path, "wb") as stream:
        stream.write(data)


def reserve_stem(directory: str, base: str, profile: bytes) -> str:
    """Claim ``base`` (generation 0) or the first free generation, writing the profile there.

    ``os.link`` of a complete temporary file is an exclusive, atomic create, so two processes
    with one pid (``exec``) never share a name, which is what hpcrun's generation number is for.
    """
    prefix = base[: base.rfind("-")]
    temporary = os.path.join(directory, f".{prefix}.{threading.get_ident()}.tmp")
    try:
        write_new(temporary, profile)
        generation = 0
        while True:
            stem = f"{prefix}-{generation}"
            try:
                os.link(temporary, os.path.join(directory, stem + ".hpcrun"))
                return stem
            except FileExistsError:
                generation += 1
    finally:
        unlink_quietly(temporary)


def unlink_quietly(path: str) -> None:
    try:  # noqa: SIM105  # contextlib is one more import in every measured process
        os.unlink(path)
    except OSError:
        pass
