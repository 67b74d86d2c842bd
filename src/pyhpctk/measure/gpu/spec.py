"""The ``-e gpu=...`` event: parsing and carrying it to child processes (no numpy here).

hpcrun's syntax: ``gpu=nvidia``, ``gpu=amd``; pyhpctk adds ``gpu=simulated``. Options follow
after commas, ``gpu=BACKEND[,OPTION[=VALUE]...]``: ``buffer=BYTES`` (nvidia: activity buffer
size), ``recording=PATH``, ``buffer=N``, ``pending=N`` (simulated); ``pc[,period=N]``
(nvidia: PC sampling inside kernels, 2^N cycles, issue #7; ``pcmode=serialized|continuous``)
and ``pc=RECORDING`` (simulated: replay PC samples recorded by ``tests/data/gpu/record_pc.py``);
``inst`` (nvidia: exact instruction counts, CUPTI's SASS metrics) and ``inst=RECORDING``
(simulated: replay counts recorded by ``record_pc.py --inst``); ``pc`` and ``inst`` exclude
each other; ``blocks[=edges|warps]`` (nvidia: exact PTX block counts of the kernels Triton,
CuPy and Numba compile, issue #34; with ``kernel-name=REGEX``, ``launch-skip=N``,
``launch-count=M``) and ``blocks=RECORDING`` (simulated); ``trace[=chunks|exact]`` and
``tracebytes=N`` (nvidia: per-warp traces,
:mod:`.warp_options`); ``traces=RECORDING`` (simulated: replay per-warp traces recorded by
``tests/data/gpu/traces_device.py``, issue #34); ``sync=api|activity|both`` (who times
synchronizations: the C hook at the API, or CUPTI's SYNCHRONIZATION records, which cost PyTorch
models about 30 %; :mod:`.syncapi`).
A spec travels to child processes as its text in pyrun's options (``MeasureOptions.gpu``), not
inside the comma-separated event list: its options use commas.
"""

from __future__ import annotations

from pyhpctk.errors import UsageError


class BackendInfo:
    """One row of the backend table: what ``gpu=NAME`` is and where it lives (a value; not a
    NamedTuple: typing costs every measured process milliseconds to import)."""

    __slots__ = ("listing", "module", "options")

    def __init__(
        self, module: str, options: tuple[str, ...], listing: tuple[tuple[str, str], ...]
    ) -> None:
        #: The module that makes it: ``check(spec)`` and ``make(spec)``
        #: (:class:`~pyhpctk.measure.gpu.backend.BackendModule`); imported only when used.
        self.module = module
        #: The options it reads; any other is a typo.
        self.options = options
        #: Its lines in ``pyrun -L``: (what follows ``gpu=NAME``, text), then (option, text)
        #: or ("", text going on).
        self.listing = listing


#: ``blocks`` and its kernel filter (:mod:`.kernel_filter`; issue #34).
BLOCK_OPTIONS = ("blocks", "kernel-name", "launch-skip", "launch-count")

#: The GPU backends, name → :class:`BackendInfo`: option checking, making the backend and
#: ``pyrun -L`` all read it (adding a backend is a row here and its module).
BACKENDS: dict[str, BackendInfo] = {
    "nvidia": BackendInfo(
        "pyhpctk.measure.gpu.cupti",
        (
            *("buffer", "records", "pc", "inst", "period", "pcmode", "hook", "sync"),
            *BLOCK_OPTIONS,
            *("trace", "tracebytes"),  # issue #34 item 4: .warp_options
            "memory",  # issue #37 item 2: .memory
        ),
        (
            ("[,OPTION...]", "kernels, copies, memsets, syncs and allocations through"),
            ("", "CUPTI, under the Python line that issued them"),
            ("pc[,period=N]", "also PC samples with stall reasons (2^N cycles, default 12)"),
            ("inst", "also exact instruction counts (CUPTI SASS metrics) of the"),
            ("", "kernel launched first after cudaProfilerStart()"),
            ("blocks[=edges|warps]", "also exact counts of the PTX basic blocks, lines and"),
            ("", "loops of the kernels Triton, CuPy and Numba compile"),
            ("", "(instrumented PTX; warps: warp counts too)"),
            ("kernel-name=REGEX", "with blocks: only kernels whose name REGEX matches"),
            ("launch-skip=N", "with blocks: the first N launches left uncounted"),
            ("launch-count=M", "with blocks: M launches counted after them (ncu's -k,"),
            ("", "--launch-skip, --launch-count)"),
            ("hook=c|python|auto", "how API calls are seen: the C hook (built by pip"),
            ("", "install where a C compiler is present) or cupti-python's"),
            ("", "Python callbacks; auto (default) picks the C hook if built"),
            ("sync=api|activity", "who times synchronizations: the C hook, at the API"),
            ("", "(default), or CUPTI's SYNCHRONIZATION records, which"),
            ("", "cost PyTorch models about 30 % (docs/gpu.md)"),
            ("memory", "also every allocation and free of PyTorch's and CuPy's"),
            ("", "allocators with its Python line: bytes allocated, peak"),
            ("", "live, live at the peak; a timeline per device; what was"),
            ("", "live at an out-of-memory error (gpumem/, docs/gpu.md)"),
            ("buffer=BYTES, records=raw|objects, pcmode=serialized|continuous", ""),
            ("trace[=chunks|exact]", "per-warp traces of instrumented kernels (issue #34;"),
            ("", "chunks under pyrun; kernel-name= and the launch window"),
            ("", "choose them as for blocks; docs/gpu.md)"),
            ("tracebytes=N[K|M|G]", "cap on a launch's trace buffer (default 256M)"),
        ),
    ),
    "simulated": BackendInfo(
        "pyhpctk.measure.gpu.simulated",
        (
            *("recording", "buffer", "pending", "pc", "inst", "hook", "sync"),
            *(*BLOCK_OPTIONS, "traces", "memory"),
        ),
        (
            ("[,OPTION...]", "replays activity recorded on an H200 (no GPU needed):"),
            ("recording=FILE, pc=FILE, inst=FILE, buffer=N, pending=N, hook=..., sync=...", ""),
            ("blocks=FILE", "block counts recorded by blocks_device.py, with"),
            ("", "kernel-name=, launch-skip=, launch-count= as for nvidia"),
            ("traces=FILE", "each launch is a recorded traced launch of a kernel: its"),
            ("", "warps on trace lines per SM and warp slot (docs/gpu.md)"),
            ("memory", "allocations as for nvidia (a program's own fake allocator"),
            ("", "tells pyhpctk.measure.gpu.memory.current(), docs/gpu.md)"),
        ),
    ),
    "amd": BackendInfo(
        "pyhpctk.measure.gpu.hip_backend",
        (),
        (("", "HIP (refused with a reason where ROCm tracing is absent)"),),
    ),
}
#: The options each backend reads, from :data:`BACKENDS`.
OPTIONS = {name: info.options for name, info in BACKENDS.items()}


