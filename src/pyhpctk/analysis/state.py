"""What the driver's stages share on one rank: the :class:`Analysis` and the few types around it.

:class:`Analysis` holds the options, the communicator and what each stage of
:mod:`.pipeline` leaves for the next ones (the profiles read, the unified tree, the expansion
plan, the planes, the sizes of every block); :class:`RunReport` is what a run returns, with the
time this rank spent in each stage. :func:`parallel_map` is how a stage spreads its profiles over
``-j`` threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis import inputs
from pyhpctk.analysis.comm import Comm
from pyhpctk.analysis.context import ContextBuilder
from pyhpctk.analysis.expand import Expansion
from pyhpctk.analysis.expand_plan import EarlyExpansion
from pyhpctk.analysis.graft import GraftPlan
from pyhpctk.analysis.metrics import PARTIALS_STATS, PARTIALS_SUM, Partial
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.planes import ProfilePlane, Spill
from pyhpctk.analysis.screening import Screened
from pyhpctk.analysis.sources import SourcesReport, Warrants
from pyhpctk.analysis.stats import SparseValues, TreeShape
from pyhpctk.analysis.unify import ProfileData, RawTree
from pyhpctk.analysis.write import database_error
from pyhpctk.formats import profiledb, tracedb
from pyhpctk.formats.threads import ThreadEntry

T = TypeVar("T")
R = TypeVar("R")

Progress = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]
"""``progress(stage label, total)`` gives a context manager whose value advances the bar."""

RAW_BYTES_PER_INPUT_BYTE = 3
"""Memory a rank's profiles take between reading and statistics, per byte of input files."""


def no_progress(label: str, total: int) -> AbstractContextManager[Callable[[int], None]]:
    return nullcontext(lambda n: None)


@contextmanager
def small_pages() -> Iterator[None]:
    """numpy's request for transparent huge pages (``madvise(MADV_HUGEPAGE)`` of every array of
    4 MiB and more) turned off for the analysis, and back as it was after it.

    The analysis makes and drops many large temporary arrays, each in memory fresh from the
    kernel, which zeroes it on first touch: with huge pages, 2 MiB at a time (and compacts
    memory to find them, where the kernel's ``defrag`` setting is ``madvise``, its default),
    for arrays often touched only in part. On the development VM that was 1.4-1.8 s of one
    rank's 4 s of CPU time (``clear_page`` under the huge-page fault), 0.6-0.7 s with 4 KiB
    pages (benchmarks/RESULTS.md). An explicit ``NUMPY_MADVISE_HUGEPAGE`` in the environment
    wins.
    """
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    switch = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if switch is None or os.environ.get("NUMPY_MADVISE_HUGEPAGE") is not None:
        yield
        return
    before = bool(switch(False))
    try:
        yield
    finally:
        switch(before)


def parallel_map(
    function: Callable[[T], R], items: Sequence[T], jobs: int, advance: Callable[[int], None]
) -> Iterator[R]:
    """``function`` over ``items`` on ``jobs`` threads, yielding results in input order.

    Work is handed out one item at a time as workers free up, so a few large profiles do not
    leave other workers idle (dynamic load balance).
    """
    if jobs <= 1 or len(items) <= 1:
        for item in items:
            result = function(item)
            advance(1)
            yield result
        return
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures: list[Future[R]] = [pool.submit(function, item) for item in items]
        for future in futures:
            result = future.result()
            advance(1)
            yield result


@dataclass(slots=True)
class Plan:
    """What rank 0 broadcasts after expansion: everything the per-profile work needs."""

    shape: TreeShape
    visible: npt.NDArray[np.int64]
    placement: Expansion  # call/leaf contexts and splits of every raw node (no tree)
    title: str
    output: Path
    replacing: bool  # an old database holds the output's name (then it is kept on errors)
    grafts: GraftPlan | None = None  # where native runtimes' worker threads go (.graft)


@dataclass(slots=True)
class ProfileOffsets:
    """Every profile's block and trace sizes, all-gathered: the offsets of every write."""

    # rank 0: every profile's info; other ranks: stand-ins with id tuples of the same lengths
    # (they place every block alike; only rank 0 writes the head, pipeline._stand_ins)
    infos: list[profiledb.ProfileInfo]
    n_values: npt.NDArray[np.int64]  # per profile.db index (0: the summary, sized last)
    n_ctxs: npt.NDArray[np.int64]
    trace_counts: npt.NDArray[np.int64]  # per position; -1: no trace
    span: tuple[int | None, int | None]

    def trace_plan(self) -> tracedb.TraceLayout:
        lines = np.maximum(self.trace_counts, 0)
        low, high = self.span
        return tracedb.layout(
            list(range(1, len(self.trace_counts) + 1)),
            lines,
            lines,
            0 if low is None else low,
            0 if high is None else high,
        )

    @property
    def has_traces(self) -> bool:
        return bool(self.trace_counts.size) and bool(np.any(self.trace_counts >= 0))


