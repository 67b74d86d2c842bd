"""pyrun's GPU layer: ``-e gpu=nvidia|amd|simulated[,OPTION[=VALUE]...]`` (hpcrun's syntax).

One entry point for the session: :func:`install` adds the GPU metric kind to a
:class:`~pyhpctk.measure.session.Session`, starts the monitor and tracing threads and connects
the backend; :func:`shutdown` flushes the backend, attributes every activity, writes the
per-stream profiles and traces, and reports what could not be attributed. In between, the
backend calls the monitor from the application threads (operation entry) and from its own buffer
thread (activity buffers). See :mod:`pyhpctk.measure.gpu.monitor` for the design and
``docs/gpu.md`` for the whole story.

Backends: ``nvidia`` (CUPTI through ``cupti-python``), ``amd`` (ROCm's ``roctracer`` Python
bindings where present), ``simulated`` (replays a recording; options ``recording=PATH``,
``buffer=N`` records per buffer, ``pending=N`` records before the buffer overflows).

Importing this package is cheap (no numpy): :func:`install` imports the monitor, which uses
numpy, only when a GPU event is given.
"""

from __future__ import annotations

import os

from pyhpctk.errors import UsageError
from pyhpctk.measure.gpu.spec import (
    BACKENDS,
    DEFAULT_SIMULATED_SYNC,
    DEFAULT_SYNC,
    ENV_GPU,
    SYNC_MODES,
    GpuSpec,
    is_gpu_event,
    parse_gpu_event,
    spec_from_env,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.extension import Host
    from pyhpctk.measure.gpu.backend import Backend
    from pyhpctk.measure.gpu.monitor import GpuMonitor, GpuStats
    from pyhpctk.measure.gpu.simulated import SimulatedBackend

__all__ = [
    "BACKENDS",
    "ENV_GPU",
    "GpuSpec",
    "install",
    "is_gpu_event",
    "parse_gpu_event",
    "shutdown",
    "simulated_runtime",
    "spec_from_env",
]

ENV_RECORDING = "PYHPCTK_GPU_RECORDING"  # default recording for gpu=simulated
#: The recording gpu=simulated replays by default (the H200 fixture, in a source checkout).
DEFAULT_RECORDING = os.path.join(
    os.path.dirname(os.path.abspath(__file__)).rsplit(os.sep + "src" + os.sep, 1)[0],
    "tests",
    "data",
    "gpu",
    "cupy_streams.json",
)


def _backend(spec: GpuSpec) -> Backend:
    inst = inst_counting(spec)
    if spec.backend == "simulated":
        from pyhpctk.measure.gpu import recording
        from pyhpctk.measure.gpu.simulated import SimulatedBackend

        path = spec.option("recording") or os.environ.get(ENV_RECORDING, "") or DEFAULT_RECORDING
        try:
            replayed = recording.load(path)
        except OSError as error:
            raise UsageError(f"gpu=simulated: cannot read the recording {path}: {error}") from None
        pc = None
        if spec.option("pc"):
            from pyhpctk.measure.gpu.pcsampling import load_recording

            pc = load_recording(spec.option("pc"))
        counts = None
        if inst:
            from pyhpctk.measure.gpu.sassmetrics import load_inst_recording

            counts = load_inst_recording(spec.option("inst"))
        return SimulatedBackend(
            replayed,
            buffer_records=spec.int_option("buffer", 256),
            max_pending=spec.int_option("pending", 0),
            pc=pc,
            inst=counts,
            hook=_hook_option(spec),
            sync=_sync_option(spec),
        )
    if spec.backend == "nvidia":
        from pyhpctk.measure.gpu.cupti_backend import CuptiBackend

        records, pc_mode = _nvidia_options(spec)
        return CuptiBackend(
            buffer_bytes=spec.int_option("buffer", 8 << 20),
            records=records,
            pc_period=pc_period(spec),
            pc_mode=pc_mode,
            hook=_hook_option(spec),
            inst=inst,
            sync=_sync_option(spec),
        )
    from pyhpctk.measure.gpu.hip_backend import HipBackend

    return HipBackend()


ENV_HOOK = "PYHPCTK_GPU_HOOK"  # the default of hook= (c, python, auto)


def check(spec: GpuSpec) -> None:
    """Refuse bad option values and missing recordings now (pyrun, before the command runs).

    The same checks run again where the backend is made; here nothing is loaded or started.
    """
    _hook_option(spec)
    _sync_option(spec)
    inst_counting(spec)
    pc_period(spec)
    if spec.backend == "nvidia":
        _nvidia_options(spec)
    if spec.backend == "simulated":
        for key in ("recording", "pc", "inst"):
            path = spec.option(key)
            if path and not os.path.isfile(path):
                raise UsageError(f"gpu=simulated: {key}={path}: no such file")


def _nvidia_options(spec: GpuSpec) -> tuple[str, str]:
    """``records=raw|objects`` and ``pcmode=serialized|continuous``."""
    records = spec.option("records", "raw")
    pc_mode = spec.option("pcmode", "serialized")
    if pc_mode not in ("serialized", "continuous"):
        raise UsageError(f"gpu=nvidia: pcmode={pc_mode!r}: say serialized or continuous")
    if records not in ("raw", "objects"):
        raise UsageError(f"gpu=nvidia: records={records!r}: say records=raw or records=objects")
    return records, pc_mode


def _hook_option(spec: GpuSpec) -> str:
    """``hook=c|python|auto``: how GPU API calls are seen (the C CUPTI hook where built)."""
    hook = spec.option("hook", os.environ.get(ENV_HOOK, "") or "auto")
    if hook not in ("auto", "c", "python"):
        raise UsageError(f"gpu={spec.backend}: hook={hook!r}: say hook=c, hook=python or hook=auto")
    return hook


def _sync_option(spec: GpuSpec) -> str:
    """``sync=api|activity|both``: who times synchronizations (:mod:`.syncapi`)."""
    default = DEFAULT_SIMULATED_SYNC if spec.backend == "simulated" else DEFAULT_SYNC
    sync = spec.option("sync", default)
    if sync not in SYNC_MODES:
        raise UsageError(
            f"gpu={spec.backend}: sync={sync!r}: say "
            + " or ".join(f"sync={mode}" for mode in SYNC_MODES)
        )
    return sync


def inst_counting(spec: GpuSpec) -> bool:
    """``gpu=nvidia,inst`` / ``gpu=simulated,inst=RECORDING``: exact instruction counts.

    Refused together with ``pc``: CUPTI's SASS metrics API needs ``cuptiProfilerInitialize``,
    which blocks its PC sampling API, and ``GINS`` would mix counts with samples.
    """
    keys = {key for key, _ in spec.options}
    if "inst" not in keys:
        return False
    if "pc" in keys:
        raise UsageError(f"gpu={spec.backend}: pc and inst exclude each other (one per run)")
    if spec.backend == "simulated" and not spec.option("inst"):
        raise UsageError("gpu=simulated: say inst=RECORDING (from record_pc.py --inst)")
    if spec.backend == "nvidia" and spec.option("inst"):
        raise UsageError("gpu=nvidia: inst takes no value")
    return True


def pc_period(spec: GpuSpec) -> int:
    """``gpu=nvidia,pc[,period=N]``: the PC sampling period exponent (2^N cycles), 0 when off."""
    if not any(key == "pc" for key, _ in spec.options):
        return 0
    from pyhpctk.measure.gpu.pcsampling import period_exponent

    try:
        return period_exponent(spec.int_option("period", 12))
    except ValueError as error:
        raise UsageError(f"gpu={spec.backend}: {error}") from None


def install(session: Host, spec: GpuSpec | str) -> GpuMonitor:
    """Start GPU measurement in ``session``; call :func:`shutdown` before the session writes."""
    from pyhpctk.measure.gpu.metrics import gpu_metric_kind
    from pyhpctk.measure.gpu.monitor import GpuMonitor

    if isinstance(spec, str):
        spec = parse_gpu_event(spec)
    backend = _backend(spec)
    pc_kind = None
    if any(key in ("pc", "inst") for key, _ in spec.options):
        from pyhpctk.measure.gpu.metrics import pc_metric_kind

        # hpcrun's order: the 30 instruction metrics come before the activity metrics.
        pc_kind = session.add_metric_kind(pc_metric_kind())
    kind = session.add_metric_kind(gpu_metric_kind())
    monitor = GpuMonitor(session, kind, limits=backend.limits())
    monitor.backend = backend
    if pc_kind is not None and inst_counting(spec):
        monitor.enable_pc(pc_kind, 0)  # counts: no sampling period, no GSAMP metrics
    elif pc_kind is not None:
        monitor.enable_pc(pc_kind, *backend.pc_settings(pc_period(spec)))
    try:
        backend.start(monitor)
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
    from pyhpctk.measure.gpu.simulated import SimulatedBackend

    session = hooks.current_session()
    monitor = session.gpu if session is not None else None
    backend = monitor.backend if isinstance(monitor, GpuMonitor) else None
    if not isinstance(backend, SimulatedBackend):
        raise UsageError("no simulated GPU here: run the program under pyrun -e gpu=simulated")
    return backend


def shutdown(monitor: GpuMonitor, report: bool = True) -> GpuStats:
    """Flush the backend, attribute everything, write stream files; say what went missing."""
    return monitor.finish(report)
