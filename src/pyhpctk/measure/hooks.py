"""Connect a :class:`~pyhpctk.measure.session.Session` to the life of its process.

- **Threads**: ``threading.Thread._bootstrap_inner`` is wrapped so each thread registers itself
  when it starts (reading its own CPU clock) and writes its profile when it ends.
- **Exit**: an ``atexit`` handler registered before the program runs, so it runs after the
  program's own handlers, writes every thread's files.
- **SIGTERM**: its default action would kill the process without ``atexit``; pyrun installs a
  handler that writes the files and then dies of SIGTERM as before. ``signal.signal`` and
  ``signal.getsignal`` are wrapped so the program still installs, sees and gets called through
  its own SIGTERM handler. SIGINT keeps Python's default (``KeyboardInterrupt`` reaches ``atexit``).
- **os._exit and exec**: wrapped to write the files first (``multiprocessing`` fork children end
  with ``os._exit``).
- **sys.setswitchinterval / getswitchinterval**: wrapped so the program sets and sees its own
  GIL switch interval while pyrun shortens it in one-thread programs (see the session).
- **fork**: ``os.register_at_fork``: the child gets a new pid, fresh CCTs and a new sampler.

It must never change what the program observes beyond that: handlers, timers and threads of the
program keep working, and ``threading.enumerate()`` does not list the sampler.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any, NoReturn, TypeAlias

    from pyhpctk.measure.session import Session

    _Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_session: Session | None = None
_installed = False
_program_sigterm: _Handler = signal.SIG_DFL
_real_signal = signal.signal
_real_getsignal = signal.getsignal
_real_exit = os._exit
_real_execv = os.execv
_real_execve = os.execve
_real_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
_real_setswitchinterval = sys.setswitchinterval
_real_getswitchinterval = sys.getswitchinterval


def current_session() -> Session | None:
    """The session measuring this process, if any."""
    return _session


def _bootstrap_inner(self: threading.Thread) -> None:
    session = _session
    if session is not None and not session.finished:
        try:
            session.register_thread(self, main=False)
        except Exception:  # measurement must never stop a thread from running
            session = None
    try:
        _real_bootstrap_inner(self)
    finally:
        if session is not None:
            session.thread_finished()


def _on_sigterm(signum: int, frame: FrameType | None) -> Any:
    handler = _program_sigterm
    if callable(handler):
        return handler(signum, frame)
    if handler == signal.SIG_IGN:
        return None
    # The program left SIGTERM at its default: write the files, then die of SIGTERM as it would.
    if _session is not None:
        _session.finish()
    _real_signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    return None


def _signal(signalnum: int, handler: _Handler) -> _Handler:
    global _program_sigterm
    if signalnum != signal.SIGTERM:
        return _real_signal(signalnum, handler)
    _real_signal(signalnum, handler)  # validates the handler, as the original would
    _real_signal(signalnum, _on_sigterm)
    previous, _program_sigterm = _program_sigterm, handler
    return previous


def _getsignal(signalnum: int) -> _Handler:
    if signalnum == signal.SIGTERM and _real_getsignal(signalnum) is _on_sigterm:
        return _program_sigterm
    return _real_getsignal(signalnum)


def _setswitchinterval(interval: float) -> None:
    if _session is None:
        _real_setswitchinterval(interval)
    else:
        _session.set_program_switch_interval(interval)


def _getswitchinterval() -> float:
    return _real_getswitchinterval() if _session is None else _session.program_switch_interval


def _exit(status: int) -> NoReturn:
    if _session is not None:
        _session.finish()
    _real_exit(status)


def _execv(path: Any, argv: Any) -> NoReturn:
    session = _session
    if session is not None:
        session.before_exec()
    try:
        _real_execv(path, argv)
    finally:  # only reached when the exec failed
        if session is not None:
            session.after_failed_exec()


def _execve(path: Any, argv: Any, env: Any) -> NoReturn:
    session = _session
    if session is not None:
        session.before_exec()
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
        _session.finish()


def install(session: Session) -> None:
    """Make ``session`` this process's measurement and hook it into the process's life."""
    global _session, _installed, _program_sigterm
    _session = session
    if _installed:
        return
    _installed = True
    threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]
    atexit.register(_at_exit)
    os._exit = _exit
    sys.setswitchinterval = _setswitchinterval
    sys.getswitchinterval = _getswitchinterval
    os.execv = _execv
    os.execve = _execve
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
    if threading.current_thread() is threading.main_thread():
        current = _real_getsignal(signal.SIGTERM)
        if current in (signal.SIG_DFL, None):
            _program_sigterm = signal.SIG_DFL
            _real_signal(signal.SIGTERM, _on_sigterm)
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
    os.execv = _real_execv
    os.execve = _real_execve
    if signal.signal is _signal:
        signal.signal = _real_signal
        signal.getsignal = _real_getsignal
        if _real_getsignal(signal.SIGTERM) is _on_sigterm:
            handler = _program_sigterm
            _real_signal(signal.SIGTERM, handler if handler is not None else signal.SIG_DFL)


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
        session.finish()
    uninstall()


__all__ = ["current_session", "install", "start", "stop", "uninstall"]
