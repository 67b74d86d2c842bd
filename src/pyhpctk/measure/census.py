"""Which Python processes a command started, so pyrun can say which ones it did not measure.

pyrun reaches a process only through its environment (``PYTHONPATH`` and ``PYHPCTK_PYRUN_*``):
a child started with ``env -i``, by a runner that passes a list of variables (pyperf), or with
``python -I`` is not measured, and nothing inside it can say so. pyrun's side can: while the
command runs, a thread walks the command's process tree in ``/proc`` (each thread's
``task/TID/children``) every :data:`INTERVAL_S`, and notes every process whose executable is a
Python interpreter, with what its environment and flags lacked. At the end pyrun compares them
with the processes that said they were measured (:mod:`pyhpctk.measure.losses`) and wrote
profiles.

What this cannot know: a process that lived less than two walks (about 0.1 s: too short to
have been sampled much anyway; a process is counted from its second sighting, since one caught
between ``fork`` and ``exec`` briefly runs its parent's interpreter), processes that left the
tree (daemons that detach, ranks on other nodes), and interpreters under other names (an
embedding program). Linux only;
elsewhere :meth:`Census.available` is False and pyrun says nothing. Runs in pyrun, never in a
measured process.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass

from pyhpctk.measure.control import start_time

#: How often the command's process tree is walked (seconds).
INTERVAL_S = 0.05

#: An executable that is a Python interpreter: python, python3, python3.12, python3.13t, ...
PYTHON_EXECUTABLE = re.compile(r"python(\d+(\.\d+)*)?[dmt]?(-dbg)?")

ENV_OPTIONS = b"PYHPCTK_PYRUN_OPTIONS"


@dataclass(frozen=True, slots=True)
class PythonProcess:
    """A Python process seen in the command's tree: pid, start time (clock ticks after boot,
    ``/proc/PID/stat`` field 22, so a reused pid is another process), command line, and why
    pyrun could not reach it when that shows in its environment or flags (else empty)."""

    pid: int
    start: int
    command: str
    why: str


def process_tree(root: int) -> list[int]:
    """Process ``root`` and every process below it now (each thread's ``children``)."""
    found = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in threads:
            children = _read(f"/proc/{pid}/task/{tid}/children")
            if children:
                frontier.extend(int(child) for child in children.split())
    return found


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except OSError:
        return None


def _python_flags(argv: list[bytes]) -> set[str]:
    """The interpreter's one-letter options before the script (``-I``, ``-E``, ``-S``, ``-IsE``)."""
    flags: set[str] = set()
    args = iter(argv[1:])
    for arg in args:
        if not arg.startswith(b"-") or arg in (b"-", b"--"):
            break
        if arg.startswith(b"--"):  # --check-hash-based-pycs MODE and the like
            continue
        letters = arg[1:].decode("ascii", "replace")
        for at, letter in enumerate(letters):
            flags.add(letter)
            if letter in "cm":  # -c CODE, -m MODULE: what follows is the program's
                return flags
            if letter in "WX":  # -W ARG, -X OPT: the value is the rest, or the next argument
                if at == len(letters) - 1:
                    next(args, None)
                break
    return flags


def why_unreached(environ: bytes | None, argv: list[bytes], bootstrap: str) -> str:
    """Why pyrun's bootstrap could not run in a process with this environment and argv."""
    flags = _python_flags(argv)
    if "I" in flags or "E" in flags:
        return f"run with -{'I' if 'I' in flags else 'E'}, which ignores PYTHONPATH"
    if "S" in flags:
        return "run with -S, which skips the site module that starts pyrun's bootstrap"
    if environ is None:
        return ""
    variables = dict(entry.partition(b"=")[::2] for entry in environ.split(b"\0") if b"=" in entry)
    path = variables.get(b"PYTHONPATH", b"").decode("utf-8", "surrogateescape")
    has_bootstrap = bootstrap in path.split(os.pathsep)
    if not variables.get(ENV_OPTIONS):
        if has_bootstrap:
            return "its environment lost pyrun's PYHPCTK_PYRUN_* variables"
        return (
            "its environment lost pyrun's variables and PYTHONPATH (cleared with env -i, or "
            "passed through a list of variables, as pyperf and some MPI launchers do)"
        )
    if not has_bootstrap:
        return "its PYTHONPATH lost pyrun's bootstrap directory"
    return ""  # it had everything: an interpreter pyrun refuses, or a failure on its stderr


class Census:
    """The Python processes of one command's process tree, found while it runs."""

    def __init__(self, bootstrap: str, interval_s: float = INTERVAL_S) -> None:
        self.bootstrap = bootstrap
        self.interval_s = interval_s
        self.seen: dict[tuple[int, int], PythonProcess] = {}
        # Seen once: a process caught between fork and exec runs its parent's interpreter
        # for a few microseconds, so a Python process counts from its second sighting.
        self._once: dict[tuple[int, int], PythonProcess] = {}
        self._others: dict[tuple[int, int], str] = {}  # not Python (yet: it may exec one)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        """Whether this machine lists a thread's children (Linux with CONFIG_PROC_CHILDREN)."""
        tid = threading.get_native_id()
        return os.path.exists(f"/proc/{os.getpid()}/task/{tid}/children")

    def watch(self, root: int) -> None:
        """Start walking the tree below (and including) process ``root``."""
        self._thread = threading.Thread(
            target=self._run, args=(root,), name="pyrun-census", daemon=True
        )
        self._thread.start()

    def stop(self) -> list[PythonProcess]:
        """Stop walking; the Python processes seen, in the order they were found."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return list(self.seen.values())

    def _run(self, root: int) -> None:
        while True:
            began = time.monotonic()
            self.walk(root)
            # A large tree (hundreds of ranks under one pyrun) is walked less often: the
            # census never takes more than about 5 % of one core.
            pause = max(self.interval_s, 20 * (time.monotonic() - began))
            if self._stop.wait(pause):
                return

    def walk(self, root: int) -> None:
        """Note every Python process now in the tree below ``root``."""
        for pid in process_tree(root):
            self._note(pid)

    def _note(self, pid: int) -> None:
        start = start_time(pid)
        if start is None or (pid, start) in self.seen:
            return
        try:
            executable = os.readlink(f"/proc/{pid}/exe")
        except OSError:  # gone, a zombie, or another user's
            return
        key = (pid, start)
        if self._others.get(key) == executable:
            return
        if not PYTHON_EXECUTABLE.fullmatch(os.path.basename(executable)):
            self._others[key] = executable  # checked again in case it execs an interpreter
            self._once.pop(key, None)
            return
        argv = (_read(f"/proc/{pid}/cmdline") or b"").rstrip(b"\0").split(b"\0")
        shown = [os.path.basename(argv[0]), *argv[1:]]  # the interpreter by its name
        command = b" ".join(shown).decode("utf-8", "replace")
        why = why_unreached(_read(f"/proc/{pid}/environ"), argv, self.bootstrap)
        found = PythonProcess(pid, start, _shorten(command), why)
        if self._once.pop(key, None) is not None:
            self.seen[key] = found  # read again: the first sighting may predate its exec
        else:
            self._once[key] = found


def _shorten(command: str, width: int = 100) -> str:
    return command if len(command) <= width else command[: width - 3] + "..."
