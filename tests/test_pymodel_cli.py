"""pymodel end to end: a series of databases in, a ranked table / JSON / Extra-P export out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pymodel import main
from pyhpctk.formats import metadb, profiledb

# Three functions under main with known scaling: worst is the quadratic one.
BEHAVIOUR = {
    "solve": lambda p: 50.0 + 0.5 * p**2,
    "exchange": lambda p: 20.0 + 3.0 * p * np.log2(p),
    "setup": lambda p: 40.0 + 0.0 * p,
}


def make_database(
    path: Path, title: str, values: dict[str, float], extra: dict[str, float] | None = None
) -> None:
    """A database whose summary profile holds ``values`` (inclusive) per function context."""
    names = list(values) + list(extra or {})
    functions = [metadb.Function(name) for name in names]
    contexts = [
        metadb.Context(ctx_id=2 + i, relation=metadb.Relation.CALL, function=i)
        for i in range(len(names))
    ]
    meta = metadb.MetaDB(
        title=title,
        metrics=[metadb.Metric.standard("time (sec)", 0)],
        functions=functions,
        entry_points=[metadb.Entry(1, children=contexts)],
    )
    everything = {**values, **(extra or {})}
    total = sum(everything.values())
    ctx = [0, 1] + [c.ctx_id for c in contexts]
    vals = [total, total] + [everything[n] for n in names]
    summary = profiledb.ProfileValues.from_triples(ctx, [3] * len(ctx), vals)
    thread = profiledb.ProfileValues.from_triples(ctx, [3] * len(ctx), vals)
    profiles = profiledb.ProfileDB(
        [
            profiledb.ProfileInfo(is_summary=True, id_tuple=None),
            profiledb.ProfileInfo(id_tuple=(profiledb.IdTupleElement(3, False, 0, 0),)),
        ],
        [summary, thread],
    )
    path.mkdir(parents=True)
    metadb.write(meta, path / "meta.db")
    profiledb.write(profiles, path / "profile.db")


@pytest.fixture
def series(tmp_path: Path) -> list[Path]:
    out = []
    for p in (2, 4, 8, 16, 32):
        db = tmp_path / f"app-p{p}.d"
        make_database(db, "app", {name: f(float(p)) for name, f in BEHAVIOUR.items()})
        out.append(db)
    return out


def test_ranked_table_puts_the_worst_scaling_context_first(
    series: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*map(str, series), "--param", "p=2,4,8,16,32"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line[:3].strip().isdigit()]
    order = [
        next(n for n in ("solve", "exchange", "setup", "whole", "main thread") if n in r)
        for r in rows
    ]
    # The whole program is dominated by solve's p^2 too; setup is constant and comes last.
    assert order[-1] == "setup"
    assert order.index("solve") < order.index("exchange")
    solve_row = next(r for r in rows if "solve" in r)
    assert "p^2" in solve_row


def test_a_context_its_model_does_not_fit_ranks_after_the_ones_that_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A context seen at one scale only (a few samples in a native frame: zero elsewhere) gets
    a steep model that misses its own points; it must not top the table above solve's p^2."""
    databases = []
    for p in (2, 4, 8, 16, 32):
        db = tmp_path / f"app-p{p}.d"
        values = {name: f(float(p)) for name, f in BEHAVIOUR.items()}
        values["glitch"] = 3.0 if p == 32 else 0.0
        make_database(db, "app", values)
        databases.append(db)
    out = tmp_path / "models.json"
    assert main([*map(str, databases), "--param", "p=2,4,8,16,32", "--json", str(out)]) == 0
    contexts = json.loads(out.read_text())["analyses"][0]["contexts"]
    labels = [" ".join(c["labels"]) for c in contexts]
    glitch = next(i for i, text in enumerate(labels) if "glitch" in text)
    solve = next(i for i, text in enumerate(labels) if "solve" in text)
    assert contexts[glitch]["smape"] > 50.0, contexts[glitch]
    assert solve < glitch, labels


