"""Which signals end a process, and how pyrun and the processes it measures die of one.

A measured process writes its profiles before it dies of a signal whose default action ends it
(:mod:`pyhpctk.measure.hooks`), and ``pyrun`` passes such signals on to its command and dies of
the signal its command died of (:mod:`pyhpctk.measure.launch.launcher`). Both take their lists from
here. Standard library only: this is imported into every measured process.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# Signals whose default action terminates the process or dumps core (signal(7)), and that are
# sent to a process from outside: kill(1), a batch system's time limit, a terminal, a launcher.
# Not here: SIGKILL and SIGSTOP (cannot be caught); SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP,
# SIGSYS and SIGABRT, which a fault or abort() raises in the faulting thread itself (a Python
# handler runs only later, in the main thread, after the fault has repeated or abort() has
# killed the process: the last checkpoint is what such a crash leaves).
_NAMES = (
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGIO",
    "SIGPWR",
)
#: Catchable signals that end a process when left at their default action.
TERMINATING: tuple[int, ...] = tuple(
    int(getattr(signal, name)) for name in _NAMES if hasattr(signal, name)
) + tuple(range(int(getattr(signal, "SIGRTMIN", 0)), int(getattr(signal, "SIGRTMAX", -1)) + 1))

#: What a measured process writes its profiles for before it dies (hooks). Not the real-time
#: signals: they are the channel of the C libraries a process loads (glibc's threads, MPI and
#: UCX progress engines) and of pyrun's own sampling engine, which takes the first one left at
#: its default; a handler on each would leave it none. Launchers and batch systems end programs
#: with the classic signals above.
WRITE_BEFORE_DYING: tuple[int, ...] = tuple(
    int(getattr(signal, name)) for name in _NAMES if hasattr(signal, name)
)

#: Signals whose default action also dumps core (signal(7)).
_CORE_NAMES = ("SIGQUIT", "SIGXCPU", "SIGXFSZ", "SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL")
DUMPS_CORE: frozenset[int] = frozenset(
    int(getattr(signal, name))
    for name in (*_CORE_NAMES, "SIGFPE", "SIGTRAP", "SIGSYS")
    if hasattr(signal, name)
)

#: What pyrun passes on to its command. Not SIGINT: a terminal's Ctrl-C reaches pyrun and the
#: command together (one process group), and a second copy would interrupt the program's own
#: KeyboardInterrupt clean-up. Not SIGPIPE and SIGXFSZ: they come from pyrun's own writes.
FORWARDED: tuple[int, ...] = tuple(
    s for s in TERMINATING if s not in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)
)


def name_of(signum: int) -> str:
    """``SIGTERM``, ``SIGRTMIN+3``, or ``signal 99`` for a number this system does not name."""
    rtmin, rtmax = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1)
    if rtmin < signum <= rtmax:
        return f"SIGRTMIN+{signum - rtmin}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def die_of(
    signum: int,
    set_handler: Callable[[int, Any], Any] = signal.signal,
    exit_: Callable[[int], Any] = os._exit,
) -> None:
    """End this process by ``signum``'s default action, as if no handler had been installed.

    The exit status seen by the parent (``WTERMSIG``, and a core dump where the signal's
    default makes one) is then what it would have been without pyrun. ``set_handler`` and
    ``exit_`` are the real ``signal.signal`` and ``os._exit`` where the program sees wrapped ones.
    """
    if signum != signal.SIGKILL:  # SIGKILL cannot be caught and needs no restoring
        # Outside the main thread this fails and a handler stays: the kill below still ends
        # the process, through that handler.
        try:  # noqa: SIM105  # contextlib is one more import in every measured process
            set_handler(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    # A parent may have blocked the signal in this process: delivery must not wait.
    try:  # noqa: SIM105
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), signum)  # a fatal signal at its default ends every thread at once
    exit_(128 + signum)  # only if the signal could not be delivered to this process
