"""OpenBLAS's worker thread under the numpy lines that gave it work, on a real program.

numpy's matrix product on two OpenBLAS threads (``OPENBLAS_NUM_THREADS=2``: the calling
thread and one worker) from two lines, one product on the first for three on the second. The
program measures its worker's CPU time during each line itself (``/proc/self/task/*/schedstat``
of every thread but the main one, before and after the line), the truth the database's split
is held to: by time from the traces (``pyrun -t``, pyprof's default there) and in proportion
to the main thread's time in each line's product (``--graft-workers proportion``). Either
way, no thread's total changes, and the database passes ``pyhpctk verify``.

The issue's scikit-learn program (``tests/programs/real/sklearn_pipeline.py``): its ``fit``
line's share on pyview's default screen is the share of the process's CPU time the program's
own clock gives the line, OpenMP's workers included.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.formats.inspect import verify_path
from pyhpctk.measure import _engine  # type: ignore[attr-defined]
from test_pyprof_workers import MARKER, Tree, _thread_totals
from test_pyview_real import BUDGET, PROGRAMS

#: Timing-sensitive: run alone, after the parallel tests (Makefile: unit).
pytestmark = [
    pytest.mark.timing,
    pytest.mark.skipif(
        not _engine.NATIVE_SUPPORTED or not Path("/proc/self/task").is_dir(),
        reason="native frames are recorded on x86-64 Linux; the truth reads /proc",
    ),
]

PROGRAM = """\
import json, os, sys, threading, time
import numpy

a = numpy.random.default_rng(1).random((300, 300))
main = threading.get_native_id()


def workers_cpu():
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != main:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    return total / 1e9


spent = {"small": 0.0, "large": 0.0}
stop = time.thread_time() + float(sys.argv[1])
while time.thread_time() < stop:
    t0 = workers_cpu()
    a @ a  # SMALL
    t1 = workers_cpu()
    for _ in range(3):
        a @ a  # LARGE
    t2 = workers_cpu()
    spent["small"] += t1 - t0
    spent["large"] += t2 - t1
json.dump(spent, open(sys.argv[2], "w"))
"""

TOLERANCE = 0.1
"""Of a line's share of the worker's time: a sample period at each switch between the lines,
and a machine other work loads. By time, the split leans to the line after each switch (a
worker's sample is stamped when its CPU period ends): beside two busy loops the first line's
share came out 0.016 to 0.072 above the truth in five runs, 0.085 in one full suite run."""


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(PROGRAM.splitlines(), 1) if marker in text)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    pytest.importorskip("numpy")
    where = tmp_path_factory.mktemp("workers")
    program, truth = where / "blas_lines.py", where / "truth.json"
    program.write_text(PROGRAM)
    out = where / "m"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENBLAS_NUM_THREADS", "2")
        command = [sys.executable, str(program), "2.0", str(truth)]
        assert pyrun_main(["-t", "-e", "CPUTIME@2000", "-o", str(out), *command]) == 0
    return out, json.loads(truth.read_text())


def _shares(db: Path) -> dict[str, float]:
    """Each line's share of the worker time grafted below the two lines."""
    tree = Tree(db)
    small, large = _line("# SMALL"), _line("# LARGE")
    found = {
        name: sum(
            value
            for row, (label, value) in enumerate(zip(tree.labels, tree.values, strict=True))
            if label == MARKER
            and any(a.endswith(f"blas_lines.py: {line}") for a in tree.ancestors(row))
        )
        for name, line in (("small", small), ("large", large))
    }
    total = sum(found.values())
    assert total > 0, "worker time under the lines"
    return {name: value / total for name, value in found.items()}


@pytest.mark.parametrize("mode", ["auto", "proportion"], ids=["by-time", "in-proportion"])
def test_worker_time_under_each_numpy_line_in_the_programs_own_proportion(
    tmp_path: Path, measured: tuple[Path, dict[str, float]], mode: str
) -> None:
    measurement, truth = measured
    db = tmp_path / "db"
    run(ProfOptions.build([measurement], output=db, graft_workers=mode))
    expected = truth["small"] / (truth["small"] + truth["large"])
    shares = _shares(db)
    assert shares["small"] == pytest.approx(expected, abs=TOLERANCE), (shares, truth)
    apart = tmp_path / "apart"
    run(ProfOptions.build([measurement], output=apart, graft_workers="off"))
    assert _thread_totals(db) == pytest.approx(_thread_totals(apart), rel=1e-9)
    assert len(_thread_totals(db)) >= 2
    report = verify_path(db)
    assert report.exit_code == 0, (report.problems, report.unreadable)
    shutil.rmtree(apart)


def test_pyview_names_the_worker_threads_below_the_matmul_line(
    tmp_path: Path, measured: tuple[Path, dict[str, float]], capsys: pytest.CaptureFixture[str]
) -> None:
    measurement, _ = measured
    db = tmp_path / "db"
    run(ProfOptions.build([measurement], output=db))
    capsys.readouterr()
    assert pyview_main([str(db), "--no-color", "--lines", "40"]) == 0
    out = capsys.readouterr().out
    rows = out.splitlines()
    at = next(i for i, row in enumerate(rows) if MARKER in row)
    large = f"blas_lines.py: {_line('# LARGE')}"
    assert any(large in row for row in rows[:at]), out
    assert "application thread" not in out, out


def percent_of_row(capsys: pytest.CaptureFixture[str], db: Path, ending: str) -> float:
    """The inclusive percentage pyview's top-down screen shows on the row ending ``ending``."""
    capsys.readouterr()
    assert pyview_main([str(db), "--lines", str(BUDGET)]) == 0
    lines = capsys.readouterr().out.splitlines()
    found = [line for line in lines if line.rstrip().split(" (+")[0].endswith(ending)]
    assert len(found) == 1, "\n".join(lines)  # a string: pytest shows it whole, a list cut short
    return float(found[0].split()[1].rstrip("%"))


def test_sklearns_worker_threads_sit_under_the_fit_line_that_started_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """HistGradientBoosting's OpenMP workers do most of ``fit``'s work: their CPU time shows
    under the program's ``fit`` line, as the program's own process clock measures it (before:
    in `application thread` rows of their own, and the line held the main thread's share).

    One OpenBLAS thread: OpenBLAS's idle workers spin in ``blas_thread_server`` after the PCA's
    calls, in the background while ``fit`` runs (0.27 s of 1.9 s on an idle machine), time the
    process clock counts during ``fit`` but no call of ``fit``'s started; it stays in their own
    rows. The numpy tests above hold OpenBLAS's workers to their lines."""
    pytest.importorskip("sklearn", reason="scikit-learn is in the dev extra")
    program = PROGRAMS / "sklearn_pipeline.py"
    line = (
        program.read_text()
        .splitlines()
        .index("    model.fit(features, y)  # the fit line: OpenMP workers do most of its work")
    )
    truth_file = tmp_path / "t.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "2")
        patch.setenv("OPENBLAS_NUM_THREADS", "1")
        command = [sys.executable, str(program), str(truth_file), "20000"]
        assert pyrun_main(["-o", str(tmp_path / "m"), *command]) == 0
    db = tmp_path / "db"
    run(ProfOptions.build([tmp_path / "m"], output=db))
    truth = json.loads(truth_file.read_text())
    expected = 100 * truth["fit_cpu"] / truth["process_cpu"]
    shown = percent_of_row(capsys, db, f"← sklearn_pipeline.py: {line + 1}")
    assert abs(shown - expected) <= 5, (shown, expected, truth)
    report = verify_path(db)
    assert report.exit_code == 0, (report.problems, report.unreadable)
