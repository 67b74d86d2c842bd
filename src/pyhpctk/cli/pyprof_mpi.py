"""``pyprof-mpi``: pyprof spread over MPI ranks (``mpiexec -n N pyprof-mpi ...`` or ``srun``).

The options are pyprof's, plus ``--memory-limit``; the database is the one ``pyprof`` writes.
A thin click command over :func:`pyhpctk.analysis.pipeline.run` on ``MPI.COMM_WORLD`` (see
``docs/pyprof.md``, "pyprof-mpi"). Rank 0 prints the summary and any error; the other ranks stay
quiet and exit with the same status. An unexpected exception on one rank aborts the whole job,
so that the others do not wait for it forever.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import click

from pyhpctk.cli._common import EXIT_OUT_OF_MEMORY, run_command, version_option
from pyhpctk.cli.pyprof import OUT_OF_MEMORY, analysis_options, prof_options, progress_for
from pyhpctk.errors import PyhpctkError, UsageError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("pyprof-mpi")
@analysis_options(per_rank=True)
@click.option(
    "--memory-limit",
    default=None,
    metavar="SIZE",
    help="Bytes of values a rank may hold (e.g. 512M, 4G; 'none': no limit); beyond it "
    "a rank reads its profiles twice and cct.db is built in rounds. Default: no limit.",
)
def command(**arguments: Any) -> int:
    """Aggregate MEASUREMENTS on every MPI rank into one database (same as pyprof's).

    \b
    As pyprof: an existing database is replaced only with --force; a full disk on any rank
    stops every rank with one error line from rank 0 (exit status 2), and nothing is left
    under the -o name (a database being replaced stays as it was).

    \b
    Each rank's share of the input follows its speed, timed at the start (~30 ms): a rank on a
    slower or shared CPU gets less. PYHPCTK_PYPROF_SPEEDS=even gives equal shares instead;
    PYHPCTK_PYPROF_SPEEDS=1,1,0.5,... (one number a rank) fixes them. The database is the
    same either way.
    """
    from pyhpctk.analysis.comm import world
    from pyhpctk.analysis.pipeline import run

    try:
        comm = world()
    except ImportError as error:
        raise UsageError(f"pyprof-mpi needs mpi4py and an MPI library: {error}") from error
    try:
        options = prof_options(arguments)
        report = run(options, progress_for(options.progress), comm)
    except PyhpctkError as error:
        if comm.rank != 0:  # every rank raises the same error; rank 0 reports it
            raise click.exceptions.Exit(error.exit_code) from error
        raise
    except MemoryError:
        if comm.size > 1:  # one line from the rank that ran out, then every rank stops
            click.echo(
                f"pyprof-mpi: rank {comm.rank}: error: out of memory: {OUT_OF_MEMORY}", err=True
            )
            comm.abort(EXIT_OUT_OF_MEMORY)
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
    return run_command(command, argv, "pyprof-mpi", out_of_memory=OUT_OF_MEMORY)


if __name__ == "__main__":
    sys.exit(main())
