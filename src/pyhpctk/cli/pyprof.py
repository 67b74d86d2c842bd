"""``pyprof``: aggregate measurement directories into an HPCToolkit database.

A thin click command over :func:`pyhpctk.analysis.pipeline.run`; see ``docs/pyprof.md``. It builds
a :class:`~pyhpctk.analysis.options.ProfOptions`, draws one progress bar per stage on stderr when
stderr is a terminal, and prints a short summary (with any skipped profiles) at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from pyhpctk.analysis.options import METRIC_MODES, ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli._common import run_command, version_option


@contextmanager
def _bar(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A click progress bar on stderr: count, rate (items/s) and ETA, advanced by the stage."""
    start = time.monotonic()
    done = 0
    rate = [""]
    bar: click._termui_impl.ProgressBar[int]
    with click.progressbar(
        length=max(total, 1),
        label=f"{label:<22}",
        file=sys.stderr,
        show_pos=True,
        show_percent=False,
        item_show_func=lambda _item: rate[0],
    ) as bar:

        def advance(n: int) -> None:
            nonlocal done
            done += n
            elapsed = max(time.monotonic() - start, 1e-9)
            rate[0] = f"{done / elapsed:,.0f}/s"
            bar.update(n)

        yield advance


def _progress_for(
    enabled: bool,
) -> Callable[[str, int], AbstractContextManager[Callable[[int], None]]] | None:
    return _bar if enabled else None


F = TypeVar("F", bound=Callable[..., Any])


def analysis_options(per_rank: bool = False) -> Callable[[F], F]:
    """The arguments and options pyprof and pyprof-mpi share (one definition for both)."""
    where = " per rank" if per_rank else ""
    decorators = [
        click.argument("measurements", nargs=-1, required=True, type=click.Path(path_type=Path)),
        click.option(
            "-o",
            "--output",
            type=click.Path(path_type=Path),
            default=None,
            help="Database directory to create (default, in the current directory: "
            "hpctoolkit-<app>-database for hpctoolkit-<app>-measurements, DIR-database for "
            "another DIR).",
        ),
        click.option(
            "-j",
            "--jobs",
            type=int,
            default=1,
            show_default=True,
            help=f"Worker threads{where} for reading and aggregating profiles.",
        ),
        click.option(
            "-S",
            "--structure",
            "structs",
            multiple=True,
            type=click.Path(path_type=Path),
            help="An hpcstruct file to use (before MEAS/structs/); may repeat.",
        ),
        click.option("--ignore-structs", is_flag=True, help="Use no structure file at all."),
        click.option(
            "-M",
            "--metrics",
            "metric_mode",
            type=click.Choice(METRIC_MODES),
            default="sum",
            show_default=True,
            help="Summary statistics: sum, or stats (min/mean/max/...).",
        ),
        click.option("--strict", is_flag=True, help="Stop at the first damaged profile."),
        click.option(
            "--force",
            is_flag=True,
            help="Replace an existing output database (refused without it).",
        ),
        click.option("--no-sources", is_flag=True, help="Do not copy source files into DB/src."),
        click.option(
            "--derived",
            is_flag=True,
            help="Also write pyhpctk's own derived metrics (GPU warp issue rate) into the "
            "metric taxonomy; without it the taxonomy is hpcprof's.",
        ),
        click.option(
            "--progress/--no-progress",
            default=None,
            help="Progress bars on stderr"
            + (", rank 0 only" if per_rank else "")
            + " (default: when stderr is a terminal).",
        ),
    ]

    def apply(function: F) -> F:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def prof_options(
    measurements: tuple[Path, ...],
    output: Path | None,
    jobs: int,
    structs: tuple[Path, ...],
    ignore_structs: bool,
    metric_mode: str,
    strict: bool,
    force: bool,
    no_sources: bool,
    progress: bool | None,
    derived: bool = False,
) -> ProfOptions:
    """The options object both commands build from their shared command-line values."""
    return ProfOptions(
        measurements=measurements,
        output=output,
        jobs=jobs,
        structs=structs,
        ignore_structs=ignore_structs,
        metrics=metric_mode,
        strict=strict,
        force=force,
        progress=sys.stderr.isatty() if progress is None else progress,
        copy_sources=not no_sources,
        derived=derived,
    )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("pyprof")
@analysis_options()
def command(
    measurements: tuple[Path, ...],
    output: Path | None,
    jobs: int,
    structs: tuple[Path, ...],
    ignore_structs: bool,
    metric_mode: str,
    strict: bool,
    force: bool,
    no_sources: bool,
    derived: bool,
    progress: bool | None,
) -> int:
    """Aggregate MEASUREMENTS (hpcrun/pyrun directories) into a database.

    \b
    The database is assembled in a temporary directory beside -o and renamed into place
    when complete. An existing database is replaced only with --force. On a full disk
    (or quota, or an I/O error) pyprof says so in one line, exits with status 2 and leaves
    nothing under the -o name (a database being replaced stays as it was).
    """
    options = prof_options(
        measurements,
        output,
        jobs,
        structs,
        ignore_structs,
        metric_mode,
        strict,
        force,
        no_sources,
        progress,
        derived,
    )
    report = run(options, _progress_for(options.progress))
    click.echo(report.summary(), err=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run pyprof and return its exit status."""
    return run_command(command, argv, "pyprof")


if __name__ == "__main__":
    sys.exit(main())
