"""PTX that Triton compiles here, for an explicit target and without a GPU (issue #34, CI part):
the same kernels as the recorded fixtures, compiled afresh by the installed Triton, parsed into
the same control flow, instrumented and assembled by ptxas."""

from __future__ import annotations

import os

import pytest

from ptx_helpers import PTX_DIR, TRITON_KERNELS, triton_ptx
from pyhpctk.instrument.ptx import Mode, assemble, build, find_loops, instrument, parse

pytest.importorskip("triton", reason="Triton (the dev extra) compiles the kernels")


@pytest.fixture(scope="module")
def compile_ptx(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """triton_kernels.compile_ptx, with Triton's cache in a temporary folder for this module."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_DEFAULT_FP_FUSION", os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
        env.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        env.syspath_prepend(str(PTX_DIR))
        import triton_kernels

        yield triton_kernels.compile_ptx


def _shape(ptx: str) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
    cfg = build(parse(ptx).kernels[0])
    loops = find_loops(cfg).loops
    return [(e.src, e.dst, e.kind.value) for e in cfg.edges], [
        (lp.header, lp.depth) for lp in loops
    ]


@pytest.mark.parametrize("kernel", TRITON_KERNELS)
def test_triton_compiles_for_sm90_without_a_gpu_into_the_recorded_control_flow(
    compile_ptx, kernel: str
) -> None:  # type: ignore[no-untyped-def]
    fresh = compile_ptx(kernel, 90)
    assert ".target sm_90a" in fresh
    assert _shape(fresh) == _shape(triton_ptx(kernel).read_text())
    assemble(instrument(fresh).ptx, "sm_90a")


@pytest.mark.parametrize("kernel", ["matmul", "bfs"])
def test_triton_sm80_ptx_instruments_and_assembles_for_sm80(compile_ptx, kernel: str) -> None:  # type: ignore[no-untyped-def]
    fresh = compile_ptx(kernel, 80)
    assert ".target sm_80" in fresh
    for mode in Mode:
        assemble(instrument(fresh, mode).ptx, "sm_80")
