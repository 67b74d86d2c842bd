"""``pyrun ctl PID start|stop|mark NAME``: open, close and name the windows of a measured job.

The job runs under ``pyrun --start-paused`` (or ``--control``); each of its measured processes
listens on a control socket of its own (:mod:`pyhpctk.measure.control`). :func:`control` sends
the command to process PID and to every measured process below it (``pyrun``'s own pid, or the
program's, reaches the whole job: workers, ``subprocess`` and ``multiprocessing`` children), waits
until each has acted and answered, then looks at the tree again: a process started meanwhile
by one that had not acted yet began in the old state and is sent the command too. What cannot
be done is one line (:class:`ControlError`): no such process, another user's, a process pyrun
does not measure, or one measured without control. Runs in ``pyrun``, never in a measured
process.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass

from pyhpctk.errors import PyhpctkError, UsageError
from pyhpctk.measure.census import PYTHON_EXECUTABLE, process_tree
from pyhpctk.measure.control import (
    MAX_DATAGRAM,
    command_problem,
    control_directory,
    encode_command,
    socket_name,
    start_time,
)
from pyhpctk.measure.launch.config import decode_options
from pyhpctk.measure.settings import ENV_OPTIONS

#: How long ``pyrun ctl`` waits for the processes to answer (a process acts within 50 ms, and
#: stopping writes its files; a program holding the GIL in a long C call answers after it).
ANSWER_TIMEOUT_S = 10.0
#: How long a Python process of the job that has not bound its socket yet (it is starting) is
#: waited for.
STARTING_TIMEOUT_S = 2.0


class ControlError(PyhpctkError):
    """``pyrun ctl`` could not reach the processes it was pointed at (one line says why)."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class Answer:
    """What one process said: its pid, its command line, and ``ok STATE [MARK]`` or
    ``error WHY``."""

    pid: int
    command: str
    text: str

    @property
    def ok(self) -> bool:
        return self.text.startswith("ok ")

    @property
    def state(self) -> str:
        return self.text.split(" ")[1] if self.ok else ""


@dataclass(slots=True)
class ControlResult:
    """The answers, and the processes that did not answer in time."""

    answers: list[Answer]
    silent: list[tuple[int, str]]


def command_argv(pid: int) -> tuple[str, ...]:
    """The command line of process ``pid``; :class:`ControlError` when there is no such
    process (or it shows none: a kernel thread)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            data = stream.read()
    except OSError:
        raise ControlError(f"no process {pid}") from None
    argv = tuple(arg.decode("utf-8", "surrogateescape") for arg in data.rstrip(b"\0").split(b"\0"))
    if not argv or not argv[0]:
        raise ControlError(
            f"process {pid} shows no command line (a kernel thread, or it is ending)"
        )
    return argv


def _command_line(pid: int) -> str:
    """Process ``pid``'s command line as pyrun ctl shows it (the program by its name)."""
    try:
        argv = command_argv(pid)
    except ControlError:
        return "?"
    shown = " ".join([os.path.basename(argv[0]), *argv[1:]])
    # One line: a newline or tab in an argument (python -c '...') is shown escaped.
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _environment(pid: int) -> dict[bytes, bytes] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as stream:
            data = stream.read()
    except OSError:
        return None
    return dict(entry.partition(b"=")[::2] for entry in data.split(b"\0") if b"=" in entry)


def _socket_of(pid: int) -> str | None:
    """The control socket of process ``pid`` (through ``/proc/PID/root`` when the process has a
    /tmp of its own), or None."""
    start = start_time(pid)
    if start is None:
        return None
    path = os.path.join(control_directory(), socket_name(pid, start))
    for candidate in (path, f"/proc/{pid}/root{path}"):
        try:
            if os.path.exists(candidate):
                return candidate
        except OSError:
            continue
    return None


def _starting(pid: int) -> bool:
    """Whether ``pid`` is a Python process with control asked for, not yet listening."""
    try:
        executable = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    environ = _environment(pid) or {}
    return bool(PYTHON_EXECUTABLE.fullmatch(executable)) and _carried(environ).get("control") == "1"


def _carried(environ: dict[bytes, bytes]) -> dict[str, str]:
    """The options pyrun exported into a process's environment ({} where none or not such)."""
    text = environ.get(ENV_OPTIONS.encode(), b"")
    try:
        return decode_options(text.decode(errors="surrogateescape")) if text else {}
    except ValueError:
        return {}


