"""Piecewise models where a one-parameter series changes behaviour: one model up to the split,
another after it, in the table, the JSON and the plots. Truths: Extra-P 4.2.5's segmented test
inputs, whose generating functions its tests state (test_segmented_modeler.py: p^2 up to the
changing point 6, then 30 + p), and the splits of Extra-P's segmented modeler on each file
(``extrap --modeler segmented``, run on 2026-12-07; it prints the first segment up to the last
value where both pieces agree, 'p<=6.0' for a change at 6)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pymodel import main
from pyhpctk.model.analyze import AnalysisOptions, analyze
from pyhpctk.model.extrap_input import experiment_series, read_experiment

DATA = Path(__file__).parent / "data" / "extrap" / "text"

# file -> {callpath: the first value of the second segment, None: one model}, as Extra-P's
# segmented modeler printed them ('... if p<=6.0 else ...' on values 1..10: 7)
EXTRAP_SPLITS = {
    "one_parameter_segmented_1.txt": {"main": 7.0},
    "one_parameter_segmented_2.txt": {"main": 24.0},
    "one_parameter_segmented_3.txt": {"main": None},
    "one_parameter_segmented_4.txt": {"main": 7.0, "main->comp": 7.0},
    "one_parameter_segmented_5.txt": {"met1": None, "met2": None, "met1+2": 6000.0},
    "one_parameter_segmented_6.txt": {"met1+2": 6000.0, "met1+5": 5000.0},
}


@pytest.mark.parametrize("name", sorted(EXTRAP_SPLITS))
def test_piecewise_models_split_where_extraps_segmented_modeler_does(name: str) -> None:
    """Where the point before Extra-P's split lies on both pieces (within 2 %: met1+2 is 4.0 at
    p=5000, the noisy constant before it and exactly -1 + p/1000 after it), pymodel may begin
    the second piece there; otherwise the splits are Extra-P's."""
    found, expected = {}, {}
    for series in experiment_series(read_experiment(DATA / name), name):
        values = series.points[:, 0].tolist()
        for context in analyze(series, AnalysisOptions(threshold=0.0)).contexts:
            key = "->".join(context.path)
            segmentation = context.segmentation
            found[key] = segmentation.start if segmentation else None
            expected[key] = EXTRAP_SPLITS[name][key]
            if segmentation and found[key] != expected[key] and expected[key] in values:
                shared = values[values.index(expected[key]) - 1]
                measured = series.mean[values.index(shared), series.paths.index(context.path)]
                on_both = all(
                    abs(float(m.evaluate([shared])[0]) - measured) <= 0.02 * abs(measured)
                    for m in (segmentation.before, segmentation.after)
                )
                if on_both and found[key] == shared:
                    expected[key] = shared
    assert found == expected
    assert set(found) == set(EXTRAP_SPLITS[name])


def test_the_table_and_json_show_the_piecewise_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.json"
    assert main([str(DATA / "one_parameter_segmented_1.txt"), "--json", str(out)]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("  1 "))
    assert " + 1 * p^2 for p<7; 30 + 1 * p from p=7 " in row
    (context,) = json.loads(out.read_text())["analyses"][0]["contexts"]
    piecewise = context["piecewise"]
    assert piecewise["start"] == 7.0
    before, after = piecewise["segments"]
    assert (before["from"], before["to"], after["from"], after["to"]) == (1.0, 6.0, 7.0, 10.0)
    assert before["terms"][0]["factors"] == [{"param": "p", "poly": "2", "log": 0}]
    assert before["terms"][0]["coefficient"] == pytest.approx(1.0)
    assert after["constant"] == pytest.approx(30.0) and after["terms"][0]["coefficient"] == (
        pytest.approx(1.0)
    )
    # Beyond the measurements the model is the last segment's: 30 + p at 8 x 10.
    assert context["predicted_at_target"] == pytest.approx(110.0)
    assert context["lead_order"] == {"poly": "1", "log": 0}


def test_plots_draw_each_segment_over_its_own_range() -> None:
    from pyhpctk.model.plot import model_curves

    (series,) = experiment_series(read_experiment(DATA / "one_parameter_segmented_2.txt"), "")
    (context,) = analyze(series, AnalysisOptions(threshold=0.0)).contexts
    x = series.points[:, 0]
    grid = np.geomspace(4, 320, 200)
    (early, y_early, first), (late, y_late, second) = model_curves(context, x, grid)
    assert early.max() <= 20 and late.min() >= 24 and late.max() == 320
    assert "log2(p)" in first and "p^2" in second
    assert np.allclose(y_early, np.log2(early), rtol=1e-6)
    assert np.allclose(y_late, late**2, rtol=1e-6)
