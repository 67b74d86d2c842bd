"""pymodel's modelers on synthetic series from known PMNF functions (issue: accuracy bars).

The issue's generator (``pyhpctk.model.synthetic`` defaults): five points per parameter, p = 2 ..
32, five repetitions, uniform multiplicative noise, each term 1 to 100 times the constant at the
smallest configuration; docs/pymodel.md says why, and what the older, harder generator gives.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from pyhpctk.model.fdist import f_critical as _f_critical
from pyhpctk.model.fit import (
    FitOptions,
    Repetitions,
    auto_weightings,
    fit_single_parameter,
)
from pyhpctk.model.multi import fit_multi_parameter
from pyhpctk.model.pmnf import (
    Factor,
    Hypothesis,
    Model,
    Term,
    compare_growth,
    parse_expectation,
    single,
)
from pyhpctk.model.segments import detect_segments
from pyhpctk.model.synthetic import DEFAULT_VALUES, Case, make_case, random_model

# The generator before this one (docs/pymodel.md): points 4 .. 64, each term 1 to 100 times the
# constant at the largest configuration, so steep terms hide under the constant at most points.
OLD_VALUES = (4.0, 8.0, 16.0, 32.0, 64.0)


def _cases(
    seed: int,
    params: tuple[str, ...],
    n_terms: int,
    noise: float,
    n: int,
    values: tuple[float, ...] = DEFAULT_VALUES,
    anchor: str = "smallest",
) -> list[Case]:
    rng = np.random.default_rng(seed)
    return [
        make_case(rng, random_model(rng, params, n_terms, values, anchor), noise, values=values)
        for _ in range(n)
    ]


def _fit(cases: list[Case], options: FitOptions) -> list[Model]:
    """Model the cases as pymodel models a series: means, with the repetitions behind them."""
    y = np.stack([c.mean for c in cases], axis=1)
    points = cases[0].points
    runs = Repetitions(
        np.full(len(points), cases[0].repetitions.shape[1], dtype=np.int64),
        np.stack([c.spread for c in cases], axis=1),
    )
    if points.shape[1] == 1:
        return fit_single_parameter(points[:, 0], y, options, repetitions=runs).models
    return fit_multi_parameter(points, y, cases[0].truth.params, options, runs).models


def _lead_per_parameter(model: Model) -> dict[int, tuple[Fraction, int]]:
    """The highest-order factor of each parameter: the lead-order behaviour in that parameter."""
    out: dict[int, tuple[Fraction, int]] = {}
    for term in model.hypothesis.terms:
        for factor in term.factors:
            out[factor.param] = max(out.get(factor.param, (Fraction(0), 0)), factor.growth())
    return out


_FIVE_VALUES = (2.0, 4.0, 8.0, 16.0, 32.0)


def _two_term_blocks(seed: int, count: int) -> list[Case]:
    """Seeded two-term functions of Extra-P's building blocks at 5 values and 5 % noise."""
    from pyhpctk.model.synthetic import EXTRAP_TERMS

    rng = np.random.default_rng(seed)
    return [
        make_case(
            rng,
            random_model(rng, ("p",), 2, _FIVE_VALUES, terms=EXTRAP_TERMS),
            0.05,
            values=_FIVE_VALUES,
        )
        for _ in range(count)
    ]


def _lead_rate(cases: list[Case], options: FitOptions) -> float:
    """The share of cases whose model has the generating lead factor of every parameter."""
    found = _fit(cases, options)
    return float(
        np.mean(
            [
                _lead_per_parameter(f) == _lead_per_parameter(c.truth)
                for f, c in zip(found, cases, strict=True)
            ]
        )
    )


def _same_coefficients(found: Model, truth: Model) -> bool:
    # Terms are sorted identically in both hypotheses, so coefficients line up.
    return bool(np.allclose(found.coefficients, truth.coefficients, rtol=5e-7, atol=0.0))


# These tests draw their functions from every pair of the default exponents (synthetic's
# random_factor without ``terms``), 15 of which Extra-P's building blocks leave out (p^3 *
# log2(p)^2, ...): they search that grid, the default.
GRID = "grid"

GENERATORS = [
    pytest.param(DEFAULT_VALUES, "smallest", id="issue-generator"),
    pytest.param(OLD_VALUES, "largest", id="old-generator"),
]


