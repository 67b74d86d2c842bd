"""Per-warp traces replayed without a GPU (issue #34 item 4): a recording of traced launches
(the model kernel of tests/warp_helpers.py, every event known) through
``pyrun -e gpu=simulated,traces=FILE`` → pyprof → trace.db, pyview's warp summary and its
Perfetto export. What a user reads — each SM's warp slots as lanes of PTX blocks, the time per
block and per line, the imbalance across warps and SMs, the longest warp's path — is checked
against the recording's truth."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_helpers import SIMULATED_LAUNCHES
from pyhpctk.instrument.ptx import Strategy
from pyhpctk.present.api import open_database
from pyhpctk.present.model import Experiment
from pyhpctk.present.traces import context_frames
from warp_helpers import WarpRun, model_recording

DEVICE_RECORDINGS = sorted((Path(__file__).parent / "data" / "gpu").glob("traces_*.npz"))

Lane = dict[tuple[int, int], list[list[tuple[str, int]]]]  # (SM, slot) → warps → (block, ns)


def _replay(tmp: Path, path: Path, launches: int) -> Path:
    """``launches`` launches from one line under ``pyrun -e gpu=simulated,traces=PATH``, then
    pyprof: the database."""
    from pyhpctk.cli.pyprof import main as pyprof_main
    from pyhpctk.cli.pyrun import main as pyrun_main

    app = tmp / "app.py"
    app.write_text(SIMULATED_LAUNCHES.format(launches=launches))
    out, db = tmp / "m", tmp / "db"
    event = f"gpu=simulated,traces={path}"
    assert pyrun_main(["-e", event, "-o", str(out), sys.executable, str(app)]) == 0
    assert pyprof_main(["-o", str(db), str(out)]) == 0
    return db


def _measure(tmp: Path, strategy: Strategy) -> tuple[Path, list[list[WarpRun]]]:
    runs = model_recording(tmp / "rec.npz", strategy, launches=2)
    return _replay(tmp, tmp / "rec.npz", 2), runs


def _truth(runs: list[list[WarpRun]]) -> Lane:
    """Each (SM, slot)'s warps in time order, each warp's blocks and the time it spent in each
    (its next event's time minus its own)."""
    lanes: Lane = defaultdict(list)
    for run in runs:
        for warp in sorted(run, key=lambda w: w.events[0][1]):
            times = [t for _, t, _ in warp.events]
            blocks = [(f"block {b}", times[i + 1] - times[i]) for i, b in enumerate(warp.blocks)
                      if b >= 0]  # fmt: skip
            lanes[(warp.sm, warp.slot)].append(blocks)
    return dict(lanes)


def _lanes(exp: Experiment) -> Lane:
    """What the database's warp lines say: per (SM, slot), its warps (runs between idle
    records), each a list of (leaf label, duration)."""
    assert exp.traces is not None
    lanes: Lane = {}
    for line in exp.traces.lines():
        profile = next(p for p in exp.profiles if p.index == line.profile)
        if profile.element("CORE") is None:
            continue
        key = (int(profile.element("CORE") or 0), int(profile.element("THREAD") or 0))
        warps: list[list[tuple[str, int]]] = []
        current: list[tuple[str, int]] | None = None
        stamps, ctxs = line.timestamps.tolist(), line.ctx_ids.tolist()
        for i, ctx in enumerate(ctxs):
            if ctx == 0:
                current = None
                continue
            if current is None:
                current = []
                warps.append(current)
            current.append((context_frames(exp, ctx)[-1][1], stamps[i + 1] - stamps[i]))
        lanes[key] = warps
    return lanes


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
def test_each_sm_warp_slot_is_a_trace_line_of_its_warps_blocks(
    tmp_path: Path, strategy: Strategy
) -> None:
    db, runs = _measure(tmp_path, strategy)
    exp = open_database(db).experiment
    assert _lanes(exp) == _truth(runs)
    # under the kernel's launch: every warp record's context is below the launching line
    assert exp.traces is not None
    line = next(ln for ln in exp.traces.lines() if len(ln.ctx_ids) > 1)
    labels = [label for _, label in context_frames(exp, int(line.ctx_ids[0]))]
    assert labels[-4:-1] == ["step", "<gpu kernel>", "bfs"], labels


def _perfetto_tracks(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Track name → the innermost slice names begun on it, in order."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}  # fmt: skip
    processes = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}  # fmt: skip
    tracks: dict[str, list[str]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "B" and e["name"].startswith("block "):
            tracks[f"{processes[e['pid']]} | {names[(e['pid'], e['tid'])]}"].append(e["name"])
    return dict(tracks)


def test_the_perfetto_export_has_a_track_per_sm_and_warp_slot(tmp_path: Path) -> None:
    from pyhpctk.present.traces import to_perfetto

    db, runs = _measure(tmp_path, Strategy.EXACT)
    tracks = _perfetto_tracks(to_perfetto(open_database(db).experiment))
    want: dict[str, list[str]] = {}
    for (sm, slot), warps in sorted(_truth(runs).items()):
        name = f"GPU 0 warps (NODE 0) | SM {sm} / warp slot {slot}"
        want[name] = [block for warp in warps for block, _ in warp]
    assert tracks == want


def test_the_perfetto_export_looks_each_lines_profile_up_once(tmp_path: Path) -> None:
    """A GPU trace has a line per SM and warp slot (2,816 of one H100 launch): the export finds
    each line's profile by its index, not by walking every profile (before: lines x profiles
    profiles made; three launches of the H100 recording took over 5 minutes to export, now
    about 14 s)."""
    import dataclasses

    from pyhpctk.present.model import ProfileList
    from pyhpctk.present.traces import to_perfetto

    exp = open_database(_measure(tmp_path, Strategy.CHUNKS)[0]).experiment
    assert isinstance(exp.profiles, ProfileList) and exp.traces is not None
    lines, made = len(exp.traces.lines()), [0]

    def counted(index: int) -> tuple[tuple[str, int], ...]:
        made[0] += 1
        assert made[0] <= 4 * lines, "profiles made by walking them all"
        return identify(index)

    identify = exp.profiles._identify
    profiles = ProfileList(exp.profiles.indices, counted, exp.profiles._gpu)
    doc = to_perfetto(dataclasses.replace(exp, profiles=profiles))
    assert lines > 8 and sum(e["ph"] == "B" for e in doc["traceEvents"]) > lines


def _block_lines() -> dict[str, int]:
    """Each block's source line, from the bfs plan the recording was traced with."""
    from ptx_helpers import triton_ptx
    from pyhpctk.instrument.ptx import instrument_traces

    plan = instrument_traces(triton_ptx("bfs").read_text(), Strategy.EXACT).plans["bfs"]
    return {f"block {s.block}": s.location.line for s in plan.sites if s.location is not None}


def test_the_warp_summary_reads_the_recordings_truth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyhpctk.cli.pyview import main as pyview_main
    from pyhpctk.present.warps import warp_summary

    db, runs = _measure(tmp_path, Strategy.CHUNKS)
    truth = _truth(runs)
    warps = [(sm, warp) for (sm, _), lane in truth.items() for warp in lane]
    per_block: dict[str, int] = defaultdict(int)
    per_line: dict[int, int] = defaultdict(int)
    per_sm: dict[int, int] = defaultdict(int)
    lines = _block_lines()
    for sm, warp in warps:
        for block, ns in warp:
            per_block[block] += ns
            per_line[lines[block]] += ns
            per_sm[sm] += ns
    durations = [sum(ns for _, ns in warp) for _, warp in warps]
    longest = max(durations)

    (kernel,) = warp_summary(open_database(db).experiment)  # both launches from one line
    assert (kernel.kernel, len(kernel.warps)) == ("bfs", len(warps))
    assert kernel.called_from.startswith("step > ") and kernel.called_from.endswith("app.py: 8")
    assert kernel.per_block == per_block
    assert {int(name.rsplit(": ", 1)[1]): ns for name, ns in kernel.per_line.items()} == per_line
    assert kernel.per_sm == per_sm
    assert kernel.warp_imbalance() == (longest, sum(durations) / len(durations), min(durations))
    assert kernel.longest().duration == longest

    assert pyview_main(["--warps", str(db)]) == 0
    text = capsys.readouterr().out
    mean = sum(durations) / len(durations)
    assert f"longest {longest / 1e3:.3f} µs, mean {mean / 1e3:.3f} µs" in text
    busiest = max(per_sm, key=lambda sm: per_sm[sm])
    sm_mean = sum(per_sm.values()) / len(per_sm)
    assert (
        f"busiest SM {busiest} {per_sm[busiest] / 1e3:.3f} µs, mean {sm_mean / 1e3:.3f} µs" in text
    )
    share = 100 * per_block["block 3"] / sum(per_block.values())
    assert f"{per_block['block 3'] / 1e3:.3f} µs  {share:5.1f}%  block 3\n" in text
    # the longest warps loop 3 times (x % 4 == 3): block 2 is the loop's header
    path = "block 0 → block 1 → (block 2 → block 3 → block 4 → block 5) ×3 → block 2 → block 6"
    assert f"{longest / 1e3:.3f} µs: {path}\n" in text


def test_compress_writes_each_repeated_run_once() -> None:
    from pyhpctk.present.warps import compress

    assert compress(["a", "b", "c", "b", "c", "b", "c", "d"]) == "a → (b → c) ×3 → d"
    assert compress(["a", "a", "b"]) == "(a) ×2 → b"
    assert compress([]) == ""


def test_a_database_without_warp_lines_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyhpctk.cli.pyprof import main as pyprof_main
    from pyhpctk.cli.pyrun import main as pyrun_main
    from pyhpctk.cli.pyview import main as pyview_main

    app = tmp_path / "app.py"
    app.write_text(SIMULATED_LAUNCHES.format(launches=2))
    out, db = tmp_path / "m", tmp_path / "db"
    assert pyrun_main(["-e", "gpu=simulated", "-t", "-o", str(out), sys.executable, str(app)]) == 0
    assert pyprof_main(["-o", str(db), str(out)]) == 0
    capsys.readouterr()
    assert pyview_main(["--warps", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"{db}: no warp traces: trace kernels with pyrun -e gpu=...,trace\n")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ("gpu=nvidia,trace=exact", "gpu=nvidia: trace=exact runs each launch twice"),
        ("gpu=nvidia,trace,blocks", "gpu=nvidia: trace and blocks exclude each other"),
        ("gpu=nvidia,trace,pc", "gpu=nvidia: trace and pc exclude each other"),
        ("gpu=nvidia,trace=fast", "gpu=nvidia: trace='fast': say trace=chunks or trace=exact"),
        ("gpu=nvidia,tracebytes=5M", "gpu=nvidia: tracebytes= without trace caps nothing"),
        ("gpu=nvidia,trace=exact,tracebytes=1x", "gpu=nvidia: tracebytes='1X': say a number"),
        ("gpu=nvidia,trace,tracebytes=100", "gpu=nvidia: tracebytes=100: at least 2048 bytes"),
    ],
)
def test_the_trace_option_is_listed_and_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], event: str, message: str
) -> None:
    from pyhpctk.cli.pyrun import main as pyrun_main

    assert pyrun_main(["-L"]) == 0
    listing = capsys.readouterr().out
    assert "trace[=chunks|exact]   per-warp traces of instrumented kernels" in listing
    assert "chunks under pyrun; kernel-name= and the launch window" in listing
    assert "tracebytes=N[K|M|G]    cap on a launch's trace buffer (default 256M)" in listing
    out = tmp_path / "m"
    assert pyrun_main(["-e", event, "-o", str(out), sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyrun: error: {message}") and err.count("\n") == 1
    assert not out.exists()


def test_the_trace_cap_takes_suffixes() -> None:
    from pyhpctk.measure.gpu.spec import parse_gpu_event
    from pyhpctk.measure.gpu.warp_options import trace_option

    assert trace_option(parse_gpu_event("gpu=nvidia,trace,tracebytes=64M")) == ("chunks", 64 << 20)
    assert trace_option(parse_gpu_event("gpu=nvidia,trace=exact")) == ("exact", 256 << 20)
    assert trace_option(parse_gpu_event("gpu=nvidia,pc")) is None


def _recorded_block_times(path: Path) -> tuple[dict[str, int], int]:
    """From a recording alone: each block's warp time (each event to the warp's next event,
    a partial exit skipped: the warp goes on), and the number of warps."""
    from pyhpctk.instrument.ptx import SiteKind
    from pyhpctk.instrument.tracing.decode import times
    from pyhpctk.instrument.tracing.recording import load

    rec = load(path)
    plan = rec.plan()
    exits = {s.id for s in plan.sites if s.kind is SiteKind.EXIT}
    per_block: dict[str, int] = defaultdict(int)
    warps = 0
    for launch in rec.launches:
        rows = launch.decode().rows
        when = times(rows).tolist()
        for warp in np.unique(rows["warp"]).tolist():
            mine = np.flatnonzero(rows["warp"] == warp).tolist()
            warps += 1
            alive, last = 0, None
            for i in mine:
                site, mask = int(rows["site"][i]), int(rows["mask"][i])
                if site in exits:
                    alive &= ~mask
                    if alive:
                        continue  # some lanes left: the warp goes on
                if last is not None:
                    per_block[last[0]] += when[i] - last[1]
                    last = None
                if site in exits:
                    break
                alive |= mask
                last = (f"block {plan.sites[site].block}", when[i])
    return dict(per_block), warps


@pytest.mark.parametrize(
    "source",
    ["model-exact", "model-chunks", *(p.name for p in DEVICE_RECORDINGS)],
)
def test_a_recording_replays_into_the_warp_summary_it_implies(tmp_path: Path, source: str) -> None:
    """Recordings of the device script (tests/data/gpu/traces_*.npz, once the lead has run it)
    and of the model: the summary's warp time per block and warp count equal what the
    recording's own events say."""
    from pyhpctk.instrument.tracing.recording import load
    from pyhpctk.present.warps import warp_summary

    if source.startswith("model-"):
        path = tmp_path / "rec.npz"
        model_recording(path, Strategy(source.split("-")[1]), launches=2)
    else:
        path = Path(__file__).parent / "data" / "gpu" / source
    launches = len(load(path).launches)
    per_block, warps = _recorded_block_times(path)
    (kernel,) = warp_summary(open_database(_replay(tmp_path, path, launches)).experiment)
    assert (kernel.per_block, len(kernel.warps)) == (per_block, warps)


def test_lost_events_are_counted_and_said_in_pyruns_summary(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rec.npz"
    runs = model_recording(path, Strategy.CHUNKS, launches=1, cap_bytes=32 * 64 * 3)  # 3 chunks
    total = sum(len(w.events) for run in runs for w in run)
    from pyhpctk.instrument.tracing.recording import load

    (launch,) = load(path).launches
    kept = len(launch.decode().rows)
    assert 0 < kept < total and launch.lost == total - kept
    _replay(tmp_path, path, 1)
    err = capfd.readouterr().err
    assert (f"pyrun: gpu: warp traces: {total - kept} events found no room in the trace buffer "
            "(1 of 1 traced launches); they are counted, not traced") in err  # fmt: skip


def test_the_html_report_draws_the_first_launchs_warps_per_sm_and_slot(tmp_path: Path) -> None:
    """The report's warp section: a lane per SM and warp slot of the first traced launch, its
    segments the truth's blocks and durations, under the text of pyview --warps; it renders
    in Chromium without an error (browser-marked part below)."""
    from pyhpctk.present.html import report_data

    db, runs = _measure(tmp_path, Strategy.EXACT)
    database = open_database(db)
    data = report_data(database, database.view("top-down"))
    warps = data["warps"]
    first = _truth([runs[0]])
    want = {f"GPU 0 SM {sm} / warp slot {slot}": [b for warp in lane for b in warp]
            for (sm, slot), lane in sorted(first.items())}  # fmt: skip
    got = {row["name"]: [(warps["names"][int(f)], int(d)) for _, d, f in row["s"]]
           for row in warps["rows"]}  # fmt: skip
    assert got == want
    assert list(got) == list(want)  # ordered by SM, then slot
    assert "longest warp: SM" in warps["text"]
    # the program's timeline keeps the CPU threads and streams, not the warps
    timeline = data["timeline"]
    assert timeline is None or not any("warp slot" in row["name"] for row in timeline["rows"])


@pytest.mark.browser
def test_the_warp_section_renders_in_chromium(tmp_path: Path) -> None:
    from pyhpctk.present.html import render_html
    from test_pyview_html import run_in_browser

    db, runs = _measure(tmp_path, Strategy.CHUNKS)
    database = open_database(db)
    result = run_in_browser(render_html(database, database.view("top-down")), tmp_path)
    assert result["errors"] == [] and result["ready"] == "yes" and result["warpsShown"]
    lanes = [f"GPU 0 SM {sm} / warp slot {slot}" for sm, slot in sorted(_truth([runs[0]]))]
    assert result["warpLanes"] == lanes and result["warpCanvases"] == len(lanes)
    assert "imbalance across SMs" in result["warpSummary"]


def test_a_damaged_recording_is_refused_before_the_program_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyhpctk.cli.pyrun import main as pyrun_main

    path = tmp_path / "rec.npz"
    model_recording(path, Strategy.EXACT, launches=1)
    path.write_bytes(path.read_bytes()[:300])
    out = tmp_path / "m"
    event = f"gpu=simulated,traces={path}"
    assert pyrun_main(["-e", event, "-o", str(out), sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert err == (f"pyrun: error: gpu=simulated: traces={path}: warp trace recording: bad "
                   "content: File is not a zip file\n")  # fmt: skip
    assert not out.exists()


def test_the_trace_summary_folds_the_warp_lines_into_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyhpctk.cli.pyview import main as pyview_main

    db, runs = _measure(tmp_path, Strategy.EXACT)
    capsys.readouterr()
    assert pyview_main(["--trace-summary", str(db)]) == 0
    text = capsys.readouterr().out
    slots = {(w.sm, w.slot) for run in runs for w in run}
    sms = {sm for sm, _ in slots}
    assert (
        f"  {len(slots)} warp slots on {len(sms)} SMs of traced kernels: see pyview --warps\n"
        in text
    )
    assert "CORE" not in text
