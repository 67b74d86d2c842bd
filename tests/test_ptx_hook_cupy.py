"""CuPy's NVRTC output reached as PTX (issue #34 item 2), without a GPU: NVRTC compiles a
RawKernel's source here (the nvidia-cuda-nvrtc wheel), the hook instruments its PTX and hands
that to CuPy in place of the cubin; nothing instrumented reaches CuPy's disk cache, and after
uninstall the same compile gives the original cubin. Loading the module needs the driver: a
stand-in Module records what CuPy would load."""

from __future__ import annotations

import types
from typing import ClassVar

import numpy as np
import pytest

from pyhpctk.instrument.frameworks import Collector
from pyhpctk.instrument.frameworks.cupy import CuPy
from pyhpctk.instrument.ptx import Buffer, Mode, assemble, instrument

compiler = pytest.importorskip(
    "cupy.cuda.compiler", reason="CuPy and the nvidia-cuda-nvrtc wheel compile the kernels"
)

SOURCE = r"""
extern "C" __global__ void clamp_sum(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = 0.0f;
    for (int k = 0; k < (i % 7); ++k) {  // a data-dependent loop
        s += x[(i + k) % n];
    }
    if (i < n) y[i] = s > 1.0f ? 1.0f : s;
}
"""
OPTIONS = ("-arch=sm_90", "--device-as-default-execution-space")


def _nvrtc(method: str = "cubin") -> bytes:
    out, _ = compiler._NVRTCProgram(SOURCE, "k.cu", method=method).compile(OPTIONS)
    return bytes(out)


def _plain_ptx() -> str:
    from cupy.cuda import nvrtc

    program = compiler._NVRTCProgram(SOURCE, "k.cu", method="cubin")
    program.compile(OPTIONS)
    return bytes(nvrtc.getPTX(program.ptr)).decode().rstrip("\0")


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_cupy_hook_hands_cupy_instrumented_ptx_for_its_cubin(mode: Mode) -> None:
    plain = _nvrtc()
    assert plain.startswith(b"\x7fELF")
    hook, collector = CuPy(), Collector(mode)
    hook.install(collector)
    try:
        counted = _nvrtc()
    finally:
        hook.uninstall()
    expected = instrument(_plain_ptx(), mode, buffer=Buffer.GLOBAL)
    assert counted.decode() == expected.ptx and set(expected.plans) == {"clamp_sum"}
    assemble(counted.decode(), "sm_90")
    assert _nvrtc() == plain


class _Module:
    """Stands in for cupy.cuda.function.Module: records what CuPy loads."""

    loads: ClassVar[list[bytes]] = []

    def load(self, image: bytes) -> None:
        self.loads.append(bytes(image))

    def _set_mapping(self, mapping: object) -> None:
        pass


def test_cupy_instrumented_modules_stay_out_of_the_disk_cache(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from cupy.cuda._compiler_cache import DiskKernelCacheBackend

    cache = DiskKernelCacheBackend(str(tmp_path))
    monkeypatch.setattr(compiler, "_kernel_cache_backend", cache)
    monkeypatch.setattr(compiler, "function", types.SimpleNamespace(Module=_Module))
    monkeypatch.setattr(
        compiler, "_get_arch_for_options_for_nvrtc", lambda a: (f"-arch=sm_{a}", "cubin")
    )
    _Module.loads.clear()

    def compile_once() -> bytes:
        compiler._compile_with_cache_cuda(SOURCE, (), "90")
        return _Module.loads[-1]

    plain = compile_once()
    cached = sorted(p.name for p in tmp_path.iterdir())
    assert plain.startswith(b"\x7fELF") and cached
    hook, collector = CuPy(), Collector()
    hook.install(collector)
    try:
        counted = compile_once()
    finally:
        hook.uninstall()
    assert b"clamp_sum___pyhpctk_counters" in counted and not counted.startswith(b"\x7fELF")
    assert sorted(p.name for p in tmp_path.iterdir()) == cached  # nothing written, nothing read
    (loaded,) = collector.loaded_modules
    assert loaded.framework == "cupy" and loaded.kernels == ["clamp_sum"]
    assert compiler._kernel_cache_backend is cache
    assert compile_once() == plain


def test_cupy_hook_forgets_the_modules_cupy_memoized_before_and_while_it_was_installed() -> None:
    """A RawKernel's module is memoized by source (``cupy._core.raw._get_raw_module``): a new
    RawKernel of a source already run got the plain module, never compiled, and ran plain on
    the H200 (ptx_hooks_h200.log: "one instrumented module loaded: 0"). Install and uninstall
    clear CuPy's memos, so the next launch compiles through the hook, and after it the
    original is compiled again (the memo, not the GPU, is what this test can reach)."""
    import cupy._core.raw as raw
    import cupy._util as util

    assert hasattr(raw._get_raw_module, "__wrapped__")  # memoized in this CuPy
    made: list[str] = []

    @util.memoize()
    def module(source: str) -> str:
        made.append(source)
        return source

    module("k")
    hook = CuPy()
    hook.install(Collector(Mode.EDGES))
    try:
        module("k")  # compiled again, under the hook
    finally:
        hook.uninstall()
    module("k")  # and again after: no instrumented module stays memoized
    assert made == ["k", "k", "k"]


class _LoadedModule:
    """Stands in for a loaded cupy.cuda.function.Module: ``ptr`` is its CUmodule, and, as in
    CuPy, ``get_global_var`` gives a global's device address (an int, no MemoryPointer: the
    H100 run of blocks_device.py failed on ``copy_to_host`` of it)."""

    ptr = 0xC0DE

    def get_global_var(self, name: str) -> int:
        return 0x7000_0000


def test_cupy_counters_are_read_and_zeroed_through_the_loaded_modules_handle(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from pyhpctk.instrument.frameworks import driver

    result = instrument(_plain_ptx(), Mode.EDGES, buffer=Buffer.GLOBAL)
    symbol = result.counter_globals["clamp_sum"]
    size = result.counter_bytes("clamp_sum")
    device = {(0xC0DE, symbol): np.arange(size, dtype=np.uint8)}  # the global's bytes

    def read_global(module: int, name: str, nbytes: int) -> np.ndarray:
        return device[(module, name)][:nbytes].copy()

    def zero_global(module: int, name: str, nbytes: int) -> None:
        device[(module, name)][:nbytes] = 0

    monkeypatch.setattr(driver, "read_global", read_global)
    monkeypatch.setattr(driver, "zero_global", zero_global)
    collector = Collector(Mode.EDGES)
    CuPy._register(collector, _LoadedModule(), result)
    (loaded,) = collector.loaded_modules
    want = result.fold("clamp_sum", np.arange(size, dtype=np.uint8))
    assert loaded.counters("clamp_sum").tolist() == want.tolist()
    loaded.reset()
    assert not loaded.counters("clamp_sum").any()
