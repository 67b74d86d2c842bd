"""Counts the device measured, replayed without a GPU (issue #34, CI part): kernels.cu as nvcc
compiled it on an H100 (tests/data/ptx/kernels_sm90_h100.ptx) and the block counts the
instrumented kernels left there, in both probe modes (device_counts_h100.json, written from
tests/data/gpu/device_ptx.sh's output). The pass's CFG of that PTX must give each block count
its place: the counts each kernel's arithmetic implies (stores, atomics, multiply-adds, loop
trips, computed on the device from the inputs) follow from the recorded block counts and the
instructions our parser finds in each block."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from ptx_helpers import PTX_DIR
from pyhpctk.instrument.ptx import Cfg, Mode, assemble, build, find_loops, instrument, parse

PTX = PTX_DIR / "kernels_sm90_h100.ptx"
RECORD = json.loads((PTX_DIR / "device_counts_h100.json").read_text())


def _executed(cfg: Cfg, counts: list[int], *prefixes: str) -> int:
    return sum(
        threads * sum(1 for i in b.instructions if cfg.statement(i).opcode.startswith(prefixes))
        for b, threads in zip(cfg.blocks, counts, strict=True)
    )


def _single_loop_header(cfg: Cfg, counts: list[int]) -> int:
    (loop,) = find_loops(cfg).loops
    return counts[loop.header]


TRUTHS: dict[str, dict[str, Callable[[Cfg, list[int]], int]]] = {
    "stencil": {"stores": lambda cfg, c: _executed(cfg, c, "st.global")},
    "reduce": {
        "shared stores": lambda cfg, c: _executed(cfg, c, "st.shared"),
        "global stores": lambda cfg, c: _executed(cfg, c, "st.global"),
    },
    "matmul": {"fma per thread and k": lambda cfg, c: _executed(cfg, c, "fma.rn.f32")},
    "bfs": {
        "loop trips (sum of frontier degrees)": _single_loop_header,
        "marks (unvisited neighbours)": lambda cfg, c: _executed(cfg, c, "st.global"),
    },
    "wavefront": {"cells written": lambda cfg, c: _executed(cfg, c, "st.global")},
    "histogram": {
        "shared atomics": lambda cfg, c: _executed(cfg, c, "atom.shared", "red.shared"),
        "global atomics": lambda cfg, c: _executed(cfg, c, "atom.global", "red.global"),
    },
    "softmax": {"stores": lambda cfg, c: _executed(cfg, c, "st.global")},
}


@pytest.mark.parametrize("mode", [m.value for m in Mode])
@pytest.mark.parametrize("kernel", sorted(TRUTHS))
def test_recorded_counts_imply_each_kernels_arithmetic(kernel: str, mode: str) -> None:
    cfg = build(parse(PTX.read_text()).function(kernel))
    counts = RECORD["kernels"][kernel][mode]["block_threads"]
    assert len(counts) == len(cfg.blocks)
    checks = RECORD["checks"]
    assert counts[0] == checks[f"{kernel} {mode}: threads entering"]
    for what, truth in TRUTHS[kernel].items():
        assert truth(cfg, counts) == checks[f"{kernel} {mode}: {what}"], what


@pytest.mark.parametrize("kernel", sorted(TRUTHS))
def test_both_modes_measured_the_same_thread_counts_and_whole_warps(kernel: str) -> None:
    record = RECORD["kernels"][kernel]
    assert record["edges"]["block_threads"] == record["blocks"]["block_threads"]
    warps, threads = record["blocks"]["block_warps"][0], record["blocks"]["block_threads"][0]
    assert warps * 32 == threads  # every launch used whole warps, all entering


def test_ptx_recorded_on_the_device_instruments_and_assembles_here() -> None:
    text = PTX.read_text()
    for mode in Mode:
        result = instrument(text, mode)
        assert sorted(result.plans) == sorted(TRUTHS)
        assemble(result.ptx, "sm_90")