@pytest.mark.parametrize(("values", "anchor"), GENERATORS)
@pytest.mark.parametrize("selection", ["f-test", "cv-smape"])
@pytest.mark.parametrize("n_terms", [1, 2])
def test_noise_free_single_parameter_recovers_terms_exponents_and_coefficients(
    n_terms: int, selection: str, values: tuple[float, ...], anchor: str
) -> None:
    cases = _cases(11 + n_terms, ("p",), n_terms, 0.0, 300 // n_terms, values, anchor)
    models = _fit(cases, FitOptions(max_terms=n_terms, selection=selection, space=GRID))
    for found, case in zip(models, cases, strict=True):
        assert found.hypothesis == case.truth.hypothesis, (found.render(), case.truth.render())
        assert _same_coefficients(found, case.truth), (found.render(), case.truth.render())


@pytest.mark.parametrize(("values", "anchor"), GENERATORS)
def test_noise_free_two_parameters_recovers_terms_exponents_and_coefficients(
    values: tuple[float, ...], anchor: str
) -> None:
    cases = _cases(21, ("p", "n"), 1, 0.0, 150, values, anchor)
    models = _fit(cases, FitOptions(space=GRID))
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


ISSUE_BAR = 0.90  # "with 5% noise the lead-order term is right in at least 90% of cases"


# The bars below sit just under the figures measured and reported in docs/pymodel.md, so each
# test fails when accuracy drops; at 5 % noise on the issue's generator the issue's own bar must
# hold too. 1000 functions of one parameter and 600 of two: at 200 a rate near 92 % has a
# standard error of 2 points, too coarse to tell a pass from a fail.
@pytest.mark.parametrize(
    ("params", "noise", "n", "exact_bar", "close_bar"),
    [
        (("p",), 0.01, 1000, 0.99, 0.99),
        (("p",), 0.05, 1000, 0.95, 0.985),
        (("p", "n"), 0.01, 600, 0.98, 0.985),
        (("p", "n"), 0.05, 600, 0.905, 0.955),
    ],
)
def test_lead_order_term_under_noise(
    params: tuple[str, ...], noise: float, n: int, exact_bar: float, close_bar: float
) -> None:
    cases = _cases(31, params, 1, noise, n)
    exact, close = _lead_rates(cases, _fit(cases, FitOptions(space=GRID)))
    assert exact >= exact_bar, f"lead-order term exactly right in {exact:.1%} of cases"
    assert close >= close_bar, f"lead-order term right or adjacent in {close:.1%} of cases"
    if noise == 0.05:
        assert exact >= ISSUE_BAR, f"the issue's bar: {exact:.1%} < {ISSUE_BAR:.0%}"


# The old generator, where a steep term is under the noise at all but the last points: no choice
# by goodness of fit reaches the issue's bar there (docs/pymodel.md), but what was reached must
# not be lost. Its functions come from the whole grid, where 15 of 56 terms are outside Extra-P's
# building blocks; since those are a tenth as likely a priori (FitOptions.outside_prior) the
# rates fell (bars before: 0.92/0.98, 0.58/0.84, 0.87/0.98, 0.53/0.83) to 91.2/98.x %,
# 54.2/83.0 %, 85.0/96.0 % and 50.0/77.0 % (issue #35: the price of +1.2 to +1.7 points on
# functions of building blocks, docs/pymodel.md).
@pytest.mark.parametrize(
    ("params", "noise", "exact_bar", "close_bar"),
    [
        (("p",), 0.01, 0.91, 0.98),
        (("p",), 0.05, 0.54, 0.82),
        (("p", "n"), 0.01, 0.85, 0.95),
        (("p", "n"), 0.05, 0.50, 0.76),
    ],
)
def test_lead_order_term_under_noise_on_the_old_generator(
    params: tuple[str, ...], noise: float, exact_bar: float, close_bar: float
) -> None:
    cases = _cases(31, params, 1, noise, 200 if len(params) == 2 else 400, OLD_VALUES, "largest")
    exact, close = _lead_rates(cases, _fit(cases, FitOptions(space=GRID)))
    assert exact >= exact_bar, f"lead-order term exactly right in {exact:.1%} of cases"
    assert close >= close_bar, f"lead-order term right or adjacent in {close:.1%} of cases"


def test_the_f_test_quantiles_match_the_tables() -> None:
    # F distribution upper quantiles, as printed in every statistics table.
    assert _f_critical(1, 3, 0.05) == pytest.approx(10.128, abs=1e-3)
    assert _f_critical(1, 20, 0.01) == pytest.approx(8.096, abs=1e-3)
    assert _f_critical(2, 23, 0.05) == pytest.approx(3.422, abs=1e-3)
    assert _f_critical(3, 5, 0.01) == pytest.approx(12.06, abs=1e-2)


def test_repetitions_weight_points_by_their_run_counts() -> None:
    # Fitting means weighted by run counts is fitting every run: the same coefficients.
    rng = np.random.default_rng(3)
    p = np.array([2.0, 4, 8, 16, 32])
    runs = [
        5.0 + 2.0 * v * (1 + rng.uniform(-0.05, 0.05, size=(k, 1)))
        for v, k in zip(p, (1, 4, 2, 7, 3), strict=True)
    ]
    every_run = np.repeat(p, [len(r) for r in runs])
    options = FitOptions(weighting="absolute")
    whole = fit_single_parameter(every_run, np.concatenate(runs), options).models[0]
    means = np.stack([r.mean(axis=0) for r in runs])
    averaged = fit_single_parameter(p, means, options, repetitions=Repetitions.of(runs))
    assert averaged.models[0].hypothesis == whole.hypothesis
    assert averaged.models[0].coefficients == pytest.approx(whole.coefficients, rel=1e-9)


def test_the_best_of_many_hypotheses_must_beat_noise_for_all_of_them() -> None:
    # A sampled context from a real series (tests/test_pymodel_series.py), two runs per scale:
    # noise, but of 56 one-term hypotheses p^3 * log2(p)^2 fits it well enough to pass a single
    # F-test at 5 %; against all 56 at once (Bonferroni) it does not.
    p = np.array([2.0, 4, 8, 16, 32])
    means = np.array([[0.0002], [0.0008], [0.0003], [0.0004], [0.0012]])
    spread = np.array([[0.0002], [0.0002], [0.0], [0.0001], [0.0001]])
    runs = Repetitions(np.full(5, 2, dtype=np.int64), spread)
    model = fit_single_parameter(p, means, FitOptions(weighting="absolute"), repetitions=runs)
    assert model.models[0].hypothesis == Hypothesis(())


def test_runs_that_agree_better_than_the_means_do_not_earn_terms() -> None:
    # Five runs per scale agree to 0.3 %, but the means wander by 3 % from scale to scale
    # (what back-to-back runs on one loaded machine look like): the pure error would call that
    # wandering significant, so where no model fits the means to within it, the means' own
    # residual is the yardstick.
    rng = np.random.default_rng(0)
    p = np.array([2.0, 4, 8, 16, 32])
    means = 100 * (1 + rng.uniform(-0.03, 0.03, size=(5, 200)))
    runs = Repetitions(np.full(5, 5, dtype=np.int64), np.full((5, 200), 0.3))
    models = fit_single_parameter(p, means, repetitions=runs).models
    assert sum(m.hypothesis == Hypothesis(()) for m in models) >= 190


def test_constant_data_gives_the_constant_model() -> None:
    p = np.array([2.0, 4, 8, 16, 32])
    y = np.full((5, 1), 7.5)
    model = fit_single_parameter(p, y).models[0]
    assert model.hypothesis == Hypothesis(())
    assert model.coefficients == pytest.approx((7.5,))


@pytest.mark.parametrize("repetitions", [1, 5])
def test_pure_noise_around_a_constant_falls_back_to_the_constant_model(repetitions: int) -> None:
    rng = np.random.default_rng(5)
    p = np.array([2.0, 4, 8, 16, 32])
    raw = 100.0 * (1 + rng.uniform(-0.05, 0.05, size=(5, repetitions, 200)))
    runs = Repetitions.of(list(raw))
    models = fit_single_parameter(p, raw.mean(axis=1), repetitions=runs).models
    constant = sum(m.hypothesis == Hypothesis(()) for m in models)
    assert constant >= 190  # the F-test's 5 % is for all hypotheses together


def test_refinement_finds_an_exponent_outside_the_search_space() -> None:
    p = np.array([4.0, 8, 16, 32, 64, 128])
    truth = 3.0 + 2.0 * p**0.6  # 3/5 is not in the default search space
    # Refinement refines one-term models (with two terms, noise-free data this close to the
    # space are fitted by two neighbouring exponents instead).
    one = FitOptions(max_terms=1)
    plain = fit_single_parameter(p, truth[:, None], one).models[0]
    refined = fit_single_parameter(p, truth[:, None], FitOptions(max_terms=1, refine=True)).models[
        0
    ]
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


def _scattered(kind: str, seed: int = 3) -> tuple[np.ndarray, Repetitions, list[Model]]:
    """Means and repetitions of 300 generator models under one kind of noise (5 runs)."""
    rng = np.random.default_rng(seed)
    models = [random_model(rng, ("p",), 1, DEFAULT_VALUES, "smallest") for _ in range(300)]
    grid = np.array(DEFAULT_VALUES)[:, None]
    exact = np.stack([m.evaluate(grid) for m in models], axis=1)
    shape = (len(DEFAULT_VALUES), 5, len(models))
    if kind == "multiplicative":
        runs = exact[:, None, :] * (1 + rng.uniform(-0.05, 0.05, size=shape))
    elif kind == "additive":
        runs = exact[:, None, :] + rng.normal(size=shape) * 0.02 * exact.max(axis=0)
    else:  # counting: ~400 samples at the largest point
        scale = 400 / exact.max(axis=0)
        runs = rng.poisson(exact[:, None, :] * scale, size=shape) / scale
    return runs.mean(axis=1), Repetitions(np.full(len(grid), 5), runs.std(axis=1)), models


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("multiplicative", "relative"), ("additive", "absolute"), ("counting", "poisson")],
)
def test_auto_weighting_reads_the_kind_of_noise_from_the_repetitions(
    kind: str, expected: str
) -> None:
    mean, repetitions, _ = _scattered(kind)
    chosen = auto_weightings(mean, repetitions)
    assert chosen.count(expected) >= 0.85 * len(chosen), Counter(chosen)


