"""Extra-P's experiment formats read by pymodel: text, JSON (both forms) and JSON Lines.

The files under tests/data/extrap/ are Extra-P 4.2.5's own test inputs (README there); the
truths are their values as written in the files and the models Extra-P's tests assert.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pymodel import main
from pyhpctk.model.extrap_input import ExtrapInputError, experiment_series, read_experiment

DATA = Path(__file__).parent / "data" / "extrap"


def test_text_format_reads_parameters_points_regions_metrics_and_repetitions() -> None:
    experiment = read_experiment(DATA / "text" / "one_parameter_2.txt")
    assert experiment.params == ("x",)
    assert experiment.metrics == ["time"]
    assert experiment.callpaths[:3] == ["main", "main->merge", "main->merge->comp1"]
    runs = experiment.data[("main", "time")]
    assert sorted(runs) == [(20.0,), (30.0,), (40.0,), (50.0,), (60.0,)]
    assert runs[(20.0,)] == [
        82.00848518948744,
        81.42023198759563,
        81.98984501217201,
        80.76019835580321,
        82.54252892405795,
    ]
    series = experiment_series(experiment, "one_parameter_2.txt")
    assert len(series) == 1
    assert series[0].paths[2] == ("main", "merge", "comp1")
    assert series[0].mean[0, 0] == pytest.approx(np.mean(runs[(20.0,)]))
    assert series[0].repetitions.tolist() == [5] * 5


def test_text_format_with_several_points_per_line_and_three_parameters() -> None:
    experiment = read_experiment(DATA / "text" / "three_parameter_1.txt")
    assert experiment.params == ("x", "y", "z")
    points = set().union(*(set(p) for p in experiment.data.values()))
    assert (20.0, 1.0, 100.0) in points and (60.0, 5.0, 500.0) in points
    assert len(points) == 125


def test_both_json_forms_and_json_lines_read_the_same_measurements() -> None:
    numbered = read_experiment(DATA / "json" / "input_1.JSON")
    named = read_experiment(DATA / "json" / "new" / "input1.json")
    assert numbered.params == named.params == ("x",)
    assert numbered.data == named.data
    assert named.data[("sweep", "time")][(4.0,)] == [3.5] * 5
    lines = read_experiment(DATA / "jsonlines" / "extended2.jsonl")
    assert lines.params == ("x", "y")
    assert lines.data[("test", "metr")][(3.0, 2.0)] == [11.0] * 5
    # Callpath and metric are optional in JSON Lines: Extra-P's defaults stand in.
    reduced = read_experiment(DATA / "jsonlines" / "reduced.jsonl")
    assert reduced.callpaths == ["<root>"] and reduced.metrics == ["<default>"]


def test_call_paths_measured_a_different_number_of_times_share_one_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """one_parameter_6.txt: met2 has 4 runs at its last point, met4 three everywhere. Extra-P's
    test_default_single_parameter_modeling asserts met1 constant 4.068, met2 and met4 p^2."""
    assert main([str(DATA / "text" / "one_parameter_6.txt")]) == 0
    out = capsys.readouterr().out
    assert "4 contexts" in out
    rows = {line.split()[1]: line for line in out.splitlines() if line[:3].strip().isdigit()}
    assert " 4.068 " in rows["met1"] + " "
    assert "* p^2 " in rows["met2"] and "* p^2 " in rows["met4"]


def test_exported_series_reads_back_as_the_same_models(tmp_path: Path) -> None:
    """pymodel --extrap writes Extra-P's JSON Lines; pymodel FILE on it models the same."""
    from tests.test_pymodel_cli import BEHAVIOUR, make_database

    databases = []
    for p in (2, 4, 8, 16, 32):
        for run in range(2):
            db = tmp_path / f"app-p{p}-{run}.d"
            values = {n: f(float(p)) * (1 + 0.01 * run) for n, f in BEHAVIOUR.items()}
            make_database(db, "app", values)
            databases.append(str(db))
    values = ",".join(str(p) for p in (2, 4, 8, 16, 32) for _ in range(2))
    exported, first, second = tmp_path / "x.jsonl", tmp_path / "a.json", tmp_path / "b.json"
    assert main([*databases, f"--param=p={values}", "--extrap", str(exported)]) == 0
    assert main([*databases, f"--param=p={values}", "--json", str(first), "--threshold", "0"]) == 0
    assert main([str(exported), "--json", str(second)]) == 0
    a = json.loads(first.read_text())["analyses"][0]
    b = json.loads(second.read_text())["analyses"][0]
    assert b["repetitions"] == a["repetitions"] == [2] * 5
    models_a = {c["labels"][-1]: c["model"] for c in a["contexts"]}
    models_b = {c["labels"][-1]: c["model"] for c in b["contexts"]}
    assert models_b == models_a
    assert "p^2" in models_b["solve"]


