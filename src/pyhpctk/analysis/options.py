"""The options of one pyprof run, as a typed, frozen object (the CLI only builds one of these)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pyhpctk.errors import UsageError

METRIC_MODES = ("sum", "stats")
GRAFT_MODES = ("auto", "proportion", "off")
"""How worker threads of native runtimes are placed (:mod:`.graft`): ``auto`` by time where
the worker and the Python threads that called the runtime were traced, else in proportion to
those threads' time in each call; ``proportion`` always so; ``off``: they stay apart."""


@dataclass(frozen=True, slots=True)
class ProfOptions:
    """What to aggregate and how.

    ``measurements``: measurement directories (as hpcrun/pyrun write them).
    ``output``: the database directory to create; None means hpcprof's default name after the
    measurement directory (``hpctoolkit-<app>-database``), in the current directory
    (:func:`~pyhpctk.analysis.pipeline.default_output`).
    ``jobs``: worker threads for reading and expanding profiles (1 = serial).
    ``structs``: extra hpcstruct files (``-S``), used before those in ``MEAS/structs/``.
    ``ignore_structs``: use no structure file at all (``--ignore-structs``).
    ``metrics``: ``"sum"`` (the default summary) or ``"stats"`` (adds min / mean / max / std. dev.
    / coefficient of variation across profiles).
    ``strict``: a damaged profile is fatal instead of skipped with a warning.
    ``force``: replace an existing output directory.
    ``progress``: draw progress bars on stderr (the CLI turns it on only for a terminal).
    ``copy_sources``: copy the source files the measurement vouches for into ``DB/src/``
    (:mod:`.sources`).
    ``title``: the database title (default: the profiled program's name).
    ``derived``: also write pyhpctk's own derived metrics into ``metrics/default.yaml``
    (:data:`~pyhpctk.analysis.taxonomy.EXTRA_ROOTS`: the GPU warp issue rate); without it the
    taxonomy is hpcprof's, byte for byte.
    ``memory_limit``: bytes of values a rank may hold while cct.db is built, and beyond which
    it reads its profiles twice and keeps finished blocks in ``$TMPDIR`` (None: no cap).
    ``graft_workers``: one of :data:`GRAFT_MODES`.
    """

    measurements: tuple[Path, ...]
    output: Path | None = None
    jobs: int = 1
    structs: tuple[Path, ...] = ()
    ignore_structs: bool = False
    metrics: str = "sum"
    strict: bool = False
    force: bool = False
    progress: bool = False
    copy_sources: bool = True
    title: str | None = None
    derived: bool = False
    memory_limit: int | None = None
    graft_workers: str = "auto"

    def __post_init__(self) -> None:
        if not self.measurements:
            raise UsageError("no measurement directory given")
        if self.jobs < 1:
            raise UsageError(f"-j must be at least 1, got {self.jobs}")
        if self.ignore_structs and self.structs:
            raise UsageError("-S and --ignore-structs contradict each other")
        if self.metrics not in METRIC_MODES:
            raise UsageError(f"-M must be one of {', '.join(METRIC_MODES)}, got {self.metrics!r}")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise UsageError("--memory-limit must be positive")
        if self.graft_workers not in GRAFT_MODES:
            raise UsageError(
                f"--graft-workers must be one of {', '.join(GRAFT_MODES)}, "
                f"got {self.graft_workers!r}"
            )

    @classmethod
    def build(
        cls,
        measurements: list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...],
        *,
        output: str | os.PathLike[str] | None = None,
        jobs: int = 1,
        structs: tuple[str | os.PathLike[str], ...] | list[str | os.PathLike[str]] = (),
        ignore_structs: bool = False,
        metrics: str = "sum",
        strict: bool = False,
        force: bool = False,
        progress: bool = False,
        copy_sources: bool = True,
        title: str | None = None,
        derived: bool = False,
        memory_limit: int | None = None,
        graft_workers: str = "auto",
    ) -> ProfOptions:
        """Convenience constructor taking plain strings or paths."""
        return cls(
            measurements=tuple(Path(m) for m in measurements),
            output=None if output is None else Path(output),
            jobs=jobs,
            structs=tuple(Path(s) for s in structs),
            ignore_structs=ignore_structs,
            metrics=metrics,
            strict=strict,
            force=force,
            progress=progress,
            copy_sources=copy_sources,
            title=title,
            derived=derived,
            memory_limit=memory_limit,
            graft_workers=graft_workers,
        )
