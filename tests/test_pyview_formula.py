"""pyview's formula language and the metric taxonomy (metrics/default.yaml)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.cli.pyview import main as pyview
from pyhpctk.formats import hpcrun
from pyhpctk.formats.hpcrun_model import MetricDescriptor
from pyhpctk.present import formula as fx
from pyhpctk.present import open_database
from pyhpctk.present.taxonomy import Input, load_yaml, parse_taxonomy


def ev(text: str, **columns: float) -> float:
    cols = {k: np.array([v]) for k, v in columns.items()}
    return float(fx.evaluate(fx.parse(text), cols.__getitem__, 1)[0])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("2 ^ 3 ^ 2", 512.0),  # right-associative
        ("-2 ^ 2", -4.0),  # ^ binds tighter than unary minus
        ("10 - 4 - 3", 3.0),  # left-associative
        ("12 / 3 / 2", 2.0),
        ("min(3, 1, 2) + max(4, 5)", 6.0),
        ("abs(-3) + sqrt(16)", 7.0),
        ("min(100, max(0, 100*250/200))", 100.0),
        ("1.5e2 + .5", 150.5),
    ],
)
def test_arithmetic_follows_precedence_and_associativity(text: str, expected: float) -> None:
    assert ev(text) == expected


def test_references_by_name_quoted_name_and_position() -> None:
    expr = fx.parse('gker / "GPUOP (sec)" + #3 - {a b} + GKER:COUNT')
    assert fx.references(expr) == ["gker", "GPUOP (sec)", "#3", "a b", "GKER:COUNT"]
    assert ev("a / b", a=3.0, b=4.0) == 0.75


def test_division_by_zero_gives_nan_not_an_exception() -> None:
    assert math.isnan(ev("a / b", a=1.0, b=0.0))
    assert math.isnan(ev("0 / 0"))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty formula"),
        ("1 +", "expected a number, a metric or '(', found end of formula"),
        ("(1 + 2", "expected ')'"),
        ("1 2", "expected an operator"),
        ("foo(1)", "unknown function 'foo'"),
        ("__import__(1)", "unknown function '__import__'"),
        ("os.system('x')", "unexpected character"),
        ("a ; b", "unexpected character ';'"),
        ("abs(1, 2)", "abs() takes 1 argument"),
        ('""', "empty metric name"),
    ],
)
def test_broken_formulas_raise_formula_error_naming_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(fx.FormulaError) as info:
        fx.parse(text)
    assert fragment in str(info.value)
    assert repr(text) in str(info.value)


def test_error_column_points_at_the_offending_token() -> None:
    with pytest.raises(fx.FormulaError) as info:
        fx.parse("a + * b")
    assert info.value.column == 4
    assert "column 5" in str(info.value)


def test_definition_needs_a_name_and_a_formula() -> None:
    name, expr = fx.parse_definition(" util = gker / gpuop ")
    assert name == "util"
    assert fx.references(expr) == ["gker", "gpuop"]
    for bad in ("gker / gpuop", "= a", "u = "):
        with pytest.raises(fx.FormulaError):
            fx.parse_definition(bad)


@st.composite
def expressions(draw: st.DrawFn, depth: int = 0) -> str:
    if depth > 3 or draw(st.booleans()):
        return draw(st.sampled_from(["a", "b", "2", "0.5", "3"]))
    kind = draw(st.sampled_from(["bin", "neg", "call", "paren"]))
    if kind == "bin":
        op = draw(st.sampled_from(["+", "-", "*", "/", "^"]))
        return f"{draw(expressions(depth + 1))} {op} {draw(expressions(depth + 1))}"
    if kind == "neg":
        return f"-{draw(expressions(depth + 1))}"
    if kind == "call":
        return f"max({draw(expressions(depth + 1))}, {draw(expressions(depth + 1))})"
    return f"({draw(expressions(depth + 1))})"


@given(expressions())
def test_printing_and_reparsing_gives_the_same_tree(text: str) -> None:
    tree = fx.parse(text)
    assert fx.parse(fx.to_text(tree)) == tree


# -- YAML subset and taxonomy --------------------------------------------------------------------
def test_yaml_subset_handles_anchors_aliases_flow_and_quotes() -> None:
    doc = load_yaml(
        "version: 0\n"
        "inputs:\n"
        "  - &X\n"
        "    metric: GKER:COUNT\n"
        "    scope: execution\n"
        '  - &Y {metric: "A (s)", scope: lex_aware}\n'
        "roots:\n"
        "  - name: R\n"
        '    description: "quoted: text"\n'
        "    variants:\n"
        "      Sum:\n"
        "        render: [number, percent]\n"
        '        formula: {"*": [2, *X, {/: [*Y, 4.5]}]}\n'
    )
    assert doc["version"] == 0
    x, y = doc["inputs"]
    assert x == {"metric": "GKER:COUNT", "scope": "execution"}
    assert y == {"metric": "A (s)", "scope": "lex_aware"}
    root = doc["roots"][0]
    assert root["description"] == "quoted: text"
    assert root["variants"]["Sum"]["render"] == ["number", "percent"]
    assert root["variants"]["Sum"]["formula"] == {"*": [2, x, {"/": [y, 4.5]}]}


def test_taxonomy_formula_of_a_derived_metric_evaluates_by_the_book() -> None:
    text = (
        "inputs:\n"
        "  - &T\n    metric: TOT\n    scope: execution\n    formula: $$\n    combine: sum\n"
        "  - &E\n    metric: EXP\n    scope: execution\n    formula: $$\n    combine: sum\n"
        "roots:\n"
        "  - name: UTIL\n"
        "    variants:\n"
        '      "":\n'
        "        formula:\n"
        '          inclusive: {min: [100, {max: [0, {/: [{"*": [100, *T]}, *E]}]}]}\n'
    )
    (metric,) = parse_taxonomy(text)
    assert metric.name == "UTIL"
    assert metric.exclusive is None
    assert sorted(metric.inputs.values(), key=lambda i: i.metric) == [
        Input("EXP", "execution"),
        Input("TOT", "execution"),
    ]
    refs = {inp.metric: ref for ref, inp in metric.inputs.items()}
    assert metric.inclusive is not None
    columns = {refs["TOT"]: np.array([30.0, 300.0, 5.0]), refs["EXP"]: np.array([60.0, 100.0, 0.0])}
    got = fx.evaluate(metric.inclusive, columns.__getitem__, 3)
    assert got[0] == 50.0 and got[1] == 100.0 and math.isnan(got[2])


def test_every_reference_taxonomy_parses_and_names_gsamp_util(reference: Path) -> None:
    for path in sorted((reference / "dbase").glob("*.d/metrics/default.yaml")):
        metrics = parse_taxonomy(path.read_text(), str(path))
        assert metrics, path
        for m in metrics:
            assert m.inclusive is not None or m.exclusive is not None, (path, m.name)
        names = {m.name for m in metrics}
        if "nvidiapc" in str(path):
            util = next(m for m in metrics if m.name == "GSAMP:UTIL")
            assert {i.metric for i in util.inputs.values()} == {"GSAMP:TOT", "GSAMP:EXP"}
            assert util.format == "%6.2f %%"
        elif "cuda" in str(path):
            assert {"GPUOP (sec)", "GKER (sec)"} <= names
            stmem = next(m for m in metrics if m.name == "GKER:STMEM (B)")
            assert stmem.inclusive is None and not stmem.percent  # exclusive only, no percent
        else:
            assert names == {"CPUTIME (sec)"}


# -- formulas too deep for a recursive parser (issue #15 item 10) --------------------------------
DEEP = {
    "parentheses": "(" * 5000 + "a" + ")" * 5000,
    "calls": "min(" * 5000 + "a" + ")" * 5000,
    "signs": "-" * 5000 + "a",
    "powers": "a^" * 5000 + "a",
    "chain": "+".join(["a"] * 5000),
}


@pytest.mark.parametrize("text", DEEP.values(), ids=DEEP.keys())
def test_formulas_nested_past_the_limit_are_refused(text: str) -> None:
    with pytest.raises(fx.FormulaError) as caught:
        fx.parse(text)
    message = str(caught.value)
    assert "levels deep" in message or "operations deep" in message
    assert len(message) < 200  # the formula is not repeated in full


def test_deep_derive_is_one_line_on_the_command_line(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = str(reference / "dbase" / "small.d")
    assert pyview([small, "--derive", "x = " + DEEP["parentheses"]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyview: error: formula ") and err.count("\n") == 1
    assert "nested more than 64 levels deep at column 65" in err


@pytest.mark.parametrize("formula", ["(" * 5000 + "#0" + ")" * 5000, "#0 +", "-" * 5000 + "#0"])
def test_pyprof_refuses_a_measurement_formula_it_cannot_parse(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], formula: str
) -> None:
    """A derived metric in a .hpcrun metric table: one line, no database (was a traceback)."""
    measurement = tmp_path / "m"
    measurement.mkdir()
    source = next((reference / "meas" / "small.m").glob("*.hpcrun"))
    profile = hpcrun.read(source)
    profile.metrics.append(MetricDescriptor("DER", formula=formula))
    hpcrun.write(profile, measurement / source.name)
    assert pyprof(["-o", str(tmp_path / "db"), str(measurement), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyprof: error: derived metric 'DER': formula ")
    assert err.count("\n") == 1 and len(err) < 300
    assert not (tmp_path / "db").exists()


def test_formulas_up_to_the_limits_are_evaluated_and_deeper_chains_refused(
    reference: Path,
) -> None:
    nested = "(" * (fx.MAX_NESTING - 1) + "a" + ")" * (fx.MAX_NESTING - 1)
    assert ev(nested, a=2.0) == 2.0
    assert ev("+".join(["a"] * (fx.MAX_DEPTH + 1)), a=1.0) == fx.MAX_DEPTH + 1
    # Derived metrics built on each other: bounded written out, too.
    db = open_database(reference / "dbase" / "small.d")
    chain = "+".join(["cputime"] * fx.MAX_DEPTH)
    db.derive(f"d0 = {chain}")
    db.derive(f"d1 = d0 + {chain}")  # 2 * MAX_DEPTH - 1 deep written out: still allowed
    assert db.catalog.column("d1", inclusive=True)[0] == pytest.approx(
        2 * fx.MAX_DEPTH * 1.210259, rel=1e-6
    )
    with pytest.raises(fx.FormulaError, match="written out, more than 512 operations deep"):
        db.derive(f"d2 = d1 + {chain}")
