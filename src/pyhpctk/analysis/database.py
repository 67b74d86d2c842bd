"""The aggregated database in memory, before it is written as meta/profile/cct/trace.db.

:class:`AggregateDatabase` is what the pipeline produces and what the writer and the comparison
consume: the final context tree, the metrics with their base ids, one :class:`ProfileResult` per
input profile (identifier tuple, sparse values, rewritten trace) and the summary profile. It also
knows how to build the cct.db transpose and the meta.db view of the tree (elided contexts
removed). No file I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.context import ContextBuilder, FunctionKey
from pyhpctk.analysis.metrics import MeasuredMetric, Partial
from pyhpctk.analysis.stats import SparseValues


@dataclass(frozen=True, slots=True)
class IdElement:
    """One element of a profile.db identifier tuple (formats.md §3.3)."""

    kind: int
    is_physical: bool
    logical: int
    physical: int


@dataclass(slots=True)
class Trace:
    """A profile's trace rewritten to final contexts (formats.md §3.5), sorted by time."""

    time: npt.NDArray[np.uint64]
    ctx: npt.NDArray[np.int64]


@dataclass(slots=True)
class ProfileResult:
    """One non-summary profile of the database."""

    name: str
    id_tuple: tuple[IdElement, ...]
    values: SparseValues
    trace: Trace | None = None


@dataclass(slots=True)
class AggregateDatabase:
    """Everything a database holds; ids are final (meta.db, profile.db, cct.db agree)."""

    title: str
    tree: ContextBuilder
    metrics: list[MeasuredMetric]
    bases: dict[str, int]
    partials: tuple[Partial, ...]
    profiles: list[ProfileResult]
    summary: SparseValues
    trace_range: tuple[int, int] | None = None
    formulas: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    copied_files: set[str] = field(default_factory=set)

    @property
    def stored_metrics(self) -> list[MeasuredMetric]:
        """The metrics meta.db lists: those with values (derived ones live in default.yaml)."""
        return [m for m in self.metrics if not m.is_derived]

    def functions(self) -> list[FunctionKey]:
        """Functions used by visible contexts, in first-use order."""
        seen: dict[FunctionKey, None] = {}
        for key in self.tree.distinct_keys():
            if key.function is not None and not key.is_elided:
                seen.setdefault(key.function, None)
        return list(seen)

    def modules(self) -> list[str]:
        """Load modules used by visible contexts or their functions, in first-use order."""
        seen: dict[str, None] = {}
        for key in self.tree.distinct_keys():
            if key.is_elided:
                continue
            if key.function is not None and key.function.module is not None:
                seen.setdefault(key.function.module, None)
            if key.module is not None:
                seen.setdefault(key.module, None)
        return list(seen)

    def files(self) -> list[str]:
        """Source files used by visible contexts or their functions, in first-use order."""
        seen: dict[str, None] = {}
        for key in self.tree.distinct_keys():
            if key.is_elided:
                continue
            if key.function is not None and key.function.file is not None:
                seen.setdefault(key.function.file, None)
            if key.file is not None:
                seen.setdefault(key.file, None)
        return list(seen)

    def context_major(
        self,
    ) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]
    ]:
        """cct.db's order: (ctx, metric id, profile index, value) sorted by ctx, metric, profile.

        Profile indices are profile.db's: 1 + position in :attr:`profiles` (0 is the summary).
        """
        if not self.profiles:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty, np.zeros(0, dtype=np.float64)
        ctx = np.concatenate([p.values.ctx for p in self.profiles])
        metric = np.concatenate([p.values.metric for p in self.profiles])
        value = np.concatenate([p.values.value for p in self.profiles])
        prof = np.concatenate(
            [np.full(len(p.values), i + 1, dtype=np.int64) for i, p in enumerate(self.profiles)]
        )
        order = np.lexsort((prof, metric, ctx))
        return ctx[order], metric[order], prof[order], value[order]

    def verify(self) -> list[str]:
        """Invariants: tree well formed, values sorted and non-zero, inclusive ≥ 0 where sane."""
        problems = list(self.tree.verify())
        for profile in self.profiles:
            problems += [f"{profile.name}: {p}" for p in profile.values.verify()]
            trace = profile.trace
            if trace is not None and np.any(np.diff(trace.time.astype(np.int64)) < 0):
                problems.append(f"{profile.name}: trace not sorted by time")
        problems += [f"summary: {p}" for p in self.summary.verify()]
        return problems