@dataclass(slots=True)
class WriteState:
    """The database being written: its staging directory, the threads writing its files and
    what they raised, and where every profile's values go (write_stages)."""

    staging: Path | None = None
    meta_thread: threading.Thread | None = None
    profile_thread: threading.Thread | None = None  # writes profile.db during cct.db
    cct_thread: threading.Thread | None = None  # writes a round's cct.db window (write_stages)
    profile_errors: list[BaseException] = field(default_factory=list)  # and cct_thread's
    meta_errors: list[BaseException] = field(default_factory=list)
    layout: ProfileOffsets | None = None
    cct_end: int = 0
    sources: SourcesReport | None = None  # what was copied into src/, and what not (.sources)


@dataclass(slots=True)
class Analysis:
    """What the stages share on one rank; each stage fills its part (module docstring)."""

    options: ProfOptions
    comm: Comm
    progress: Progress
    in_memory: bool = False  # aggregate(): nothing will be written
    timings: dict[str, float] = field(default_factory=dict)
    speeds: npt.NDArray[np.float64] | None = None  # every rank's relative speed (.balance)
    sources: inputs.Listing = field(default_factory=lambda: inputs.Listing([], [], [], [], []))
    # rank 0: the name pyrun recorded for each input profile that has one (inputs.thread_names)
    thread_names: dict[int, ThreadEntry] = field(default_factory=dict)
    # rank 0: what vouches for copying each source file (.sources)
    warrants: Warrants = field(default_factory=Warrants)
    light: bool = False  # read twice: call paths first, values again for the statistics
    tree: RawTree | None = None  # this rank's call paths; after unify, every profile's
    merged: RawTree | None = None  # rank 0: the unified tree
    own: list[tuple[int, ProfileData]] = field(default_factory=list)
    screened: Screened | None = None
    weights: npt.NDArray[np.float64] | None = None
    early: EarlyExpansion | None = None  # rank 0: its own call paths, expanded while others read
    plan: Plan | None = None
    expanded: ContextBuilder | None = None  # rank 0
    spill: Spill | None = None
    planes: list[ProfilePlane] = field(default_factory=list)
    failure: BaseException | None = None  # this rank's statistics failed (raised on all later)
    local_counts: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    n_metrics: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    summary_parts: list[SparseValues] = field(default_factory=list)
    output: WriteState = field(default_factory=WriteState)

    @property
    def root(self) -> bool:
        return self.comm.rank == 0

    @property
    def partials(self) -> tuple[Partial, ...]:
        return PARTIALS_STATS if self.options.metrics == "stats" else PARTIALS_SUM

    def stage(self, label: str, total: int) -> AbstractContextManager[Callable[[int], None]]:
        """A progress bar on rank 0 only."""
        return self.progress(label, total) if self.root else no_progress(label, total)

    def writing(self, function: Callable[[], T]) -> Callable[[], T]:
        """``function`` with an ``OSError`` (a full disk) turned into the database's one-line
        error, which names the output and what was left of it."""
        plan = self.plan
        assert plan is not None

        def guarded() -> T:
            try:
                return function()
            except OSError as error:
                raise database_error(plan.output, error, plan.replacing) from None

        return guarded


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a pyprof run did: where the database went and what it skipped.

    ``timings``: seconds this rank spent in each stage (the critical path of a run).
    """

    output: Path
    profiles: int
    contexts: int
    metrics: int
    traces: int
    problems: tuple[str, ...]
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    sources: SourcesReport | None = field(default=None, compare=False)

    def summary(self) -> str:
        """A few lines for the terminal."""
        lines = [
            f"wrote {self.output}: {self.profiles} profiles, {self.contexts} contexts, "
            f"{self.metrics} metrics, {self.traces} traces"
        ]
        if self.sources is not None:
            lines.append(self.sources.line())
        if self.problems:
            lines.append(f"{len(self.problems)} problem(s):")
            lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


__all__ = [
    "RAW_BYTES_PER_INPUT_BYTE",
    "Analysis",
    "Plan",
    "ProfileOffsets",
    "Progress",
    "RunReport",
    "WriteState",
    "no_progress",
    "parallel_map",
]