def test_json_holds_exact_models_and_expectation_verdicts(
    series: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "models.json"
    assert (
        main(
            [
                *map(str, series),
                "--param",
                "p=2,4,8,16,32",
                "--expect",
                "p*log2(p)",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    document = json.loads(out.read_text())["analyses"][0]
    by_name = {c["path"][-1].split("] ")[-1]: c for c in document["contexts"]}
    solve = by_name["solve"]
    assert solve["terms"][0]["factors"] == [{"param": "p", "poly": "2", "log": 0}]
    assert solve["constant"] == pytest.approx(50.0, rel=1e-6)
    assert solve["terms"][0]["coefficient"] == pytest.approx(0.5, rel=1e-6)
    assert solve["expectation"] == "no match"
    assert by_name["exchange"]["expectation"] == "match"
    assert by_name["setup"]["terms"] == []
    assert document["target"] == [256.0]


def test_extrap_export_has_every_measurement(series: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "data.jsonl"
    assert main([*map(str, series), "--param", "p=2,4,8,16,32", "--extrap", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    solve = [r for r in records if r["callpath"].endswith("solve")]
    assert sorted(r["params"]["p"] for r in solve) == [2, 4, 8, 16, 32]
    assert all(r["metric"] == "time (sec)" for r in records)
    by_p = {r["params"]["p"]: r["value"] for r in solve}
    assert by_p[16] == [pytest.approx(50.0 + 0.5 * 256)]
    assert all("->" in r["callpath"] for r in solve)


def test_repetitions_are_averaged_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dbs, ps = [], []
    for p in (2, 4, 8, 16, 32):
        for rep, factor in enumerate((0.98, 1.02)):
            db = tmp_path / f"r{p}-{rep}.d"
            make_database(db, "app", {n: f(float(p)) * factor for n, f in BEHAVIOUR.items()})
            dbs.append(str(db))
            ps.append(str(p))
    out = tmp_path / "m.json"
    assert main([*dbs, "--param", "p=" + ",".join(ps), "--json", str(out)]) == 0
    document = json.loads(out.read_text())["analyses"][0]
    assert document["repetitions"] == [2, 2, 2, 2, 2]
    solve = next(c for c in document["contexts"] if c["path"][-1].endswith("solve"))
    assert solve["constant"] == pytest.approx(50.0, rel=1e-6)


def test_missing_contexts_count_as_zero_and_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dbs = []
    for p in (2, 4, 8, 16, 32):
        db = tmp_path / f"m{p}.d"
        extra = {"late": float(p) ** 3} if p >= 8 else None
        make_database(db, "app", {n: f(float(p)) for n, f in BEHAVIOUR.items()}, extra)
        dbs.append(str(db))
    assert main([*dbs, "--param", "p=2,4,8,16,32"]) == 0
    out = capsys.readouterr().out
    assert "missing from some databases: counted as zero" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--param", "p=2,4"], "has 2 values for 5 databases"),
        (["--param", "p=2,2,4,4,4"], "at least 3 are needed"),
        (["--param", "p=2,4,x,16,32"], "values must be numbers"),
        (["--param", "p=2,4,8,16,32", "-m", "nosuch"], "no metric named 'nosuch'"),
        (["--param", "p=2,4,8,16,32", "--expect", "q^2"], "unknown parameter"),
        ([], "say which parameter values"),
    ],
)
def test_bad_input_is_one_clear_line(
    series: list[Path], args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*map(str, series), *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_databases_of_different_programs_are_refused(
    series: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.d"
    make_database(other, "another-program", {"solve": 1.0})
    args = [*map(str, series[:4]), str(other), "--param", "p=2,4,8,16,32"]
    assert main(args) == 2
    assert "different programs" in capsys.readouterr().err


def test_not_a_database_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(tmp_path / f"x{i}") for i in range(5)] + ["--param", "p=2,4,8,16,32"]
    assert main(args) == 2
    assert "not a database" in capsys.readouterr().err


def test_the_library_runs_what_the_command_runs(
    series: list[Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """pymodel's analysis lives in the library: one options object, the same table and JSON."""
    import io

    from pyhpctk.model.driver import ModelOptions, run

    assert main([*map(str, series), "--param", "p=2,4,8,16,32", "--json", str(tmp_path / "a")]) == 0
    table = capsys.readouterr().out
    options = ModelOptions(tuple(series), params=("p=2,4,8,16,32",), json_out=tmp_path / "b.json")
    out = io.StringIO()
    assert run(options, out) == 0
    assert out.getvalue() == table
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads((tmp_path / "a").read_text())


def test_six_scales_under_the_default_weighting_model_and_report_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six or more scales turn on segment detection; under ``--weighting auto`` (the default)
    it crashed (``weighting auto is resolved per context before fitting``). A context that is
    quadratic up to p=16 and flat after it must come out as a piecewise model."""
    scales = (2, 4, 8, 16, 32, 64, 128)
    databases = []
    for p in scales:
        db = tmp_path / f"app-p{p}.d"
        values = {name: f(float(p)) for name, f in BEHAVIOUR.items()}
        values["saturate"] = 100.0 * min(p, 16) ** 2
        make_database(db, "app", values)
        databases.append(db)
    arguments = [*map(str, databases), "--param", "p=" + ",".join(map(str, scales))]
    assert main(arguments) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line[:3].strip().isdigit()]
    solve = next(r for r in rows if "solve" in r)
    assert "p^2" in solve and "from p=" not in solve
    saturate = next(r for r in rows if "saturate" in r)
    assert "100 * p^2 for p<32; 2.56e+04 from p=32" in saturate, saturate
