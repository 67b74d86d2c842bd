"""The analysis runs with numpy's huge-page requests off, and leaves numpy's setting as it was.

``state.small_pages`` (benchmarks/RESULTS.md: fresh 2 MiB pages cost a rank more kernel time
than the 4 KiB ones its arrays touch) wraps ``pipeline.run`` and ``pipeline.aggregate``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyhpctk.analysis import pipeline
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.state import Analysis, small_pages

_core = getattr(np, "_core", None) or np.core
switch = _core.multiarray._set_madvise_hugepage


def current() -> bool:
    """numpy's setting now (the switch returns the previous one)."""
    value = bool(switch(True))
    switch(value)
    return value


@pytest.fixture(autouse=True)
def restore() -> object:
    before = current()
    yield
    switch(before)


@pytest.mark.parametrize("before", [True, False])
def test_off_inside_and_back_after(monkeypatch: pytest.MonkeyPatch, before: bool) -> None:
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    switch(before)
    with small_pages():
        assert current() is False
    assert current() is before


def test_back_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    switch(True)
    with pytest.raises(KeyError), small_pages():
        raise KeyError("stage failed")
    assert current() is True


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
    switch(True)
    with small_pages():
        assert current() is True


@pytest.mark.parametrize("entry", ["run", "aggregate"])
def test_the_analysis_runs_with_small_pages(
    reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    switch(True)
    seen: list[bool] = []
    read = pipeline.read

    def spying(state: Analysis) -> None:
        seen.append(current())
        read(state)

    monkeypatch.setattr(pipeline, "read", spying)
    measurement = reference / "meas" / "loops-cputime-t.m"
    options = ProfOptions.build([measurement], output=tmp_path / "db")
    result = pipeline.run(options) if entry == "run" else pipeline.aggregate(options)
    assert result is not None
    assert seen == [False]
    assert current() is True