def test_auto_weighting_without_repetitions_or_variation_is_ordinary_least_squares() -> None:
    mean, repetitions, _ = _scattered("multiplicative")
    assert set(auto_weightings(mean, None)) == {"absolute"}
    once = Repetitions(np.ones(len(DEFAULT_VALUES), dtype=np.int64), repetitions.spread)
    assert set(auto_weightings(mean, once)) == {"absolute"}
    flat = np.full((len(DEFAULT_VALUES), 1), 7.0) * (1 + 0.01 * np.arange(5))[:, None]
    assert auto_weightings(flat, Repetitions(once.counts * 5, flat * 0.05)) == ["absolute"]


def test_auto_fits_each_context_as_its_own_weighting_would() -> None:
    """A multiplicative and an additive series side by side: auto gives each the models its
    own weighting gives it alone, and finds the lead term as often as the best fixed one."""
    mult, mult_runs, mult_models = _scattered("multiplicative")
    add, add_runs, _ = _scattered("additive")
    y = np.concatenate([mult, add], axis=1)
    runs = Repetitions(
        mult_runs.counts, np.concatenate([mult_runs.spread, add_runs.spread], axis=1)
    )
    auto = fit_single_parameter(DEFAULT_VALUES, y, FitOptions(weighting="auto"), repetitions=runs)
    chosen = np.array(auto_weightings(y, runs))
    for weighting in set(chosen.tolist()):
        columns = np.flatnonzero(chosen == weighting)
        alone = fit_single_parameter(
            DEFAULT_VALUES,
            y[:, columns],
            FitOptions(weighting=weighting),
            repetitions=Repetitions(runs.counts, runs.spread[:, columns]),
        )
        assert [str(auto.models[c]) for c in columns] == [str(m) for m in alone.models]
        assert np.array_equal(auto.smape[columns], alone.smape)
    n = mult.shape[1]

    def right(models: list[Model]) -> float:
        return float(
            np.mean(
                [
                    compare_growth(m.lead_term(), t.lead_term()) == "match"
                    for m, t in zip(models, mult_models, strict=True)
                ]
            )
        )

    relative = fit_single_parameter(
        DEFAULT_VALUES, mult, FitOptions(weighting="relative"), repetitions=mult_runs
    )
    absolute = fit_single_parameter(
        DEFAULT_VALUES, mult, FitOptions(weighting="absolute"), repetitions=mult_runs
    )
    assert right(auto.models[:n]) >= right(relative.models) - 0.02 > right(absolute.models)


