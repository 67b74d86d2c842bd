"""Benchmark: ``pystruct MEAS`` the first time, on the measurement of a real program (issue #36).

pyrun measures a program once (by default a small scikit-learn one: a pipeline of a scaler and a
HistGradientBoosting classifier fit on 4,000 rows, then numpy matrix products; scikit-learn must
be installed, it is no dependency of pyhpctk). Then, in turns, each pyhpctk source tree runs
``pystruct -q`` on its own copy of the measurement (no ``structs/``) with an empty cache:

- ``current``: this checkout;
- ``baseline``: ``--baseline SRC``, another tree's ``src`` directory (for example
  ``git archive main src | tar -x -C /tmp/base`` then ``--baseline /tmp/base/src``), put first
  on ``PYTHONPATH``.

The trees alternate round by round, so a change of the machine's load reaches both alike; each
row gives the wall time, the CPU time of pystruct and its workers, and the load average (1 min)
when the run began. A last run of each tree on a fresh copy of the measurement with the cache
its cold run filled shows what a second program using the same libraries gets. Everything lives
in a temporary directory removed at the end. Example::

    .venv/bin/python benchmarks/pystruct_program.py --baseline /tmp/base/src --rounds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKLEARN_PROGRAM = """\
import numpy as np
from sklearn.datasets import make_classification
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

X, y = make_classification(n_samples=4000, n_features=20, random_state=0)
model = make_pipeline(StandardScaler(), HistGradientBoostingClassifier(max_iter=60))
model.fit(X, y)
print(model.score(X, y))
a = np.random.rand(600, 600)
for _ in range(5):
    a = a @ a / 600
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _pystruct(meas: Path, cache: Path, source: Path | None) -> tuple[float, float, float]:
    """(wall s, CPU s, load average) of one ``pystruct -q MEAS`` with ``cache``."""
    environment = dict(os.environ, PYHPCTK_CACHE_DIR=str(cache))
    if source is not None:
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(source), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    load = os.getloadavg()[0]
    cpu = _children_cpu()
    start = time.perf_counter()
    command = [sys.executable, "-m", "pyhpctk.cli.pystruct", "-q", str(meas)]
    subprocess.run(command, check=True, env=environment)
    return time.perf_counter() - start, _children_cpu() - cpu, load


def _copy(meas: Path, where: Path) -> Path:
    shutil.copytree(meas, where, ignore=shutil.ignore_patterns("structs"))
    return where


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", type=Path, help="the program to measure (default: sklearn)")
    parser.add_argument("--baseline", type=Path, help="another pyhpctk tree's src directory")
    parser.add_argument("--rounds", type=int, default=3, help="cold runs of each tree")
    args = parser.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("current", None)]
    if args.baseline is not None:
        if not (args.baseline / "pyhpctk" / "__init__.py").is_file():
            parser.error(f"{args.baseline}: not a src directory holding pyhpctk")
        trees.insert(0, ("baseline", args.baseline.resolve()))
    print(f"# {platform.node()} {platform.machine()} cores={os.cpu_count()}")
    with tempfile.TemporaryDirectory(prefix="pystruct-program-") as tmp:
        work = Path(tmp)
        program = work / "program.py"
        if args.program is not None:
            shutil.copy(args.program, program)
        else:
            program.write_text(SKLEARN_PROGRAM)
        meas = work / "meas"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pyhpctk.cli.pyrun",
                "-o",
                str(meas),
                sys.executable,
                str(program),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        print(f"# measured {program.name}: {len(list(meas.glob('*.hpcrun')))} profiles")
        print("| tree | run | wall s | CPU s | load (1 min) |")
        print("| --- | --- | --- | --- | --- |")
        for round_ in range(1, args.rounds + 1):
            for name, source in trees:
                copy = _copy(meas, work / f"{name}-{round_}")
                wall, cpu, load = _pystruct(copy, work / f"cache-{name}-{round_}", source)
                print(f"| {name} | cold {round_} | {wall:.1f} | {cpu:.1f} | {load:.1f} |")
        for name, source in trees:
            copy = _copy(meas, work / f"{name}-again")
            wall, cpu, load = _pystruct(copy, work / f"cache-{name}-{args.rounds}", source)
            print(f"| {name} | same cache, new copy | {wall:.1f} | {cpu:.1f} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
