"""How a Python process whose launcher cleared its environment still finds the pyrun above it.

pyrun reaches the processes of its command through the environment: ``PYTHONPATH`` names its
bootstrap and ``PYHPCTK_PYRUN_*`` say what to measure. A launcher that clears the environment
(``env -i``, pyperf's worker processes, some MPI launchers) leaves a Python process nothing to
find pyrun by, and no mechanism outside the environment reaches such a process without changing
the Python installation it runs from (docs/pyrun.md, "Launchers that clear the environment").

So pyrun also leaves its variables in a file of its own, ``/tmp/pyhpctk-pyrun-UID/PID-START.env``
(the pid and start time of pyrun: a later process with the same pid is not it), and a process
that lacks them looks for the file of its nearest pyrun ancestor in ``/proc``. Two roads lead
here: pyrun's ``sitecustomize``, when ``PYTHONPATH`` survived but the variables did not; and the
``.pth`` file ``pyrun --install-pth`` puts into a venv the user names, which Python reads at every
start even with an empty environment. The directory's place cannot come from the environment, so
it is fixed, and trusted only when it is this user's and no one else can write to it.

This file runs inside measured processes (exec'd, never imported there, so it adds nothing to
``sys.modules``) and is imported by pyrun for the names it defines. Standard library only, and
written for any Python 3 the user's venv may hold.
"""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

#: Where pyrun leaves its variables; ``{uid}`` is the user's id.
RUN_DIRECTORY = "/tmp/pyhpctk-pyrun-{uid}"
SETTINGS_SUFFIX = ".env"
PREFIX = "PYHPCTK_PYRUN_"
_MAX_ANCESTORS = 64


def run_directory() -> str:
    """This user's directory of pyrun settings files."""
    return RUN_DIRECTORY.format(uid=os.getuid())


def settings_name(pid: int, start: int) -> str:
    """The settings file of the pyrun whose pid and start time these are."""
    return f"{pid}-{start}{SETTINGS_SUFFIX}"


def is_private(path: str, directory: bool) -> bool:
    """Whether ``path`` is this user's own (no link) and, for a directory, only theirs to write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return kind and info.st_uid == os.getuid() and not writable_by_others


def ancestors() -> Iterator[tuple[int, int]]:
    """(pid, start time) of this process's parent, its parent, ... up to init."""
    pid = os.getppid()
    for _ in range(_MAX_ANCESTORS):
        if pid <= 1:
            return
        try:
            with open(f"/proc/{pid}/stat", "rb") as stream:
                line = stream.read()
        except OSError:
            return
        fields = line[line.rindex(b")") + 2 :].split()  # the name may hold spaces
        yield pid, int(fields[19])
        pid = int(fields[1])


def restore_settings() -> bool:
    """Put pyrun's variables back into ``os.environ`` from the nearest pyrun ancestor's file.

    False (and nothing changed) when no pyrun ancestor left one: the process is not under
    pyrun, or the directory is not trustworthy.
    """
    directory = run_directory()
    if not os.path.isdir(directory) or not is_private(directory, True):
        return False
    for pid, start in ancestors():
        path = os.path.join(directory, settings_name(pid, start))
        if not os.path.exists(path):
            continue
        if not is_private(path, False):
            return False
        try:
            with open(path, "rb") as stream:
                entries = stream.read().split(b"\0")
        except OSError:
            return False
        for entry in entries:
            name, _, value = entry.decode("utf-8", "surrogateescape").partition("=")
            if name.startswith(PREFIX):
                os.environ[name] = value
        return True
    return False


def from_pth() -> None:
    """The ``.pth`` road: restore the variables if they are gone, and put pyrun's bootstrap at
    the head of ``sys.path``, where Python's ``import sitecustomize`` (after the ``.pth``
    files) finds it; the bootstrap then measures and takes itself off ``sys.path``."""
    bootstrap = os.environ.get(PREFIX + "BOOTSTRAP", "")
    on_path = {os.path.abspath(entry or ".") for entry in sys.path}
    if bootstrap and os.environ.get(PREFIX + "OPTIONS") and bootstrap in on_path:
        return  # PYTHONPATH and the variables came through: the usual road measures it
    if not os.environ.get(PREFIX + "OPTIONS") and not restore_settings():
        return
    bootstrap = os.environ.get(PREFIX + "BOOTSTRAP", "")
    if bootstrap and bootstrap not in on_path:
        sys.path.insert(0, bootstrap)


if __name__ == "_pyhpctk_pyrun_pth":  # exec'd by the line of pyrun's .pth file
    try:
        from_pth()
    except Exception as error:  # never stop a program from starting
        sys.stderr.write(f"pyrun: the .pth hook failed, this process is not measured: {error!r}\n")
