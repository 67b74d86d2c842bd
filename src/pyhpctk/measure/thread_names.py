"""The names of the threads one process measured: the ``threads/`` side file of its measurements.

hpcrun's profile header has no place for a thread's name, so the session records, for every
thread profile it writes, the thread's name under the profile's file stem in
``MEAS/threads/PID.TAG.txt`` (docs/formats.md, "Thread names"; ``TAG`` is that of the process's
``logical/`` file, so a forked child or an ``exec`` never shares the file). The name is
threading's as of the thread's last write (a thread may be renamed; at its end, its final name);
a thread that never ran Python (a BLAS or OpenMP pool's) has the kernel's name of it, read from
``/proc/self/task/TID/comm`` when the engine first sees it and again at each write while the
thread lives. The file is rewritten whole through a temporary name whenever it changes, so a
crash leaves the last complete one. pyprof carries the names into the database.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from pyhpctk.formats.hpcrun_constants import THREADS_BY_FILE
from pyhpctk.measure.encode import encode_threads

#: Signals a thread raises itself by a fault: never blocked (a blocked one kills the process,
#: and faulthandler reports a crash of pyrun's own threads through them).
_FAULTS = {
    getattr(signal, name)
    for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGSYS")
    if hasattr(signal, name)
}

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from pyhpctk.measure.thread_state import ThreadState


#: The kernel names of pyrun's own threads begin so (tests/conftest.py finds any left running).
OWN_THREAD_PREFIX = "pyrun-"


def name_own_thread(name: str) -> None:
    """Give one of pyrun's own threads a kernel name (``pyrun-...``, at most 15 bytes): top,
    ``ps -L`` and py-spy tell it from the program's threads; nothing if /proc is not there.

    It also blocks in the calling thread every signal but a fault's: a signal sent to the
    process (``kill(getpid(), SIGTRAP)``) then reaches one of the program's threads, as
    without pyrun. Delivered to one of pyrun's, its handler ran later in the main thread,
    and a second one sent meanwhile merged with it: a program that sent itself three SIGTRAPs
    in a row counted two."""
    try:  # noqa: SIM105  # contextlib: one more import in every measured process
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _FAULTS)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this platform
        pass
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as stream:
            stream.write(name[:15])
    except OSError:
        pass


def comm_name(native_id: int) -> str:
    """The kernel's name of this process's thread ``native_id`` ("" once the thread is gone)."""
    try:
        with open(f"/proc/self/task/{native_id}/comm", "rb") as stream:
            raw = stream.read()
    except OSError:
        return ""
    return raw.rstrip(b"\n").decode("utf-8", "surrogateescape")


def program_name() -> str:
    """What the process runs: the basename of ``sys.argv[0]`` (``app.py``, ``-c``), the
    package of ``python -m pkg`` (whose ``argv[0]`` is ``pkg/__main__.py``), else the
    interpreter's."""
    argv = getattr(sys, "argv", None)
    first = str(argv[0]) if argv else ""
    base = os.path.basename(first)
    if base == "__main__.py":
        package = os.path.basename(os.path.dirname(os.path.abspath(first)))
        return package or base
    return base or first or os.path.basename(sys.executable) or "python"


def thread_name(state: ThreadState) -> str:
    """A measured thread's name now: threading's, else the kernel's (kept from its last read)."""
    thread = state.thread
    if thread is not None and not isinstance(thread, threading._DummyThread):
        try:
            return str(thread.name)
        except Exception:  # a Thread subclass with a broken name property: the kernel's
            pass
    if state.native_id is not None:
        state.comm = comm_name(state.native_id) or state.comm
    if not state.comm and thread is not None:
        return str(thread.name)  # a foreign thread threading calls "Dummy-N"
    return state.comm


class ThreadNames:
    """The names recorded so far, by profile file stem, and the file they make."""

    __slots__ = ("_names", "_written", "path", "pid")

    def __init__(self, tag: str, pid: int) -> None:
        self.pid = pid
        self.path = os.path.join("threads", f"{pid}.{tag}.txt")
        self._names: dict[str, str] = {}
        self._written = b""

    def record(self, stem: str, name: str, old_stem: str = "") -> bytes | None:
        """Note ``name`` for the profile ``stem`` (which replaced ``old_stem``); the file's new
        bytes when they differ from those last written, else None."""
        if old_stem and old_stem != stem:
            self._names.pop(old_stem, None)
        if not name and stem not in self._names:
            return None
        if name:
            self._names[stem] = name
        program = program_name()
        data = encode_threads(
            THREADS_BY_FILE,
            ((key, self.pid, program, value) for key, value in self._names.items()),
        )
        return None if data == self._written else data

    def written(self, data: bytes) -> None:
        self._written = data
