"""Rank 0's early expansion (analysis/expand_plan.py) gives the expansion of one pass.

Rank 0 expands the tree of its own profiles while the other ranks read, then only the frames
they add. These tests do what rank 0 does, in one process, on HPCToolkit's reference
measurements (structure files, loops, GPU binaries), and compare with expanding the unified tree
in one pass; the byte-identity tests of test_pyprof_mpi.py run it under MPI.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.analysis import inputs
from pyhpctk.analysis.context import ContextKey
from pyhpctk.analysis.expand import Expansion, expand
from pyhpctk.analysis.expand_plan import (
    ClassifierInputs,
    EarlyExpansion,
    classifiers_for,
    expand_early,
    expand_frames,
    read_share,
)
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.screening import Loaded, ProfileBrief, load_profile, screen
from pyhpctk.analysis.unify import RawTree


def _loaded(measurement: Path) -> tuple[list[inputs.ProfileSource], list[Loaded]]:
    sources = inputs.discover([measurement])
    return sources, [load_profile(i, s) for i, s in enumerate(sources)]


def _fold(items: list[Loaded], into: RawTree | None = None) -> RawTree:
    tree = into
    for item in items:
        assert item.data is not None
        if tree is None:
            tree = item.data.tree
        else:
            tree.merge(item.data.tree)
    assert tree is not None
    return tree


def _one_pass(
    options: ProfOptions, raw: RawTree, loaded: list[Loaded], sources: list[inputs.ProfileSource]
) -> Expansion:
    usable = screen([ProfileBrief.of(i) for i in loaded], strict=False, warn=False).usable
    return expand(raw, classifiers_for(options, ClassifierInputs.of(raw, usable, sources), []))


def _plain(key: ContextKey) -> ContextKey:
    """The key without its function's token (which names the structure object it came from:
    two builds of the classifiers give two)."""
    if key.function is None:
        return key
    return dataclasses.replace(key, function=dataclasses.replace(key.function, token=None))


def _same(a: Expansion, b: Expansion) -> None:
    assert a.tree.parent == b.tree.parent
    assert [_plain(k) for k in a.tree.keys] == [_plain(k) for k in b.tree.keys]
    assert np.array_equal(a.call_ctx, b.call_ctx)
    assert np.array_equal(a.leaf_ctx, b.leaf_ctx)


@pytest.mark.parametrize(
    ("name", "first"),
    [
        ("loops-cputime-t", 1),
        ("loops-cputime-t", 3),
        ("loops-cuda-nvidiapc-t", 1),
        ("loops-cuda-nvidia-t", 1),
    ],
)
def test_rank0s_profiles_expanded_first_then_the_rest(
    reference: Path, name: str, first: int
) -> None:
    measurement = reference / "meas" / f"{name}.m"
    options = ProfOptions.build([measurement], ignore_structs=False)
    sources, loaded = _loaded(measurement)
    assert len(loaded) > first
    tree = _fold(loaded[:first])
    early = expand_early(options, tree, loaded[:first], sources)
    assert early is not None and early.nodes == len(tree)
    _fold(loaded[first:], into=tree)  # the unified tree, grown from rank 0's
    usable = screen([ProfileBrief.of(i) for i in loaded], strict=False, warn=False).usable
    problems: list[str] = []
    expansion, _ = expand_frames(options, tree, usable, sources, problems, early)
    assert expansion.tree is early.expansion.tree  # the early expansion was continued
    _, again = _loaded(measurement)
    _same(expansion, _one_pass(options, _fold(again), again, sources))


def test_a_module_only_later_profiles_use_makes_it_start_over(reference: Path) -> None:
    """The early classifiers do not know a module first seen in another rank's profiles (here
    the measured binary, whose structure file gives loops and lines): the early expansion is
    dropped, and the result is still the one pass's."""
    measurement = reference / "meas" / "loops-cputime-t.m"
    options = ProfOptions.build([measurement])
    sources, loaded = _loaded(measurement)
    whole = _fold(loaded[:1])
    keys, parents = whole.keys, whole.parent
    binary = max({k[0] for k in keys if k[0]}, key=lambda m: sum(k[0] == m for k in keys))
    keep: list[int] = []  # the frames above the binary's: a tree without it
    where: dict[int, int] = {}
    for node, (key, parent) in enumerate(zip(keys, parents, strict=True)):
        if key[0] != binary and (parent < 0 or parent in where):
            where[node] = len(keep)
            keep.append(node)
    assert 0 < len(keep) < len(keys)
    prefix = RawTree.from_arrays(
        [where[parents[n]] if parents[n] >= 0 else -1 for n in keep], [keys[n] for n in keep]
    )
    brief = ProfileBrief.of(loaded[0])
    given = ClassifierInputs.of(prefix, [brief], sources)
    assert binary not in given.used
    problems: list[str] = []
    classifiers = classifiers_for(options, given, problems)
    early = EarlyExpansion(
        len(prefix), [0], given, classifiers, problems, expand(prefix, classifiers)
    )
    _, again = _loaded(measurement)
    _fold(again, into=prefix)
    usable = screen([ProfileBrief.of(i) for i in again], strict=False, warn=False).usable
    expansion, _ = expand_frames(options, prefix, usable, sources, [], early)
    assert expansion.tree is not early.expansion.tree
    _same(expansion, _one_pass(options, prefix, again, sources))
    # Continuing the early expansion would have missed the binary's loops and lines:
    continued = expand(prefix, classifiers, early.expansion.tree, early.nodes, early.expansion)
    assert len(continued.tree) != len(expansion.tree)


def test_rank0_reads_less_by_about_its_expansion() -> None:
    sizes = np.full(1024, 600_000, dtype=np.int64)
    assert read_share(sizes, 1) == 1.0
    shares = [read_share(sizes, ranks) for ranks in (2, 4, 16, 64)]
    assert all(0.5 <= s < 1.0 for s in shares)
    assert shares == sorted(shares, reverse=True)  # smaller shares: expansion weighs more
    assert read_share(np.zeros(4, dtype=np.int64), 4) == 1.0
