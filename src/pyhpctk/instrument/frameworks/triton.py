"""Triton: its PTX reached between the ``ptx`` and ``cubin`` compile stages.

Hook points (private; the tests ran on Triton 3.6, 3.7, 3.8 and 3.9):
- ``triton.knobs.runtime.add_stages_inspection_hook``: called by the NVIDIA backend's
  ``add_stages`` with the stage table; the hook adds a stage ``ptx_pyhpctk`` after ``ptx`` that
  instruments the PTX, so ptxas assembles the counted kernel. Triton >= 3.7 also calls it with no
  arguments for a key (and hash) that join the kernel's cache keys; 3.6 does not.
- ``CUDABackend.hash``: part of every on-disk cache key; while the hook is installed it carries
  the collector's key, so instrumented kernels are cached under keys of their own, in both
  versions, and the original stays where it was. The cache entry keeps the original ``.ptx``
  beside the instrumented ``.ptx_pyhpctk``: a cache hit re-derives the plans from it.
- ``knobs.runtime.jit_post_compile_hook``: which JIT function compiled what while installed;
  uninstall drops those entries from the functions' in-memory caches. Triton 3.6 has no key
  for the hook in those caches: there, install also sets aside what the JIT functions alive
  (``gc``) hold, so their next launch compiles the instrumented kernel, and uninstall puts it
  back.
- ``knobs.runtime.kernel_load_end_hook``: the loaded ``CUmodule``, whose counter arrays are
  read through ``cuModuleGetGlobal``.
- PyTorch Inductor (``torch.compile``) compiles through ``triton.compile`` but by default loads
  the cubins itself (its static CUDA launcher, torch >= 2.7), where no load hook is called:
  while installed, ``TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER=0`` (unless the program set it) and,
  where ``torch._inductor.config`` is already imported, its ``use_static_cuda_launcher`` off, so
  Inductor launches through Triton's own launcher, whose loads the hook sees.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pyhpctk.instrument.frameworks import driver
from pyhpctk.instrument.frameworks.base import Collector, FrameworkError, Patches, check_version

STAGE = "ptx_pyhpctk"
STATIC_LAUNCHER = "TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"


class Triton:
    name: str = "triton"
    distributions: tuple[str, ...] = ("triton",)
    supported: tuple[tuple[int, int], ...] = ((3, 6), (3, 7), (3, 8), (3, 9))

    def __init__(self) -> None:
        self._patches = Patches()
        self._collector: Collector | None = None
        self._compiled: list[tuple[Any, int, Any]] = []  # (JITFunction, device, key)
        self._set_aside: list[tuple[dict[Any, Any], dict[Any, Any]]] = []  # (cache, entries)
        self._chained: Any = None
        self._inductor: list[tuple[str, Any]] = []  # what was set aside: ("env"|"config", old)

    def install(self, collector: Collector) -> None:
        version = check_version(self)
        from triton import knobs
        from triton.backends.nvidia.compiler import CUDABackend

        if knobs.runtime.add_stages_inspection_hook is not None:
            raise FrameworkError(
                "triton: another compile-stage hook is installed (Proton?); "
                "pyhpctk cannot instrument Triton's kernels beside it"
            )
        self._collector = collector
        original_hash = CUDABackend.hash

        def keyed_hash(backend: Any) -> str:
            return f"{original_hash(backend)}-{collector.key}"

        self._patches.set(knobs.runtime, "add_stages_inspection_hook", self._stages)
        self._patches.set(CUDABackend, "hash", keyed_hash)
        self._chained = self._patches.set(
            knobs.runtime, "jit_post_compile_hook", self._compiled_one
        )
        knobs.runtime.kernel_load_end_hook.add(self._loaded)
        if version.startswith("3.6."):
            self._set_aside = _set_aside_jit_caches()
        self._inductor = _inductor_through_triton()

    def uninstall(self) -> None:
        if not self._patches:
            return
        from triton import knobs

        knobs.runtime.kernel_load_end_hook.remove(self._loaded)
        self._patches.undo()
        for function, device, key in self._compiled:
            function.device_caches[device][0].pop(key, None)
        for cache, entries in self._set_aside:
            cache.update(entries)
        self._compiled.clear()
        self._set_aside.clear()
        _inductor_restored(self._inductor)
        self._inductor = []
        self._collector = None

    def _stages(self, *args: Any) -> Any:
        assert self._collector is not None
        if not args:  # Triton >= 3.7 asks for what sets this pipeline apart in its caches
            return self._collector.key, self._collector.key
        _backend, stages, _options, _language, _capability = args
        cubin = stages.pop("cubin")
        stages[STAGE] = self._rewrite
        stages["cubin"] = cubin
        return None

    def _rewrite(self, ptx: str, metadata: dict[str, Any]) -> str:
        assert self._collector is not None
        result = self._collector.rewrite("triton", ptx)
        return ptx if result is None else result.ptx

    def _compiled_one(self, **kwargs: Any) -> Any:
        self._compiled.append(
            (kwargs["fn"].jit_function, kwargs["compile"]["device"], kwargs["key"])
        )
        return self._chained(**kwargs) if self._chained is not None else None

    def _loaded(
        self, module: Any, function: Any, name: str, group: dict[str, str], hash: str
    ) -> None:
        collector = self._collector
        if collector is None or module is None:
            return
        counted = [p for k, p in group.items() if k.endswith(f".{STAGE}")]
        original = [p for k, p in group.items() if k.endswith(".ptx")]
        if not counted:
            return  # compiled before the hook was installed
        if not original:
            why = "Triton's cache kept no PTX of it (TRITON_STORE_BINARY_ONLY?): no counters"
            collector.skipped("triton", name, why)
            return
        result = collector.rewrite("triton", Path(original[0]).read_text(encoding="utf-8"))
        if result is None:
            return
        handle = int(module)
        collector.loaded(
            "triton",
            result,
            lambda symbol, n: driver.read_global(handle, symbol, n),
            lambda symbol, n: driver.zero_global(handle, symbol, n),
            lambda symbol: driver.module_global(handle, symbol)[0],
        )


def _set_aside_jit_caches() -> list[tuple[dict[Any, Any], dict[Any, Any]]]:
    """Empty the in-memory kernel caches of every live JIT function; return what they held."""
    import gc

    from triton.runtime.jit import JITFunction

    aside = []
    for obj in gc.get_objects():
        if isinstance(obj, JITFunction):
            for entry in list(obj.device_caches.values()):
                cache = entry[0]
                if cache:
                    aside.append((cache, dict(cache)))
                    cache.clear()
    return aside


def _inductor_through_triton() -> list[tuple[str, Any]]:
    """Inductor's kernels launched by Triton's launcher, not its static one (the module
    docstring); what was there before, for :func:`_inductor_restored`."""
    saved: list[tuple[str, Any]] = []
    if STATIC_LAUNCHER not in os.environ:
        os.environ[STATIC_LAUNCHER] = "0"
        saved.append(("env", None))
    config = sys.modules.get("torch._inductor.config")
    old = getattr(config, "use_static_cuda_launcher", None)
    if config is not None and old:
        setattr(config, "use_static_cuda_launcher", False)  # noqa: B010 (a module of torch)
        saved.append(("config", old))
    return saved


def _inductor_restored(saved: list[tuple[str, Any]]) -> None:
    for what, old in saved:
        if what == "env":
            os.environ.pop(STATIC_LAUNCHER, None)
        config = sys.modules.get("torch._inductor.config")
        if what == "config" and config is not None:
            setattr(config, "use_static_cuda_launcher", old)  # noqa: B010
