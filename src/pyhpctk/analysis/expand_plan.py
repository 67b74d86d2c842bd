"""Expansion off the critical path: rank 0 expands its own call paths while the others read.

The driver's expansion (:func:`.pipeline.expand_contexts`) is serial: rank 0 turns every frame
of the unified tree into contexts while the other ranks wait. But rank 0 reads the first
profiles, and the unified tree numbers frames as one-by-one insertion in profile order would
(:meth:`.unify.RawTree.merge`), so rank 0's own tree is a prefix of the unified one. Rank 0
therefore reads a smaller share (:func:`read_share`), expands its own tree as soon as it has
read it (:func:`expand_early`), while the others still read, and after unification expands only
the frames the others added (:func:`expand_frames`, incrementally, as :func:`.expand.expand`
allows).

The early expansion is used only when it is the expansion one pass would give: the classifiers
are built from the same inputs (:class:`ClassifierInputs`: modules used, the measurement
directory each was first seen in, the measurement directories; structure files and symbols are
found from those alone) and the screening kept the same profiles of rank 0. Otherwise it is
dropped and everything is expanded again, as without it. It never changes a database byte.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis import inputs
from pyhpctk.analysis.expand import Expansion, ModuleClassifiers, expand
from pyhpctk.analysis.native_modules import recorded_identities
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.screening import Loaded, ProfileBrief, screen
from pyhpctk.analysis.structures import build_classifiers, captured_gpu, load_structures
from pyhpctk.analysis.unify import RawTree, module_name
from pyhpctk.errors import PyhpctkError

EXPAND_FRAME_BYTES = 900
"""Expanding one frame costs rank 0 about what reading this many bytes of input does
(benchmarks/pyprof.py: 6-11 us a frame against 8 ns a byte, here and on the device machine)."""

FRAME_BYTES = 32
"""Bytes of a profile per call-path node, about (a 19-byte node record and its values): the
largest profile's nodes estimate the unified tree's frames."""


def read_share(sizes: npt.NDArray[np.int64], ranks: int) -> float:
    """Rank 0's share of the reading, against the others' (1: as much): less by about the
    time it takes to expand the call paths (at most half)."""
    if ranks == 1 or not len(sizes):
        return 1.0
    per_rank = float(sizes.sum()) / ranks
    if per_rank <= 0:
        return 1.0
    frames = float(sizes.max()) / FRAME_BYTES
    return max(0.5, 1.0 - frames * EXPAND_FRAME_BYTES / per_rank)


@dataclass(frozen=True, slots=True)
class ClassifierInputs:
    """What the classifiers of the frames are built from (:func:`classifiers_for`)."""

    used: frozenset[str]  # load modules with frames in the tree
    module_dirs: tuple[tuple[str, Path], ...]  # each used module's first measurement directory
    measurements: tuple[Path, ...]  # of the usable profiles, in order
    #: each captured GPU binary's offsets in the tree (a return address's call, its byte before)
    gpu_offsets: tuple[tuple[str, frozenset[int]], ...] = ()

    @classmethod
    def of(
        cls, raw: RawTree, usable: list[ProfileBrief], sources: inputs.Listing
    ) -> ClassifierInputs:
        columns = raw.columns()
        codes = np.unique(columns.code).tolist()
        used = frozenset(m for m in map(module_name, codes) if m is not None)
        module_dirs: dict[str, Path] = {}
        for brief in usable:
            for module, measurement in brief.module_paths.items():
                if module in used:
                    module_dirs.setdefault(module, Path(measurement))
        measurements = dict.fromkeys(sources.measurement(b.index) for b in usable)
        gpu_offsets = []
        for code in codes:
            name = module_name(code)
            if name is not None and captured_gpu(name):
                mine = columns.code == code
                offsets = columns.offset[mine].astype(np.int64)
                calls = offsets[columns.unwound[mine]] - 1
                gpu_offsets.append((name, frozenset(np.concatenate([offsets, calls]).tolist())))
        return cls(used, tuple(module_dirs.items()), tuple(measurements), tuple(gpu_offsets))

    def covers(self, other: ClassifierInputs) -> bool:
        """Whether classifiers built from these inputs serve ``other``'s: the same modules and
        measurements, and every GPU binary offset ``other`` names among these."""
        if replace(self, gpu_offsets=()) != replace(other, gpu_offsets=()):
            return False
        mine = dict(self.gpu_offsets)
        return all(
            offsets <= mine.get(module, frozenset()) for module, offsets in other.gpu_offsets
        )


def classifiers_for(
    options: ProfOptions, given: ClassifierInputs, problems: list[str]
) -> ModuleClassifiers:
    """The classifiers of every used module (structure files, symbols, logical metadata)."""
    explicit, found = load_structures(options, given.measurements, given.used)
    identities = recorded_identities(given.measurements, problems)
    return build_classifiers(
        given.module_dirs,
        explicit,
        found,
        problems,
        not options.ignore_structs,
        identities,
        dict(given.gpu_offsets),
    )


@dataclass(slots=True)
class EarlyExpansion:
    """Rank 0's expansion of its own call paths, made while the other ranks read."""

    nodes: int  # frames expanded: the first ``nodes`` frames of the unified tree
    usable: list[int]  # rank 0's profiles it is made of (input indices)
    inputs: ClassifierInputs
    classifiers: ModuleClassifiers
    problems: list[str]  # what building the classifiers reported
    expansion: Expansion


def expand_early(
    options: ProfOptions,
    tree: RawTree | None,
    loaded: list[Loaded],
    sources: inputs.Listing,
) -> EarlyExpansion | None:
    """Expand rank 0's tree of the ``loaded`` profiles; None when the screening would drop
    one of them (the tree would then be folded again) or when anything goes wrong (the
    expansion after unification then does it all and reports it)."""
    if tree is None or not len(tree):
        return None
    briefs = [ProfileBrief.of(item) for item in loaded]
    try:
        screened = screen(briefs, strict=False, warn=False)
    except PyhpctkError:
        return None
    read = [item.index for item in loaded if item.data is not None]
    usable = [brief.index for brief in screened.usable]
    if usable != read:
        return None
    given = ClassifierInputs.of(tree, screened.usable, sources)
    problems: list[str] = []
    try:
        classifiers = classifiers_for(options, given, problems)
        expansion = expand(tree, classifiers)
    except (PyhpctkError, OSError):
        return None
    return EarlyExpansion(len(tree), usable, given, classifiers, problems, expansion)


def expand_frames(
    options: ProfOptions,
    raw: RawTree,
    usable: list[ProfileBrief],
    sources: inputs.Listing,
    problems: list[str],
    early: EarlyExpansion | None,
) -> tuple[Expansion, ModuleClassifiers]:
    """Every frame of the unified tree ``raw`` expanded, and the classifiers used: ``early``'s
    expansion continued over the frames it lacks when it is valid (module docstring), else
    all of them from the start."""
    given = ClassifierInputs.of(raw, usable, sources)
    if early is not None and early.inputs.covers(given) and early.nodes <= len(raw):
        mine = set(early.usable)
        if [b.index for b in usable if b.index in mine] == early.usable:
            problems.extend(early.problems)
            expansion = early.expansion
            if early.nodes < len(raw):  # frames only other ranks' profiles have
                expansion = expand(raw, early.classifiers, expansion.tree, early.nodes, expansion)
            return expansion, early.classifiers
    classifiers = classifiers_for(options, given, problems)
    return expand(raw, classifiers), classifiers


__all__ = [
    "ClassifierInputs",
    "EarlyExpansion",
    "classifiers_for",
    "expand_early",
    "expand_frames",
    "read_share",
]
