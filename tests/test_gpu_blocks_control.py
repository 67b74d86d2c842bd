"""Choosing what gpu=...,blocks counts (issue #34, item 5): the options pyrun -L lists, their
refusals in one line before anything runs, and the CUPTI side's per-launch read of the counter
globals (its driver calls replaced by arrays), without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.instrument.frameworks import Collector
from pyhpctk.instrument.ptx import Buffer, Mode, instrument
from pyhpctk.measure.gpu.cupti.blocks import BlockReader
from pyhpctk.measure.gpu.kernel_filter import KernelFilter

LOOP_PTX = """
.version 8.0
.target sm_90
.address_size 64

.visible .entry spin(.param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    ld.param.u32 %r1, [n];
    mov.u32 %r2, 0;
$L_loop:
    add.s32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra $L_loop;
    ret;
}
"""


def test_pyrun_lists_blocks_and_its_kernel_filter(capsys: pytest.CaptureFixture[str]) -> None:
    assert pyrun_main(["-L"]) == 0
    listing = capsys.readouterr().out
    for option in ("blocks[=edges|warps]", "kernel-name=REGEX", "launch-skip=N", "launch-count=M"):
        assert f"      {option}" in listing, option
    assert "blocks=FILE" in listing  # gpu=simulated's replay


WHICH = "blocks counts or trace traces: add one of them"


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (
            "gpu=nvidia,kernel-name=gemm",
            "kernel-name= chooses the kernels or launches that " + WHICH,
        ),
        (
            "gpu=simulated,launch-count=2",
            "launch-count= chooses the kernels or launches that " + WHICH,
        ),
        ("gpu=nvidia,blocks,launch-skip=-1", "launch-skip='-1': say a number >= 0"),
        ("gpu=nvidia,blocks,launch-count=two", "launch-count='two': say a number >= 0"),
        ("gpu=nvidia,blocks,kernel-name=a[", "kernel-name='a[' is no regular expression"),
        ("gpu=nvidia,blocks,kernel-name=", "kernel-name= needs a regular expression"),
        ("gpu=nvidia,blocks=sideways", "blocks='sideways': say blocks, blocks=edges or"),
        ("gpu=nvidia,blocks,inst", "blocks excludes pc and inst"),
        ("gpu=simulated,blocks", "say blocks=RECORDING"),
        ("gpu=simulated,blocks=/nonexistent/b.json", "blocks=/nonexistent/b.json: no such file"),
    ],
)
def test_bad_block_options_are_refused_in_one_line_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], event: str, message: str
) -> None:
    out, marker = tmp_path / "m", tmp_path / "ran"
    program = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    assert pyrun_main(["-e", event, "-o", str(out), *program]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not out.exists() and not marker.exists()


class Monitor:
    """What the reader tells the monitor (MonitorPort's block methods)."""

    def __init__(self) -> None:
        self.counts: list[tuple[int, str, list[int]]] = []
        self.modules = 0
        self.skips: list[tuple[str, str]] = []

    def instrumented_module(self, module: object) -> None:
        self.modules += 1

    def block_counts(self, correlation: int, module: object, kernel: str, counters: np.ndarray):  # type: ignore[no-untyped-def]
        self.counts.append((correlation, kernel, counters[:, 1].tolist()))

    def instrumentation_skipped(self, what: str, reason: str) -> None:
        self.skips.append((what, reason))


def test_each_launch_is_read_after_it_and_zeroed_within_the_launch_window() -> None:
    """launch-skip=1, launch-count=2: of four launches of spin (each leaving its own counts in
    the module's global), the 2nd and 3rd reach the monitor under their correlation ids; the
    first is read and zeroed but not counted; after the window nothing is read (no
    synchronization); a launch of another kernel (nothing counted) does not take an index."""
    result = instrument(LOOP_PTX, Mode.EDGES, {"spin"}, Buffer.GLOBAL)
    plan = result.plans["spin"]
    memory = {result.counter_globals["spin"]: np.zeros(result.counter_bytes("spin"), np.uint8)}
    synced: list[int] = []

    def read(symbol: str, nbytes: int) -> np.ndarray:
        return memory[symbol][:nbytes].copy()

    def zero(symbol: str, nbytes: int) -> None:
        memory[symbol][:nbytes] = 0

    def run_spin(threads: int) -> None:  # the kernel's own probes: every counter by `threads`
        view = memory[result.counter_globals["spin"]].view(np.uint64).reshape(-1, 2)
        view = view[: plan.counters]  # the first SM's replica
        view[:, 1] += np.uint64(threads)
        view[:, 0] += np.uint64(threads // 32)

    reader = BlockReader("edges", KernelFilter("", 1, 2))
    reader.synchronize = lambda: synced.append(1)
    monitor = Monitor()
    reader.monitor = monitor  # type: ignore[assignment]
    reader.collector = Collector(Mode.EDGES)
    reader.collector.listener = reader._loaded
    reader.collector.loaded("test", result, read, zero)
    assert monitor.modules == 1  # announced as it loads, before any launch
    reader.kernel_ended(100)  # another kernel: nothing counted, no index taken
    for correlation, threads in ((101, 32), (102, 64), (103, 96), (104, 128)):
        run_spin(threads)
        reader.kernel_ended(correlation)
    counters = plan.counters
    assert monitor.counts == [(102, "spin", [64] * counters), (103, "spin", [96] * counters)]
    assert len(synced) == 4  # 100, 101, 102, 103: after the window no read, no synchronization
    assert reader.index == 3


@pytest.mark.parametrize("mode", ["edges", "blocks"])
def test_pyruns_counters_keep_a_loops_counts_in_registers(mode: str) -> None:
    """gpu=nvidia,blocks instruments as instrument(registers=True) does: no atomic in a loop
    (on the H100 the Triton set's median kernel time was 4.31x plain with one per warp on every
    trip, 1.07x with registers)."""
    rewritten = BlockReader(mode).new_collector().rewrite("test", LOOP_PTX)
    assert rewritten is not None
    wanted = instrument(LOOP_PTX, Mode(mode), buffer=Buffer.GLOBAL, registers=True)
    assert rewritten.ptx == wanted.ptx
    if mode == "blocks":  # the loop's block counts itself
        trip = rewritten.ptx.split("$L_loop:")[1].split("@%p1 bra $L_loop;")[0]
    else:  # the back edge's count, in a block split off the loop's end
        trip = rewritten.ptx.split("$L__pyhpctk__split0:")[1].split("bra $L_loop;")[0]
    assert "red.global" not in trip and "add.u64 %__pyhpctk_t" in trip, trip


def test_a_module_pyrun_cannot_save_is_said_and_never_raises_into_the_framework(
    tmp_path: Path,
) -> None:
    """The PTX of a loaded module is saved in the measurement before its kernels run; where
    that fails (here the output directory is a file) the module's launches are refused with
    one line at exit, and neither the framework's load nor CUPTI's callback sees an error."""
    import types

    from pyhpctk.measure.gpu.attribution import KernelTable
    from pyhpctk.measure.gpu.blocks import BlockCounting

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    session = types.SimpleNamespace(options=types.SimpleNamespace(output_dir=str(blocked)))
    counting = BlockCounting(session, KernelTable())  # type: ignore[arg-type]
    result = instrument(LOOP_PTX, Mode.EDGES, {"spin"}, Buffer.GLOBAL)
    counters = np.ones((result.plans["spin"].counters, 2), np.uint64)
    assert counting.module(result) is None
    counting.counts(7, result, "spin", counters)  # a launch of it: refused, not raised
    assert counting.stats["refused"] == 1 and counting.stats["launches"] == 0
    (error,) = counting.errors
    assert error.startswith("pyrun: gpu: blocks: spin: ") and error.endswith("; not counted")
