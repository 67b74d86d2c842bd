"""Profile screening: read one profile, and decide once which profiles a database is made of.

Reading (:func:`load_profile`) never raises for a damaged file: it returns what went wrong, so
that every rank of pyprof-mpi can tell every other one (:class:`ProfileBrief`, all-gathered) and
all of them take the same decisions in :func:`screen`: warnings from the readers are shown once,
a damaged profile is skipped with a note (``--strict``: an error), and a profile whose metric
table disagrees with the others' is skipped too (:class:`MetricTable`). The identifier tuples of
the profiles kept are made dense here (:func:`id_tuples`, formats.md §1.8 -> §3.3).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis import inputs
from pyhpctk.analysis.database import IdElement
from pyhpctk.analysis.extract import extract
from pyhpctk.analysis.metrics import MeasuredMetric
from pyhpctk.analysis.unify import ProfileData
from pyhpctk.errors import FormatError, FormatWarning, PyhpctkError
from pyhpctk.formats.hpcrun_constants import (
    INTERP_BOTH_VALID,
    INTERP_LOGIC_GLOBAL,
    INTERP_LOGIC_LOCAL,
    id_interpretation,
    id_kind,
)


class ProfileError(PyhpctkError):
    """A profile cannot be used (damaged, or its metric table disagrees with the others)."""

    exit_code = 2


@dataclass(slots=True)
class Loaded:
    """One profile as read: its data, or why it could not be read, and what the readers said."""

    index: int
    data: ProfileData | None
    problem: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def load_profile(index: int, source: inputs.ProfileSource) -> Loaded:
    """Read and extract one profile; a damaged trace costs only the trace (and is reported)."""
    from pyhpctk.formats import hpcrun, hpctrace

    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FormatWarning)
        try:
            profile = hpcrun.read(source.profile, strict=False)  # extract() checks it
            trace = None
            if source.trace is not None:
                try:
                    trace = hpctrace.read(source.trace)
                except PyhpctkError as error:
                    notes.append(f"trace dropped: {error}")
            where = (source.name, str(source.profile), str(source.measurement))
            try:
                data = extract(profile, trace, *where)
            except PyhpctkError as error:
                if trace is None or error.__class__ is not FormatError or "trace" not in str(error):
                    raise
                notes.append(f"trace dropped: {error}")
                data = extract(profile, None, *where)
        except PyhpctkError as error:
            return Loaded(index, None, str(error))
        except (OSError, ValueError, IndexError, KeyError) as error:  # defensive: never a traceback
            return Loaded(index, None, f"{source.profile}: cannot read: {error}")
    return Loaded(index, data, None, [str(w.message) for w in caught], notes)


@dataclass(slots=True)
class ProfileBrief:
    """What every rank learns about every profile (all-gathered after reading)."""

    index: int
    problem: str | None
    warnings: list[str]
    notes: list[str]
    name: str = ""
    metrics: list[MeasuredMetric] = field(default_factory=list)
    id_tuple: list[tuple[int, int, int]] = field(default_factory=list)
    program: str = ""
    module_paths: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, item: Loaded) -> ProfileBrief:
        brief = cls(item.index, item.problem, item.warnings, item.notes)
        if item.data is not None:
            brief.name = item.data.name
            brief.metrics = item.data.metrics
            brief.id_tuple = item.data.id_tuple
            brief.program = item.data.header.get("program-name", "")
            brief.module_paths = item.data.module_paths
        return brief


def briefs_of(items: list[Loaded]) -> list[ProfileBrief]:
    """The briefs of a rank's profiles, to be all-gathered: equal metric tables and module
    lists are one object each, which the pickle then holds once (the profiles of one
    measurement mostly share them: 64 briefs pickle to a fifth, and unpickle 4x faster)."""
    tables: dict[tuple[MeasuredMetric, ...], list[MeasuredMetric]] = {}
    modules: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    briefs = []
    for item in items:
        brief = ProfileBrief.of(item)
        brief.metrics = tables.setdefault(tuple(brief.metrics), brief.metrics)
        brief.module_paths = modules.setdefault(
            tuple(brief.module_paths.items()), brief.module_paths
        )
        briefs.append(brief)
    return briefs


@dataclass(slots=True)
class MetricTable:
    """The union of the profiles' metric tables, by name, in first-seen order."""

    metrics: list[MeasuredMetric] = field(default_factory=list)
    by_name: dict[str, int] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)

    def add_table(self, name: str, table: list[MeasuredMetric]) -> npt.NDArray[np.int64]:
        """Map profile ``name``'s metric indices to global ones; ProfileError on a disagreement."""
        mapping = np.empty(len(table), dtype=np.int64)
        for local, metric in enumerate(table):
            found = self.by_name.get(metric.name)
            if found is None:
                found = len(self.metrics)
                self.by_name[metric.name] = found
                self.metrics.append(metric)
                self.origin[metric.name] = name
                if metric.formula:
                    self.formulas[metric.name] = _named_formula(metric.formula, table)
            else:
                known = self.metrics[found]
                for attr in ("is_real", "period", "move_to_proc", "formula"):
                    if getattr(known, attr) != getattr(metric, attr):
                        raise ProfileError(
                            f"{name}: metric table disagrees with "
                            f"{self.origin[metric.name]}: metric {metric.name!r} has "
                            f"{attr}={getattr(metric, attr)!r} here and "
                            f"{getattr(known, attr)!r} there"
                        )
            mapping[local] = found
        return mapping


