"""Lead-term recovery on synthetic series of one to three parameters: pymodel and Extra-P.

Our own seeded generator (``pyhpctk.model.synthetic``) draws PMNF functions from the terms both
Extra-P's default modeler and pymodel can express (``EXTRAP_TERMS``, Extra-P's building blocks;
``--space pymodel``: from every pair of pymodel's exponents, its ``grid`` space, which holds 15
terms Extra-P's does not) — one parameter with one or two terms, two or three parameters as a
product or a sum of one factor each — and measures them on full grids of doublings from 2 (5 to
10 values of one parameter, 5 of each of two or three), five repetitions each (``--runs``), with
uniform multiplicative noise of 0 to 10 % (each run f·(1 + u), u ~ U(−noise, noise)). Each group
of cases is modelled by pymodel as ``pymodel FILE`` would (means, the runs' scatter,
``--weighting auto``) and, where Extra-P is installed (``--extrap PATH/bin/extrap``), by
Extra-P's default modeler on the very same runs (one JSON Lines file per group). A case counts as
recovered when the model's highest-order factor of every parameter is the generating function's
(:func:`pyhpctk.model.compare.lead_factors`).

    python benchmarks/pymodel_recovery.py --cases 100 --extrap /work/extrap-venv/bin/extrap
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import tempfile
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from pyhpctk.model.analyze import fit_series
from pyhpctk.model.compare import lead_factors, parse_python_model
from pyhpctk.model.fit import FitOptions
from pyhpctk.model.report import write_extrap_jsonl
from pyhpctk.model.series import Series
from pyhpctk.model.synthetic import EXTRAP_TERMS, Case, make_case, random_model

NOISES = (0.0, 0.02, 0.05, 0.10)
PARAMS = {1: ("p",), 2: ("p", "n"), 3: ("p", "n", "m")}


@dataclass(frozen=True, slots=True)
class Group:
    """Cases measured alike: one series of many contexts."""

    n_params: int
    n_values: int
    n_terms: int
    noise: float

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(float(2**k) for k in range(1, self.n_values + 1))

    def label(self) -> str:
        terms = f", {self.n_terms} terms" if self.n_params == 1 else ""
        return f"{self.n_params}p x {self.n_values} values{terms}, noise {self.noise:.0%}"


def groups() -> list[Group]:
    out = []
    for noise in NOISES:
        for n_values, n_terms in itertools.product((5, 6, 8, 10), (1, 2)):
            out.append(Group(1, n_values, n_terms, noise))
        out.append(Group(2, 5, 1, noise))
        out.append(Group(3, 5, 1, noise))
    return out


def draw(
    group: Group,
    count: int,
    rng: np.random.Generator,
    terms: tuple[tuple[Fraction, int], ...] | None = EXTRAP_TERMS,
    runs: int = 5,
) -> list[Case]:
    params = PARAMS[group.n_params]
    return [
        make_case(
            rng,
            random_model(rng, params, group.n_terms, group.values, terms=terms),
            group.noise,
            runs,
            values=group.values,
        )
        for _ in range(count)
    ]


def as_series(cases: list[Case]) -> Series:
    points = cases[0].points
    runs = cases[0].repetitions.shape[1]
    return Series(
        params=cases[0].truth.params,
        points=points,
        mean=np.stack([c.mean for c in cases], axis=1),
        spread=np.stack([c.spread for c in cases], axis=1),
        repetitions=np.full(len(points), runs, dtype=np.int64),
        paths=[(f"ctx{i}",) for i in range(len(cases))],
        metric="time",
        scope="",
        title="synthetic",
        raw=[np.stack([c.repetitions[k] for c in cases], axis=1) for k in range(len(points))],
        labels=[(f"ctx{i}",) for i in range(len(cases))],
    )


def pymodel_hits(cases: list[Case], options: FitOptions) -> list[bool]:
    """Whether pymodel (as ``pymodel FILE`` models the group's series) recovers each case's lead."""
    result = fit_series(as_series(cases), options, negative="auto")
    return [
        lead_factors(m) == lead_factors(c.truth) for m, c in zip(result.models, cases, strict=True)
    ]


def run_extrap(extrap: str, series: Series) -> tuple[dict[str, str], float]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "series.jsonl"
        with open(data, "w") as stream:
            write_extrap_jsonl(series, stream)
        start = time.perf_counter()
        done = subprocess.run(
            [
                extrap,
                "--disable-progress",
                "--print",
                "{callpath}@@{model:python}",
                "--json",
                str(data),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        elapsed = time.perf_counter() - start
    models = {}
    for line in done.stdout.splitlines():
        if line.count("@@") == 1:
            path, model = line.split("@@")
            models[path] = model
    return models, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="functions per group")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5, help="repetitions per point")
    parser.add_argument("--extrap", help="Extra-P's extrap executable (else pymodel only)")
    parser.add_argument("--terms", type=int, default=FitOptions().max_terms, help="pymodel's")
    parser.add_argument("--selection", default=FitOptions().selection, help="pymodel's rule")
    parser.add_argument(
        "--no-lead-average", action="store_true", help="pymodel: the best fit's lead alone"
    )
    parser.add_argument(
        "--terms-by", default=FitOptions().terms_by, help="pymodel: f-test or evidence"
    )
    parser.add_argument(
        "--space",
        choices=("both", "pymodel"),
        default="both",
        help="draw terms both tools can express (default) or every pair of pymodel's exponents",
    )
    arguments = parser.parse_args()
    rng = np.random.default_rng(arguments.seed)
    totals = np.zeros(3)  # cases, pymodel right, Extra-P right
    times = np.zeros(2)
    print(f"{'group':<42} {'pymodel':>8} {'Extra-P':>8}")
    for group in groups():
        cases = draw(
            group,
            arguments.cases,
            rng,
            EXTRAP_TERMS if arguments.space == "both" else None,
            arguments.runs,
        )
        series = as_series(cases)
        truth = [lead_factors(c.truth) for c in cases]
        start = time.perf_counter()
        options = FitOptions(
            weighting="auto",
            max_terms=arguments.terms,
            selection=arguments.selection,
            lead_average=not arguments.no_lead_average,
            terms_by=arguments.terms_by,
        )
        ours = float(np.mean(pymodel_hits(cases, options)))
        times[0] += time.perf_counter() - start
        theirs = float("nan")
        if arguments.extrap:
            models, elapsed = run_extrap(arguments.extrap, series)
            times[1] += elapsed
            found = [
                lead_factors(parse_python_model(models[f"ctx{i}"], series.params))
                for i in range(len(cases))
            ]
            theirs = float(np.mean([f == t for f, t in zip(found, truth, strict=True)]))
        totals += (len(cases), ours * len(cases), theirs * len(cases))
        print(f"{group.label():<42} {ours:8.1%} {theirs:8.1%}")
    print(
        f"{'all ' + str(int(totals[0])) + ' cases':<42} {totals[1] / totals[0]:8.1%} "
        f"{totals[2] / totals[0]:8.1%}"
    )
    print(f"time: pymodel {times[0]:.1f} s, Extra-P {times[1]:.1f} s (whole process)")


if __name__ == "__main__":
    main()
