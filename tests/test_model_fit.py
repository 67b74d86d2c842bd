"""pymodel's modelers on synthetic series from known PMNF functions (issue: accuracy bars)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from pyhpctk.model.fit import FitOptions, detect_segments, fit_multi_parameter, fit_single_parameter
from pyhpctk.model.pmnf import (
    Factor,
    Hypothesis,
    Model,
    Term,
    compare_growth,
    parse_expectation,
    single,
)
from pyhpctk.model.synthetic import Case, make_case, random_model


def _cases(seed: int, params: tuple[str, ...], n_terms: int, noise: float, n: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    return [make_case(rng, random_model(rng, params, n_terms), noise) for _ in range(n)]


def _fit(cases: list[Case], options: FitOptions) -> list[Model]:
    y = np.stack([c.mean for c in cases], axis=1)
    points = cases[0].points
    if points.shape[1] == 1:
        return fit_single_parameter(points[:, 0], y, options).models
    return fit_multi_parameter(points, y, cases[0].truth.params, options).models


def _lead_per_parameter(model: Model) -> dict[int, tuple[Fraction, int]]:
    """The highest-order factor of each parameter: the lead-order behaviour in that parameter."""
    out: dict[int, tuple[Fraction, int]] = {}
    for term in model.hypothesis.terms:
        for factor in term.factors:
            out[factor.param] = max(out.get(factor.param, (Fraction(0), 0)), factor.growth())
    return out


def _same_coefficients(found: Model, truth: Model) -> bool:
    # Terms are sorted identically in both hypotheses, so coefficients line up.
    return bool(np.allclose(found.coefficients, truth.coefficients, rtol=5e-7, atol=0.0))


@pytest.mark.parametrize("n_terms", [1, 2])
def test_noise_free_single_parameter_recovers_terms_exponents_and_coefficients(
    n_terms: int,
) -> None:
    cases = _cases(11 + n_terms, ("p",), n_terms, 0.0, 150)
    models = _fit(cases, FitOptions(max_terms=n_terms))
    for found, case in zip(models, cases, strict=True):
        assert found.hypothesis == case.truth.hypothesis, (found.render(), case.truth.render())
        assert _same_coefficients(found, case.truth), (found.render(), case.truth.render())


def test_noise_free_two_parameters_recovers_terms_exponents_and_coefficients() -> None:
    cases = _cases(21, ("p", "n"), 1, 0.0, 120)
    models = _fit(cases, FitOptions())
    for found, case in zip(models, cases, strict=True):
        assert found.hypothesis == case.truth.hypothesis, (found.render(), case.truth.render())
        assert _same_coefficients(found, case.truth), (found.render(), case.truth.render())


def _lead_rates(cases: list[Case], models: list[Model]) -> tuple[float, float]:
    exact = close = 0
    for found, case in zip(models, cases, strict=True):
        got, want = _lead_per_parameter(found), _lead_per_parameter(case.truth)
        if got == want:
            exact += 1
            close += 1
        elif set(got) == set(want) and all(
            compare_growth(Term((Factor(p, *got[p]),)), Term((Factor(p, *want[p]),))) != "no match"
            for p in want
        ):
            close += 1
    return exact / len(cases), close / len(cases)


# The bars below are the figures measured and reported in docs/pymodel.md; each test fails when
# accuracy drops below them.
@pytest.mark.parametrize(
    ("params", "noise", "exact_bar", "close_bar"),
    [
        (("p",), 0.01, 0.90, 0.97),
        (("p",), 0.05, 0.55, 0.84),
        (("p", "n"), 0.01, 0.82, 0.93),
        (("p", "n"), 0.05, 0.42, 0.74),
    ],
)
def test_lead_order_term_under_noise(
    params: tuple[str, ...], noise: float, exact_bar: float, close_bar: float
) -> None:
    cases = _cases(31, params, 1, noise, 200)
    exact, close = _lead_rates(cases, _fit(cases, FitOptions()))
    assert exact >= exact_bar, f"lead-order term exactly right in {exact:.0%} of cases"
    assert close >= close_bar, f"lead-order term right or adjacent in {close:.0%} of cases"


def test_constant_data_gives_the_constant_model() -> None:
    p = np.array([2.0, 4, 8, 16, 32])
    y = np.full((5, 1), 7.5)
    model = fit_single_parameter(p, y).models[0]
    assert model.hypothesis == Hypothesis(())
    assert model.coefficients == pytest.approx((7.5,))


def test_pure_noise_around_a_constant_falls_back_to_the_constant_model() -> None:
    rng = np.random.default_rng(5)
    p = np.array([2.0, 4, 8, 16, 32])
    y = 100.0 * (1 + rng.uniform(-0.01, 0.01, size=(5, 50)))
    models = fit_single_parameter(p, y).models
    constant = sum(m.hypothesis == Hypothesis(()) for m in models)
    assert constant >= 45


def test_refinement_finds_an_exponent_outside_the_search_space() -> None:
    p = np.array([4.0, 8, 16, 32, 64, 128])
    truth = 3.0 + 2.0 * p**0.6  # 3/5 is not in the default search space
    plain = fit_single_parameter(p, truth[:, None]).models[0]
    refined = fit_single_parameter(p, truth[:, None], FitOptions(refine=True)).models[0]
    assert plain.hypothesis.terms[0].factors[0].poly != Fraction(3, 5)
    assert refined.hypothesis == Hypothesis((single(0, Fraction(3, 5), 0),))
    assert refined.coefficients == pytest.approx((3.0, 2.0), rel=1e-6)


def test_segmented_behaviour_is_detected_at_the_change() -> None:
    p = np.array([2.0, 4, 8, 16, 32, 64, 128, 256])
    linear_then_quadratic = np.where(p <= 16, 10 * p, 10 * p**2 / 16)
    smooth = 5 + 3 * p * np.log2(p)
    found = detect_segments(p, np.stack([linear_then_quadratic, smooth], axis=1))
    assert found[0] is not None and found[0].split == 4
    assert found[0].before.lead_term() == single(0, 1, 0)
    assert found[0].after.lead_term() == single(0, 2, 0)
    assert found[1] is None


def test_expectations_parse_and_compare() -> None:
    params = ("p", "n")
    assert parse_expectation("p*log2(p)", params) == Term((Factor(0, Fraction(1), 1),))
    assert parse_expectation("p^(3/2) * n", params) == Term(
        (Factor(0, Fraction(3, 2), 0), Factor(1, Fraction(1), 0))
    )
    assert parse_expectation("log2(n)^2", params) == Term((Factor(1, Fraction(0), 2),))
    assert parse_expectation("1", params) is None
    with pytest.raises(ValueError, match="unknown parameter"):
        parse_expectation("q^2", params)
    with pytest.raises(ValueError):
        parse_expectation("p +", params)
    lead = single(0, Fraction(5, 4), 1)
    assert compare_growth(lead, parse_expectation("p^(5/4)*log2(p)", params)) == "match"
    assert compare_growth(lead, parse_expectation("p*log2(p)", params)) == "approximate"
    assert compare_growth(lead, parse_expectation("p^2", params)) == "no match"


def test_too_few_points_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 3 points"):
        fit_single_parameter([2.0, 4.0], np.ones((2, 1)))
