"""What every command shares: running a click command and mapping errors to exit statuses.

A command's click function does the work by calling the library; :func:`run_command` turns a
:class:`~pyhpctk.errors.PyhpctkError` into one line on stderr and its exit code, so users never
see a traceback for bad input. Tests call ``main([...])`` and read the returned status.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

import click

from pyhpctk import __version__
from pyhpctk.errors import FormatWarning, PyhpctkError

_Command = TypeVar("_Command", bound=Callable[..., object])


def version_option(prog_name: str) -> Callable[[_Command], _Command]:
    """``--version``: every tool prints ``PROG, version V`` from the one version,
    :data:`pyhpctk.__version__` (the package metadata reads it too)."""
    return click.version_option(__version__, "--version", prog_name=prog_name)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    click.echo(f"warning: {message}", err=True)


def run_command(command: click.Command, argv: Sequence[str] | None, prog_name: str) -> int:
    """Run ``command`` on ``argv`` (``sys.argv[1:]`` when None) and return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.simplefilter("always", FormatWarning)
        warnings.showwarning = _show_warning
        try:
            result = command.main(args=args, prog_name=prog_name, standalone_mode=False)
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
        except BrokenPipeError:
            return 0
        except KeyboardInterrupt:
            click.echo(f"{prog_name}: interrupted", err=True)
            return 130
    return int(result) if isinstance(result, int) else 0
