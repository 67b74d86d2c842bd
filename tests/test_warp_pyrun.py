"""``pyrun -e gpu=nvidia,trace``: the framework hooks trace the kernels they load, and pyrun's
launch callbacks arm and read one pool of chunks around each launch (issue #34, item 4).

No GPU: the device is :class:`warp_helpers.FakeMemory`, a framework hook loads Triton's bfs
kernel (its PTX compiled here) into it, and each launch is what the probes do
(:func:`warp_helpers.run_probes`) on a schedule whose every event the test knows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ptx_helpers import triton_ptx
from pyhpctk.instrument.frameworks import Collector
from pyhpctk.instrument.ptx import CONTROL, TracedModule
from pyhpctk.instrument.tracing.decode import WarpEvents
from pyhpctk.measure.gpu.cupti.warp_reader import TraceReader
from pyhpctk.measure.gpu.kernel_filter import KernelFilter
from warp_helpers import (
    BLOCK,
    GRID,
    PROGRAM,
    FakeMemory,
    WarpRun,
    model_paths,
    run_probes,
    schedule,
)


class Monitor:
    """What the reader tells pyrun's monitor."""

    def __init__(self) -> None:
        self.traces: list[tuple[int, str, WarpEvents]] = []
        self.skipped: list[tuple[str, str]] = []

    def warp_trace(self, correlation: int, plan: Any, events: WarpEvents, device: int = 0) -> None:
        self.traces.append((correlation, plan.kernel, events))

    def instrumentation_skipped(self, what: str, reason: str) -> None:
        self.skipped.append((what, reason))


def loader(memory: FakeMemory, loaded: list[TracedModule]) -> type:
    """A framework whose program compiles and loads Triton's bfs kernel once it is installed:
    its PTX through the collector, its ``.global`` symbols allocated in ``memory``."""

    class Loader:
        name, distributions, supported = "triton", ("triton",), ((0, 0),)

        def install(self, collector: Collector) -> None:
            result = collector.rewrite("triton", triton_ptx("bfs").read_text())
            assert isinstance(result, TracedModule)
            symbols: dict[str, int] = {}

            def locate(symbol: str) -> int:
                if symbol not in symbols:  # a module's .global: zeroed at load
                    symbols[symbol] = memory.alloc(8 * len(CONTROL))
                    memory.zero(symbols[symbol], 8 * len(CONTROL))
                return symbols[symbol]

            def read(symbol: str, n: int) -> np.ndarray:
                return memory.read(locate(symbol), n)

            collector.loaded("triton", result, read, lambda s, n: memory.zero(locate(s), n), locate)
            loaded.append(result)

        def uninstall(self) -> None:
            pass

    return Loader


def reader_with_bfs(
    cap: int = 1 << 20, kernels: KernelFilter | None = None
) -> tuple[TraceReader, FakeMemory, Monitor, int]:
    memory, monitor, loaded = FakeMemory(), Monitor(), list[TracedModule]()
    reader = TraceReader(cap, kernels, memory)
    reader.start(monitor, {"triton": loader(memory, loaded)})  # type: ignore[arg-type, dict-item]
    assert reader.collector is not None and reader.collector.loaded_modules
    module = reader.collector.loaded_modules[0]
    assert module.locate is not None
    return reader, memory, monitor, module.locate(loaded[0].plans["bfs"].control)


def launch(reader: TraceReader, memory: FakeMemory, control: int, correlation: int,
           trips: list[int]) -> list[WarpRun]:  # fmt: skip
    """One launch as pyrun sees it: the API call's entry, the kernel's probes, its exit."""
    reader.kernel_starting()
    warps = schedule(PROGRAM, GRID, BLOCK, model_paths(np.array(trips)))
    run_probes(memory, control, GRID, BLOCK, warps)
    reader.kernel_ended(correlation)
    return warps


def sites_per_warp(events: WarpEvents) -> dict[tuple[int, int], list[int]]:
    """Each warp's sites in order, keyed by (CTA, warp slot): what the events say."""
    out: dict[tuple[int, int], list[int]] = {}
    for row in events.rows:
        out.setdefault((int(row["cta_x"]), int(row["slot"])), []).append(int(row["site"]))
    return out


def truth(warps: list[WarpRun]) -> dict[tuple[int, int], list[int]]:
    return {(w.cta[0], w.slot): [site for site, _, _ in w.events] for w in warps}


def test_each_launch_reaches_the_monitor_with_its_own_warps_events() -> None:
    reader, memory, monitor, control = reader_with_bfs()
    first = launch(reader, memory, control, 11, [5, 0, 3, 2, 7, 1])
    second = launch(reader, memory, control, 12, [0, 0, 0, 1, 1, 1])  # fewer events: no stale
    reader.kernel_ended(13)  # another kernel's launch: nothing of bfs ran
    assert [(c, k) for c, k, _ in monitor.traces] == [(11, "bfs"), (12, "bfs")]
    assert sites_per_warp(monitor.traces[0][2]) == truth(first)
    assert sites_per_warp(monitor.traces[1][2]) == truth(second)
    assert [events.lost for _, _, events in monitor.traces] == [0, 0]
    assert reader.traced == 2
    reader.stop()
    words = memory.array(control, np.uint64, len(CONTROL))
    assert words[CONTROL.CHUNKS] == 0 and words[CONTROL.EVENTS] == 0  # disarmed, pool freed
    assert len(memory.freed) == 1


