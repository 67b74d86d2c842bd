"""Negative exponents (strong scaling: c0 + c1 * p^-1): asked with --negative-exponents, and
chosen automatically for contexts whose values fall as a parameter grows. Truths: the
generating functions, and Extra-P's recorded model of its strong-scaling test input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pymodel import main
from pyhpctk.model.analyze import AnalysisOptions, analyze
from pyhpctk.model.compare import context_weights, loo_smape, parse_python_model
from pyhpctk.model.extrap_input import experiment_series, read_experiment
from pyhpctk.model.fit import FitOptions, fit_single_parameter

DATA = Path(__file__).parent / "data" / "extrap"
SCALES = (2, 4, 8, 16, 32, 64)


def test_negative_exponents_recover_a_strong_scaling_law() -> None:
    p = np.array(SCALES, dtype=float)
    y = np.stack([10 + 100 / p, 3 + 40 * p**-0.5], axis=1)
    asked = fit_single_parameter(p, y, FitOptions(negative_exponents=True))
    assert [m.render(4) for m in asked.models] == ["10 + 100 * p^-1", "3 + 40 * p^(-1/2)"]
    # Without them a model of non-negative exponents and coefficients cannot fall.
    plain = fit_single_parameter(p, y, FitOptions())
    assert all(not m.hypothesis.terms for m in plain.models)


def _experiment(tmp_path: Path) -> Path:
    lines = []
    for p in SCALES:
        for name, value in (("solve", 10 + 100 / p), ("grow", 5 + 2 * p)):
            record = {"params": {"p": p}, "callpath": name, "metric": "time", "value": [value]}
            lines.append(json.dumps(record))
    path = tmp_path / "strong.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("flag", [[], ["--negative-exponents"]])
def test_falling_contexts_get_negative_exponents_rising_ones_keep_theirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    assert main([str(_experiment(tmp_path)), *flag]) == 0
    out = capsys.readouterr().out
    rows = {r.split()[1]: r for r in out.splitlines() if r[:3].strip().isdigit()}
    assert "10 + 100 * p^-1 " in rows["solve"]
    assert "5 + 2 * p " in rows["grow"]
    note = "1 of 2 contexts fall as a parameter grows (strong scaling)"
    assert (note in out) == (not flag)


def test_extraps_strong_scaling_input_fits_better_out_of_sample_than_extraps_model() -> None:
    """strong_scaling/one_parameter_1.txt falls from 725 to 82 over x = 20..60; Extra-P's default
    modeler gives 2512 - 411.9 * log2(x) (recorded). pymodel's model predicts each point left
    out better (both refitted alike: weighted as pymodel weighs this context, 1/y^2, for its
    runs scatter in proportion to their values)."""
    (series,) = experiment_series(
        read_experiment(DATA / "text/strong_scaling/one_parameter_1.txt"), ""
    )
    record = json.loads((DATA / "extrap_models.json").read_text())["models"]
    extrap = parse_python_model(
        record["text/strong_scaling/one_parameter_1.txt"]["compute@@time"], series.params
    )
    (context,) = analyze(series, AnalysisOptions(threshold=0.0)).contexts
    assert context.model.hypothesis.terms[0].factors[0].poly < 0
    y, weights = series.mean[:, 0], context_weights(series, 0)
    ours = loo_smape(context.model.hypothesis, series.points, y, weights)
    assert ours < loo_smape(extrap.hypothesis, series.points, y, weights)
    assert ours < 4.0
