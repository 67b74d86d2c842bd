"""Numba-CUDA: its PTX reached as it enters the linker.

Hook points (private; the tests ran on numba-cuda 0.30):
- ``numba.cuda.cudadrv.driver._Linker.add_ptx``: every PTX module a code library links (its
  own, and PTX files it links in) is instrumented on its way in, while a library's
  ``get_cubin`` runs; the library's PTX (``inspect_asm``, ``_ptx_cache``) stays the original.
- ``numba.cuda.codegen.CUDACodeLibrary.get_cubin`` and ``get_cufunc``: while installed they
  use caches of their own on each library (cubins, linker logs, loaded functions), so the
  instrumented kernel is never in the library's own caches nor in what Numba's disk cache
  saves of it, and after uninstall the next launch links and loads the original. The loaded
  function's module reads the counter arrays (``get_global_symbol``).
A library linked with LTO has no PTX to instrument: it is reported as skipped.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import numpy as np

from pyhpctk.instrument.frameworks.base import Collector, Patches, Rewritten, check_version

_OWN = "_pyhpctk_caches"


class Numba:
    name: str = "numba"
    distributions: tuple[str, ...] = ("numba-cuda",)
    supported: tuple[tuple[int, int], ...] = ((0, 30),)

    def __init__(self) -> None:
        self._patches = Patches()
        self._linking = threading.local()

    def install(self, collector: Collector) -> None:
        check_version(self)
        codegen: Any = importlib.import_module("numba.cuda.codegen")
        driver: Any = importlib.import_module("numba.cuda.cudadrv.driver")
        CUDACodeLibrary = codegen.CUDACodeLibrary

        add_ptx = driver._Linker.add_ptx
        get_cubin = CUDACodeLibrary.get_cubin
        get_cufunc = CUDACodeLibrary.get_cufunc
        linking = self._linking

        def counted_add_ptx(linker: Any, ptx: Any, *args: Any, **kw: Any) -> Any:
            done: list[Rewritten] | None = getattr(linking, "done", None)
            text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
            result = collector.rewrite("numba", text) if done is not None else None
            if result is None or done is None:
                return add_ptx(linker, ptx, *args, **kw)
            done.append(result)
            return add_ptx(linker, result.ptx.encode(), *args, **kw)

        def counted_get_cubin(library: Any, cc: Any = None) -> Any:
            own = _own(library)
            if library._lto:
                collector.skipped("numba", str(library.name), "linked with LTO: no PTX")
            saved = library._cubin_cache, library._linkerinfo_cache
            library._cubin_cache, library._linkerinfo_cache = own["cubin"], own["linkerinfo"]
            linking.done = []
            try:
                cubin = get_cubin(library, cc)
                if linking.done:
                    own["instrumented"] = list(linking.done)
                return cubin
            finally:
                linking.done = None
                library._cubin_cache, library._linkerinfo_cache = saved

        def counted_get_cufunc(library: Any) -> Any:
            own = _own(library)
            before = set(own["cufunc"])
            saved = library._cufunc_cache
            library._cufunc_cache = own["cufunc"]
            try:
                cufunc = get_cufunc(library)
            finally:
                library._cufunc_cache = saved
            if set(own["cufunc"]) != before:  # loaded now, on a device it was not loaded on
                for result in own.get("instrumented", []):
                    _register(collector, cufunc.module, result)
            return cufunc

        self._patches.set(driver._Linker, "add_ptx", counted_add_ptx)
        self._patches.set(CUDACodeLibrary, "get_cubin", counted_get_cubin)
        self._patches.set(CUDACodeLibrary, "get_cufunc", counted_get_cufunc)

    def uninstall(self) -> None:
        self._patches.undo()


def _own(library: Any) -> dict[str, Any]:
    own: dict[str, Any] = library.__dict__.setdefault(
        _OWN, {"cubin": {}, "linkerinfo": {}, "cufunc": {}}
    )
    return own


def _register(collector: Collector, module: Any, result: Rewritten) -> None:
    driver: Any = importlib.import_module("numba.cuda.cudadrv.driver")

    def read(symbol: str, nbytes: int) -> np.ndarray:
        pointer, size = module.get_global_symbol(symbol)
        out = np.zeros(min(nbytes, size), np.uint8)
        driver.device_to_host(out, pointer, out.size)
        return out

    def zero(symbol: str, nbytes: int) -> None:
        pointer, size = module.get_global_symbol(symbol)
        driver.device_memset(pointer, 0, min(nbytes, size))

    def locate(symbol: str) -> int:
        pointer, _ = module.get_global_symbol(symbol)
        return int(driver.device_pointer(pointer))

    collector.loaded("numba", result, read, zero, locate)
