"""Worker threads of native runtimes under the Python lines that gave them work (issue #36 item 3).

On a measurement written node by node (:mod:`worker_helpers`: two lines of one process call
OpenBLAS, whose worker thread has no Python frame), pyprof places the worker's time below each
line's call into OpenBLAS, under ``<OpenBLAS worker threads>``: in proportion to the main
thread's time in each call, or, where both threads were traced, each worker sample under the
call running at its time. Totals are kept, per thread and in all; ``--no-graft-workers`` keeps
the worker apart as before. ``tests/test_pyprof_workers_real.py`` does it on a real program.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import RunReport, run
from pyhpctk.cli.pyprof import main as pyprof_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.formats.inspect import verify_path
from pyhpctk.present.api import open_database
from worker_helpers import (
    CPUTIME,
    DISPATCH_A,
    DISPATCH_B,
    LINE_A,
    LINE_B,
    PYTHON_ONLY,
    WORKER_SPIN,
    WORKER_X,
    WORKER_Y,
    write_process,
)

MARKER = "<OpenBLAS worker threads>"
WORKER = WORKER_X + WORKER_Y + WORKER_SPIN
TOTAL = DISPATCH_A + DISPATCH_B + PYTHON_ONLY + WORKER


def _database(
    tmp_path: Path, measurement: Path, name: str = "db", **options: object
) -> tuple[Path, RunReport]:
    output = tmp_path / name
    report = run(ProfOptions.build([measurement], output=output, **options))  # type: ignore[arg-type]
    return output, report


def _measurement(tmp_path: Path, **options: object) -> Path:
    measurement = tmp_path / "app.m"
    write_process(measurement, **options)  # type: ignore[arg-type]
    return measurement


class Tree:
    """A database's contexts as pyview's API gives them: labels, parents, inclusive time."""

    def __init__(self, db: Path) -> None:
        arrays = open_database(db).arrays([CPUTIME])
        self.labels = [str(label) for label in arrays["label"]]
        self.parents = [int(p) for p in arrays["parent"]]
        self.values = [float(v) for v in arrays[f"{CPUTIME} (I)"]]

    def ancestors(self, row: int) -> list[str]:
        chain = []
        while self.parents[row] >= 0:
            row = self.parents[row]
            chain.append(self.labels[row])
        return chain

    def under_line(self, label: str, line: int) -> float:
        """Inclusive time of the contexts ``label`` below the script's line ``line``."""
        return sum(
            value
            for row, (name, value) in enumerate(zip(self.labels, self.values, strict=True))
            if name == label and any(a.endswith(f"app.py: {line}") for a in self.ancestors(row))
        )

    def rows(self, label: str) -> list[int]:
        return [row for row, name in enumerate(self.labels) if name == label]


def _thread_totals(db: Path) -> list[float]:
    """Every profile's total time (its value at the root), by profile."""
    experiment = open_database(db).experiment
    prop = experiment.metric(CPUTIME).prop_id("execution")
    assert prop is not None
    values = experiment.values
    return [float(values.profile_column(p.index, prop)[0]) for p in experiment.profiles]


def test_worker_time_is_shared_by_the_lines_in_proportion_to_their_time_in_openblas(
    tmp_path: Path,
) -> None:
    db, report = _database(tmp_path, _measurement(tmp_path))
    tree = Tree(db)
    share_a = WORKER * DISPATCH_A / (DISPATCH_A + DISPATCH_B)
    assert tree.under_line(MARKER, LINE_A) == pytest.approx(share_a, rel=1e-12)
    assert tree.under_line(MARKER, LINE_B) == pytest.approx(WORKER - share_a, rel=1e-12)
    # The worker's frames hang below the marker from its pool's thread start down (the C
    # library's start_thread left out), and nothing of it is left under "application thread"
    # (whose contexts stay in the tree, empty).
    pools = [r for r in range(len(tree.labels)) if tree.labels[r].endswith("+0x5000")]
    grafted = [r for r in pools if tree.values[r] > 0]
    assert [tree.labels[tree.parents[r]] for r in grafted] == [MARKER] * 2
    (thread,) = tree.rows("application thread")
    assert tree.values[thread] == 0
    assert not any("stays a thread" in problem for problem in report.problems)


