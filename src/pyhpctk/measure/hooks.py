"""Connect a :class:`~pyhpctk.measure.session.Session` to the life of its process.

- **Threads**: ``threading.Thread._bootstrap_inner`` is wrapped so each thread registers itself
  when it starts (reading its own CPU clock) and writes its profile when it ends.
- **Exit**: an ``atexit`` handler registered before the program runs, so it runs after the
  program's own handlers, writes every thread's files.
- **Signals that end the process** (SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, ...: every classic
  catchable one whose default action terminates,
  :data:`pyhpctk.measure.signals.WRITE_BEFORE_DYING`; not the real-time ones): their default
  would kill the process without ``atexit``. For each one left at its default, pyrun installs a
  handler that writes the files and then dies of that signal by its default action (exit status
  and core dump as without pyrun). ``signal.signal`` and ``signal.getsignal`` are wrapped: a
  program that installs its own handler gets exactly that handler (pyrun steps aside), and one
  that restores ``SIG_DFL`` gets pyrun's writer back while ``getsignal`` reports ``SIG_DFL``.
  Signals the program or its parent ignore (Python ignores SIGPIPE and SIGXFSZ; ``nohup``
  SIGHUP) and SIGINT (Python's ``KeyboardInterrupt`` reaches ``atexit``) are left alone.
- **os._exit and exec**: wrapped to write the files first (``multiprocessing`` fork children end
  with ``os._exit``).
- **sys.setswitchinterval / getswitchinterval**: wrapped so the program sets and sees its own
  GIL switch interval while pyrun shortens it in one-thread programs (see the session).
- **gc.enable / gc.disable / gc.isenabled** (CPython 3.11): wrapped so the program switches and
  sees its own collector while the Python sampler holds collections off as it reads frames
  (:class:`~pyhpctk.measure.gc_context.HeldOff`).
- **fork**: ``os.register_at_fork``: the child gets a new pid, fresh CCTs and a new sampler.

It must never change what the program observes beyond that: handlers, timers and threads of the
program keep working, and ``threading.enumerate()`` does not list the sampler.
"""

from __future__ import annotations

import _thread
import atexit
import gc
import os
import signal
import sys
import threading
import time

from pyhpctk.measure import signals
from pyhpctk.measure.gc_context import COLLECTS_IN_ALLOCATIONS, held_off

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any, NoReturn, TypeAlias

    from pyhpctk.measure.session import Session

    _Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_session: Session | None = None
_installed = False
_HOOKED = frozenset(signals.WRITE_BEFORE_DYING)
# The thread writing files through one of the hooks below, and a signal that arrived in that
# thread meanwhile: it is acted on once the files are written.
_writer: int | None = None
_deferred: list[int] = []
_written_for_signal = False  # a helper wrote the files for a signal: the next one ends us
_real_signal = signal.signal
_SIGTRAP = int(getattr(signal, "SIGTRAP", -1))
_real_getsignal = signal.getsignal
_real_exit = os._exit
_real_execv = os.execv
_real_execve = os.execve
_real_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
_real_setswitchinterval = sys.setswitchinterval
_real_getswitchinterval = sys.getswitchinterval
_real_gc_switches = (gc.enable, gc.disable, gc.isenabled)


def current_session() -> Session | None:
    """The session measuring this process, if any."""
    return _session


def _bootstrap_inner(self: threading.Thread) -> None:
    program_ns = time.thread_time_ns()  # the thread's start in the interpreter: the program's
    session = _session
    if session is not None and not session.finished:
        try:
            session.register_thread(self, main=False, program_ns=program_ns)
        except Exception as error:  # measurement must never stop a thread from running
            session.tell_once(f"pyrun: a thread could not be measured: {error!r}")
            session = None
    try:
        _real_bootstrap_inner(self)
    finally:
        if session is not None:
            try:
                session.thread_finished()
            except Exception as error:  # never a traceback of pyrun's in the program's stderr
                session.tell_once(f"pyrun: writing a thread's profile failed: {error!r}")


def _write(session: Session, checkpoint: bool = False) -> None:
    """Finish (or checkpoint) ``session``; a fatal signal arriving meanwhile waits until done."""
    global _writer
    me = threading.get_ident()
    outer = _writer == me
    _writer = me
    try:
        if checkpoint:
            session.checkpoint()
        else:
            session.finish()
    finally:
        if not outer:
            _writer = None
            if _deferred:
                signals.die_of(_deferred[0], _real_signal, _real_exit)


