"""pyrun's GPU layer: ``-e gpu=nvidia|amd|simulated[,OPTION[=VALUE]...]`` (hpcrun's syntax).

One entry point for the session: :func:`install` adds the GPU metric kind to a
:class:`~pyhpctk.measure.session.Session`, starts the monitor and tracing threads and connects
the backend; :func:`shutdown` flushes the backend, attributes every activity, writes the
per-stream profiles and traces, and reports what could not be attributed. In between, the
backend calls the monitor from the application threads (operation entry) and from its own buffer
thread (activity buffers). See :mod:`pyhpctk.measure.gpu.monitor` for the design and
``docs/gpu.md`` for the whole story.

Backends, one row each of the table :data:`BACKENDS` (:mod:`.spec`), which names the module
that checks the options and makes the backend: ``nvidia`` (CUPTI through ``cupti-python``,
:mod:`.cupti`), ``amd`` (ROCm's ``roctracer`` Python bindings where present,
:mod:`.hip_backend`), ``simulated`` (replays a recording, :mod:`.simulated`; options
``recording=PATH``, ``buffer=N`` records per buffer, ``pending=N`` records before the buffer
overflows).

Importing this package is cheap (no numpy): :func:`install` imports the monitor, which uses
numpy, only when a GPU event is given.
"""

from __future__ import annotations

import importlib

from pyhpctk.errors import UsageError
from pyhpctk.measure.gpu.options import block_counting, inst_counting, memory_tracking, pc_period
from pyhpctk.measure.gpu.spec import (
    BACKENDS,
    GpuSpec,
    is_gpu_event,
    parse_gpu_event,
    with_defaults,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.extension import Host
    from pyhpctk.measure.gpu.backend import BackendModule
    from pyhpctk.measure.gpu.monitor import GpuMonitor, GpuStats
    from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend

__all__ = [
    "BACKENDS",
    "GpuSpec",
    "check",
    "inst_counting",
    "install",
    "is_gpu_event",
    "parse_gpu_event",
    "pc_period",
    "shutdown",
    "simulated_runtime",
]


def backend_module(spec: GpuSpec) -> BackendModule:
    """The module of ``spec``'s row of :data:`BACKENDS` (its ``check`` and ``make``)."""
    module: BackendModule = importlib.import_module(BACKENDS[spec.backend].module)
    return module


def check(spec: GpuSpec) -> None:
    """Refuse bad option values and missing recordings now (pyrun, before the command runs).

    The same checks run again where the backend is made; here nothing is loaded or started.
    """
    backend_module(spec).check(spec)


def install(session: Host, spec: GpuSpec | str) -> GpuMonitor:
    """Start GPU measurement in ``session``; call :func:`shutdown` before the session writes."""
    from pyhpctk.measure.gpu.metrics import gpu_metric_kind
    from pyhpctk.measure.gpu.monitor import GpuMonitor

    if isinstance(spec, str):
        spec = parse_gpu_event(spec)
    settings = session.options.settings  # the hook's and the recording's defaults
    spec = with_defaults(spec, settings.gpu_hook, settings.gpu_recording)
    backend = backend_module(spec).make(spec)
    pc_kind = None
    if any(key in ("pc", "inst") for key, _ in spec.options):
        from pyhpctk.measure.gpu.metrics import pc_metric_kind

        # hpcrun's order: the 30 instruction metrics come before the activity metrics.
        pc_kind = session.add_metric_kind(pc_metric_kind())
    kind = session.add_metric_kind(gpu_metric_kind())
    monitor = GpuMonitor(session, kind, limits=backend.limits(), backend=backend)
    if block_counting(spec):  # issue #34: a kind of pyrun's own, after hpcrun's
        from pyhpctk.measure.gpu.blocks import block_metric_kind

        monitor.enable_blocks(session.add_metric_kind(block_metric_kind()))
    if memory_tracking(spec.options, spec.backend):  # issue #37 item 2: .memory
        from pyhpctk.measure.gpu.memory import MemoryTracker, memory_metric_kind

        monitor.inside.memory = MemoryTracker(
            session, session.add_metric_kind(memory_metric_kind())
        )
    if pc_kind is not None and inst_counting(spec):
        monitor.enable_pc(pc_kind, 0)  # counts: no sampling period, no GSAMP metrics
    elif pc_kind is not None:
        monitor.enable_pc(pc_kind, *backend.pc_settings(pc_period(spec)))
    try:
        backend.start(monitor)
        if monitor.inside.memory is not None:
            from pyhpctk.measure.gpu import memory_hooks

            memory_hooks.install(monitor.inside.memory)
    except BaseException:
        try:
            backend.stop()
        finally:
            monitor.close(write=False)
        raise
    return monitor


def simulated_runtime() -> SimulatedBackend:
    """The simulated GPU runtime of this process (under ``pyrun -e gpu=simulated``).

    A program without a GPU calls its ``launch()``, ``copy()``, ``memset()`` and
    ``synchronize()`` where a real one would call CUDA; each call is measured exactly as a CUDA
    call under ``gpu=nvidia`` (placeholder at the calling Python line, activity answered from the
    recording). Raises a UsageError when this process is not measured with ``gpu=simulated``.
    """
    from pyhpctk.measure import hooks
    from pyhpctk.measure.gpu.monitor import GpuMonitor
    from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend

    session = hooks.current_session()
    monitor = session.gpu if session is not None else None
    backend = monitor.backend if isinstance(monitor, GpuMonitor) else None
    if not isinstance(backend, SimulatedBackend):
        raise UsageError("no simulated GPU here: run the program under pyrun -e gpu=simulated")
    return backend


def shutdown(monitor: GpuMonitor, report: bool = True) -> GpuStats:
    """Flush the backend, attribute everything, write stream files; say what went missing."""
    return monitor.finish(report)
