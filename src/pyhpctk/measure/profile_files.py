"""Writing measurement files so that a crash never leaves half of one.

Every file is written whole to a temporary name and renamed into place (:func:`atomic_write`);
a profile's name is claimed with an exclusive link (:func:`reserve_stem`), so two processes
with one pid (``exec``) never share one.

A program at its open-file limit leaves no descriptor for a write: pyrun holds one back from
the start (:func:`hold_reserve`, a descriptor of the measurement directory) and a write that
finds none free gives it up for the file, then takes it again (issue #32, item 4).

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import errno
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
    try:
        stream = open(path, "wb")  # noqa: SIM115  # closed below
    except OSError as error:
        if error.errno not in (errno.EMFILE, errno.ENFILE) or not give_up_reserve():
            raise
        try:  # the reserve's number, unless a thread of the program took it first
            with open(path, "wb") as stream:
                stream.write(data)
        finally:
            hold_reserve()  # its descriptor is free again
        return
    with stream:
        stream.write(data)


# The descriptor held back for writing near the open-file limit: (fd, device, inode), and the
# directory it is taken on.
_reserve: tuple[int, int, int] | None = None
_reserve_dir = ""


def hold_reserve(directory: str = "") -> None:
    """Hold one descriptor (of ``directory``, by default the one held before) for a write that
    finds the process out of descriptors; nothing if one is held or none can be had."""
    global _reserve, _reserve_dir
    directory = directory or _reserve_dir
    if not directory or (_reserve is not None and _reserve_dir == directory):
        return
    give_up_reserve()
    _reserve_dir = directory
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    held = os.fstat(fd)
    _reserve = (fd, held.st_dev, held.st_ino)


def give_up_reserve() -> bool:
    """Close the reserved descriptor; False when there was none or it is no longer ours (the
    program closed it and the number now names one of its own files: that is left alone)."""
    global _reserve
    reserve, _reserve = _reserve, None
    if reserve is None:
        return False
    fd, device, inode = reserve
    try:
        held = os.fstat(fd)
    except OSError:
        return False
    if (held.st_dev, held.st_ino) != (device, inode):
        return False
    os.close(fd)
    return True


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