def _on_fatal_signal(signum: int, frame: FrameType | None) -> None:
    """A signal the program left at its default: write the files, then die of it as it would."""
    session = _session
    if session is None or _written_for_signal:
        signals.die_of(signum, _real_signal, _real_exit)
        return
    if _writer == threading.get_ident():
        # It interrupted pyrun's own writing in this thread (Python runs handlers between any
        # two bytecodes): finishing that first writes complete files, then _write dies of it.
        _deferred.append(signum)
        return
    if session.lock._is_owned():  # type: ignore[attr-defined]
        # It interrupted pyrun code in this thread that holds the session lock, halfway through
        # changing a CCT: a helper writes once this thread has let go, then signals again.
        _thread.start_new_thread(_write_then_signal_again, (session, signum))
        return
    _write_reporting(session, f"on {signals.name_of(signum)}")
    signals.die_of(signum, _real_signal, _real_exit)


def _write_reporting(session: Session, when: str, checkpoint: bool = False) -> None:
    """:func:`_write`, whose failure is one line on stderr, never a traceback: the process goes
    on (or dies of its signal, or exits) whatever happened."""
    try:
        _write(session, checkpoint)
    except Exception as error:
        sys.stderr.write(f"pyrun: writing the profiles {when} failed: {error!r}\n")


def _write_then_signal_again(session: Session, signum: int) -> None:
    global _written_for_signal
    session.exclude_thread(threading.get_ident())  # pyrun's own: not measured
    _write_reporting(session, f"on {signals.name_of(signum)}")
    _written_for_signal = True
    os.kill(os.getpid(), signum)  # the main thread's handler now dies of it


class _TrapHandler:
    """The program's Python handler for SIGTRAP, as pyrun installs it while the engine's
    counters raise SIGTRAP: it runs the handler only for SIGTRAPs that the engine's C handler
    passed on (``program_traps``), not for a sample's that reached CPython's own C handler in
    the moment between ``signal.signal`` and the engine's handler going first again."""

    def __init__(self, handler: Callable[[int, FrameType | None], Any], engine: Any) -> None:
        self.handler = handler
        self.engine = engine

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        if self.engine.program_traps() > 0:  # signals that came together run it once, as ever
            return self.handler(signum, frame)
        return None


_trap_asked: _Handler = None  # what the program last asked for SIGTRAP, while pyrun ran


def _signal_trap(handler: _Handler) -> _Handler:
    """signal.signal(SIGTRAP, handler) while the engine may sample through SIGTRAP: the
    engine's handler goes first again at once and passes every SIGTRAP that is not a sample on
    to ``handler``. Meanwhile the kernel holds SIG_IGN (asked SIG_DFL or SIG_IGN: a sample
    arriving then must not dump core) or a handler that ignores samples (_TrapHandler)."""
    global _trap_asked
    assert _session is not None and _session.engine is not None
    engine = _session.engine
    if not callable(handler) and handler not in (signal.SIG_DFL, signal.SIG_IGN):
        return _real_signal(_SIGTRAP, handler)  # the error Python gives for it
    asked_default = not callable(handler) and handler == signal.SIG_DFL
    if callable(handler):
        previous = _real_signal(_SIGTRAP, _TrapHandler(handler, engine.module))
    else:
        previous = _real_signal(_SIGTRAP, signal.SIG_IGN)
    engine.take_sigtrap(asked_default)
    earlier, _trap_asked = _trap_asked, handler
    if isinstance(previous, _TrapHandler):
        return previous.handler
    return earlier if earlier is not None and not callable(previous) else previous


def _signal(signalnum: int, handler: _Handler) -> _Handler:
    engine = None if _session is None else _session.engine
    if signalnum == _SIGTRAP and engine is not None and engine.sigtrap_taken():
        return _signal_trap(handler)
    if signalnum not in _HOOKED:
        return _real_signal(signalnum, handler)
    # The program's own handler (or SIG_IGN) replaces pyrun's writer outright; asking for the
    # default gives the writer back. Either way the program sees what it asked for.
    default = not callable(handler) and handler == signal.SIG_DFL
    previous = _real_signal(signalnum, _on_fatal_signal if default else handler)
    return signal.SIG_DFL if previous is _on_fatal_signal else previous


