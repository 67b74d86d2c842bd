"""``pyhpctk``: the toolchain's utility command (``dump`` and ``verify`` any file or directory)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import click

from pyhpctk.cli._common import run_command, version_option
from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats.inspect import dump_path, kind_of, verify_path


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("pyhpctk")
def cli() -> None:
    """pyhpctk utilities: inspect the files the toolchain reads and writes.

    The tools themselves are separate commands: pyrun (measure), pystruct (recover program
    structure), pyprof / pyprof-mpi (analyze into a database) and pyview (view).
    """


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
def dump(path: Path) -> None:
    """Print PATH as readable text.

    PATH is any file pyhpctk knows (.hpcrun, .hpctrace, meta.db, profile.db, cct.db, trace.db,
    .hpcstruct, logical/python.*, threads/*.txt, kernel_symbols/vmlinux.*), a measurement
    directory or a database directory. The format is detected from the content, not the name
    (a kernel symbol file, xz or text, by its directory kernel_symbols/). Damaged content that
    can still be parsed is shown as stored, under a "# problem:" line; a file that cannot be
    parsed is one error line (in a directory, marked "# unreadable:" while the other files are
    shown) and exit status 2.

    \b
    Examples:
      pyhpctk dump app-measurements/app-000000-000-7f000101-4242-0.hpcrun
      pyhpctk dump app-database | less
    """
    dump_path(path, sys.stdout)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; only set the exit status.")
def verify(path: Path, quiet: bool) -> int:
    """Check PATH (a file, measurement directory or database) for consistency.

    Each file is checked alone (offsets inside the file, parents before children, sorted sparse
    indices, header numbers that are numbers, no NaN values or negative times, ...), then the
    files of a directory against each other: every id one file takes from another's table
    (trace nodes, Python functions, contexts, metrics, profiles) must be in it, trace times
    within their bounds, cct.db the transpose of profile.db; a database's metrics/default.yaml
    as pyview reads it. docs/formats.md lists every check.

    Exit status: 0 clean, 1 problems found, 2 something could not be read.
    """
    report = verify_path(path)
    if not report.unreadable and kind_of(path) == "database":
        report.problems.extend(_taxonomy_problems(path))
    if not quiet:
        for line in report.unreadable:
            click.echo(f"unreadable: {line}", err=True)
        for line in report.problems:
            click.echo(f"problem: {line}")
        if report.exit_code == 0:
            click.echo(f"{path}: ok ({report.checked} file(s) checked)")
    return report.exit_code


def _taxonomy_problems(database: Path) -> list[str]:
    """A database's ``metrics/default.yaml`` is checked as pyview reads it (present/metrics.py)."""
    from pyhpctk.present.metrics import taxonomy_problems
    from pyhpctk.present.source import open_experiment

    if not (database / "metrics" / "default.yaml").is_file():
        return []
    try:
        with warnings.catch_warnings():  # what else pyview would warn of, verify has reported
            warnings.simplefilter("ignore", FormatWarning)
            experiment = open_experiment(database)
    except FormatError as error:  # pyview refuses the database: say why, as a problem
        return [str(error)]
    return taxonomy_problems(experiment)


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv, "pyhpctk")


if __name__ == "__main__":
    sys.exit(main())
