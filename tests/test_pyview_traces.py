"""Trace summaries, the Perfetto / Chrome trace export and GPU idleness blame.

The constructed trace (times in ns; K = a GPU kernel, f and g CPU functions, 0 = idle):

    GPU stream S   K 0..10, idle 10..30, K 30..40, then nothing (idle)
    CPU thread T0  f 0..20, idle 20..25, g 25..50
    CPU thread T1  g 5..35, idle 35..45, f 45..60

Every GPU stream is idle over [10, 30) and [40, 60): 40 ns. Sharing each instant equally among
the busy CPU threads gives, by hand:
    [10,20) f 5, g 5 | [20,25) g 5 | [25,30) g 2.5 + 2.5 | [40,45) g 5 | [45,50) g 2.5, f 2.5
    | [50,60) f 10    =>  g 22.5, f 17.5.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyhpctk.present import open_database
from pyhpctk.present.model import Experiment, Timeline
from pyhpctk.present.synthetic import Spec, build
from pyhpctk.present.traces import (
    NoTraceError,
    gpu_idle_blame,
    render_blame,
    render_summary,
    summarize,
    to_perfetto,
)

CPU = "CPUTIME (sec)"


def traced_program(with_gpu: bool = True) -> Experiment:
    f = Spec(
        "function",
        name="f",
        file="f.py",
        ctx_id=10,
        children=(Spec("line", file="f.py", line=1, ctx_id=11, values={CPU: (1, 1)}),),
    )
    g = Spec(
        "function",
        name="g",
        file="g.py",
        ctx_id=20,
        children=(Spec("line", file="g.py", line=1, ctx_id=21, values={CPU: (1, 1)}),),
    )
    kernel = Spec(
        "function",
        name="<gpu kernel>",
        ctx_id=30,
        module="",
        children=(Spec("function", name="kern", ctx_id=31, module="/k.gpubin"),),
    )
    main = Spec(
        "function",
        name="main",
        file="m.py",
        ctx_id=2,
        children=(Spec("line", file="m.py", line=3, ctx_id=3, children=(f, g, kernel)),),
    )
    entry = Spec("entry", name="main thread", ctx_id=1, children=(main,))

    def line(prof: int, pairs: list[tuple[int, int]]) -> Timeline:
        return Timeline(
            prof,
            np.array([t for t, _ in pairs], dtype=np.uint64) + 1_000_000,
            np.array([c for _, c in pairs], dtype=np.uint32),
        )

    traces = [
        line(1, [(0, 11), (20, 0), (25, 21), (50, 0)]),
        line(2, [(5, 21), (35, 0), (45, 11), (60, 0)]),
    ]
    profiles: list[tuple[tuple[str, int], ...]] = [(("THREAD", 0),), (("THREAD", 1),)]
    if with_gpu:
        traces.append(line(3, [(0, 31), (10, 0), (30, 31), (40, 0)]))
        profiles.append((("GPUCONTEXT", 0), ("GPUSTREAM", 7)))
    return build([entry], [CPU], profiles, title="traced", traces=traces)


def test_blame_shares_gpu_idle_time_among_busy_cpu_functions() -> None:
    blame = gpu_idle_blame(traced_program())
    assert blame.gpu_idle_ns == 40
    assert blame.blamed_ns == 40
    assert blame.by_function == (("g", 22.5), ("f", 17.5))
    assert dict(blame.by_context) == {21: 22.5, 11: 17.5}


def test_blame_without_gpu_streams_is_an_error() -> None:
    with pytest.raises(NoTraceError, match="no GPU stream"):
        gpu_idle_blame(traced_program(with_gpu=False))


def test_blame_report_lists_functions_by_blame() -> None:
    out = io.StringIO()
    render_blame(gpu_idle_blame(traced_program()), out)
    lines = out.getvalue().splitlines()
    assert lines[2].endswith("g") and "56.2%" in lines[2]
    assert lines[3].endswith("f") and "43.8%" in lines[3]


def test_summary_per_line() -> None:
    by_name = {s.profile: s for s in summarize(traced_program())}
    t0 = by_name["THREAD 0"]
    assert (t0.samples, t0.span_ns, t0.busy_ns, t0.is_gpu) == (4, 50, 45, False)
    assert t0.top == (("g", 25), ("f", 20))
    stream = by_name["GPUCONTEXT 0 / GPUSTREAM 7"]
    assert stream.is_gpu and stream.busy_ns == 20 and stream.top == (("kern", 20),)


def check_trace_events(doc: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Chrome trace-event rules: B/E nest per track, times never go back."""
    json.loads(json.dumps(doc, allow_nan=False))
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in doc["traceEvents"]:
        assert event["ph"] in ("B", "E", "M")
        if event["ph"] == "M":
            continue
        tracks[(event["pid"], event["tid"])].append(event)
    for events in tracks.values():
        stack: list[str] = []
        last = -1.0
        for event in events:
            assert event["ts"] >= last
            last = event["ts"]
            if event["ph"] == "B":
                stack.append(event["name"])
            else:
                assert stack.pop() == event["name"]
        assert stack == []
    return tracks


