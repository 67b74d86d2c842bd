"""``pyprof``: aggregate measurement directories into an HPCToolkit database.

A thin click command over :func:`pyhpctk.analysis.pipeline.run` (the one analysis driver, on one
process); see ``docs/pyprof.md``. It builds a :class:`~pyhpctk.analysis.options.ProfOptions` from
click's values (:func:`prof_options`, shared with pyprof-mpi), draws one progress bar per stage on
stderr when stderr is a terminal, and prints a short summary (with any skipped profiles).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from pyhpctk.analysis.memory import default_limit
from pyhpctk.analysis.options import GRAFT_MODES, METRIC_MODES, ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli._common import run_command, version_option
from pyhpctk.errors import UsageError


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


def progress_for(
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
        click.option(
            "--no-sources",
            is_flag=True,
            help="Copy no source file into DB/src (by default: the Python sources pyrun saw the "
            "program load, unchanged since, and the sources structure files name).",
        ),
        click.option(
            "--derived",
            is_flag=True,
            help="Also write pyhpctk's own derived metrics (GPU warp issue rate) into the "
            "metric taxonomy; without it the taxonomy is hpcprof's.",
        ),
        click.option(
            "--graft-workers",
            type=click.Choice(GRAFT_MODES),
            default="auto",
            show_default=True,
            help="Place the worker threads of OpenMP, OpenBLAS and PyTorch under the Python "
            "lines that gave them work: auto (by time where traced, pyrun -t, else in "
            "proportion to each line's time in the runtime), proportion, or off.",
        ),
        click.option(
            "--no-graft-workers",
            is_flag=True,
            help="Keep native runtimes' worker threads apart (--graft-workers off).",
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


def prof_options(arguments: Mapping[str, Any]) -> ProfOptions:
    """The options object both commands build from click's values (the parameter names of
    :func:`analysis_options`, plus ``memory_limit``: a size, ``none``, or None for the
    command's default, :func:`~pyhpctk.analysis.memory.default_limit` where ``default_limit``
    is set (pyprof) and no limit otherwise (pyprof-mpi))."""
    progress = arguments["progress"]
    text = arguments.get("memory_limit")
    if text is None:
        memory_limit = default_limit() if arguments.get("default_limit") else None
    elif text.strip().lower() == "none":
        memory_limit = None
    else:
        memory_limit = parse_size(text)
    return ProfOptions.build(
        arguments["measurements"],
        output=arguments["output"],
        jobs=arguments["jobs"],
        structs=arguments["structs"],
        ignore_structs=arguments["ignore_structs"],
        metrics=arguments["metric_mode"],
        strict=arguments["strict"],
        force=arguments["force"],
        progress=sys.stderr.isatty() if progress is None else progress,
        copy_sources=not arguments["no_sources"],
        derived=arguments["derived"],
        memory_limit=memory_limit,
        graft_workers="off" if arguments["no_graft_workers"] else arguments["graft_workers"],
    )


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1.5GiB"``, ``"4096"`` -> bytes (binary units, case-insensitive)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if match is None:
        raise UsageError(f"--memory-limit: cannot read {text!r} as a size (e.g. 512M, 4G)")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise UsageError("--memory-limit must be positive")
    return size


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("pyprof")
@analysis_options()
@click.option(
    "--memory-limit",
    default=None,
    metavar="SIZE",
    help="Memory pyprof may hold for profile values (e.g. 512M, 4G; 'none': no limit); "
    "beyond it pyprof reads profiles twice and builds cct.db in rounds. "
    "Default: half the memory available (MemAvailable, the cgroup's limit, ulimit -v).",
)
def command(**arguments: Any) -> int:
    """Aggregate MEASUREMENTS (hpcrun/pyrun directories) into a database.

    \b
    The database is assembled in a temporary directory beside -o and renamed into place
    when complete. An existing database is replaced only with --force. On a full disk
    (or quota, or an I/O error) pyprof says so in one line, exits with status 2 and leaves
    nothing under the -o name (a database being replaced stays as it was).

    \b
    Memory: pyprof keeps the values it holds within --memory-limit (its own footprint,
    the interpreter and the call-path tree, comes on top). When one profile or one
    context needs more than the limit, it says which and what limit it needs, and exits
    with status 2 before the work; out of memory all the same, it says so in one line.
    """
    options = prof_options({**arguments, "default_limit": True})
    report = run(options, progress_for(options.progress))
    click.echo(report.summary(), err=True)
    return 0


OUT_OF_MEMORY = (
    "pyprof keeps to --memory-limit (by default half the memory available) all but its "
    "call-path tree: give a smaller --memory-limit, or run where more memory is free"
)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run pyprof and return its exit status."""
    return run_command(command, argv, "pyprof", out_of_memory=OUT_OF_MEMORY)


if __name__ == "__main__":
    sys.exit(main())
