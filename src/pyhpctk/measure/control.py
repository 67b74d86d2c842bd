"""The channel between ``pyrun ctl`` and the processes pyrun measures (issue #37, item 3).

A process measured with control on (``pyrun --control``, ``--start-paused``) binds a Unix
datagram socket named after its pid and start time, ``PID-START.sock``, in
``/tmp/pyhpctk-pyrun-UID/ctl/`` (:func:`control_directory`): a directory of this user's, mode
0700, inside the one where pyrun already leaves its settings (``bootstrap/rescue.py``). Only this
user (and root) can reach a socket there; another user cannot even see it. The place is fixed
rather than taken from ``$XDG_RUNTIME_DIR``: ``pyrun ctl`` runs from another shell, an ssh
session, whose environment shares nothing with the job's (a batch job has no
``XDG_RUNTIME_DIR``), and both sides must find the same directory. A job that has a /tmp of its
own (Slurm's ``job_container/tmpfs``) is reached through ``/proc/PID/root``.

``pyrun ctl`` sends one datagram, ``pyrun-ctl 1 COMMAND [NAME]``, from a socket of its own (an
address in the abstract namespace, which a job with a /tmp of its own can answer too); the
process acts on it (its sampling thread looks every :data:`POLL_INTERVAL_S`) and answers
``ok STATE MARK`` or ``error WHY``. Both sides read the sender's credentials, which the kernel
fills in (``SO_PASSCRED``): only this user's commands, and answers, count. A signal was the
other road: every signal a program may use is the program's (pyrun passes them on), and a
signal carries no name for a mark.

Standard library only (``_socket``, as :mod:`pyhpctk.measure.losses`): this runs inside the
measured program.
"""

from __future__ import annotations

import os
import stat
import sys

try:
    import _socket
except ImportError:  # pragma: no cover - an interpreter built without sockets: no control
    _socket = None  # type: ignore[assignment]

from pyhpctk.measure.launch.bootstrap.rescue import is_private, run_directory

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from _socket import socket

MAGIC = "pyrun-ctl 1"
START, STOP, MARK = "start", "stop", "mark"
COMMANDS = (START, STOP, MARK)
MEASURING, PAUSED = "measuring", "paused"
SOCKET_SUFFIX = ".sock"
MAX_MARK = 200  # characters of a mark's name
MAX_DATAGRAM = 4096
POLL_INTERVAL_S = 0.05  # how often a measured process looks for a command


def control_directory() -> str:
    """This user's directory of control sockets."""
    return os.path.join(run_directory(), "ctl")


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat``: when the process started, in clock ticks after boot
    (None when it is gone), so that a later process with the same pid is not taken for it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            line = stream.read()
    except OSError:
        return None
    if b")" not in line:
        return None
    fields = line[line.rindex(b")") + 2 :].split()  # the command name may hold spaces
    return int(fields[19]) if len(fields) > 19 else None


def socket_name(pid: int, start: int) -> str:
    return f"{pid}-{start}{SOCKET_SUFFIX}"


def private_directory(path: str) -> bool:
    """Whether ``path`` is a directory of this user's that no one else may enter (0700)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def ensure_directory() -> str:
    """The control directory, made if missing; OSError when it cannot be trusted."""
    base = run_directory()
    for path in (base, control_directory()):
        try:  # noqa: SIM105  # (as _unlink)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    if not is_private(base, True):
        raise OSError(f"{base} is not this user's alone")
    directory = control_directory()
    if not private_directory(directory):
        raise OSError(f"{directory} is not this user's alone (mode 0700)")
    return directory


def encode_command(command: str, name: str = "") -> bytes:
    return f"{MAGIC} {command} {name}".rstrip(" ").encode("utf-8", "surrogateescape")


def check_mark(name: str) -> str:
    """Why ``name`` cannot name a mark ('' when it can)."""
    if not name.strip():
        return "a mark needs a name"
    if len(name) > MAX_MARK:
        return f"a mark's name is at most {MAX_MARK} characters"
    if not name.isprintable():
        return "a mark's name must be printable (no newline, tab or control character)"
    return ""


def decode_command(data: bytes) -> tuple[str, str]:
    """(command, name) of a datagram; ValueError says why it is not one."""
    text = data.decode("utf-8", "surrogateescape")
    if not text.startswith(MAGIC + " "):
        raise ValueError("not a pyrun ctl command")
    command, _, name = text[len(MAGIC) + 1 :].partition(" ")
    why = command_problem(command, name)
    if why:
        raise ValueError(why)
    return command, name


def command_problem(command: str, name: str) -> str:
    """Why ``command`` with ``name`` is not a command ('' when it is one)."""
    if command not in COMMANDS:
        return f"unknown command {command!r}: give start, stop or mark NAME"
    if command == MARK:
        return check_mark(name)
    return f"{command} takes no name" if name else ""


def forget_stale(directory: str, suffix: str = SOCKET_SUFFIX) -> None:
    """Remove the files named ``PID-START<suffix>`` of processes that are gone (killed before
    they could remove them): control sockets, and pyrun's settings (``rendezvous``)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid, _, rest = name.partition("-")
        start = rest.removesuffix(suffix)
        ours = name.endswith(suffix) and pid.isdigit() and start.isdigit()
        if ours and start_time(int(pid)) != int(start):
            _unlink(os.path.join(directory, name))