def test_with_traces_each_worker_sample_goes_under_the_line_running_at_its_time(
    tmp_path: Path,
) -> None:
    measurement = _measurement(tmp_path, traced=True)
    db, _ = _database(tmp_path, measurement)
    tree = Tree(db)
    assert tree.under_line(MARKER, LINE_A) == pytest.approx(WORKER_X, rel=1e-12)
    assert tree.under_line(MARKER, LINE_B) == pytest.approx(WORKER_Y + WORKER_SPIN, rel=1e-12)
    # The worker's trace follows: its samples are below the marker of the line of their time.
    experiment = open_database(db).experiment
    assert experiment.traces is not None
    lines = {line.profile: line for line in experiment.traces.lines()}
    worker = lines[2]
    node_of = experiment.tree.node_of
    where = [tree.ancestors(node_of(int(c))) for c in worker.ctx_ids]
    assert [MARKER in chain for chain in where] == [True] * 6
    lines_of = [next(a for a in chain if "app.py" in a) for chain in where]
    assert [label.endswith(f"app.py: {LINE_A}") for label in lines_of] == [True] * 2 + [False] * 4
    # Forced to the proportion, the same measurement shares the worker's time half and half.
    db, _ = _database(tmp_path, measurement, "proportion", graft_workers="proportion")
    assert Tree(db).under_line(MARKER, LINE_A) == pytest.approx(WORKER / 2, rel=1e-12)


def test_a_worker_with_a_few_stacks_not_unwound_to_its_start_is_still_a_worker(
    tmp_path: Path,
) -> None:
    """Under load the engine leaves a few of a worker's stacks short of the thread's start
    (their outermost frame the extension's function it ran): seen on the sklearn program, where
    such samples kept a whole OpenMP worker (a third of the process) out of the ``fit`` line.
    The short stacks stay in the thread; the rest is the pool's work."""
    short = 0.05 * WORKER
    db, report = _database(tmp_path, _measurement(tmp_path, cut_short=short))
    tree = Tree(db)
    assert tree.under_line(MARKER, LINE_A) + tree.under_line(MARKER, LINE_B) == pytest.approx(
        WORKER, rel=1e-12
    )
    (thread,) = tree.rows("application thread")
    assert tree.values[thread] == pytest.approx(short, rel=1e-12)
    assert sum(_thread_totals(db)) == pytest.approx(TOTAL + short, rel=1e-12)
    assert not any("stays a thread" in problem for problem in report.problems)


@pytest.mark.parametrize("traced", [False, True], ids=["proportion", "time"])
def test_no_time_is_created_or_lost_per_thread_or_in_all(tmp_path: Path, traced: bool) -> None:
    measurement = _measurement(tmp_path, traced=traced)
    grafted, _ = _database(tmp_path, measurement)
    apart, _ = _database(tmp_path, measurement, "apart", graft_workers="off")
    assert _thread_totals(grafted) == pytest.approx(_thread_totals(apart), rel=1e-12)
    assert _thread_totals(grafted) == pytest.approx(
        [DISPATCH_A + DISPATCH_B + PYTHON_ONLY, WORKER], rel=1e-12
    )
    assert Tree(grafted).values[0] == pytest.approx(TOTAL, rel=1e-12)
    for db in (grafted, apart):
        report = verify_path(db)
        assert report.exit_code == 0, (report.problems, report.unreadable)


def test_off_keeps_the_worker_under_application_thread(tmp_path: Path) -> None:
    measurement = _measurement(tmp_path)
    db, _ = _database(tmp_path, measurement, graft_workers="off")
    tree = Tree(db)
    assert not tree.rows(MARKER)
    (thread,) = tree.rows("application thread")
    assert tree.values[thread] == pytest.approx(WORKER)
    # --no-graft-workers says the same on the command line, byte for byte.
    cli = tmp_path / "cli"
    assert pyprof_main(["--no-graft-workers", "-o", str(cli), str(measurement)]) == 0
    for name in ("meta.db", "profile.db", "cct.db"):
        assert (cli / name).read_bytes() == (db / name).read_bytes(), name