def backend_listing() -> list[str]:
    """The GPU backends' lines of ``pyrun -L``, from :data:`BACKENDS`."""
    lines = []
    for name, info in BACKENDS.items():
        (suffix, text), *rest = info.listing
        lines.append(f"  {'gpu=' + name + suffix:<27}{text}")
        lines += [f"      {option:<23}{text}".rstrip() for option, text in rest]
    return lines


#: ``sync=``: synchronizations timed by the C hook at the API (``api``), CUPTI's
#: SYNCHRONIZATION records (``activity``), or both, the hook's kept aside (``both``: diagnosis).
SYNC_MODES = ("api", "activity", "both")
#: gpu=nvidia's ``sync=`` when not said: the one switch (docs/gpu.md, "Synchronizations").
DEFAULT_SYNC = "api"
#: gpu=simulated's: its recordings hold CUPTI's records, replayed as they came.
DEFAULT_SIMULATED_SYNC = "activity"


def is_gpu_event(text: str) -> bool:
    """Whether an ``-e`` argument is a GPU event (``gpu=...``)."""
    return text.strip().lower().startswith("gpu=")


class GpuSpec:
    """A parsed ``gpu=`` event: the backend and its options (an immutable value)."""

    __slots__ = ("backend", "options")

    def __init__(self, backend: str, options: tuple[tuple[str, str], ...] = ()) -> None:
        if backend not in BACKENDS:
            raise UsageError(f"unknown GPU backend {backend!r}; known: {', '.join(BACKENDS)}")
        for key, _ in options:
            if key not in OPTIONS[backend]:
                known = ", ".join(OPTIONS[backend]) or "none"
                raise UsageError(f"gpu={backend}: unknown option {key!r} (known: {known})")
        self.backend = backend
        self.options = tuple(options)

    def option(self, name: str, default: str = "") -> str:
        for key, value in self.options:
            if key == name:
                return value
        return default

    def int_option(self, name: str, default: int) -> int:
        text = self.option(name, "")
        try:
            return int(text) if text else default
        except ValueError:
            raise UsageError(
                f"gpu={self.backend}: option {name}={text!r} is not a number"
            ) from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GpuSpec):
            return NotImplemented
        return (self.backend, self.options) == (other.backend, other.options)

    def __hash__(self) -> int:
        return hash((self.backend, self.options))

    def __str__(self) -> str:
        parts = [self.backend] + [f"{k}={v}" if v else k for k, v in self.options]
        return "gpu=" + ",".join(parts)

    def __repr__(self) -> str:
        return f"GpuSpec({self.backend!r}, {self.options!r})"


def parse_gpu_event(text: str) -> GpuSpec:
    """Parse ``gpu=BACKEND[,OPTION[=VALUE]...]`` (also without the ``gpu=`` prefix)."""
    body = text.strip()
    if body.lower().startswith("gpu="):
        body = body[4:]
    parts = [part.strip() for part in body.split(",") if part.strip()]
    if not parts:
        raise UsageError(f"bad GPU event {text!r}: say gpu=nvidia, gpu=amd or gpu=simulated")
    options = []
    for part in parts[1:]:
        key, _, value = part.partition("=")
        options.append((key.strip().lower(), value.strip()))
    return GpuSpec(parts[0].lower(), tuple(options))


def with_defaults(spec: GpuSpec, hook: str = "", recording: str = "") -> GpuSpec:
    """``spec`` with the run's settings (``PYHPCTK_GPU_HOOK``, ``PYHPCTK_GPU_RECORDING``) for
    the options it does not give itself and its backend takes."""
    given = {key for key, _ in spec.options}
    added = tuple(
        (key, value)
        for key, value in (("hook", hook), ("recording", recording))
        if value and key not in given and key in OPTIONS[spec.backend]
    )
    return GpuSpec(spec.backend, spec.options + added) if added else spec
