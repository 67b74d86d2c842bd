"""How a measured process tells pyrun that it measures, and which profiles it could not write.

pyrun binds a Unix datagram socket in Linux's abstract namespace — no file, so a full file
system cannot stop it — and names it in its options (``MeasureOptions.report``). Every measured
process that inherits them sends one datagram when it starts measuring (:func:`tell_started`: its
pid and start time, which pyrun compares with the Python processes it saw start,
:mod:`pyhpctk.measure.census`), one when a thread's files could not be written, and one
when a later write of them succeeded (a checkpoint that failed is no loss once the final write
went through). When the command has ended, pyrun reads what is left: the profiles whose last
word was a failure are lost. A process that is not pyrun's child (another node of the launch,
a program that cleared its environment) reports nothing; its own stderr line remains.

The measured side sends through ``_socket`` alone (``socket`` costs every measured process
milliseconds to import), imported with this module: a report is sent when a write failed, and
that may be because the process is out of file descriptors, when an import, which opens
files, would fail too (issue #32, item 4). Standard library only.
"""

from __future__ import annotations

import os

try:
    import _socket
except ImportError:  # pragma: no cover - an interpreter built without sockets: nothing is told
    _socket = None  # type: ignore[assignment]

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    import socket
    import threading

LOST, WRITTEN, STARTED = "lost", "written", "started"
_MAX_DATAGRAM = 8192
_SEND_TIMEOUT_S = 0.5
_STARTED_TIMEOUT_S = 0.1  # a start-up report must never hold the program back for long


def tell_pyrun(address: str, word: str, name: str, error: str = "") -> None:
    """Tell pyrun (listening at ``address``, the options' ``report``; "" for none) that profile
    ``name`` was ``LOST`` (with ``error``) or ``WRITTEN`` after all."""
    line = f"{word}\t{name}\t{error}".encode("utf-8", "surrogateescape")[:_MAX_DATAGRAM]
    # pyrun drains its queue as reports come (the kernel queues only a few datagrams); a
    # bounded wait covers a burst, and a pyrun that is gone refuses at once.
    _send(address, line, _SEND_TIMEOUT_S)


def _send(address: str, line: bytes, timeout: float) -> None:
    """Send ``line`` to pyrun's report socket; nothing if there is none or it cannot be sent
    (pyrun gone or stuck, no descriptor left: the process's stderr line is what remains)."""
    if not address or _socket is None:
        return
    try:
        channel = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    except OSError:
        return
    try:
        channel.settimeout(timeout)
        channel.sendto(line, "\0" + address)
    except OSError:
        pass
    finally:
        channel.close()


def tell_started(address: str) -> None:
    """Tell pyrun (at ``address``) that this process measures itself: its pid and start time
    (field 22 of ``/proc/self/stat``, so that pyrun tells it from a later process with the
    same pid).

    Sent at start-up by pyrun's bootstrap: it waits a moment at most (a full queue of start-up
    reports), then gives up; pyrun still finds the process's profiles by their names.
    """
    if not address:
        return
    start = ""
    try:
        with open("/proc/self/stat", "rb") as stream:
            stat = stream.read()
        start = stat[stat.rindex(b")") + 2 :].split()[19].decode()
    except (OSError, ValueError, IndexError):  # no /proc: the pid alone
        pass
    # pyrun gone or its queue full: the profile names still tell
    _send(address, f"{STARTED}\t{os.getpid()}\t{start}".encode(), _STARTED_TIMEOUT_S)


class LossReport:
    """pyrun's end: the socket the measured processes report to, and what they said.

    A thread receives while the command runs; :meth:`close` stops it and returns the losses.
    """

    def __init__(self) -> None:
        import socket
        import threading

        self.address = f"pyhpctk-pyrun-{os.getpid()}-{os.urandom(6).hex()}"
        self.lost: dict[str, str] = {}  # profile name -> why it could not be written
        self.started: dict[int, int | None] = {}  # pid of a measured process -> its start time
        self._receiver: threading.Thread | None = None
        self._socket: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._socket.bind("\0" + self.address)
        except OSError:  # no abstract namespace here: losses are still told on stderr
            self._socket.close()
            self._socket = None
            return
        self._receiver = threading.Thread(
            target=self._receive, args=(self._socket,), name="pyrun-losses", daemon=True
        )
        self._receiver.start()

    @property
    def listening(self) -> str:
        """The socket's name for the options of the processes pyrun starts ("" when there is no
        socket: no abstract namespace here)."""
        return self.address if self._socket is not None else ""

    def _receive(self, channel: socket.socket) -> None:
        while True:
            try:
                data = channel.recv(_MAX_DATAGRAM)
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
            except OSError:
                return
            if not data:  # close() shut the socket down
                return
            word, _, rest = data.decode("utf-8", "surrogateescape").partition("\t")
            name, _, error = rest.partition("\t")
            if word == LOST:
                self.lost[name] = error
            elif word == WRITTEN:
                self.lost.pop(name, None)
            elif word == STARTED and name.isdigit():
                self.started[int(name)] = int(error) if error.isdigit() else None

    def close(self) -> dict[str, str]:
        """Stop listening; return the profiles whose last report was a loss, name -> reason."""
        import socket

        channel, receiver = self._socket, self._receiver
        self._socket = self._receiver = None
        if channel is not None and receiver is not None:
            # Reports already queued are read before the shutdown's end-of-file.
            channel.shutdown(socket.SHUT_RDWR)
            receiver.join(5.0)
            channel.close()
        return dict(self.lost)
