"""Reading at scale: a database's profiles cost no memory until a view needs them (issue #19).

The database comes from benchmarks/pyview_profiles.py's generator (ranks x threads profiles
written with pyhpctk's writers), here at 500 and 5,000 profiles instead of 100,000. Opening it,
the top-down view and one context's per-profile statistics must allocate no more per profile
than a few numbers in arrays (the readers' vectorised checks, the statistics' own input), where
an object per profile costs about a kilobyte; the answers must be the generator's.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from measurement_helpers import benchmark_module
from pyhpctk.present import open_database

CONTEXTS, HOT = 400, 8


def _generator() -> ModuleType:
    return benchmark_module("pyview_profiles")


def _open_view_and_spread(database: Path) -> tuple[int, float, float, int]:
    """Peak bytes Python allocated, and what the user reads: the statistics of one context."""
    tracemalloc.start()
    try:
        db = open_database(database)
        view = db.view("top-down", depth=4)
        spread = db.spread(CONTEXTS - 1, "CPUTIME (sec)")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert view.root.children, "the top-down view shows the paths to the hot contexts"
    return peak, spread.stats.mean, spread.stats.maximum, spread.stats.count


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    generator = _generator()
    out = {}
    for ranks in (125, 1250):
        where = tmp_path_factory.mktemp("scale") / f"p{ranks * 4}.d"
        generator.generate(where, ranks, 4, CONTEXTS, HOT)
        out[ranks * 4] = where
    return out


def test_profiles_cost_no_memory_until_asked_for(databases: dict[int, Path]) -> None:
    _open_view_and_spread(databases[500])  # first: whatever the views import on first use
    small, small_mean, _, small_count = _open_view_and_spread(databases[500])
    large, mean, maximum, count = _open_view_and_spread(databases[5000])
    assert (small_count, count) == (500, 5000)
    per_profile = (large - small) / (5000 - 500)
    # A few numbers per profile in numpy arrays, for a moment (the reader's checks of every
    # profile's block and id tuple, the statistics' input): ~100 bytes; objects cost ~900.
    assert per_profile < 160, f"{per_profile:.0f} bytes per profile"
    # The generator's values at that (hot) context: f(p, c, 0), x1.5 for p % 997 == 5.
    generator = _generator()
    p = np.arange(1, 5001)
    expected = generator.value(p, CONTEXTS - 1, 0)
    assert mean == pytest.approx(float(expected.mean()), rel=1e-12)
    assert maximum == pytest.approx(float(expected.max()), rel=1e-12)
    assert small_mean == pytest.approx(float(expected[:500].mean()), rel=1e-12)


def test_profiles_are_listed_on_demand_with_their_identity(databases: dict[int, Path]) -> None:
    db = open_database(databases[5000])
    profiles = db.experiment.profiles
    assert len(profiles) == 5000
    assert profiles[9].label == "NODE 0 / RANK 2 / THREAD 1"
    assert profiles[-1].label == "NODE 19 / RANK 1249 / THREAD 3"
    assert not any(p.is_gpu for p in profiles[:10])
