"""pymodel --advise: the next measurement is where the models the runs cannot reject disagree,
and taking it settles the model. Truth: the generating function 1 + p^2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pymodel import main
from pyhpctk.model.advise import advise, candidates
from pyhpctk.model.extrap_input import experiment_series, read_experiment


def _write(path: Path, values: list[float]) -> Path:
    lines = [
        json.dumps({"params": {"p": p}, "callpath": "k", "metric": "t", "value": [1 + p * p]})
        for p in values
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_candidates_extend_each_end_and_split_each_gap() -> None:
    assert candidates(np.array([2.0, 4.0, 8.0])) == [
        (16.0, "beyond the largest"),
        (1.0, "below the smallest"),
        (pytest.approx(2 * np.sqrt(2)), "between measured values"),
        (pytest.approx(4 * np.sqrt(2)), "between measured values"),
    ]


def test_measuring_where_advised_settles_a_model_three_values_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At p = 2, 4, 8 the rises of p^2 and p*log2(p)^2 have the same ratio (4): both fit
    1 + p^2 exactly and pymodel cannot tell them apart. The advisor proposes a value where they
    differ; measured there, the model is p^2."""
    source = _write(tmp_path / "three.jsonl", [2, 4, 8])
    (series,) = experiment_series(read_experiment(source), "three")
    (best, *_) = advise(series)
    assert best.spread > 0.1
    assert best.point[0] not in (2.0, 4.0, 8.0)
    assert main([str(source), "--advise"]) == 0
    out = capsys.readouterr().out
    assert f"  1  p={best.point[0]:g} " in out
    assert "p * log2(p)^2" in out  # the twin the three values prefer (the lower order)
    settled = _write(tmp_path / "four.jsonl", [2, 4, 8, best.point[0]])
    assert main([str(settled)]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("  1 "))
    assert " + 1 * p^2 " in row


def test_noise_free_data_of_one_model_need_no_more_measurements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(_write(tmp_path / "five.jsonl", [2, 4, 8, 16, 32])), "--advise"]) == 0
    assert "no measurement would change it" in capsys.readouterr().out
