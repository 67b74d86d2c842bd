"""CuPy: NVRTC's output reached as PTX, and loaded by the driver as PTX.

Hook points (private; the tests ran on CuPy 14.2):
- ``cupy.cuda.compiler._NVRTCProgram.compile``: after NVRTC compiled a program (for a real
  architecture, CuPy's default, or a virtual one), the hook takes its PTX (``nvrtcGetPTX``),
  instruments it and returns that PTX in place of the cubin; CuPy's ``Module.load`` hands it
  to ``cuModuleLoadData``, which assembles it for the device (as CuPy does with
  ``CUPY_COMPILE_WITH_PTX``).
- ``cupy.cuda.compiler._compile_with_cache_cuda``: the module it returns is where the counter
  arrays are read (through the driver, from the ``Module``'s ``ptr``, its CUmodule:
  ``Module.get_global_var`` gives a bare address); what it compiles without PTX (``backend='nvcc'``
  straight to a cubin, LTO-IR) is reported as skipped.
- ``cupy.cuda.compiler._kernel_cache_backend``: while installed, a cache that keeps nothing,
  so no instrumented module reaches CuPy's disk cache and none of the original cubins is taken
  from it; uninstall puts CuPy's own back.
- ``cupy._util.clear_memo()`` at install and uninstall: CuPy memoizes a ``RawKernel``'s
  module by its source, so a new ``RawKernel`` of a source already run would get the module
  loaded before (the H200 run of ``device_ptx_hooks.py`` ran its kernel plain that way).
Modules that CuPy objects already hold (a ``RawKernel`` object already called, an
``ElementwiseKernel``'s own memo) stay as they were loaded.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

import numpy as np

from pyhpctk.instrument.frameworks import driver
from pyhpctk.instrument.frameworks.base import Collector, Patches, Rewritten, check_version


class _NoCache:
    """A kernel cache backend that keeps nothing (CuPy's KernelCacheBackend interface)."""

    def load(self, name: str) -> bytes | None:
        return None

    def save(self, name: str, cubin: bytes, source: str) -> None:
        return None


class CuPy:
    name: str = "cupy"
    distributions: tuple[str, ...] = ("cupy-cuda13x", "cupy-cuda12x", "cupy")
    supported: tuple[tuple[int, int], ...] = ((14, 2),)

    def __init__(self) -> None:
        self._patches = Patches()
        self._collector: Collector | None = None
        self._pending = threading.local()

    def install(self, collector: Collector) -> None:
        check_version(self)
        from cupy.cuda import compiler

        self._collector = collector
        program_compile = compiler._NVRTCProgram.compile
        with_cache = compiler._compile_with_cache_cuda

        def compile(program: Any, options: Any = (), log_stream: Any = None) -> Any:
            out, mapping = program_compile(program, options, log_stream)
            if program.method not in ("cubin", "ptx"):
                return out, mapping
            from cupy.cuda import nvrtc

            ptx = nvrtc.getPTX(program.ptr)
            text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
            result = collector.rewrite("cupy", text.rstrip("\\0"))
            if result is None:
                return out, mapping
            self._pending.__dict__.setdefault("done", []).append(result)
            return result.ptx.encode(), mapping

        signature = inspect.signature(with_cache)

        def compile_with_cache(*args: Any, **kw: Any) -> Any:
            call = signature.bind(*args, **kw)
            call.apply_defaults()
            self._pending.done = []
            module = with_cache(*args, **kw)
            backend, ltoir = call.arguments["backend"], call.arguments["to_ltoir"]
            if backend != "nvrtc" or ltoir:
                what = "LTO-IR" if ltoir else f"a cubin from {backend}"
                source = _first_line(call.arguments["source"])
                collector.skipped("cupy", source, f"{what}: no PTX to instrument")
            for result in self._pending.done:
                self._register(collector, module, result)
            self._pending.done = []
            return module

        self._patches.set(compiler._NVRTCProgram, "compile", compile)
        self._patches.set(compiler, "_compile_with_cache_cuda", compile_with_cache)
        self._patches.set(compiler, "_kernel_cache_backend", _NoCache())
        _forget_memos()

    def uninstall(self) -> None:
        self._patches.undo()
        self._collector = None
        _forget_memos()

    @staticmethod
    def _register(collector: Collector, module: Any, result: Rewritten) -> None:
        # through the module's CUmodule (``ptr``): CuPy's get_global_var gives a bare address
        def read(symbol: str, nbytes: int) -> np.ndarray:
            return driver.read_global(int(module.ptr), symbol, nbytes)

        def zero(symbol: str, nbytes: int) -> None:
            driver.zero_global(int(module.ptr), symbol, nbytes)

        def locate(symbol: str) -> int:
            return driver.module_global(int(module.ptr), symbol)[0]

        collector.loaded("cupy", result, read, zero, locate)


def _forget_memos() -> None:
    """CuPy memoizes a RawKernel's module by its source (``_core.raw._get_raw_module``): a
    kernel run before install would run plain, one run while installed would stay
    instrumented after uninstall. Its memos are cleared at both (CuPy compiles again; the
    disk cache spares the original's compile after uninstall)."""
    import cupy._util

    cupy._util.clear_memo()


def _first_line(source: Any) -> str:
    text = source.decode() if isinstance(source, bytes) else str(source)
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "<empty source>")[:80]
