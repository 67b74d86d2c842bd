"""GPU work in windows of long jobs (issue #37, item 3): ``pyrun --start-paused`` and
``pyrun ctl`` leave out the kernels launched while the window is closed.

The program launches kernels through the simulated runtime in three phases, each from its own
line: 5 in phase A, 7 in phase B, 3 in phase C, waiting between phases for files the test
writes. pyrun starts paused; the test opens the window after phase A and closes it after phase
B. The database must hold phase B's 7 kernels, under phase B's line, and none of A's or C's;
with ``-t`` the GPU stream's trace must hold 7 kernels too; pyrun's GPU line counts the others
as left out.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pyprof import main as pyprof
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.formats import hpctrace
from pyhpctk.measure.gpu.matching import SiteOperations, issued_into
from pyhpctk.present.api import open_database

PYRUN = str(Path(sys.executable).parent / "pyrun")

PROGRAM = """
import os, sys, time
from pyhpctk.measure.gpu import simulated_runtime

gpu = simulated_runtime()
where = sys.argv[1]


def wait_for(name):
    while not os.path.exists(os.path.join(where, name)):
        time.sleep(0.01)


def launches(count):
    for _ in range(count):
        gpu.launch()
    gpu.synchronize()


launches(5)  # phase A
open(os.path.join(where, "ready-b"), "w").close()
wait_for("go-b")
launches(7)  # phase B
open(os.path.join(where, "done-b"), "w").close()
wait_for("go-c")
launches(3)  # phase C
"""


def _wait_for(path: Path, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the program ended early: {process.communicate()}")
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.02)


def _ctl(capsys: pytest.CaptureFixture[str], pid: int, command: str) -> str:
    capsys.readouterr()
    assert pyrun_main(["ctl", str(pid), command]) == 0
    return capsys.readouterr().err


@pytest.mark.parametrize("hook", ["c", "python"])
@pytest.mark.parametrize("trace", [False, True], ids=["profile", "trace"])
def test_kernels_launched_outside_the_window_are_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trace: bool, hook: str
) -> None:
    program = tmp_path / "phases.py"
    program.write_text(PROGRAM)
    lines = PROGRAM.splitlines()
    phase_line = {p: lines.index(f"launches({n})  # phase {p}") + 1 for p, n in
                  (("A", 5), ("B", 7), ("C", 3))}  # fmt: skip
    out, db = tmp_path / "m", tmp_path / "d"
    event = f"gpu=simulated,hook={hook}"
    command = [PYRUN, "--start-paused", *(["-t"] if trace else []), "-e", event]
    pyrun = subprocess.Popen(
        [*command, "-o", str(out), sys.executable, str(program), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(tmp_path / "ready-b", pyrun)
        _ctl(capsys, pyrun.pid, "start")
        (tmp_path / "go-b").touch()
        _wait_for(tmp_path / "done-b", pyrun)
        _ctl(capsys, pyrun.pid, "stop")
        (tmp_path / "go-c").touch()
        _, stderr = pyrun.communicate(timeout=120)
    finally:
        pyrun.kill()
    assert pyrun.returncode == 0, stderr
    outside = 5 + 1 + 3 + 1  # phase A's and C's kernels and their synchronize
    assert f"({outside} of them left out: issued while the window was closed)" in stderr, stderr
    assert pyprof(["-o", str(db), str(out)]) == 0
    database = open_database(db)
    arrays = database.arrays(["GKER:COUNT"])
    counts = arrays["GKER:COUNT (I)"]
    assert counts[0] == 7, "the window's kernels, and only them"
    by_line: dict[int, float] = {}
    for label, value in zip(arrays["label"], counts, strict=True):
        path, _, line = str(label).rpartition(": ")
        if path.endswith("phases.py") and line.isdigit():
            by_line[int(line)] = max(by_line.get(int(line), 0.0), float(value))
    assert by_line.get(phase_line["B"]) == 7, by_line
    assert by_line.get(phase_line["A"], 0) == 0 and by_line.get(phase_line["C"], 0) == 0
    if trace:  # GPU streams' traces (thread numbers from 500): each activity, then idle
        streams = [p for p in out.glob("*.hpctrace") if int(p.name.split("-")[2]) >= 500]
        nodes = [int(n) for p in streams for n in hpctrace.read(p).records["node_id"]]
        idle = nodes[-1]
        assert sum(n != idle for n in nodes) == 7 + 1, nodes  # phase B's kernels, its sync


def test_the_operations_issued_outside_are_told_per_site_or_per_activity() -> None:
    # Which activities the window left out: the C hook's activities name their site by token
    # (one look per site), the others carry their operation (None: not matched).
    inside, outside = object(), object()
    sites = np.empty(3, dtype=object)
    for token, cct in enumerate((inside, outside, inside)):
        sites[token] = (token, 0, 0, -1, None, cct, False)
    tokens = np.array([0, 1, 1, 2, 1, 0])
    expected = [False, True, True, False, True, False]
    assert issued_into(outside, SiteOperations(sites, tokens)).tolist() == expected
    listed = [sites[t] for t in tokens.tolist()]
    assert issued_into(outside, [*listed, None]).tolist() == [*expected, False]
