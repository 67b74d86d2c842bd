"""What every command shares: running a click command and mapping errors to exit statuses.

A command's click function does the work by calling the library; :func:`run_command` turns a
:class:`~pyhpctk.errors.PyhpctkError` into one line on stderr and its exit code, so users never
see a traceback for bad input. Tests call ``main([...])`` and read the returned status.

It also makes standard output safe for commands that print a lot (``pyhpctk dump``, ``pyview``,
``--help``): a reader that goes away (``| head -1``) ends the command quietly with status 141, as
SIGPIPE ends other Unix tools; a full disk (``> /dev/full``) is one message and status 1; and a
name the output encoding cannot hold (a non-UTF-8 file name, an ASCII terminal) is written as a
backslash escape instead of stopping the command. A command started with standard output
closed (``cmd >&-``) holds descriptor 1 with /dev/null, so no file it opens takes that number
(nor does the program pyrun runs: it gets descriptor 1 closed, as given), and any attempt to
print is one message and status 1; a command that prints nothing there (pyprof) just succeeds.
"""

from __future__ import annotations

import codecs
import errno
import io
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from pyhpctk import __version__
from pyhpctk.errors import FormatWarning, PyhpctkError

_Command = TypeVar("_Command", bound=Callable[..., object])


def version_option(prog_name: str) -> Callable[[_Command], _Command]:
    """``--version``: every tool prints ``PROG, version V`` from the one version,
    :data:`pyhpctk.__version__` (the package metadata reads it too)."""
    return click.version_option(__version__, "--version", prog_name=prog_name)


#: What a shell reports for a command that SIGPIPE ended (128 + 13).
EXIT_BROKEN_PIPE = 128 + int(signal.SIGPIPE)
#: Exit status when the output could not be written (a full disk), as cat and cp use.
EXIT_WRITE_FAILED = 1
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_ESCAPING = "pyhpctk.surrogateescape_or_backslash"


def _surrogateescape_or_backslash(error: UnicodeError) -> tuple[str | bytes, int]:
    """Bytes that were not UTF-8 (surrogate escapes) go out as they came in; any other
    character the encoding cannot hold becomes a backslash escape."""
    assert isinstance(error, UnicodeEncodeError)
    try:
        return codecs.lookup_error("surrogateescape")(error)
    except UnicodeError:
        return codecs.backslashreplace_errors(error)


codecs.register_error(_ESCAPING, _surrogateescape_or_backslash)


@contextmanager
def _forgiving_encoding(stream: Any) -> Iterator[None]:
    """Let ``stream`` write every string: 'strict' becomes 'backslashreplace' (the output stays
    valid in its encoding), 'surrogateescape' also escapes what it cannot pass through."""
    old = getattr(stream, "errors", None)
    new = {"strict": "backslashreplace", "surrogateescape": _ESCAPING}.get(old or "")
    if new is None or not isinstance(stream, io.TextIOWrapper) or isinstance(stream, _StandIn):
        yield
        return
    stream.reconfigure(errors=new)
    try:
        yield
    finally:
        stream.reconfigure(errors=old)


def _discard_stdout() -> None:
    """Point file descriptor 1 at /dev/null when stdout cannot take what is still buffered,
    so the interpreter's last flush neither fails nor prints "Exception ignored"."""
    try:
        sys.stdout.flush()
        return
    except OSError:
        pass
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to flush later
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class StdoutClosed(OSError):
    """Standard output was closed when the command started and the command wrote to it."""


class _StandIn(io.TextIOWrapper):
    """``sys.stdout`` over :class:`_ClosedOutput`."""


class _ClosedOutput(io.RawIOBase):
    """Where ``sys.stdout`` writes when descriptor 1 was closed at start (:func:`_closed_stdout`):
    every write fails with :class:`StdoutClosed`, until the command is over (``discard``)."""

    def __init__(self) -> None:
        super().__init__()
        self.discard = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.discard:
            return len(data)
        raise StdoutClosed(errno.EBADF, "standard output is closed")


@contextmanager
def _closed_stdout() -> Iterator[None]:
    """When Python started with descriptor 1 closed (``sys.stdout`` is None): hold descriptor 1
    with /dev/null (close-on-exec) while the command runs, and give it a ``sys.stdout`` whose
    writes fail with :class:`StdoutClosed`."""
    if sys.stdout is not None:
        yield
        return
    held = _hold_descriptor(1)
    raw = _ClosedOutput()
    sys.stdout = _StandIn(io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace")
    try:
        yield
    finally:
        raw.discard = True  # what is still buffered goes nowhere, quietly
        stand_in, sys.stdout = sys.stdout, None
        stand_in.close()
        if held:
            os.close(1)


def _hold_descriptor(fd: int) -> bool:
    """Open /dev/null as ``fd`` when ``fd`` is closed; whether it was."""
    try:
        os.fstat(fd)
        return False
    except OSError:
        pass
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    if devnull != fd:
        os.dup2(devnull, fd, inheritable=False)
        os.close(devnull)
    return True


def _warning_printer() -> Callable[..., None]:
    """``warnings.showwarning`` for one command: each message once (a structure file read
    again, a second pass over the same input, say nothing new), as ``warning: MESSAGE``."""
    shown: set[str] = set()

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: object = None,
        line: str | None = None,
    ) -> None:
        text = str(message)
        if text not in shown:
            shown.add(text)
            click.echo(f"warning: {text}", err=True)

    return show


#: Exit status when memory ran out (a MemoryError no limit foresaw), as for other failures.
EXIT_OUT_OF_MEMORY = 2


def run_command(
    command: click.Command,
    argv: Sequence[str] | None,
    prog_name: str,
    out_of_memory: str = "free memory (or give it more) and run again",
) -> int:
    """Run ``command`` on ``argv`` (``sys.argv[1:]`` when None) and return the exit status.

    ``out_of_memory`` is the advice of the one line that replaces a MemoryError's traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings(), _closed_stdout(), _forgiving_encoding(sys.stdout):
        warnings.simplefilter("always", FormatWarning)
        warnings.showwarning = _warning_printer()
        try:
            # Not command.main(): click answers a closed pipe there itself, with status 1.
            with command.make_context(prog_name, args) as ctx:
                result = command.invoke(ctx)
            sys.stdout.flush()  # a failure writing the tail belongs to this command too
        except PyhpctkError as error:
            click.echo(f"{prog_name}: error: {error}", err=True)
            return error.exit_code
        except click.exceptions.Abort:
            click.echo(f"{prog_name}: interrupted", err=True)
            return 130
        except click.ClickException as error:
            error.show()
            return error.exit_code
        except click.exceptions.Exit as error:
            return int(error.exit_code)
        except StdoutClosed as error:
            click.echo(f"{prog_name}: error: cannot write the output: {error.strerror}", err=True)
            return EXIT_WRITE_FAILED
        except BrokenPipeError:
            _discard_stdout()
            return EXIT_BROKEN_PIPE
        except OSError as error:
            if error.errno not in _NO_ROOM:
                raise
            _discard_stdout()
            what = error.filename if error.filename is not None else "the output"
            click.echo(f"{prog_name}: error: cannot write {what}: {error.strerror}", err=True)
            return EXIT_WRITE_FAILED
        except (KeyboardInterrupt, EOFError):
            click.echo(f"{prog_name}: interrupted", err=True)
            return 130
        except MemoryError:
            click.echo(f"{prog_name}: error: out of memory: {out_of_memory}", err=True)
            return EXIT_OUT_OF_MEMORY
    return int(result) if isinstance(result, int) else 0
