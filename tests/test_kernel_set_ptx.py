"""The overhead benchmark's eight kernels (benchmarks/kernel_set_*.py, issue #34's Done-when) go
through the PTX pass without a GPU: Triton compiles each for ``GPUTarget("cuda", 90, 32)``,
NVRTC compiles the CUDA C ones and Numba-CUDA (``compile_ptx``) its own for sm_90; every kernel
is counted in both modes and traced in both strategies, and ptxas (the nvidia-cuda-nvcc wheel)
assembles every result. Each kernel has the loop its truth counts (a loop of the PTX CFG), but
CuPy's and Numba's stencils (a thread a point); each instruction kind a CUDA C truth counts is
in the Numba kernel's PTX, which the device run checks against the same truths."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ptx_helpers import cupy_ptx
from pyhpctk.instrument.ptx import (
    Buffer,
    Mode,
    Strategy,
    assemble,
    build,
    find_loops,
    instrument,
    instrument_traces,
    parse,
)

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
#: The issue's seven kinds and one more, in its order.
SET = ("stencil", "reduce_branchy", "matmul_tiled", "bfs_step", "nw_wavefront", "histogram",
       "softmax_rows", "kmeans_assign")  # fmt: skip


@pytest.fixture(scope="module")
def kernel_sets():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import kernel_set_cupy

        yield kernel_set_cupy
    finally:
        sys.path.remove(str(BENCHMARKS))


def _triton_ptx(name: str, tmp_path: Path) -> str:
    triton = pytest.importorskip("triton", reason="Triton (the dev extra) compiles the set")
    import os

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    os.environ["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    import kernel_set_triton

    fn, signature, constants = kernel_set_triton.SIGNATURES[name]
    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
    target = GPUTarget("cuda", 90, 32)
    compiled = triton.compile(source, target=target, options={"num_warps": kernel_set_triton.WARPS})
    return str(compiled.asm["ptx"])


def _numba_ptx(kernel_sets, name: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Numba's PTX of kernel ``name`` for sm_90, and its (mangled) entry."""
    pytest.importorskip("numba.cuda", reason="numba-cuda (the dev extra) compiles the set")
    import kernel_set_numba
    from numba import cuda

    function, signature = kernel_set_numba.FUNCTIONS[name], kernel_set_numba.SIGNATURES[name]
    ptx, _ = cuda.compile_ptx(function, signature, cc=(9, 0), lineinfo=True)
    entry = kernel_set_numba.entry(name, (f.name for f in parse(ptx).functions))
    assert entry is not None, name
    return ptx, entry


def _every_instrumentation_assembles(ptx: str, kernel: str, arch: str, name: str = "") -> None:
    function = parse(ptx).function(kernel)
    loops = find_loops(build(function)).loops
    name = name or kernel
    assert bool(loops) is (name != "stencil" or arch == "sm_90a"), name  # a thread a point
    plain = assemble(ptx, arch)
    assert plain.cubin
    for mode in Mode:
        for registers in (False, True):
            counted = instrument(ptx, mode, {kernel}, Buffer.GLOBAL, registers)
            assert counted.plans[kernel].counters > 0
            assert assemble(counted.ptx, arch).cubin, f"{kernel} {mode.value} {registers}"
    for strategy in Strategy:
        traced = instrument_traces(ptx, strategy, kernels={kernel})
        assert traced.plans[kernel].sites
        done = assemble(traced.ptx, arch)
        assert done.cubin, f"{kernel} traced {strategy.value}"
        # the kernel's dynamic shared memory (Triton's tiles) starts after the static, where
        # it did modulo 1024: a 128-byte-swizzled wgmma tile needs it (matmul_tiled's traced
        # output was wrong on the H100 with 512 bytes of warp state)
        grown = _static_smem(done.log) - _static_smem(plain.log)
        assert grown % 1024 == 0, f"{kernel} traced {strategy.value}: {grown} bytes more smem"


def _static_smem(log: str) -> int:
    found = re.search(r"(\d+) bytes smem", log)
    return int(found.group(1)) if found else 0


def test_the_set_has_the_eight_kernels_the_issue_names(kernel_sets) -> None:  # type: ignore[no-untyped-def]
    assert kernel_sets.NAMES == SET


@pytest.mark.parametrize("name", SET)
def test_each_cupy_kernel_of_the_set_is_instrumented_and_assembles(kernel_sets, name: str) -> None:  # type: ignore[no-untyped-def]
    _every_instrumentation_assembles(cupy_ptx(kernel_sets.SOURCE), name, "sm_90")


@pytest.mark.parametrize("name", SET)
def test_each_triton_kernel_of_the_set_is_instrumented_and_assembles(  # type: ignore[no-untyped-def]
    kernel_sets, name: str, tmp_path: Path
) -> None:
    _every_instrumentation_assembles(_triton_ptx(name, tmp_path), name, "sm_90a")


@pytest.mark.parametrize("name", SET)
def test_each_numba_kernel_of_the_set_is_instrumented_and_assembles(kernel_sets, name: str) -> None:  # type: ignore[no-untyped-def]
    ptx, entry = _numba_ptx(kernel_sets, name)
    _every_instrumentation_assembles(ptx, entry, "sm_90", name)


def test_the_numba_kernels_have_the_instruction_kinds_their_truths_count(kernel_sets) -> None:  # type: ignore[no-untyped-def]
    """The truths are CUDA C's (the same inputs, the same arithmetic): the kinds they count must
    be in NVVM's code for Numba too, or the device check could only fail. The launches are made
    on the host here (NumPy in CuPy's place, small sizes): their truths, not their arrays."""
    pytest.importorskip("numba.cuda", reason="numba-cuda (the dev extra) compiles the set")
    import kernel_set_numba
    import numpy as np

    launches = kernel_set_numba.launches(np, scale=1e-3)
    assert [launch.kernel for launch in launches] == list(SET)
    missing = []
    for launch in launches:
        ptx, entry = _numba_ptx(kernel_sets, launch.kernel)
        cfg = build(parse(ptx).function(entry))
        kinds = {cfg.statement(i).opcode for block in cfg.blocks for i in block.instructions}
        for what, (prefix, _) in launch.truths.items():
            if not any(kind.startswith(prefix) for kind in kinds):
                missing.append((launch.kernel, what, prefix))
    assert not missing