def test_the_likeliest_lead_beats_the_best_fits_lead_on_two_term_functions() -> None:
    """One parameter, two terms, six values, 2 % noise, five runs: among two-term hypotheses
    that fit about as well, the best fit's lead is a coin toss; the lead whose hypotheses
    together are likeliest (FitOptions.lead_average, the default) is right more often. Measured
    on this seed: 65.0 % against 57.5 % (docs/pymodel.md, "How models are chosen")."""
    from pyhpctk.model.compare import lead_factors
    from pyhpctk.model.synthetic import EXTRAP_TERMS

    rng = np.random.default_rng(11)
    values = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    cases = [
        make_case(
            rng, random_model(rng, ("p",), 2, values, terms=EXTRAP_TERMS), 0.02, values=values
        )
        for _ in range(200)
    ]
    y = np.stack([c.mean for c in cases], axis=1)
    runs = Repetitions(np.full(len(values), 5), np.stack([c.spread for c in cases], axis=1))
    truth = [lead_factors(c.truth) for c in cases]
    rates = []
    for average in (False, True):
        options = FitOptions(weighting="relative", lead_average=average)
        found = fit_single_parameter(values, y, options, repetitions=runs).models
        rates.append(np.mean([lead_factors(m) == t for m, t in zip(found, truth, strict=True)]))
    best_fit, likeliest = rates
    assert likeliest >= best_fit + 0.05, rates
    assert likeliest >= 0.62, rates


