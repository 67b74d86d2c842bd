"""Reaching the PTX of kernels compiled from Python, at load time (issue #34 item 2).

One :class:`~.base.Framework` per framework whose kernels go through PTX, in one table,
:data:`FRAMEWORKS`: ``triton`` (between its ``ptx`` and ``cubin`` stages), ``cupy`` (NVRTC's
output, as PTX the driver loads), ``numba`` (numba-cuda's PTX as it enters the linker). Each
pins the versions whose private hook points were tested and refuses any other in one line;
each keeps the instrumented kernels out of the framework's normal caches, so that after
:meth:`uninstall` the next compile of a kernel is the original. The counters live in
module-level ``.global`` arrays; :class:`~.base.Loaded` reads them. docs/gpu.md lists the hook
points and versions.
"""

from __future__ import annotations

from pyhpctk.instrument.frameworks.base import (
    Collector,
    Framework,
    FrameworkError,
    LoadedModule,
    Skipped,
    check_version,
    installed_version,
)
from pyhpctk.instrument.frameworks.cupy import CuPy
from pyhpctk.instrument.frameworks.numba import Numba
from pyhpctk.instrument.frameworks.triton import Triton

FRAMEWORKS: dict[str, type[Framework]] = {"triton": Triton, "cupy": CuPy, "numba": Numba}

__all__ = [
    "FRAMEWORKS",
    "Collector",
    "Framework",
    "FrameworkError",
    "LoadedModule",
    "Skipped",
    "check_version",
    "installed_version",
]
