"""Sparse and small measurement designs: crosses, bands, 3-value lines, designs that cannot
identify a parameter. The truths are the generating functions (noise-free), and Extra-P 4.2.5's
own test inputs where its tests state them (tests/data/extrap/README.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pymodel import main
from pyhpctk.model.fit import FitOptions
from pyhpctk.model.multi import design_notes, fit_multi_parameter

DATA = Path(__file__).parent / "data" / "extrap"


def _cross(values: tuple[float, ...], n_params: int) -> np.ndarray:
    """One line per parameter through the smallest point (the others at their smallest)."""
    base = [values[0]] * n_params
    rows = {tuple(base)}
    for param in range(n_params):
        for v in values:
            row = list(base)
            row[param] = v
            rows.add(tuple(row))
    return np.array(sorted(rows))


@pytest.mark.parametrize(
    ("n_params", "function", "expected"),
    [
        (2, lambda x: 3 + 2 * x[:, 0] ** 3 + 5 * x[:, 1], "3 + 2 * p0^3 + 5 * p1"),
        (
            2,
            lambda x: 1 + 0.5 * x[:, 0] * np.log2(x[:, 0]) * x[:, 1],
            "1 + 0.5 * p0 * log2(p0) * p1",
        ),
        (
            3,
            lambda x: 2 + x[:, 0] + 4 * x[:, 1] ** 0.5 + x[:, 2] ** 2,
            "2 + 1 * p0 + 4 * p1^(1/2) + 1 * p2^2",
        ),
    ],
)
def test_a_cross_of_three_value_lines_identifies_every_term(n_params, function, expected) -> None:  # type: ignore[no-untyped-def]
    """Three values per parameter along one line each: enough for Extra-P's point selection,
    which models such designs; pymodel skipped lines under 4 values and picked arbitrary
    factors. (Three values tell a factor only by the ratio of its two rises: at 2, 4, 8 that
    of p^2 and p*log2(p)^2 is 4 for both, so these functions avoid such twins.)"""
    points = (
        _cross((2.0, 4.0, 8.0), n_params) if n_params == 2 else _cross((2.0, 4.0, 8.0, 16.0), 3)
    )
    names = tuple(f"p{i}" for i in range(n_params))
    y = function(points)
    result = fit_multi_parameter(points, y, names, FitOptions(weighting="absolute"))
    assert result.models[0].render(4) == expected


def test_extras_3x3_grid_of_x2_plus_y_is_recovered(capsys: pytest.CaptureFixture[str]) -> None:
    """extended2.jsonl is exactly x^2 + y + 1 on a 3x3 grid; Extra-P finds x^2 + y."""
    assert main([str(DATA / "jsonlines" / "extended2.jsonl")]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("  1 "))
    assert "1 * x^2 + 1 * y" in row


def test_a_design_that_cannot_identify_a_parameter_says_so_and_leaves_it_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """json/new/input2.json moves x and y together (4,10), (8,20), ...: no factor of either
    can be told apart from the other's; Extra-P gives the constants 13.9 and 5."""
    assert main([str(DATA / "json" / "new" / "input2.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("parameter 'x': no 3 measurements differ in x alone") == 2
    rows = [r for r in out.splitlines() if r[:3].strip().isdigit()]
    assert len(rows) == 4
    for row in rows:
        assert "*" not in row.split("  ")[-5], row  # a constant model: no term
    assert sum(" 13.9 " in r for r in rows) == 2 and sum(" 5 " in r for r in rows) == 2


def test_design_notes_name_what_each_parameter_rests_on() -> None:
    full = np.array([(x, y) for x in (1, 2, 4, 8, 16) for y in (1, 2, 4, 8, 16)], dtype=float)
    assert design_notes(full, ("x", "y")) == []
    band = np.array(
        [(x, 1.0) for x in (1, 2, 4, 8, 16)] + [(3.0, y) for y in (2, 4, 8, 16)], dtype=float
    )
    assert design_notes(band, ("x", "y")) == [
        "parameter 'y': its term rests on lines of fewer than 5 values of y with the others "
        "fixed: less reliable"
    ]
