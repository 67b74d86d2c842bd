"""Garbage collection as a calling context (issue #36 item 4).

``tests/programs/garbage.py`` makes cyclic garbage over a large live heap, so that collections
cost about half of its CPU time, and times every collection itself with ``gc.callbacks`` (on
the collecting thread's CPU clock): the truth. pyview must show that time as ``<gc>`` rows
under the lines that allocated, and as a bottom-up row of its own, within 5 points of the
program's share, with either sampler (the engine samples inside collections; the Python
sampler times them, since it cannot take the GIL a collection holds).
"""

from __future__ import annotations

import _thread
import gc
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.measure.gc_context import HeldOff
from pyhpctk.measure.sampling import engine

#: Timing-sensitive (the samplers' accuracy, memory peaks): run alone, after the parallel tests
#: (Makefile: unit), so that the other worker's load does not decide them.
pytestmark = pytest.mark.timing

PROGRAM = Path(__file__).resolve().parent / "programs" / "garbage.py"
ROWS = 40


def rows(capsys: pytest.CaptureFixture[str], *argv: str, depths: bool = False) -> list[Any]:
    """pyview's rows: (inclusive percent, scope), with ``depths`` (…, depth below the root)."""
    assert pyview_main(["--lines", str(ROWS), *argv]) == 0
    found: list[Any] = []
    for line in capsys.readouterr().out.splitlines():
        row = re.match(r"\s*\S+\s+([\d.]+)%\s+\S+\s+[\d.]+%( +)\*?\s*(.*)$", line)
        if row:
            share, scope = float(row[1]), row[3].strip().lstrip("* ")
            found.append((share, scope, (len(row[2]) - 2) // 2) if depths else (share, scope))
    return found


@pytest.mark.parametrize("sampler", ["engine", "thread"])
def test_collections_are_a_context_within_5_points_of_gc_callbacks_timing(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sampler: str,
) -> None:
    # Before: no <gc> row; the collections' time was the allocating lines' own.
    if sampler == "engine" and engine.load_engine()[0] is None:
        pytest.skip("the sampling engine is not built here")
    monkeypatch.setenv("PYHPCTK_PYRUN_SAMPLER", sampler)
    truth_file = tmp_path / "truth.json"
    command = [sys.executable, str(PROGRAM), str(truth_file), "1000000"]
    # 1 kHz: about a thousand samples, so that a share's noise is well under 5 points
    assert pyrun_main(["-o", str(tmp_path / "m"), "-e", "CPUTIME@1000", *command]) == 0
    run(ProfOptions.build([tmp_path / "m"], output=tmp_path / "db"))
    truth = json.loads(truth_file.read_text())
    expected = 100 * truth["gc_cpu"] / truth["main_cpu"]
    assert expected > 20, truth  # the program makes collections a large share

    top_down = rows(capsys, str(tmp_path / "db"))
    mains = [share for share, scope in top_down if scope.startswith("main ← garbage.py")]
    assert len(mains) == 1, top_down
    (main,) = mains
    under_lines = [(s, scope) for s, scope in top_down if scope.startswith("<gc> ← garbage.py")]
    assert under_lines, top_down  # under the lines whose allocation started them
    bottom_up = rows(capsys, str(tmp_path / "db"), "--bottom-up")
    # One function row <gc>, at the top of the bottom-up view. A second, short <gc> row is a
    # caller, deeper: the program's own gc.callbacks (``timing``) run inside the collection, so
    # the engine's samples of its clock_gettime read clock_gettime ← timing ← <gc>. Its time is
    # in the first row already: summing both counted it twice.
    gc_rows = [s for s, scope in bottom_up if re.sub(r" \(\+\d+ hidden\)$", "", scope) == "<gc>"]
    tops = [
        s
        for s, scope, depth in rows(capsys, str(tmp_path / "db"), "--bottom-up", depths=True)
        if depth == 1 and re.sub(r" \(\+\d+ hidden\)$", "", scope) == "<gc>"
    ]
    assert len(tops) == 1, bottom_up
    assert sum(gc_rows) - tops[0] < 2, bottom_up  # the others are callers' shares of it
    gc_share = tops[0]
    shown = 100 * gc_share / main
    assert abs(shown - expected) <= 5, (shown, expected, truth)
    # Every <gc> context is under a line of the program: the whole tree's (the screen stops
    # at ROWS rows and may fold a small one into its caller's row).
    everywhere = [
        (s, scope)
        for s, scope in rows(capsys, str(tmp_path / "db"), "--full", "--lines", "100000")
        if scope.startswith("<gc>")  # the whole tree's rows: function and line rows apart
    ]
    assert abs(sum(s for s, _ in everywhere) - gc_share) <= 1, (everywhere, gc_share)


def test_a_collection_that_starts_while_a_function_is_named_does_not_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A collection can start at any allocation, that of a new function's record included,
    while a thread names the frames it stands in (a range's anchor): the Python sampler's
    ``gc.callbacks`` entry then names that thread's frames too, the one being named among
    them, and must not wait for a lock its own thread holds (the measured program hung, every
    thread waiting)."""
    import threading

    from pyhpctk.measure import cct
    from pyhpctk.measure.gc_context import Collections

    functions = cct.FunctionTable()
    collections = Collections(functions)

    collecting: list[bool] = []

    class Stanza(cct.FunctionStanza):
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            if not collecting:  # the collection its allocation starts (none inside one)
                collecting.append(True)
                collections("start", {})
                collections("stop", {})
                collecting.clear()
            super().__init__(*args)

    monkeypatch.setattr(cct, "FunctionStanza", Stanza)

    def anchor() -> None:
        functions.register(sys._getframe().f_code)  # as Ranges.push names its caller

    worker = threading.Thread(target=anchor, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "a collection inside FunctionTable.register hung its thread"
    names = [(s.funcname, s.filename, s.lineno) for s in functions.stanzas]
    assert len(names) == len(set(names)), names  # each function named once
    assert ("anchor", __file__, anchor.__code__.co_firstlineno) in names


def test_collections_inside_the_python_samplers_reading_of_frames_do_not_crash_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``tests/programs/gc_frames.py`` starts a collection at each allocation and has its
    ``gc.callbacks`` entry hand it the GIL when one runs on another thread: on CPython 3.11 one
    then starts inside the frame object the Python sampler's ``sys._current_frames()`` or
    ``f_back`` makes for the program's frame, and the program runs on meanwhile, out of that
    frame and into its memory. The sampler took what was there for a frame: 8 runs of 8 failed
    before collections were held off (``'int' object has no attribute 'f_code'``, SIGSEGV,
    SIGABRT; test_pyrun's one-to-three split died of SIGSEGV so under load)."""
    monkeypatch.setenv("PYHPCTK_PYRUN_SAMPLER", "thread")
    program = [sys.executable, str(PROGRAM.parent / "gc_frames.py"), "2"]
    assert pyrun_main(["-o", str(tmp_path / "m"), "-e", "CPUTIME@1000", *program]) == 0
    out, err = capfd.readouterr()
    assert out.splitlines()[-1:] == ["done"], (out, err)
    assert "pyrun:" not in err, err  # no sample failed
    run(ProfOptions.build([tmp_path / "m"], output=tmp_path / "db"))
    assert pyview_main(["--lines", str(ROWS), str(tmp_path / "db")]) == 0
    assert "big" in capfd.readouterr().out  # it was sampled


class TestHeldOff:
    """The Python sampler's holds of the collector (``gc_context.HeldOff``), and the program's
    own switches during one (its ``gc.enable``/``gc.disable``/``gc.isenabled`` under pyrun)."""

    @pytest.fixture(autouse=True)
    def _collector_restored(self) -> Any:
        was = gc.isenabled()
        yield
        if was:
            gc.enable()
        else:
            gc.disable()

    def test_a_hold_stops_collections_and_gives_them_back(self) -> None:
        held = HeldOff(needed=True)
        gc.enable()
        with held:
            assert not gc.isenabled()
            assert held.isenabled()  # what the program sees
            with held:  # another hold (the main thread's, a nested one) shares it
                pass
            assert not gc.isenabled()
        assert gc.isenabled()

    def test_a_program_that_disables_the_collector_during_a_hold_keeps_it_off(self) -> None:
        held = HeldOff(needed=True)
        gc.enable()
        with held:
            held.disable()  # the program's thread ran while the sampler held it
            assert not held.isenabled()
        assert not gc.isenabled()
        with held:
            pass
        assert not gc.isenabled()  # a hold never switches on what the program switched off

    def test_a_program_that_enables_the_collector_during_a_hold_gets_it_at_the_end(self) -> None:
        held = HeldOff(needed=True)
        gc.disable()
        with held:
            held.enable()
            assert held.isenabled()
            assert not gc.isenabled()  # not before the frames are read
        assert gc.isenabled()

    def test_outside_a_hold_the_programs_switches_act_at_once(self) -> None:
        held = HeldOff(needed=True)
        held.disable()
        assert not gc.isenabled() and not held.isenabled()
        held.enable()
        assert gc.isenabled() and held.isenabled()

    def test_a_forked_child_is_left_no_hold(self) -> None:
        held = HeldOff(needed=True)
        gc.enable()
        held.__enter__()  # the fork came inside a hold: its thread is not in the child
        held.forked()
        assert gc.isenabled()
        with held:
            pass
        assert gc.isenabled()

    def test_where_collections_start_only_between_bytecodes_nothing_is_held(self) -> None:
        held = HeldOff(needed=False)
        gc.enable()
        with held:
            assert gc.isenabled()


def test_a_collection_that_starts_outside_any_python_frame_is_gc_under_the_threads_root() -> None:
    """A collection can start where a thread runs no Python code (at its end in C, freeing its
    thread-locals): the callback is then the thread's only frame. Before: ValueError ('call
    stack is not deep enough') printed into the program's stderr, and the collection's time
    went uncounted (test_pyrun_limits' 900 threads, once collections were held off during
    samples)."""
    from pyhpctk.measure import cct
    from pyhpctk.measure.gc_context import Collections

    collections = Collections(cct.FunctionTable())
    ident = _thread.start_new_thread(collections, ("start", {}))  # no frame below the callback
    deadline = time.monotonic() + 10
    taken = None
    while taken is None and time.monotonic() < deadline:
        time.sleep(0.01)
        taken = collections.take(ident, time.thread_time(), time.monotonic())
    assert taken is not None, "the collection was not recorded"
    assert list(taken) == [(collections.gc_ip,)]  # <gc> alone: right under the thread's root