def test_json_output_describes_every_model_as_data(tmp_path: Path) -> None:
    """one_parameter_1.txt is x^2-like (Extra-P's tests assert its p^2 lead term)."""
    out = tmp_path / "m.json"
    assert main([str(DATA / "text" / "one_parameter_1.txt"), "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["format"] == "pymodel-models" and document["version"] == 2
    (analysis,) = document["analyses"]
    assert analysis["parameters"] == ["x"] and analysis["metric"] == "time"
    (context,) = analysis["contexts"]
    assert context["path"] == ["compute"]
    (term,) = context["terms"]
    assert term["factors"] == [{"param": "x", "poly": "2", "log": 0}]
    assert term["coefficient"] == pytest.approx(0.2, rel=0.01)
    assert context["lead_order"] == {"poly": "2", "log": 0}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "the file is empty"),
        ("PARAMETER x\nPOINTS 1 2 3\nREGION r\nDATA 1\nDATA 2\nDATA 3\nDATA 4\n", "more DATA"),
        ("PARAMETER x\nPOINTS 1 2 3\nBOGUS 1\n", "unknown field 'BOGUS'"),
        ("PARAMETER x\nPOINTS 0 2 3\nREGION r\nDATA 1\nDATA 2\nDATA 3\n", "must be positive"),
        ('{"params": {"x": 1}, "value": 2}\n{"params": {"y": 1}, "value": 2}\n', "differ"),
        ('{"parameters": ["x"]}', "missing 'measurements'"),
        ("PARAMETER x\nPOINTS 1 2 3\nREGION r\nDATA 1 a\n", "could not convert"),
    ],
)
def test_a_bad_experiment_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(content)
    with pytest.raises(ExtrapInputError, match=message):
        read_experiment(bad)
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and message in err


def test_parameter_options_are_refused_for_an_experiment_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([str(DATA / "text" / "one_parameter_1.txt"), "--param", "x=1,2,3"]) == 2
    assert "names its parameters" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("measure", "coefficient"), [("median", 10.0), ("minimum", 9.0), ("maximum", 13.0)]
)
def test_measures_model_the_median_minimum_or_maximum_of_the_repetitions(
    tmp_path: Path, measure: str, coefficient: float
) -> None:
    """Runs 9p, 10p, 10p, 13p at each p: the median is 10p, the minimum 9p, the maximum 13p
    (the mean, 10.5p, is none of them)."""
    lines = [
        json.dumps(
            {
                "params": {"p": p},
                "callpath": "k",
                "metric": "t",
                "value": [9 * p, 10 * p, 10 * p, 13 * p],
            }
        )
        for p in (2, 4, 8, 16, 32)
    ]
    source, out = tmp_path / "e.jsonl", tmp_path / "m.json"
    source.write_text("\n".join(lines) + "\n")
    assert main([str(source), "--measure", measure, "--json", str(out)]) == 0
    (analysis,) = json.loads(out.read_text())["analyses"]
    assert analysis["measure"] == measure
    (context,) = analysis["contexts"]
    assert context["terms"][0]["factors"] == [{"param": "p", "poly": "1", "log": 0}]
    assert context["terms"][0]["coefficient"] == pytest.approx(coefficient, rel=1e-9)
    assert context["constant"] == pytest.approx(0.0, abs=1e-6)


def test_a_missing_experiment_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.jsonl"
    assert main([str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"pymodel: error: {missing}: no such file"
