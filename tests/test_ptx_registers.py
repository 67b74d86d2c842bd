"""Counters of loops kept in registers (``instrument(..., registers=True)``): a loop's trips add
to two registers of the thread, and threads add them to the counter buffer where they leave
the kernel, so no atomic runs inside a loop (hip-analyzer's registers; issue #34 item 3's cost).

No GPU: every fixture instrumented this way assembles with ptxas (both modes); in the result,
no block of a loop holds a ``red.global`` and every path to the kernel's end passes the flush;
the plans, and so the derivation of counts, are those of the atomic probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptx_helpers import NVCC_PTX, SHAPES_PTX, TRITON_KERNELS, triton_ptx
from pyhpctk.instrument.ptx import Buffer, Mode, assemble, build, find_loops, instrument, parse
from pyhpctk.instrument.ptx.rewrite import MAX_REGISTER_COUNTERS, register_counters

FIXTURES = [
    pytest.param(NVCC_PTX, "sm_90", id="nvcc"),
    pytest.param(SHAPES_PTX, "sm_90", id="shapes"),
    *(pytest.param(triton_ptx(k), "sm_90a", id=f"triton-{k}") for k in TRITON_KERNELS),
]


def _atomics_in_loops(ptx: str, kernel: str) -> list[int]:
    """PTX lines of the ``red.global`` instructions inside loops of ``kernel``."""
    cfg = build(parse(ptx).function(kernel))
    inside = {b for loop in find_loops(cfg).loops for b in loop.blocks}
    return [
        cfg.statement(i).line
        for b in sorted(inside)
        for i in cfg.blocks[b].instructions
        if cfg.statement(i).opcode.startswith("red.global")
    ]


@pytest.mark.parametrize(("path", "arch"), FIXTURES)
@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_register_counters_assemble_keep_loops_atomic_free_and_flush_at_every_exit(
    path: Path, arch: str, mode: Mode
) -> None:
    text = path.read_text()
    atomic = instrument(text, mode, buffer=Buffer.GLOBAL)
    counted = instrument(text, mode, buffer=Buffer.GLOBAL, registers=True)
    assert assemble(counted.ptx, arch).cubin
    assert counted.plans == atomic.plans  # the same counters: the same derivation
    # no atomic runs inside a loop, and every way out of the kernel adds the registers

    for kernel, plan in counted.plans.items():
        cfg = build(parse(text).function(kernel))
        hot = register_counters(cfg, find_loops(cfg), plan)
        if len(hot) < MAX_REGISTER_COUNTERS:  # every loop counter in registers
            assert _atomics_in_loops(counted.ptx, kernel) == [], kernel
        if not hot:
            continue
        out = build(parse(counted.ptx).function(kernel))
        for edge in out.edges:
            if edge.dst != len(out.blocks) or edge.src >= len(out.blocks):
                continue
            said = " ".join(out.statement(i).text for i in out.blocks[edge.src].instructions)
            assert "_f_a+" in said, f"{kernel}: block {edge.src} leaves without the flush"


def test_the_atomic_probes_do_run_inside_loops() -> None:
    """What the registers remove: nvcc's and Triton's loops hold atomics with the default."""
    for path in (NVCC_PTX, triton_ptx("matmul"), triton_ptx("bfs")):
        atomic = instrument(path.read_text(), Mode.EDGES, buffer=Buffer.GLOBAL)
        assert any(_atomics_in_loops(atomic.ptx, k) for k in atomic.plans), path.name
