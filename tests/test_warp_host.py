"""The host's side of per-warp traces (issue #34 item 4), without a GPU: the launcher's two
strategies against a model of what the probes do (tests/warp_helpers.py), the exact strategy's
save and restore, no event lost silently, decoding, times, recordings, and the memory a
launch's arguments let it write."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ptx_helpers import triton_ptx
from pyhpctk.errors import FormatError
from pyhpctk.instrument.ptx import CONTROL, Sites, Strategy, instrument_traces
from pyhpctk.instrument.tracing import recording
from pyhpctk.instrument.tracing.buffers import ExactLayout
from pyhpctk.instrument.tracing.decode import as_events, decode_exact, times
from pyhpctk.instrument.tracing.memory import writable_regions
from warp_helpers import BLOCK, GRID, PROGRAM, FakeMemory, Program, WarpRun
from warp_helpers import model_setup as _setup


def _truth(warps: list[WarpRun]) -> dict[int, list[tuple[int, int, int]]]:
    return {w.grid_index(GRID, BLOCK): w.events for w in warps}


def _decoded(events: np.ndarray) -> dict[int, list[tuple[int, int, int]]]:
    out: dict[int, list[tuple[int, int, int]]] = {}
    for row in events:
        out.setdefault(int(row["warp"]), []).append((int(row["site"]), int(row["time"]),
                                                      int(row["mask"])))  # fmt: skip
    return out


def test_the_exact_strategy_counts_then_traces_the_same_inputs_and_the_program_sees_one_run() -> (
    None
):
    memory, launcher, kernel = _setup()
    x0 = memory.array(kernel.x, np.int32, GRID[0]).copy()
    regions = [(kernel.x, 4 * GRID[0]), (kernel.y, 4 * GRID[0])]
    trace = launcher.launch(kernel, GRID, BLOCK, regions)
    counting, traced = kernel.runs
    assert _truth(counting) == _truth(traced)  # the traced pass saw the inputs the count saw
    events = trace.decode()
    assert trace.lost == 0 and _decoded(events.rows) == _truth(traced)
    assert trace.counted is not None and trace.counted.tolist() == [len(w.events) for w in traced]
    # what the program sees is one run: y = x0, x = x0 + 1
    assert memory.array(kernel.y, np.int32, GRID[0]).tolist() == x0.tolist()
    assert memory.array(kernel.x, np.int32, GRID[0]).tolist() == (x0 + 1).tolist()
    assert set(memory.blocks) == {launcher.control, kernel.x, kernel.y}  # the rest freed


def test_without_the_saved_memory_the_traced_pass_would_see_other_inputs() -> None:
    """Why the launcher saves and restores: the counting pass changed x, so a traced pass from
    there takes other paths; the events that find no room are counted, never silently lost."""
    _, launcher, kernel = _setup()
    trace = launcher.launch(kernel, GRID, BLOCK, writable=())
    counting, traced = kernel.runs
    assert _truth(counting) != _truth(traced)
    events = trace.decode()
    assert len(events.rows) + trace.lost == sum(len(w.events) for w in traced)
    assert trace.lost > 0


def test_the_chunk_strategy_takes_one_chunk_per_filled_chunk_and_keeps_each_warps_order() -> None:
    _, launcher, kernel = _setup()
    launcher.plan = instrument_traces(triton_ptx("bfs").read_text(), Strategy.CHUNKS).plans["bfs"]
    launcher.chunk_events = 4
    trace = launcher.launch(kernel, GRID, BLOCK)
    (run,) = kernel.runs  # one run: nothing to save
    events = trace.decode()
    assert trace.lost == 0
    assert trace.taken == sum(-(-len(w.events) // 4) for w in run)  # one atomic per chunk
    by_key = {(w.cta, w.sm, w.slot): w.events for w in run}
    decoded = _decoded(events.rows)
    keys = {
        int(r["warp"]): ((int(r["cta_x"]), 0, 0), int(r["sm"]), int(r["slot"])) for r in events.rows
    }
    assert {keys[w]: e for w, e in decoded.items()} == by_key


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
def test_a_full_buffer_loses_no_event_silently(strategy: Strategy) -> None:
    _, launcher, kernel = _setup()
    launcher.plan = instrument_traces(triton_ptx("bfs").read_text(), strategy).plans["bfs"]
    launcher.cap_bytes, launcher.chunk_events = 32 * 24, 4  # room for 24 of the events
    trace = launcher.launch(kernel, GRID, BLOCK, [(kernel.x, 24)])
    run = kernel.runs[-1]
    events = trace.decode()
    total = sum(len(w.events) for w in run)
    assert 0 < len(events.rows) <= 24 and len(events.rows) + trace.lost == total
    truth = {(w.cta, w.sm, w.slot): w.events for w in run}
    for warp, got in _decoded(events.rows).items():  # each warp keeps the start of its trace
        row = events.rows[events.rows["warp"] == warp][0]
        want = truth[((int(row["cta_x"]), 0, 0), int(row["sm"]), int(row["slot"]))]
        assert got == want[: len(got)]


def test_the_exact_layout_gives_each_warp_its_count_or_its_share_of_a_cap() -> None:
    layout = ExactLayout.from_tallies(np.array([3, 0, 5, 2], np.uint32))
    assert layout.table().tolist() == [[0, 3], [3, 3], [3, 8], [8, 10]] and layout.nbytes == 320
    capped = ExactLayout.from_tallies(np.array([30, 0, 50, 20], np.uint32), cap_events=10)
    assert capped.sizes.tolist() == [3, 0, 5, 2] and capped.events == 10


def test_decoding_refuses_a_buffer_that_is_no_events_and_a_table_past_it() -> None:
    with pytest.raises(ValueError, match="33 bytes are no whole number of 32-byte events"):
        as_events(bytes(33))
    with pytest.raises(ValueError, match="the table reaches slot 3, the buffer holds 2 events"):
        decode_exact(bytes(64), np.array([[0, 3]], np.uint32))


def test_times_take_the_clock_where_the_timer_ticks_in_microseconds() -> None:
    """An SM's cycles at its rate (measured over the launch) give each warp's durations to
    within the rate's error (1 µs over the SM's span); the timer alone rounds them to whole
    microseconds."""
    _, launcher, kernel = _setup(Strategy.CHUNKS)
    durations = {b: 101 * n for b, n in PROGRAM.durations.items()}  # 5 µs to 30 µs a block
    kernel.program = Program(PROGRAM.sites, PROGRAM.exit_site, durations)
    kernel.memory.write(kernel.x, np.full(GRID[0], 3, np.int32))  # 3 trips: 180 µs a warp
    trace = launcher.launch(kernel, GRID, BLOCK)
    rows = trace.decode().rows.copy()
    exact = np.diff(rows["time"].astype(np.int64))
    rows["time"] = rows["time"] // 1000 * 1000  # a timer of 1 µs steps
    same_warp = np.diff(rows["warp"].astype(np.int64)) == 0
    clocked = np.abs(np.diff(times(rows)) - exact)[same_warp]
    timer_only = np.abs(np.diff(rows["time"].astype(np.int64)) - exact)[same_warp]
    assert clocked.max() <= 1 + exact[same_warp].max() * 1000 // 180_000
    assert timer_only.max() >= 500 and clocked.max() < timer_only.max() / 2


def test_a_recording_round_trips_and_a_damaged_one_is_one_line(tmp_path: Path) -> None:
    _, launcher, kernel = _setup()
    trace = launcher.launch(kernel, GRID, BLOCK, [(kernel.x, 24), (kernel.y, 24)])
    rec = recording.TraceRecording("bfs", triton_ptx("bfs").read_text(), Strategy.EXACT,
                                   Sites.BLOCKS, (), [trace], {"name": "model"})  # fmt: skip
    path = tmp_path / "bfs.npz"
    recording.save(rec, path)
    back = recording.load(path)
    assert back.plan() == launcher.plan and back.device == {"name": "model"}
    (launch,) = back.launches
    assert launch.grid == GRID and launch.lost == 0
    assert (launch.decode().rows == trace.decode().rows).all()
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(FormatError) as caught:
        recording.load(path)
    assert str(caught.value).startswith(f"{path}: warp trace recording: bad content: ")
    assert "\n" not in str(caught.value)


def test_the_memory_a_launch_may_write_is_each_argument_allocation_whole() -> None:
    cupy_like = SimpleNamespace(data=SimpleNamespace(mem=SimpleNamespace(ptr=0x1000, size=4096)))
    view = SimpleNamespace(data=SimpleNamespace(mem=SimpleNamespace(ptr=0x1000, size=4096)))
    storage = SimpleNamespace(data_ptr=lambda: 0x9000, nbytes=lambda: 256)
    torch_like = SimpleNamespace(is_cuda=True, untyped_storage=lambda: storage)
    strided = SimpleNamespace(
        __cuda_array_interface__={
            "data": (0x20000, False),
            "shape": (4, 3),
            "typestr": "<f4",
            "strides": (24, 4),
        }
    )
    touching = SimpleNamespace(__cuda_array_interface__={
        "data": (0x2000, False), "shape": (16,), "typestr": "<u8"})  # fmt: skip
    regions = writable_regions([cupy_like, 3, np.float32(1), view, torch_like, strided, touching])
    # an allocation that starts where another ends is another: one copy may not span both
    assert regions == [(0x1000, 4096), (0x2000, 128), (0x9000, 256), (0x20000, 3 * 24 + 12)]


def test_arguments_in_allocations_end_to_end_are_saved_each_on_its_own() -> None:
    """CuPy's pool and the driver hand out allocations end to end; joined into one region, the
    save's copy spans two allocations, which the driver refuses (cuMemcpyDtoD_v2: error 1,
    CUDA_ERROR_INVALID_VALUE, in traces_device.py on the H100)."""
    memory, launcher, kernel = _setup(memory=FakeMemory(packed=True))
    assert kernel.y == kernel.x + 512  # the model's two arrays, end to end
    args = [SimpleNamespace(data=SimpleNamespace(mem=SimpleNamespace(ptr=a, size=512)))
            for a in (kernel.x, kernel.y)]  # fmt: skip
    x0 = memory.array(kernel.x, np.int32, GRID[0]).copy()
    trace = launcher.launch(kernel, GRID, BLOCK, writable_regions(args))
    assert trace.lost == 0 and trace.saved_bytes == 1024
    assert memory.array(kernel.y, np.int32, GRID[0]).tolist() == x0.tolist()
    assert memory.array(kernel.x, np.int32, GRID[0]).tolist() == (x0 + 1).tolist()


def test_the_chunk_strategy_splits_around_a_launch_it_does_not_make() -> None:
    """begin_chunks at a launch's enter, finish_chunks at its exit (a launch callback's way):
    the same events as a launch the launcher makes, the pool freed, the control block reset."""
    memory, launcher, kernel = _setup(Strategy.CHUNKS)
    pending = launcher.begin_chunks(GRID, BLOCK)
    kernel()  # the program's own launch
    trace = launcher.finish_chunks(pending)
    (run,) = kernel.runs
    assert trace.lost == 0 and len(trace.decode().rows) == sum(len(w.events) for w in run)
    assert set(memory.blocks) == {launcher.control, kernel.x, kernel.y}
    words = memory.array(launcher.control, np.uint64, 8)
    assert words[CONTROL.EVENTS] == 0 and words[CONTROL.CHUNKS] == 0


@pytest.mark.parametrize("strategy", list(Strategy), ids=lambda s: s.value)
def test_a_launch_that_fails_leaves_no_probe_pointing_at_freed_memory(strategy: Strategy) -> None:
    memory, launcher, kernel = _setup(strategy)

    def fails() -> None:
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"):
        launcher.launch(fails, GRID, BLOCK, [(kernel.x, 24)])
    assert set(memory.blocks) == {launcher.control, kernel.x, kernel.y}
    assert not memory.array(launcher.control, np.uint64, 8).any()
