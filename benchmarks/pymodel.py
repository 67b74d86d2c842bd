"""pymodel against Extra-P on the same synthetic series: speed and model choices.

Generates N contexts of one parameter (five values, five repetitions, multiplicative noise) from
known PMNF functions (``pyhpctk.model.synthetic``: the issue's generator by default, the older one
with ``--values 4,8,16,32,64 --anchor largest``), models them with pymodel's batched search (means
and the repetitions' spread, as pymodel models a series) and with Extra-P's default modeler on the
very same measurements (every repetition, exported in Extra-P's JSON Lines format), and prints both
times, their ratio, and how often each found the true lead-order term. Extra-P pins numpy < 2 and
pulls a GUI toolkit, so it lives in its own environment: pass its ``extrap`` executable with
``--extrap`` (create one with ``python3 -m venv /tmp/extrap && /tmp/extrap/bin/pip install
extrap``); without it only pymodel is timed.

    python benchmarks/pymodel.py --contexts 2000 --noise 0.05 --extrap /tmp/extrap/bin/extrap
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from pyhpctk.model.fit import FitOptions, Repetitions, fit_single_parameter
from pyhpctk.model.report import write_extrap_jsonl
from pyhpctk.model.series import Series
from pyhpctk.model.synthetic import ANCHORS, DEFAULT_VALUES, make_case, random_model

_TERM = re.compile(r"p\^\((?P<poly>[\d/.-]+)\)|log2\(p\)\^\((?P<log>[\d/.-]+)\)")


def extrap_lead(function: str) -> tuple[Fraction, int]:
    """The lead-order (poly, log) exponents of a model printed by Extra-P."""
    best = (Fraction(0), 0)
    for term in function.split(" + ")[1:]:
        poly, log = Fraction(0), 0
        for match in _TERM.finditer(term):
            if match.group("poly"):
                poly = Fraction(match.group("poly")).limit_denominator(12)
            else:
                log = int(Fraction(match.group("log")))
        best = max(best, (poly, log))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=2000)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--values", default=",".join(f"{v:g}" for v in DEFAULT_VALUES), help="parameter values"
    )
    parser.add_argument("--anchor", choices=ANCHORS, default="smallest")
    parser.add_argument("--extrap", help="path of Extra-P's extrap executable")
    args = parser.parse_args()

    values = tuple(float(v) for v in args.values.split(","))
    rng = np.random.default_rng(args.seed)
    cases = [
        make_case(rng, random_model(rng, ("p",), 1, values, args.anchor), args.noise, values=values)
        for _ in range(args.contexts)
    ]
    points = cases[0].points
    series = Series(
        params=("p",),
        points=points,
        mean=np.stack([c.mean for c in cases], axis=1),
        spread=np.stack([c.repetitions.std(axis=1) for c in cases], axis=1),
        repetitions=np.full(len(points), cases[0].repetitions.shape[1], dtype=np.int64),
        paths=[("main", f"ctx{i}") for i in range(len(cases))],
        metric="time",
        scope="execution",
        title="synthetic",
        raw=[np.stack([c.repetitions[k] for c in cases], axis=1) for k in range(len(points))],
    )
    truth = [c.truth.lead_term() for c in cases]
    truth_growth = [t.growth() if t else (Fraction(0), 0) for t in truth]

    start = time.perf_counter()
    runs = Repetitions(series.repetitions, series.spread)
    result = fit_single_parameter(points[:, 0], series.mean, FitOptions(), repetitions=runs)
    ours = time.perf_counter() - start
    our_growth = [
        m.lead_term().growth() if m.lead_term() else (Fraction(0), 0) for m in result.models
    ]
    our_right = np.mean([a == b for a, b in zip(our_growth, truth_growth, strict=True)])
    print(
        f"contexts {args.contexts}, noise {args.noise:.0%}, p = {args.values} x 5 repetitions, "
        f"terms anchored at the {args.anchor} value"
    )
    print(f"pymodel   {ours:8.2f} s   lead-order term right {our_right:6.1%}")

    extrap = args.extrap or shutil.which("extrap")
    if not extrap:
        print("Extra-P: not run (pass --extrap PATH to its executable)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "series.jsonl"
        with open(data, "w") as stream:
            write_extrap_jsonl(series, stream)
        start = time.perf_counter()
        run = subprocess.run(
            [extrap, "--json", str(data), "--print", "{callpath};{model}", "--disable-progress"],
            capture_output=True,
            text=True,
            check=True,
        )
        theirs = time.perf_counter() - start
    models = {}
    for line in run.stdout.splitlines():
        if ";" in line:
            path, function = line.split(";", 1)
            models[path.rsplit("->", 1)[-1]] = function
    their_growth = [extrap_lead(models.get(f"ctx{i}", "0")) for i in range(len(cases))]
    their_right = np.mean([a == b for a, b in zip(their_growth, truth_growth, strict=True)])
    agree = np.mean([a == b for a, b in zip(their_growth, our_growth, strict=True)])
    print(f"Extra-P   {theirs:8.2f} s   lead-order term right {their_right:6.1%}  (whole process)")
    print(f"ratio Extra-P / pymodel time: {theirs / ours:.1f}x; same lead-order term: {agree:.1%}")


if __name__ == "__main__":
    main()