def test_perfetto_export_nests_call_stacks_and_separates_gpu_streams() -> None:
    doc = to_perfetto(traced_program())
    tracks = check_trace_events(doc)
    assert set(tracks) == {(1, 1), (1, 2), (2, 3)}
    t0 = tracks[(1, 1)]
    begins = [e["name"] for e in t0 if e["ph"] == "B"][:4]
    assert begins == ["main thread", "main", "f", "f.py: 1"]  # call-stack depth = slice depth
    first_end = next(e for e in t0 if e["ph"] == "E")
    assert first_end["ts"] == pytest.approx(0.020)  # f.py: 1 ends at 20 ns = 0.020 us
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {
        "main thread (THREAD 0)",
        "main thread (THREAD 1)",
        "GPUCONTEXT 0 / GPUSTREAM 7",
    }


def test_cpu_only_export_has_no_gpu_process_and_the_summary_tells_cpu_from_wall_time() -> None:
    exp = traced_program(with_gpu=False)
    doc = to_perfetto(exp)
    processes = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert processes == ["CPU threads"]  # no empty "GPU streams" process (issue #21 item 7)
    t0 = next(s for s in summarize(exp) if s.profile == "THREAD 0")
    assert t0.cpu_ns == 2_000_000_000  # f's and g's CPUTIME in thread 0: 1 s each
    out = io.StringIO()
    render_summary(summarize(exp), out)
    line = next(x for x in out.getvalue().splitlines() if x.startswith("  THREAD 0 "))
    assert "over 0.000000s of wall time, in a calling context 0.000000s (90.0%)" in line
    assert line.endswith("; CPU time 2.000000s (4000000000.0% of the wall time)")


@pytest.mark.parametrize("name", ["small.d", "loops-cputime-t.d", "loops-cuda-nvidia-t.d"])
def test_perfetto_export_of_reference_traces_is_valid(reference: Path, name: str) -> None:
    db = open_database(reference / "dbase" / name)
    tracks = check_trace_events(db.perfetto())
    assert db.experiment.traces is not None
    lines = [line for line in db.experiment.traces.lines() if len(line.timestamps)]
    assert len(tracks) == len(lines)


def test_reference_gpu_trace_summary_and_blame(reference: Path) -> None:
    db = open_database(reference / "dbase" / "loops-cuda-nvidia-t.d")
    (stream,) = [s for s in db.trace_summary() if s.is_gpu]
    assert stream.samples == 200  # formats.md §7: lines [200, 0]
    assert stream.top[0][0] == "kernmain()"
    blame = db.gpu_idle_blame()
    assert blame.blamed_ns == 0  # the CPU thread's trace is empty: nobody to blame
    assert blame.gpu_idle_ns > 0


def test_database_without_traces_says_so() -> None:
    exp = traced_program()
    bare = Experiment(exp.path, exp.title, exp.tree, exp.metrics, exp.profiles, exp.values)
    with pytest.raises(NoTraceError, match=r"no trace\.db"):
        summarize(bare)
