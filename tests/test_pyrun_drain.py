"""pyrun's drain groups each drain's samples by path, timer and GIL state (engine_c/entries.c).

A program that alternates between three functions every few hundred microseconds gives samples
whose paths change from one sample to the next but repeat within a drain: the drain hands the
Python side one entry per distinct path. What the profiles hold must not change for it: every
sample's CPU time, to the nanosecond the records carry (the engine's ``cpu_sampled_ns``), each
function's share, and the walk from one drain to the next (a drain whose last sample's path is
not its last entry's goes back to it, or the next drain's frames would hang under another
function). Runs on CPython 3.11 (the suite) and 3.12, 3.13 (``make test-engine``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.measure.sampling import engine
from test_pyrun_engine import CPU, Profile, read_profiles

ALTERNATING = """
import json, sys, time

clock = time.thread_time  # this thread's CPU time: what its CPU samples measure
spent = {"f": 0.0, "g": 0.0, "run": 0.0}

def timed(name, work, n):
    start = clock()
    work(n)
    spent[name] += clock() - start

def f(n):
    t = 0
    for i in range(n):
        t += i * i % 7
    return t

def g(n):
    t = 0
    for i in range(n):
        t += (i ^ 3) % 5
    return t

def h(n):
    timed("f", f, n)
    timed("g", g, n)

def run(seconds):
    began = clock()
    end = began + seconds
    while clock() < end:
        timed("f", f, 3000)
        timed("g", g, 3000)
        h(1500)
    spent["run"] = clock() - began

run(float(sys.argv[2]))
with open(sys.argv[1], "w") as out:
    json.dump(spent, out)
"""

pytestmark = pytest.mark.skipif(
    engine.load_engine()[0] is None, reason="the sampling engine is not built here"
)


def callers(profile: Profile, label: str) -> set[tuple[str, ...]]:
    """The program's functions above each node labelled ``label`` (outermost first)."""
    return {
        tuple(name for name, _ in profile.path(node)[:-1] if name in ("run", "f", "g", "h"))
        for node, (_, name, _) in profile.nodes.items()
        if name == label
    }


def test_grouped_samples_keep_every_nanosecond_and_their_paths(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    program, truth, out = tmp_path / "alternating.py", tmp_path / "truth.json", tmp_path / "m"
    program.write_text(ALTERNATING)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYHPCTK_PYRUN_DEBUG", "1")
        # many drains (about 50), each ending anywhere; each of 30 ms of wall-clock time, so
        # that a drain holds enough samples to group also on a loaded machine (with 10 ms, a
        # program that got half a CPU gave 0.75 entries a sample, at the bound below)
        patch.setenv(engine.ENV_DRAIN_PERIOD, "0.03")
        status = pyrun_main(
            ["-e", "CPUTIME@1000", "-o", str(out), sys.executable, str(program), str(truth), "1.5"]
        )
    assert status == 0
    (debug,) = re.findall(r"pyrun: sampling engine in pid \d+: (.*)", capfd.readouterr().err)
    counts = {name: int(value) for name, value in re.findall(r"(\w+) (-?\d+)", debug)}
    (main,) = [p for p in read_profiles(out) if p.thread == 0]
    # grouping happened: fewer entries than samples (without it, about one per sample)
    assert counts["samples"] > 500, counts
    assert counts["drain_entries"] < 0.75 * counts["samples"], counts
    # every sample's CPU time is in the profile, to the records' nanosecond
    assert main.total(CPU) == pytest.approx(counts["cpu_sampled_ns"] * 1e-9, abs=1e-3)
    # each function's self time as the program measured it, on the clock its samples read
    # (its thread's: the process's clock also ran while pyrun's drain thread worked, which
    # the program charged to whichever function was running, and CI saw f 0.058 off)
    spent = json.loads(truth.read_text())
    for name in ("f", "g"):
        share = main.self_of(CPU, name) / main.inclusive(CPU, "run")
        expected = spent[name] / spent["run"]
        assert share == pytest.approx(expected, abs=0.05), (name, share, expected)
    # paths stay whole from one drain to the next: f and g only under run or h
    under_run = {("run",), ("run", "h")}
    assert callers(main, "f") <= under_run, callers(main, "f")
    assert callers(main, "g") <= under_run, callers(main, "g")
    assert callers(main, "h") == {("run",)}
