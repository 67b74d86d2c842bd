"""Windows of a long job: a process measures, pauses and names its phases as ``pyrun ctl`` asks.

A process measured with control on (``pyrun --control`` or ``--start-paused``) opens its control
socket (:mod:`pyhpctk.measure.control`) and its sampling thread looks for commands every
:data:`~pyhpctk.measure.control.POLL_INTERVAL_S` (:meth:`Windows.poll`): ``stop`` pauses
sampling (the session attributes every thread's time up to then and writes its files, so what
the window measured is on disk when ``pyrun ctl`` returns), ``start`` resumes it, ``mark NAME``
puts the samples that follow under a context node ``<mark NAME>`` (the session's
:meth:`~pyhpctk.measure.session.Session.enter_phase`). Each answer says the state the process is
in now. The state is also kept in the process's environment (``PYHPCTK_PYRUN_PAUSED``,
``_MARK``), so a process it starts afterwards begins as its parent is; a forked child inherits
it with the session.

Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import os
import time

from pyhpctk.measure.control import (
    MARK,
    MEASURING,
    PAUSED,
    POLL_INTERVAL_S,
    START,
    STOP,
    ControlChannel,
    decode_command,
)
from pyhpctk.measure.settings import ENV_MARK, ENV_PAUSED

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from typing import Protocol

    from pyhpctk.measure.launch.config import MeasureOptions

    class Windowed(Protocol):
        """What windows need of the session (:class:`~pyhpctk.measure.session.Session`)."""

        @property
        def options(self) -> MeasureOptions: ...

        def pause(self) -> bool: ...

        def resume(self) -> bool: ...

        def enter_phase(self, name: str) -> None: ...

        def tell_once(self, message: str) -> None: ...


#: The name of the context node a mark puts the samples under.
MARK_FORMAT = "<mark {}>"


class Windows:
    """Whether one process samples now, its current mark, and its control channel."""

    __slots__ = ("_next_poll", "channel", "mark", "paused", "session")

    def __init__(self, session: Windowed) -> None:
        self.session = session
        self.paused = session.options.paused
        self.mark = session.options.mark
        self.channel: ControlChannel | None = None
        self._next_poll = 0.0

    def open(self) -> None:
        """Open the control socket, when control is on (at start, after a fork, after a failed
        exec); a process that cannot says so once and is measured on."""
        if not self.session.options.control or self.channel is not None:
            return
        try:
            self.channel = ControlChannel.open()
        except OSError as error:
            self.session.tell_once(
                f"pyrun: pid {os.getpid()} cannot open its control socket ({error}): pyrun ctl"
                " cannot reach it; it is measured "
                + ("from its start" if not self.paused else "never (it started paused)")
            )

    def close(self) -> None:
        """Remove the control socket (exit, exec); a forked child only drops its copy."""
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()

    def poll(self) -> None:
        """Act on the commands waiting (the sampling thread calls this after each wake-up)."""
        channel = self.channel
        if channel is None:
            return
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_INTERVAL_S
        for data, sender in channel.receive():
            channel.answer(sender, self.act(data))

    def act(self, data: bytes) -> str:
        """Do what one datagram asks; the answer (``ok STATE MARK`` or ``error WHY``)."""
        try:
            command, name = decode_command(data)
        except ValueError as error:
            return f"error {error}"
        session = self.session
        if command == STOP:
            session.pause()
        elif command == START:
            session.resume()
        elif command == MARK:
            session.enter_phase(name)
        return self.state()

    def state(self) -> str:
        return f"ok {PAUSED if self.paused else MEASURING} {self.mark}".rstrip(" ")

    def publish(self) -> None:
        """Keep the state in the environment, for the processes this one starts from now on
        (both variables exist from the start: a value is replaced in place)."""
        os.environ[ENV_PAUSED] = "1" if self.paused else "0"
        os.environ[ENV_MARK] = self.mark