CREDENTIALS_SIZE = 12  # struct ucred: pid, uid, gid (32 bits each)


def sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The user id in a datagram's ``SCM_CREDENTIALS`` (None when it carries none)."""
    for level, kind, value in ancillary:
        credentials = level == _socket.SOL_SOCKET and kind == _socket.SCM_CREDENTIALS
        if credentials and len(value) >= CREDENTIALS_SIZE:
            return int.from_bytes(value[4:8], sys.byteorder)
    return None


class ControlChannel:
    """This process's control socket (see the module docstring)."""

    __slots__ = ("_socket", "path", "pid")

    def __init__(self, path: str, channel: socket) -> None:
        self.path = path
        self.pid = os.getpid()
        self._socket = channel

    @classmethod
    def open(cls) -> ControlChannel:
        """Bind this process's socket; OSError says why it cannot."""
        if _socket is None:
            raise OSError("this interpreter has no sockets")
        start = start_time(os.getpid())
        if start is None:
            raise OSError("/proc/self/stat cannot be read")
        directory = ensure_directory()
        forget_stale(directory)
        path = os.path.join(directory, socket_name(os.getpid(), start))
        _unlink(path)  # this very process's, left before an exec (same pid and start)
        channel = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        try:
            channel.setblocking(False)
            # The kernel attaches each sender's credentials: only this user's commands count.
            channel.setsockopt(_socket.SOL_SOCKET, _socket.SO_PASSCRED, 1)
            channel.bind(path)
        except OSError:
            channel.close()
            raise
        return cls(path, channel)

    def receive(self) -> list[tuple[bytes, str | bytes]]:
        """The datagrams waiting from this user's processes, with the address each came from
        (never blocks): a path, or bytes for pyrun ctl's address in the abstract namespace.
        The directory already keeps other users out; their credentials, which the kernel
        fills in, are checked too."""
        received: list[tuple[bytes, str | bytes]] = []
        space = _socket.CMSG_SPACE(CREDENTIALS_SIZE)
        while True:
            try:
                data, ancillary, _, sender = self._socket.recvmsg(MAX_DATAGRAM, space)
            except OSError:  # nothing waiting (BlockingIOError), or the socket is gone
                return received
            if sender_uid(ancillary) == os.getuid():
                received.append((data, sender if isinstance(sender, str | bytes) else ""))

    def answer(self, address: str | bytes, text: str) -> None:
        """Send ``text`` back to ``address`` (nothing when ``pyrun ctl`` is gone)."""
        if address:
            try:  # noqa: SIM105  # (as _unlink)
                self._socket.sendto(text.encode("utf-8", "surrogateescape"), address)
            except OSError:
                pass  # pyrun ctl gave up waiting

    def close(self) -> None:
        """Remove the socket (at exit, before an exec); a forked child's copy only closes."""
        if self.pid == os.getpid():
            _unlink(self.path)
        self._socket.close()


def _unlink(path: str) -> None:
    try:  # noqa: SIM105  # contextlib is one more import in every measured process
        os.unlink(path)
    except OSError:
        pass
