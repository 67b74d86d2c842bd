"""The native runtimes whose worker threads pyprof places under the Python line that called them.

A runtime is known by its load modules (the file's name, whatever directory a wheel put it in)
and by the function its pool's threads start in, the outermost frame of every sample such a
thread takes below the C library's thread start (docs/pyprof.md, "Worker threads of native
runtimes"). This module is the table and the questions asked of a module path; it reads no
file and knows nothing of profiles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from pyhpctk.formats.hpcrun_constants import (
    WORKERS_OPENBLAS,
    WORKERS_OPENMP,
    WORKERS_PYTORCH,
    placeholder_ip,
)


@dataclass(frozen=True, slots=True)
class Runtime:
    """A runtime with a pool of worker threads.

    ``modules``: a pattern of the file names of its load modules (searched in the base name);
    a Python thread's first frame in one of them is a call into the runtime (a dispatch).
    ``pool_modules``: those its pool threads start in (default: ``modules``).
    ``starts``: patterns of the function a pool thread starts in; a thread whose outermost frame
    has a name (a structure file, symbols) that matches none is not the pool's.
    ``marker``: the placeholder (8 characters) the worker threads hang below.
    """

    name: str
    modules: str
    starts: tuple[str, ...]
    marker: str
    pool_modules: str | None = None

    def starts_in(self, function: str) -> bool:
        """Whether ``function`` is one of the pool's thread starts (named alone, or as a
        library's symbols name it: ``blas_thread_server [libopenblas.so.0]``)."""
        bare = _LIBRARY_SUFFIX.sub("", function)
        return any(re.search(pattern, bare) for pattern in self.starts)


_LIBRARY_SUFFIX = re.compile(r" \[[^\]]*\]$")  # a shared library's function: "name [lib.so]"

RUNTIMES: tuple[Runtime, ...] = (
    # GNU libgomp (also the copies wheels bundle: libgomp-a34b3233.so.1.0.0), LLVM's libomp
    # and Intel's libiomp5: gomp_thread_start, __kmp_launch_worker.
    Runtime(
        "OpenMP",
        r"^lib(gomp|omp|iomp5)\b",
        (r"^gomp_thread_start$", r"^__kmp_launch_(worker|thread)"),
        WORKERS_OPENMP,
    ),
    # OpenBLAS's own pthreads server (numpy's and scipy's libscipy_openblas64_..., a system
    # libopenblas.so.0, libopenblasp-r0-....so): blas_thread_server.
    Runtime("OpenBLAS", r"openblas", (r"^blas_thread_server$",), WORKERS_OPENBLAS),
    # PyTorch's own intra-op pool (c10::ThreadPool; builds with OpenMP use libgomp, above).
    Runtime(
        "PyTorch",
        r"^lib(torch_cpu|torch_python|torch|c10)\.so",
        (r"ThreadPool.*main_loop", r"ThreadPool9main_loop"),
        WORKERS_PYTORCH,
        pool_modules=r"^lib(c10|torch_cpu)\.so",
    ),
)

MARKERS: dict[int, Runtime] = {placeholder_ip(r.marker): r for r in RUNTIMES}
"""The packed placeholder code of each runtime's marker (a raw frame's offset)."""

_THREAD_START = re.compile(r"^(libc|libpthread|libstdc\+\+|ld-linux[-\w.]*|libgcc_s)([-.]|$)")


def _base(module: str) -> str:
    return module.rsplit("/", 1)[-1]


def _find(module: str | None, pool: bool) -> int:
    if module is None:
        return -1
    base = _base(module)
    for index, runtime in enumerate(RUNTIMES):
        if re.search((runtime.pool_modules if pool else None) or runtime.modules, base):
            return index
    return -1


@lru_cache(maxsize=4096)
def runtime_of(module: str | None) -> int:
    """The index in :data:`RUNTIMES` of the runtime ``module`` belongs to, or -1."""
    return _find(module, pool=False)


@lru_cache(maxsize=4096)
def pool_runtime_of(module: str | None) -> int:
    """The index of the runtime whose pool threads start in ``module``, or -1."""
    return _find(module, pool=True)


@lru_cache(maxsize=4096)
def starts_threads(module: str | None) -> bool:
    """Whether ``module`` is where every thread starts before its own code (the C library's
    ``clone``/``start_thread``, ``std::thread``'s trampoline): frames skipped to find a
    thread's outermost frame of its own."""
    return module is not None and bool(_THREAD_START.search(_base(module)))


def is_logical(module: str | None) -> bool:
    """Whether ``module`` holds Python's logical frames (``logical/python.*``)."""
    return module is not None and (module.startswith("logical/") or "/logical/" in module)


# --------------------------------------------------------------------------------------------
# What a thread can be to them (found by .worker_roles, used by .graft)


Process = tuple[str, str, str]
"""(measurement directory, host id, process id): the threads that share one address space."""


def _ints() -> npt.NDArray[np.int64]:
    return np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class Dispatches:
    """A Python thread's calls into one runtime.

    ``node``: the dispatch frames (raw nodes), ascending when made; ``weight[i, m]``: the
    thread's values of its metric ``m`` below ``node[i]``; ``time``/``which``: its trace
    records below a dispatch, in trace order, and which dispatch each is below.
    """

    runtime: int
    node: npt.NDArray[np.int64]
    weight: npt.NDArray[np.float64]
    time: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros(0, np.uint64))
    which: npt.NDArray[np.int64] = field(default_factory=_ints)


@dataclass(slots=True)
class Roles:
    """What a profile can be for grafting: a dispatcher (``dispatches``), a worker of runtime
    ``worker`` (its value nodes, its pool's frames and its trace), or neither."""

    process: Process
    python: bool = False  # the thread has samples in Python code
    dispatches: list[Dispatches] = field(default_factory=list)
    worker: int = -1
    nodes: npt.NDArray[np.int64] = field(default_factory=_ints)
    pool: npt.NDArray[np.int64] = field(default_factory=_ints)
    trace_time: npt.NDArray[np.uint64] | None = None
    trace_node: npt.NDArray[np.int64] | None = None

    def remap(self, mapping: npt.NDArray[np.int64]) -> None:
        """Renumber nodes as :meth:`.unify.ProfileData.remap` does the profile's."""
        for dispatch in self.dispatches:
            dispatch.node = mapping[dispatch.node]
        self.nodes = mapping[self.nodes]
        self.pool = mapping[self.pool]
        if self.trace_node is not None:
            self.trace_node = np.where(self.trace_node >= 0, mapping[self.trace_node], -1)


__all__ = [
    "MARKERS",
    "RUNTIMES",
    "Dispatches",
    "Process",
    "Roles",
    "Runtime",
    "is_logical",
    "pool_runtime_of",
    "runtime_of",
    "starts_threads",
]