def why_unreachable(pid: int) -> str:
    """The one line that says why nothing measured with control was found at ``pid``."""
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return f"no process {pid}"
    except OSError as error:
        return f"process {pid} cannot be looked at: {error.strerror or error}"
    shown = f"process {pid} ({_command_line(pid)})"
    if owner != os.getuid():
        return (
            f"{shown} is another user's (uid {owner}): pyrun ctl reaches only your own"
            " processes; run it as that user"
        )
    environ = _environment(pid)
    if environ is not None and _carried(environ):
        return (
            f"{shown} is measured by pyrun without control: start the job with pyrun"
            " --start-paused (or --control) to open and close windows"
        )
    return (
        f"{shown} is not measured by pyrun, nor is any process it started: give the pid of"
        " pyrun, or of a process it measures"
    )


class _Exchange:
    """ctl's side of the datagrams: sends commands, reads answers (kernel-checked senders)."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # An address in the abstract namespace: a process of a job with a /tmp of its own
        # answers there too; the sender's credentials, which the kernel fills in, tell that
        # the answer comes from this user's process it was sent to.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.socket.bind(f"\0pyhpctk-ctl-{os.getpid()}-{os.urandom(6).hex()}")

    def send(self, path: str, data: bytes) -> bool:
        try:
            self.socket.sendto(data, path)
        except OSError:
            return False  # the process ended, or its socket went away before an exec
        return True

    def receive(self, until: float) -> tuple[int, str] | None:
        """(sender pid, text) of the next answer before ``until``; None at the deadline."""
        credentials = struct.calcsize("3i")
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return None
            self.socket.settimeout(left)
            try:
                data, ancillary, _, _ = self.socket.recvmsg(
                    MAX_DATAGRAM, socket.CMSG_SPACE(credentials)
                )
            except TimeoutError:
                return None
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid, uid, _ = struct.unpack("3i", value[:credentials])
                    if uid == os.getuid():
                        return pid, data.decode("utf-8", "replace")

    def close(self) -> None:
        self.socket.close()


def control(pid: int, command: str, name: str = "") -> ControlResult:
    """Send ``command`` (``start``, ``stop``, ``mark`` with ``name``) to process ``pid`` and
    every measured process below it; the answers. :class:`ControlError` when none is reached."""
    why = command_problem(command, name)
    if why:
        raise UsageError(why)
    if pid <= 0:
        raise UsageError(f"{pid} is not a process id")
    data = encode_command(command, name)
    exchange = _Exchange()
    try:
        return _converse(exchange, pid, data)
    finally:
        exchange.close()


def _converse(exchange: _Exchange, pid: int, data: bytes) -> ControlResult:
    """Ask every process of the tree that listens; wait for the answers; look again, until a
    look finds no one new and no Python process of the job is still starting."""
    asked: dict[int, str] = {}  # pid -> its command line
    answers: dict[int, Answer] = {}
    starting: dict[int, float] = {}  # pid -> when first seen starting (no socket yet)
    while True:
        fresh = 0
        for target in process_tree(pid):
            if target in asked:
                continue
            path = _socket_of(target)
            if path is not None and exchange.send(path, data):
                asked[target] = _command_line(target)
                starting.pop(target, None)
                fresh += 1
            elif path is None and _starting(target):
                starting.setdefault(target, time.monotonic())
        if not asked and not starting:
            raise ControlError(why_unreachable(pid))
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while len(answers) < len(asked):
            got = exchange.receive(deadline)
            if got is None:
                break
            sender, text = got
            if sender in asked:
                answers[sender] = Answer(sender, asked[sender], text)
        now = time.monotonic()
        if not fresh and all(now - since > STARTING_TIMEOUT_S for since in starting.values()):
            break
        time.sleep(0.05)
    silent = [(p, line) for p, line in asked.items() if p not in answers]
    silent += [(p, _command_line(p)) for p in starting]
    return ControlResult(sorted(answers.values(), key=lambda a: a.pid), silent)


def summary(command: str, name: str, result: ControlResult) -> list[str]:
    """The lines ``pyrun ctl`` prints: what each process is doing now, and who did not answer."""
    done = [a for a in result.answers if a.ok]
    failed = [a for a in result.answers if not a.ok]
    what = {"start": "measuring", "stop": "paused", "mark": f"marked {name!r}"}[command]
    lines = []
    if done:
        listed = ", ".join(f"{a.pid} ({a.command})" for a in done[:8])
        more = f" and {len(done) - 8} more" if len(done) > 8 else ""
        count = f"{len(done)} process{'es' if len(done) != 1 else ''}"
        lines.append(f"pyrun ctl: {count} {what}: {listed}{more}")
    for answer in failed:
        lines.append(f"pyrun ctl: process {answer.pid} ({answer.command}): {answer.text}")
    for pid, line in result.silent:
        lines.append(
            f"pyrun ctl: process {pid} ({line}) did not answer within {ANSWER_TIMEOUT_S:.0f} s"
            " (a long call into C holding the GIL delays it; it acts on the command when it"
            " can, or ended)"
        )
    return lines