def test_terms_outside_extraps_building_blocks_are_searched_at_lower_prior_odds() -> None:
    """Extra-P's default modeler pairs a logarithm with the simpler powers only: p^(3/2)·log2(p)
    is a building block, p^(7/4)·log2(p) and p^3·log2(p)^2 are not. pymodel searches all 56
    terms (``space="extrap"``: the 41 blocks only), and where two leads explain the data about
    as well, a block is ten times likelier a priori (``outside_prior``): on 120 seeded two-term
    functions of blocks at 5 values and 5 % noise that finds the lead more often than no
    preference does, and a function outside the blocks is still found where the data show it."""
    from pyhpctk.model.fit import single_parameter_hypotheses

    def pairs(options: FitOptions) -> set[tuple[Fraction, int]]:
        return {
            (h.terms[0].factors[0].poly, h.terms[0].factors[0].log)
            for h in single_parameter_hypotheses(0, options)
            if h.terms
        }

    blocks = pairs(FitOptions(max_terms=1, space="extrap"))
    assert len(blocks) == 41 and (Fraction(3, 2), 1) in blocks
    assert (Fraction(7, 4), 1) not in blocks and (Fraction(3), 2) not in blocks
    assert len(pairs(FitOptions(max_terms=1))) == 56
    with pytest.raises(ValueError, match="space must be one of extrap, grid"):
        FitOptions(space="all")

    cases = _two_term_blocks(35, 120)
    rates = [
        _lead_rate(cases, FitOptions(weighting="relative", outside_prior=outside))
        for outside in (1.0, FitOptions().outside_prior)
    ]
    assert rates[1] > rates[0], rates

    p = np.array(_FIVE_VALUES)
    truth = 3.0 + 2.0 * p**1.75 * np.log2(p)
    (model,) = fit_single_parameter(p, truth[:, None]).models
    assert model.render(3) == "3 + 2 * p^(7/4) * log2(p)"


def test_models_below_zero_at_one_are_less_likely_leads() -> None:
    """No run takes negative time, yet at five noisy values a steep term often buys a closer fit
    with a constant far below zero. A model whose constant is below zero beyond its noise is a
    tenth as likely a priori (``below_zero_prior``; before issue #35's seventh round: a model
    negative where every parameter is 1): on 200 seeded two-term functions at 5 values and 5 %
    noise that finds the lead more often than no such prior does; noise-free data below zero
    keep their exact model."""
    with pytest.raises(ValueError, match=r"below_zero_prior must be in \(0, 1\]"):
        FitOptions(below_zero_prior=0.0)
    cases = _two_term_blocks(36, 200)
    rates = [
        _lead_rate(cases, FitOptions(weighting="relative", below_zero_prior=below))
        for below in (1.0, FitOptions().below_zero_prior)
    ]
    assert rates[1] > rates[0], rates  # 40.0 % and 41.5 % (before the seventh round 37.5, 39.5)

    p = np.array(_FIVE_VALUES)
    (model,) = fit_single_parameter(p, (2.0 * p**2 - 5.0)[:, None]).models
    assert model.render(3) == "-5 + 2 * p^2"


