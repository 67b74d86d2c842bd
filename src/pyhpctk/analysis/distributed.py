"""pyprof-mpi's library entry point: the one analysis driver run on a communicator.

There is no separate MPI pipeline: :func:`run_distributed` is :func:`.pipeline.run` with a
:class:`~.comm.Comm` and a memory cap (docs/pyprof.md, "pyprof-mpi"); the exchange that builds
cct.db between ranks lives in :mod:`.exchange`, the per-profile planes in :mod:`.planes`.
"""

from __future__ import annotations

import dataclasses

from pyhpctk.analysis.comm import Comm, DistributedError
from pyhpctk.analysis.exchange import BYTES_PER_VALUE, MAX_ROUND_VALUES, plan_rounds, split_even
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import Progress, RunReport, run


def run_distributed(
    options: ProfOptions,
    comm: Comm,
    memory_limit: int | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Aggregate ``options.measurements`` on every rank of ``comm``; rank 0 finishes the files.

    Every rank must call this with the same arguments. ``memory_limit`` (or the options' own)
    bounds the bytes of values a rank holds while cct.db is built.
    """
    if memory_limit is not None:
        options = dataclasses.replace(options, memory_limit=memory_limit)
    return run(options, progress, comm)


__all__ = [
    "BYTES_PER_VALUE",
    "MAX_ROUND_VALUES",
    "DistributedError",
    "plan_rounds",
    "run_distributed",
    "split_even",
]
