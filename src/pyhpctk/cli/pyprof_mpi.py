"""``pyprof-mpi``: pyprof spread over MPI ranks (``mpiexec -n N pyprof-mpi ...`` or ``srun``).

The options are pyprof's, plus ``--memory-limit``; the database is the one ``pyprof`` writes.
A thin click command over :func:`pyhpctk.analysis.distributed.run_distributed` (see
``docs/pyprof.md``, "pyprof-mpi"). Rank 0 prints the summary and any error; the other ranks stay
quiet and exit with the same status. An unexpected exception on one rank aborts the whole job,
so that the others do not wait for it forever.
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path

import click

from pyhpctk.cli._common import run_command, version_option
from pyhpctk.cli.pyprof import _progress_for, analysis_options, prof_options
from pyhpctk.errors import PyhpctkError, UsageError

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
@version_option("pyprof-mpi")
@analysis_options(per_rank=True)
@click.option(
    "--memory-limit",
    default=None,
    metavar="SIZE",
    help="Bytes of values a rank may hold while building cct.db (e.g. 512M, 4G); "
    "beyond it cct.db is built in rounds. Default: one round.",
)
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
    memory_limit: str | None,
) -> int:
    """Aggregate MEASUREMENTS on every MPI rank into one database (same as pyprof's).

    \b
    As pyprof: an existing database is replaced only with --force; a full disk on any rank
    stops every rank with one error line from rank 0 (exit status 2), and nothing is left
    under the -o name (a database being replaced stays as it was).
    """
    from pyhpctk.analysis.comm import world
    from pyhpctk.analysis.distributed import run_distributed

    try:
        comm = world()
    except ImportError as error:
        raise UsageError(f"pyprof-mpi needs mpi4py and an MPI library: {error}") from error
    try:
        limit = None if memory_limit is None else parse_size(memory_limit)
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
        report = run_distributed(options, comm, limit, _progress_for(options.progress))
    except PyhpctkError as error:
        if comm.rank != 0:  # every rank raises the same error; rank 0 reports it
            raise click.exceptions.Exit(error.exit_code) from error
        raise
    except Exception:
        if comm.size > 1:
            click.echo(
                f"pyprof-mpi: rank {comm.rank}: internal error:\n{traceback.format_exc()}",
                err=True,
            )
            comm.abort(70)
        raise
    if comm.rank == 0:
        first, *rest = report.summary().split("\n")
        click.echo("\n".join([f"{first} ({comm.size} ranks)", *rest]), err=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run pyprof-mpi on this rank and return its exit status."""
    return run_command(command, argv, "pyprof-mpi")


if __name__ == "__main__":
    sys.exit(main())