def test_integrated_evidence_finds_more_leads_of_two_term_functions() -> None:
    """One parameter, two terms of Extra-P's building blocks, eight values, 5 % noise, five
    runs: the F-test with Bonferroni over 1,540 pairs keeps one term in most of them, where the
    two sizes weighed by their integrated evidence (``terms_by="evidence"``, a broad prior of the
    terms' shares) keep the second term where the data support it. Measured on this seed: 74.0 %
    against 71.3 % (docs/pymodel.md, "One term or two by integrated evidence"); an unknown
    rule is refused."""
    from pyhpctk.model.synthetic import EXTRAP_TERMS

    with pytest.raises(ValueError, match="terms_by must be one of f-test, evidence"):
        FitOptions(terms_by="bic")
    rng = np.random.default_rng(38)
    values = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
    cases = [
        make_case(
            rng, random_model(rng, ("p",), 2, values, terms=EXTRAP_TERMS), 0.05, values=values
        )
        for _ in range(300)
    ]
    f_test, evidence = (
        _lead_rate(cases, FitOptions(weighting="relative", terms_by=rule))
        for rule in ("f-test", "evidence")
    )
    assert evidence >= f_test + 0.015, (f_test, evidence)
    assert evidence >= 0.73, (f_test, evidence)


def test_evidence_finds_the_lead_a_negative_constant_hides() -> None:
    """A seeded two-term function of Extra-P's blocks, ``33.6 + 142·p^(3/4)·log2(p) +
    6.78·p^(7/3)`` at six values and 2 % noise, five runs: the likeliest lead among the pairs
    the F-test keeps was ``-179 + 203·p^(5/4) + 0.642·p^2·log2(p)^2``, a closer fit bought with a
    constant far below zero (the lead p²·log2(p)², below the true p^(7/3)). With a constant that
    is not negative beyond its noise (a negative one a tenth as likely), in the evidence of every
    hypothesis of one and two terms and in the lead summed over the hypotheses that share it,
    the generating lead is found."""
    from pyhpctk.model.synthetic import EXTRAP_TERMS

    values = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    rng = np.random.default_rng(8)
    cases = [
        make_case(
            rng, random_model(rng, ("p",), 2, values, terms=EXTRAP_TERMS), 0.02, values=values
        )
        for _ in range(11)
    ]
    case = cases[10]
    assert case.truth.render(3) == "33.6 + 142 * p^(3/4) * log2(p) + 6.78 * p^(7/3)"
    (model,) = _fit([case], FitOptions(weighting="relative"))
    assert _lead_per_parameter(model) == {0: (Fraction(7, 3), 0)}, model.render(3)
    assert model.coefficients[0] > 0, model.render(3)


def test_log_normal_cdf_matches_erfc_in_both_tails() -> None:
    """log Φ(z), which weighs a model by the chance that its constant is not negative, against
    the standard library's erfc: to 1e-6 relative in Φ from z = -30 to 8."""
    import math

    from pyhpctk.model.evidence import log_normal_cdf

    z = np.array([-30.0, -8.0, -3.0, -1.0, -0.1, 0.0, 0.5, 2.0, 8.0])
    want = np.array([math.log(0.5 * math.erfc(-v / math.sqrt(2.0))) for v in z])
    assert np.allclose(log_normal_cdf(z), want, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("weighting", ["relative", "poisson"])
def test_a_context_that_is_zero_at_every_point_is_modelled_as_zero_without_infinite_weights(
    weighting: str,
) -> None:
    # A context of a database series can read 0 at every scale (an exclusive cost nothing was
    # sampled in). Its relative weights were 1/(1e-300)², infinite: the normal equations filled
    # with NaN and CI's pymodel of a measured series died of "Singular matrix" (2026-12-08).
    values = [2, 2, 4, 4, 8, 8, 16, 16, 32, 32]
    x = np.asarray(values, dtype=np.float64)
    y = np.stack([3.0 + 0.5 * x**2, np.zeros_like(x), 1.0 + 2.0 * x], axis=1)
    with np.errstate(over="raise", invalid="raise"):
        both = fit_single_parameter(values, y, FitOptions(weighting=weighting))
    assert both.models[1].evaluate(np.array([[64.0]]))[0] == 0.0, str(both.models[1])
    for column in (0, 2):
        alone = fit_single_parameter(values, y[:, [column]], FitOptions(weighting=weighting))
        assert str(both.models[column]) == str(alone.models[0])
