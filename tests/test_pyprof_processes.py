"""The same Python code in different processes is one context (issue #21 item 1).

Each process pyrun measures writes its own ``logical/python.XXXXXXXX`` and numbers its functions
in the order it meets them (formats.md §1.10), so one function has another (load module, fid)
in every process. pyprof unifies Python frames by what they are — file, function name, first
line — as hpcprof unifies native frames by load module and address.
"""

from __future__ import annotations

import filecmp
import sys
from pathlib import Path

import numpy as np
import pytest

from measurement_helpers import cpu_profile, profile_name
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.formats import hpcrun, logical
from pyhpctk.formats.hpcrun_model import LoadModule, MetricDescriptor, placeholder_ip
from pyhpctk.present import open_database
from pyhpctk.present.labels import context_label
from test_pyprof_mpi import MPIEXEC, pyprof_mpi

PROGRAMS = Path(__file__).resolve().parent / "programs"
SCRIPT = "/work/app.py"
CPUTIME = "CPUTIME (sec)"


def _frame(fid: int, line: int) -> int:
    return fid << 32 | line


def _process(measurement: Path, pid: int, fids: dict[str, int], seconds: float) -> None:
    """One process: ``<module>`` line 9 -> work() line 3, with this process's fids."""
    name = f"python.{pid:08x}"
    logical.write(
        logical.LogicalMetadata(
            [
                logical.LogicalStanza(fids["<module>"], "", filename=SCRIPT),
                logical.LogicalStanza(fids["work"], "work", filename=SCRIPT, lineno=1),
            ]
        ),
        measurement / "logical" / name,
    )
    nodes = [
        (2, 0, 0, placeholder_ip("^Primary"), 1),
        (4, 2, 0, placeholder_ip("| Main  "), 1),
        (6, 4, 1, _frame(fids["<module>"], 9), 1),
        (8, 6, 1, _frame(fids["work"], 3), 1),
    ]
    profile = cpu_profile(
        [LoadModule(1, f"logical/{name}")],
        nodes,
        {8: {0: seconds}},
        [MetricDescriptor(CPUTIME, CPUTIME)],
    )
    hpcrun.write(profile, measurement / profile_name(pid=pid))


def _two_processes(tmp_path: Path) -> Path:
    measurement = tmp_path / "two.m"
    (measurement / "logical").mkdir(parents=True)
    _process(measurement, 100, {"<module>": 1, "work": 2}, 1.0)
    _process(measurement, 200, {"<module>": 2, "work": 1}, 3.0)  # met in the other order
    return measurement


def _contexts_named(db_path: Path, label: str) -> list[int]:
    tree = open_database(db_path).experiment.tree
    return [i for i in range(tree.size) if context_label(tree, i)[0] == label]


def test_a_function_with_other_fids_in_two_processes_is_one_context(tmp_path: Path) -> None:
    output = tmp_path / "db"
    run(ProfOptions.build([_two_processes(tmp_path)], output=output))
    (work,) = _contexts_named(output, "work")
    db = open_database(output)
    assert db.catalog.column(CPUTIME, inclusive=True)[work] == 4.0
    # Per-profile values are still per process.
    ctx = int(db.experiment.tree.ctx_id[work])
    metric = db.experiment.metric(CPUTIME)
    prop = metric.prop_id("execution")
    assert prop is not None
    profiles, values = db.experiment.values.context_profiles(ctx, prop)
    assert sorted(values.tolist()) == [1.0, 3.0] and len(set(profiles.tolist())) == 2


@pytest.mark.mpi
def test_pyprof_mpi_unifies_processes_as_pyprof_does(tmp_path: Path) -> None:
    measurement = _two_processes(tmp_path)
    serial = tmp_path / "serial"
    run(ProfOptions.build([measurement], output=serial))
    assert MPIEXEC.exists()
    done = pyprof_mpi(2, "-o", str(tmp_path / "mpi"), str(measurement))
    assert done.returncode == 0, done.stderr
    for name in ("meta.db", "profile.db", "cct.db", "metrics/default.yaml"):
        assert filecmp.cmp(serial / name, tmp_path / "mpi" / name, shallow=False), name


def test_parent_spawned_workers_and_subprocess_share_their_contexts(tmp_path: Path) -> None:
    """tests/programs/same_code.py: 0.2 s of spin() in each of four processes."""
    seconds = 0.2
    measurement, output = tmp_path / "m", tmp_path / "db"
    program = str(PROGRAMS / "same_code.py")
    assert pyrun_main(["-o", str(measurement), sys.executable, program, str(seconds)]) == 0
    run(ProfOptions.build([measurement], output=output))
    db = open_database(output)
    tree = db.experiment.tree
    inclusive = db.catalog.column(CPUTIME, inclusive=True)
    spins = _contexts_named(output, "spin")
    by_caller = {context_label(tree, int(tree.parent[s]))[0]: s for s in spins}
    # One context per call path: main's call line (parent and subprocess), the pool's mapstar
    # (both workers), and warm_up's (subprocess only) — not one per process.
    assert len(by_caller) == len(spins) == 3, sorted(by_caller)
    direct = by_caller["same_code.py: 34"]
    pooled = next(s for caller, s in by_caller.items() if "pool.py" in caller)
    assert inclusive[direct] == pytest.approx(2 * seconds, rel=0.3)
    assert inclusive[pooled] == pytest.approx(2 * seconds, rel=0.3)
    # Per-profile values stay per process: two processes called spin from main.
    metric = db.experiment.metric(CPUTIME)
    prop = metric.prop_id("execution")
    assert prop is not None
    profiles, values = db.experiment.values.context_profiles(int(tree.ctx_id[direct]), prop)
    assert len(profiles) == 2
    assert np.all(values > 0.5 * seconds), values
    # The bottom-up view has one spin, holding all four processes' time.
    view = db.view("bottom-up", metrics=[CPUTIME])
    rows = [c for c in view.root.children if c.label.startswith("spin")]
    assert len(rows) == 1
    assert rows[0].values[0] == pytest.approx(4 * seconds + 0.05, rel=0.3)


def test_a_benchmark_runners_workers_are_one_tree_that_fits_a_screen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """tests/programs/bench_runner.py: four worker processes, as pyperf starts them, each
    0.1 s in bench_time_func() -> task() -> inner(), the first after 0.05 s calibrating.
    (benchmarks/RESULTS.md: the same with pyperf and pyperformance's bm_nbody, bm_richards.)"""
    from pyhpctk.cli.pyview import main as pyview_main

    workers, seconds = 4, 0.1
    measurement, output = tmp_path / "m", tmp_path / "db"
    program = str(PROGRAMS / "bench_runner.py")
    command = [sys.executable, program, str(workers), str(seconds)]
    assert pyrun_main(["-o", str(measurement), *command]) == 0
    run(ProfOptions.build([measurement], output=output))
    assert len(open_database(output).experiment.profiles) == workers + 1
    (bench,) = _contexts_named(output, "bench_time_func")  # one, not one per worker
    (task,) = _contexts_named(output, "task")  # the first worker numbered it otherwise
    db = open_database(output)
    inclusive = db.catalog.column(CPUTIME, inclusive=True)
    assert inclusive[bench] == pytest.approx(workers * seconds + 0.05, rel=0.3)
    assert inclusive[task] == pytest.approx(workers * seconds, rel=0.3)
    assert pyview_main([str(output)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 100
    rows = [line.split("  ")[-1].strip().lstrip("* ") for line in lines]
    calls = [row.split(" ← ")[0] for row in rows]  # a call: the function ← the line calling it
    assert calls.count("bench_time_func") == 1 and "inner" in calls
