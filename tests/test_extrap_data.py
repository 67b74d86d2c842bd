"""pymodel on all of Extra-P 4.2.5's text and JSON Lines test inputs (45 files, 97 models),
against Extra-P's default modeler's models recorded from the installed Extra-P
(tests/data/extrap/extrap_models.json, provenance inside) and the generating functions where
the data show them.

For every call path and metric, pymodel's lead factors (the highest-order factor of every
parameter; of the last segment where its model is piecewise) equal Extra-P's, or pymodel's
model predicts the points left out at least as well as Extra-P's (leave-one-out SMAPE, both
refitted alike; a piecewise model's segments each refitted without the point).
``KNOWN_GAPS`` lists the models where neither holds yet; the test fails when one is fixed (so
the list shrinks) or a new one appears.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyhpctk.model.analyze import AnalysisOptions, analyze
from pyhpctk.model.compare import compare_with_extrap
from pyhpctk.model.extrap_input import experiment_series, read_experiment

DATA = Path(__file__).parent / "data" / "extrap"
FILES = sorted((DATA / "text").rglob("*.txt")) + sorted((DATA / "jsonlines").glob("*.jsonl"))
RECORD = json.loads((DATA / "extrap_models.json").read_text())["models"]

# Where pymodel's lead factors differ from Extra-P's and its LOO SMAPE is higher: none left.
# (The strong-scaling files of two parameters left the list when falling contexts of several
# parameters could subtract a term: two_parameter_1 now has LOO 2.6 % against Extra-P's 3.3 %,
# two_parameter_2 Extra-P's lead; band_matrix_2p, incomplete_matrix_2p and
# two_parameter_segmented_1 when models that miss their left-out points were refitted: see
# test_refit_of_models_that_miss.)
KNOWN_GAPS: set[str] = set()


def _rows() -> list[dict[str, object]]:
    rows = []
    for path in FILES:
        name = str(path.relative_to(DATA))
        rows.extend(compare_with_extrap(path, name, RECORD[name]))
    return rows


def test_every_input_reads_and_every_model_is_compared() -> None:
    assert len(FILES) == 45
    rows = _rows()
    assert len(rows) == 97
    assert all("extrap" in row for row in rows), [r["key"] for r in rows if "extrap" not in r]


def test_lead_term_equals_extraps_or_fits_better_out_of_sample() -> None:
    rows = _rows()
    gaps = {
        f"{r['file']} {r['key']}"
        for r in rows
        if not r["same_lead"] and float(r["loo_pymodel"]) > float(r["loo_extrap"])  # type: ignore[arg-type]
    }
    assert gaps == KNOWN_GAPS
    assert sum(bool(r["same_lead"]) for r in rows) >= 54


@pytest.mark.parametrize(
    ("name", "model"),
    [
        # Multiplicative noise of 1 %, values no model of the search space fits: the F-test's
        # model left y out (LOO 20.5 % against Extra-P's 16.5 %).
        ("jsonlines/band_matrix_2p.jsonl", "-4429 + 912.4 * log2(x) + 13.04 * y^(5/4) * log2(y)^2"),
        # Seven points, one of value 1 beside 502 and 795: LOO 98.2 % (Extra-P's 39.9 %).
        (
            "jsonlines/incomplete_matrix_2p.jsonl",
            "-3556 + 812 * log2(x) + 11.03 * log2(x) * y^(4/3)",
        ),
        # Behaviour that changes across the grid, a difference of terms: LOO 25.4 % (Extra-P's
        # 23.2 %).
        ("text/two_parameter_segmented_1.txt", "7.399 + 9.444 * x^(2/3) * log2(x) * y - 108.1 * y"),
    ],
)
def test_refit_of_models_that_miss(name: str, model: str) -> None:
    """A model whose leave-one-out SMAPE is above 10 % (and five times the runs' scatter) is
    fitted again (ordinary least squares, terms that subtract, and with several parameters the
    hypothesis of the lowest leave-one-out SMAPE); the one that predicts its left-out points
    best is kept, and the table says so."""
    (series, *_) = experiment_series(read_experiment(DATA / name), name)
    analysis = analyze(series, AnalysisOptions(threshold=0.0))
    (context,) = analysis.contexts
    assert context.model.render(4) == model
    assert context.weighting == "relative"  # the runs' 1 % scatter calls for it
    assert any("predicted its left-out points worse than 10 %" in n for n in analysis.notes)


@pytest.mark.parametrize(
    ("name", "key", "model"),
    [
        # 1 + 0.2 x^2 log2(y) with 1 % noise (the values at y = 1 are 1, those at y = 2 are
        # 1 + 0.2 x^2); Extra-P gives 1.374 + 6.698 log2(y) + 0.0438 x^(3/2) log2(x)^2 log2(y).
        ("text/two_parameter_1.txt", "reg", "0.9988 + 0.2002 * x^2 * log2(y)"),
        ("jsonlines/complete_matrix_2p.jsonl", "<root>", "0.9988 + 0.2002 * x^2 * log2(y)"),
        # exactly 1 + x^2 + y on a 3x3 grid (Extra-P: the same).
        ("jsonlines/extended2.jsonl", "test", " + 1 * x^2 + 1 * y"),
        # Extra-P's test_default_single_parameter_modeling: met1 constant 4.068.
        ("text/one_parameter_6.txt", "met1", "4.068"),
    ],
)
def test_known_generating_functions(name: str, key: str, model: str) -> None:
    (series, *_) = experiment_series(read_experiment(DATA / name), name)
    contexts = analyze(series, AnalysisOptions(threshold=0.0)).contexts
    found = {"->".join(c.path): c.model.render(4) for c in contexts}
    assert found[key].endswith(model)  # extended2's constant is 1e-13: rounding


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_pymodel_file_runs_from_the_command_line(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pymodel FILE`` on each input: exit status 0, a table per metric, every model in the
    JSON, no call path left out (Extra-P models them all)."""
    from pyhpctk.cli.pymodel import main

    out = tmp_path / "m.json"
    assert main([str(path), "--json", str(out), "--top", "1000"]) == 0
    document = json.loads(out.read_text())
    modelled = sum(len(a["contexts"]) for a in document["analyses"])
    assert modelled == len(RECORD[str(path.relative_to(DATA))])
    assert capsys.readouterr().out.count("configurations,") == len(document["analyses"])
