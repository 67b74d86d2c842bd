"""pymodel on real pyrun + pyprof databases (issue #9: "a series of pyprof databases from an
example program run at several scales yields a ranked table that puts the context with the worst
asymptotic behaviour first")."""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run as run_pyprof
from pyhpctk.cli.pymodel import main as pymodel
from pyhpctk.cli.pyrun import main as pyrun
from pyhpctk.model.pmnf import Factor, Term, compare_growth, single

#: Timing-sensitive (the samplers' accuracy, memory peaks): run alone, after the parallel tests
#: (Makefile: unit), so that the other worker's load does not decide them.
pytestmark = pytest.mark.timing

DEMO = Path(__file__).resolve().parent.parent / "examples" / "scaling_demo.py"
SCALES = (2, 4, 8, 16, 32)
# What examples/scaling_demo.py does at P ranks: the lead-order term of each phase.
EXPECTED = {"all_to_all": ("2", 0), "allreduce": ("1", 0), "halo_exchange": ("0", 1)}


REPETITIONS = 2  # each scale measured twice: pymodel averages repetitions


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("series")
    databases = []
    for p in SCALES:
        for r in range(REPETITIONS):
            measurements = root / f"m{p}-{r}"
            command = [sys.executable, str(DEMO), str(p)]
            # 1 kHz: the smallest phases last 10-20 ms, a handful of samples at 200 Hz (the
            # engine draws each period in [p/2, 3p/2]), too few for a stable fit
            assert pyrun(["-e", "CPUTIME@1000", "-o", str(measurements), *command]) == 0
            database = root / f"d{p}-{r}"
            run_pyprof(ProfOptions.build([str(measurements)], output=str(database)))
            databases.append(database)
    return databases


PARAMS = "p=" + ",".join(str(p) for p in SCALES for _ in range(REPETITIONS))


def _growth(context: dict[str, Any]) -> tuple[Fraction, int]:
    return Fraction(context["lead_order"]["poly"]), int(context["lead_order"]["log"])


def _verdict(context: dict[str, Any], poly: str, log: int) -> str:
    term = single(0, Fraction(poly), log) if poly != "0" or log else None
    found = _growth(context)
    got = single(0, found[0], found[1]) if found != (Fraction(0), 0) else None
    return compare_growth(got, term)


def test_the_worst_scaling_context_comes_first(series: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "models.json"
    assert pymodel([*map(str, series), "--param", PARAMS, "--json", str(out)]) == 0
    document = json.loads(out.read_text())["analyses"][0]
    assert document["repetitions"] == [REPETITIONS] * len(SCALES)
    contexts = document["contexts"]
    first = contexts[0]
    assert "all_to_all" in first["labels"], first["labels"]
    assert _verdict(first, "2", 0) != "no match", first["model"]
    others = [c for c in contexts if c["labels"][-1] in ("allreduce", "halo_exchange")]
    assert all(_growth(c) < _growth(first) for c in others)


def test_each_phase_gets_its_known_lead_order_term(series: list[Path], tmp_path: Path) -> None:
    """Right, or adjacent in the search space (a quarter power, one logarithm): sampled values
    carry a sample's worth of error at each phase boundary, more on a loaded machine."""
    out = tmp_path / "models.json"
    assert pymodel([*map(str, series), "--param", PARAMS, "--json", str(out)]) == 0
    contexts = json.loads(out.read_text())["analyses"][0]["contexts"]
    for function, (poly, log) in EXPECTED.items():
        own = [c for c in contexts if c["labels"][-1] == function]
        assert own, f"no context for {function}"
        assert _verdict(own[0], poly, log) != "no match", (function, own[0]["model"])
    # compute() does the same work at every scale: its model is its constant, give or take a
    # term that moves it by a sample's worth across the scales (sampling noise, or the machine)
    compute = next(c for c in contexts if c["labels"][-1] == "compute")
    assert compute["constant"] == pytest.approx(0.080, rel=0.1)
    growth = [_terms_at(compute, p) for p in SCALES]
    assert max(abs(g) for g in growth) <= 0.02 * compute["constant"], compute["model"]


def _terms_at(context: dict[str, Any], p: int) -> float:
    """The model's value less its constant at P = p (pmnf's own evaluation of its terms)."""
    x = np.array([[float(p)]])
    total = 0.0
    for term in context["terms"]:
        factors = tuple(Factor(0, Fraction(f["poly"]), int(f["log"])) for f in term["factors"])
        total += float(term["coefficient"]) * float(Term(factors).evaluate(x)[0])
    return total


def test_an_inclusive_context_is_ranked_by_its_children_where_its_own_fit_grows_faster() -> None:
    """A sum grows like its fastest part: ``step`` (the sum of the demo's phases) was fitted as
    ``p^(9/4)`` on a loaded machine and ranked above ``all_to_all``, its ``p²`` part (a fresh
    clone's CI). Its children, which hold nearly all of it, rank it; a context whose children
    hold little of it keeps its own growth; the model shown is unchanged."""
    from pyhpctk.model.analyze import ContextModel, rank

    def context(path: tuple[str, ...], measured: float, growth: str) -> ContextModel:
        lead = (Fraction(growth), 0)
        return ContextModel(path, path, None, 1.0, 1.0, 1.0, measured, measured, lead)  # type: ignore[arg-type]

    step = context(("main", "step"), 1.0, "9/4")
    all_to_all = context(("main", "step", "all_to_all"), 0.7, "2")
    allreduce = context(("main", "step", "allreduce"), 0.25, "1")
    alone = context(("main", "solo"), 1.0, "9/4")  # its child holds a tenth of it
    child = context(("main", "solo", "part"), 0.1, "1")
    contexts = [step, allreduce, all_to_all, child, alone]
    rank(contexts)
    assert contexts[0] is alone, [c.path for c in contexts]
    assert contexts.index(all_to_all) < contexts.index(step) < contexts.index(allreduce)
    assert step.growth == (Fraction(9, 4), 0)