def test_a_bad_graft_mode_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurement = _measurement(tmp_path)
    status = pyprof_main(
        ["--graft-workers", "sometimes", "-o", str(tmp_path / "x"), str(measurement)]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert "--graft-workers" in err and "sometimes" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_a_worker_whose_process_never_called_the_runtime_stays_a_thread(
    tmp_path: Path,
) -> None:
    measurement = tmp_path / "two.m"
    write_process(measurement, pid=100)
    write_process(measurement, pid=200, dispatch=False)
    db, report = _database(tmp_path, measurement)
    tree = Tree(db)
    # Process 100's worker is under its own lines, never process 200's.
    assert tree.under_line(MARKER, LINE_A) + tree.under_line(MARKER, LINE_B) == pytest.approx(
        WORKER, rel=1e-12
    )
    (thread,) = tree.rows("application thread")
    assert tree.values[thread] == pytest.approx(WORKER)
    assert (
        "1 OpenBLAS worker thread stays a thread of its own (process 200): no Python thread of "
        "that process was sampled in OpenBLAS (docs/pyprof.md, worker threads)"
    ) in report.problems


def test_a_thread_starting_in_another_openblas_function_is_no_worker(tmp_path: Path) -> None:
    """Where something names the outermost frame (here a structure file), it must be the pool's
    thread start; otherwise the module alone decides (the test above)."""
    measurement = _measurement(tmp_path)
    structure = tmp_path / "openblas.hpcstruct"
    structure.write_text(_STRUCTURE)
    db, _ = _database(tmp_path, measurement, structs=[structure])
    assert Tree(db).under_line(MARKER, LINE_A) == pytest.approx(WORKER / 2)
    shutil.rmtree(db)
    structure.write_text(_STRUCTURE.replace("blas_thread_server", "dgemm_itcopy"))
    db, _ = _database(tmp_path, measurement, structs=[structure])
    assert not Tree(db).rows(MARKER)


def test_a_thread_starting_in_unknown_code_of_the_library_is_a_worker(tmp_path: Path) -> None:
    """A stripped runtime's thread start that no symbol names reads as unknown code of the
    library (``lib.so @ 0x5000``, analysis/symbols.py): a name that says nothing, so the
    module decides, as for an unnamed frame. Before: it counted as another function of the
    library and the worker stayed a thread."""
    measurement = _measurement(tmp_path)
    structure = tmp_path / "openblas.hpcstruct"
    unknown = "libscipy_openblas64_-32a4b2a6.so @ 0x5000"
    structure.write_text(_STRUCTURE.replace("blas_thread_server", unknown))
    db, _ = _database(tmp_path, measurement, structs=[structure])
    assert Tree(db).under_line(MARKER, LINE_A) == pytest.approx(WORKER / 2)


_STRUCTURE = """\
<?xml version="1.0"?>
<!DOCTYPE HPCToolkitStructure [
]>
<HPCToolkitStructure i="0" version="4.9" n="">
<LM i="2" n="/opt/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so" has-calls="0" v="{}">
<F i="3" n="blas_server.c">
<P i="4" n="blas_thread_server" l="10" v="{[0x5000-0x5100)}">
<S i="5" l="12" v="{[0x5000-0x5100)}"/>
</P>
</F>
</LM>
</HPCToolkitStructure>
"""


def _scope(row: str) -> str:
    """The scope column of a text row (after the second percentage), indentation kept, without
    the hot path's mark."""
    return row[row.index("%", row.index("%") + 1) + 1 :].replace("* ", "  ", 1)


def test_pyview_shows_the_worker_time_under_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = _database(tmp_path, _measurement(tmp_path, traced=True))
    capsys.readouterr()
    assert pyview_main([str(db), "--tree", "indent", "--no-color"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]  # the title and the header before
    depth = [len(_scope(row)) - len(_scope(row).lstrip()) for row in rows]
    found = {}
    for at, row in enumerate(rows):
        if _scope(row).strip() != MARKER:
            continue
        callers = [
            _scope(rows[i]).strip()
            for i in range(at)
            if depth[i] < depth[at] and all(depth[k] > depth[i] for k in range(i + 1, at))
        ]
        line = next(c for c in reversed(callers) if "app.py: " in c)
        found[line.rsplit("app.py: ", 1)[1]] = float(row.split()[0])
    assert found == {
        str(LINE_A): pytest.approx(WORKER_X),
        str(LINE_B): pytest.approx(WORKER_Y + WORKER_SPIN),
    }, rows