def _getsignal(signalnum: int) -> _Handler:
    handler = _real_getsignal(signalnum)
    if isinstance(handler, _TrapHandler):
        return handler.handler
    if signalnum == _SIGTRAP and _trap_asked is not None and not callable(handler):
        return _trap_asked
    return signal.SIG_DFL if handler is _on_fatal_signal else handler


def _setswitchinterval(interval: float) -> None:
    if _session is None:
        _real_setswitchinterval(interval)
    else:
        _session.set_program_switch_interval(interval)


def _getswitchinterval() -> float:
    return _real_getswitchinterval() if _session is None else _session.program_switch_interval


def _exit(status: int) -> NoReturn:
    if _session is not None:
        _write_reporting(_session, "at os._exit")
    _real_exit(status)


def _execv(path: Any, argv: Any) -> NoReturn:
    session = _session
    if session is not None:
        session.before_exec()
        _write_reporting(session, "before exec", checkpoint=True)
    try:
        _real_execv(path, argv)
    finally:  # only reached when the exec failed
        if session is not None:
            session.after_failed_exec()


def _execve(path: Any, argv: Any, env: Any) -> NoReturn:
    session = _session
    if session is not None:
        session.before_exec()
        _write_reporting(session, "before exec", checkpoint=True)
    try:
        _real_execve(path, argv, env)
    finally:  # only reached when the exec failed
        if session is not None:
            session.after_failed_exec()


def _before_fork() -> None:
    if _session is not None:
        _session.lock.acquire()


def _after_fork_in_parent() -> None:
    if _session is not None:
        _session.lock.release()


def _after_fork_in_child() -> None:
    if _session is not None and not _session.finished:
        _session.after_fork_in_child()


def _at_exit() -> None:
    if _session is not None:
        _write_reporting(_session, "at exit")


def install(session: Session) -> None:
    """Make ``session`` this process's measurement and hook it into the process's life."""
    global _session, _installed
    _session = session
    if _installed:
        return
    _installed = True
    threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]
    atexit.register(_at_exit)
    os._exit = _exit
    sys.setswitchinterval = _setswitchinterval
    sys.getswitchinterval = _getswitchinterval
    if COLLECTS_IN_ALLOCATIONS:
        gc.enable, gc.disable, gc.isenabled = held_off.enable, held_off.disable, held_off.isenabled
    os.execv = _execv
    os.execve = _execve
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
    if threading.current_thread() is threading.main_thread():
        for signum in signals.WRITE_BEFORE_DYING:
            # Only signals at their default: a handler or SIG_IGN already there (Python's own
            # for SIGINT, SIGPIPE and SIGXFSZ, nohup's) or a C library's (getsignal: None)
            # stays.
            if _real_getsignal(signum) == signal.SIG_DFL:
                _real_signal(signum, _on_fatal_signal)
        signal.signal = _signal
        signal.getsignal = _getsignal


def uninstall() -> None:
    """Undo :func:`install` (fork hooks cannot be removed; they do nothing without a session)."""
    global _session, _installed
    _session = None
    if not _installed:
        return
    _installed = False
    threading.Thread._bootstrap_inner = _real_bootstrap_inner  # type: ignore[attr-defined]
    atexit.unregister(_at_exit)
    os._exit = _real_exit
    sys.setswitchinterval = _real_setswitchinterval
    sys.getswitchinterval = _real_getswitchinterval
    gc.enable, gc.disable, gc.isenabled = _real_gc_switches
    os.execv = _real_execv
    os.execve = _real_execve
    if signal.signal is _signal:
        signal.signal = _real_signal
        signal.getsignal = _real_getsignal
        for signum in signals.WRITE_BEFORE_DYING:
            if _real_getsignal(signum) is _on_fatal_signal:
                _real_signal(signum, signal.SIG_DFL)


def start(session: Session, install_hooks: bool = True) -> Session:
    """Begin measuring: register the calling thread, start the sampler, hook the process."""
    if install_hooks:
        install(session)
    session.register_thread(
        threading.current_thread(), main=threading.current_thread() is threading.main_thread()
    )
    session.start_sampler()
    return session


def stop() -> None:
    """Finish the installed session (write every file) and undo the hooks."""
    session = _session
    if session is not None:
        _write(session)
    uninstall()


__all__ = ["current_session", "install", "start", "stop", "uninstall"]