def _named_formula(formula: str, metrics: list[MeasuredMetric]) -> str:
    """Replace ``#N`` references (0-based table indices) by ``#{name}`` placeholders."""

    def name(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return "#{" + metrics[index].name + "}" if index < len(metrics) else match.group(0)

    return re.sub(r"#(\d+)", name, formula)


@dataclass(slots=True)
class Screened:
    """The decisions about the profiles: those kept (in input order) and what was said."""

    usable: list[ProfileBrief]
    table: MetricTable
    mappings: dict[int, npt.NDArray[np.int64]]  # input index -> its metrics' global indices
    problems: list[str]

    def position(self) -> dict[int, int]:
        """Input index -> 0-based position among the usable profiles (profile.db index - 1)."""
        return {brief.index: p for p, brief in enumerate(self.usable)}


def screen(briefs: list[ProfileBrief], strict: bool, warn: bool = True) -> Screened:
    """Which profiles make the database: the one place where damage and disagreement are judged.

    ``warn``: show the readers' warnings (rank 0 only, so that they appear once).
    """
    problems: list[str] = []
    good: list[ProfileBrief] = []
    for brief in briefs:
        if warn:
            for message in brief.warnings:
                warnings.warn(message, FormatWarning, stacklevel=3)
        if strict and brief.notes:
            raise ProfileError(f"{brief.notes[0]} (--strict)")
        problems.extend(brief.notes)
        if brief.problem is not None:
            if strict:
                raise ProfileError(f"{brief.problem} (--strict)")
            problems.append(f"skipped: {brief.problem}")
        else:
            good.append(brief)
    table = MetricTable()
    usable: list[ProfileBrief] = []
    mappings: dict[int, npt.NDArray[np.int64]] = {}
    for brief in good:
        try:
            mappings[brief.index] = table.add_table(brief.name, brief.metrics)
        except ProfileError as error:
            if strict:
                raise
            problems.append(f"skipped: {error}")
            continue
        usable.append(brief)
    if not usable:
        raise ProfileError(
            "no usable profile: " + "; ".join(problems) if problems else "no usable profile"
        )
    return Screened(usable, table, mappings, problems)


def id_tuples(raw: list[list[tuple[int, int, int]]]) -> list[tuple[IdElement, ...]]:
    """profile.db identifier tuples, generating dense logical ids where hpcrun left them to us.

    LOGIC_LOCAL: dense among profiles with the same tuple prefix; LOGIC_GLOBAL: dense among all
    values of that kind; LOGIC_ONLY and BOTH_VALID keep the stored logical id. Physical flags are
    set for everything but LOGIC_ONLY.
    """
    local: dict[tuple[object, ...], set[int]] = {}
    global_: dict[int, set[int]] = {}
    for elements in raw:
        for depth, (kind_word, physical, _logical) in enumerate(elements):
            interp = id_interpretation(kind_word)
            kind = id_kind(kind_word)
            if interp == INTERP_LOGIC_LOCAL:
                prefix = (kind, *[(id_kind(k), p) for k, p, _ in elements[:depth]])
                local.setdefault(prefix, set()).add(physical)
            elif interp == INTERP_LOGIC_GLOBAL:
                global_.setdefault(kind, set()).add(physical)
    local_rank = {k: {v: i for i, v in enumerate(sorted(s))} for k, s in local.items()}
    global_rank = {k: {v: i for i, v in enumerate(sorted(s))} for k, s in global_.items()}
    result = []
    for elements in raw:
        out = []
        for depth, (kind_word, physical, logical) in enumerate(elements):
            interp = id_interpretation(kind_word)
            kind = id_kind(kind_word)
            if interp == INTERP_LOGIC_LOCAL:
                prefix = (kind, *[(id_kind(k), p) for k, p, _ in elements[:depth]])
                logical = local_rank[prefix][physical]
            elif interp == INTERP_LOGIC_GLOBAL:
                logical = global_rank[kind][physical]
            physical_flag = interp in (INTERP_LOGIC_LOCAL, INTERP_LOGIC_GLOBAL, INTERP_BOTH_VALID)
            out.append(IdElement(kind, physical_flag, logical, physical))
        result.append(tuple(out))
    return result


__all__ = [
    "Loaded",
    "MetricTable",
    "ProfileBrief",
    "ProfileError",
    "Screened",
    "briefs_of",
    "id_tuples",
    "load_profile",
    "screen",
]