def test_a_full_pool_loses_no_event_silently() -> None:
    reader, memory, monitor, control = reader_with_bfs(cap=2048 * 4)  # 4 chunks of 64 events
    warps = launch(reader, memory, control, 7, [5, 0, 3, 2, 7, 1])
    events = monitor.traces[0][2]
    written = sum(len(w.events) for w in warps)
    # 12 warps want a chunk each, 4 get one: every event of the 8 others is counted as lost
    assert events.lost > 0 and len(events.rows) + events.lost == written
    assert len(sites_per_warp(events)) == 4


def test_the_launch_window_chooses_the_traced_launches() -> None:
    reader, memory, monitor, control = reader_with_bfs(kernels=KernelFilter("", 1, 1))
    for correlation in (1, 2, 3):
        launch(reader, memory, control, correlation, [1, 2, 3, 0, 1, 2])
    assert [c for c, _, _ in monitor.traces] == [2]


def test_pyrun_takes_the_trace_option_with_a_kernel_filter(tmp_path: Path) -> None:
    from pyhpctk.measure.gpu.cupti import check, make
    from pyhpctk.measure.gpu.spec import parse_gpu_event

    spec = parse_gpu_event("gpu=nvidia,trace,tracebytes=64M,kernel-name=^bfs$,launch-count=2")
    check(spec)
    backend = make(spec)
    reader = backend.fine.blocks  # type: ignore[attr-defined]
    assert isinstance(reader, TraceReader)
    assert reader.cap_bytes == 64 << 20 and reader.filter == KernelFilter("^bfs$", 0, 2)


@pytest.mark.skipif(sys.platform != "linux", reason="CUPTI callbacks: Linux")
def test_the_launch_entry_arms_through_the_backends_busy_calls() -> None:
    from pyhpctk.measure.gpu.cupti.fine import FineCounting

    reader, *_ = reader_with_bfs()
    fine = FineCounting(blocks=reader)
    seen: list[bool] = []
    arm = reader._arm

    def watched(address: int, off: bool = False) -> None:
        seen.append(fine.busy)
        arm(address, off)

    reader._arm = watched  # type: ignore[method-assign]
    fine.kernel_starting()
    assert seen == [True] and not fine.busy  # its copy is the backend's own, left out


def test_the_h100s_chunk_recording_replays_through_the_reader_unchanged() -> None:
    """gpu=simulated,traces=FILE runs a chunk recording through pyrun's reader: every launch's
    events reach the monitor exactly as the H100 left them (the recording's own decode)."""
    from pyhpctk.instrument.tracing.recording import load
    from pyhpctk.measure.gpu.simulated.trace_replay import ChunkReplay, replayable

    recording = load(Path(__file__).parent / "data" / "gpu" / "traces_chunks_h100.npz")
    assert replayable(recording)
    monitor, replay = Monitor(), ChunkReplay(recording)
    for correlation in (5, 6, 7):
        replay.launched(monitor, correlation)  # type: ignore[arg-type]
    replay.stop()
    assert [(c, k) for c, k, _ in monitor.traces] == [(5, "frontier"), (6, "frontier"),
                                                      (7, "frontier")]  # fmt: skip
    truth = [t.decode() for t in recording.launches]
    for (_, _, events), expected in zip(monitor.traces, [*truth, truth[0]], strict=True):
        assert events.lost == expected.lost
        assert events.rows.tobytes() == expected.rows.tobytes()
    assert len(truth[0].rows) == 84_088 and monitor.skipped == []  # the recording's events


def test_pyruns_summary_says_the_launches_traced_and_what_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reader, memory, _, control = reader_with_bfs()
    for correlation in (1, 2):
        launch(reader, memory, control, correlation, [1, 2, 3, 0, 1, 2])
    reader.stop()
    assert capsys.readouterr().err == (
        "pyrun: gpu: trace: 2 launches traced (chunks, a pool of 1 MiB)\n"
    )
    broken, memory, _, _ = reader_with_bfs()

    def refuse(address: int, data: np.ndarray) -> None:
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    memory.write = refuse  # type: ignore[method-assign]
    broken.kernel_starting()
    broken.kernel_ended(3)
    broken.stop()
    assert capsys.readouterr().err.splitlines() == [
        "pyrun: gpu: trace: 0 launches traced (chunks, a pool of 1 MiB)",
        "pyrun: gpu: trace: arming the trace buffers failed (CUDA_ERROR_ILLEGAL_ADDRESS); "
        "later launches are not traced",
    ]
