"""pymodel on real pyrun + pyprof databases (issue #9: "a series of pyprof databases from an
example program run at several scales yields a ranked table that puts the context with the worst
asymptotic behaviour first")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run as run_pyprof
from pyhpctk.cli.pymodel import main as pymodel
from pyhpctk.cli.pyrun import main as pyrun

DEMO = Path(__file__).resolve().parent.parent / "examples" / "scaling_demo.py"
SCALES = (2, 4, 8, 16, 32)
# What examples/scaling_demo.py does at P ranks: the lead-order term of each phase.
EXPECTED = {"all_to_all": ("2", 0), "allreduce": ("1", 0), "halo_exchange": ("0", 1)}


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("series")
    databases = []
    for p in SCALES:
        measurements = root / f"m{p}"
        status = pyrun(
            ["-e", "CPUTIME@200", "-o", str(measurements), sys.executable, str(DEMO), str(p)]
        )
        assert status == 0
        database = root / f"d{p}"
        run_pyprof(ProfOptions.build([str(measurements)], output=str(database)))
        databases.append(database)
    return databases


def test_the_worst_scaling_context_comes_first(series: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "models.json"
    params = "p=" + ",".join(map(str, SCALES))
    assert pymodel([*map(str, series), "--param", params, "--json", str(out)]) == 0
    contexts = json.loads(out.read_text())["contexts"]
    first = contexts[0]
    assert "all_to_all" in first["labels"], first["labels"]
    assert first["lead_order"] == {"poly": "2", "log": 0}


def test_each_phase_gets_its_known_lead_order_term(series: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "models.json"
    params = "p=" + ",".join(map(str, SCALES))
    assert pymodel([*map(str, series), "--param", params, "--json", str(out)]) == 0
    contexts = json.loads(out.read_text())["contexts"]
    for function, (poly, log) in EXPECTED.items():
        own = [c for c in contexts if c["labels"][-1] == function]
        assert own, f"no context for {function}"
        assert own[0]["lead_order"] == {"poly": poly, "log": log}, (function, own[0]["model"])
    compute = next(c for c in contexts if c["labels"][-1] == "compute")
    assert compute["terms"] == [], compute["model"]
    assert compute["constant"] == pytest.approx(0.040, rel=0.1)
