"""The AMD backend (``-e gpu=amd``): behind an import guard, not yet able to measure.

AMD publishes HIP bindings for Python (``hip-python``: ``from hip import hip``), but activity
tracing (roctracer / rocprofiler-sdk: API callbacks with correlation ids and asynchronous
activity records, the AMD counterparts of CUPTI's) has no Python binding we could build on, and
this project has no AMD GPU to develop or test one against. Rather than measure wrongly, the
backend says so: :meth:`HipBackend.start` raises :class:`~pyhpctk.errors.UsageError` naming
what is missing. The class implements :class:`~pyhpctk.measure.gpu.backend.Backend` and this
module is the row of :data:`~pyhpctk.measure.gpu.spec.BACKENDS` (:func:`check`, :func:`make`),
so the session wiring and ``pyrun -L`` treat every backend alike.
"""

from __future__ import annotations

import importlib
import importlib.util

from pyhpctk.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.activity import DeviceLimits
    from pyhpctk.measure.gpu.backend import Backend, MonitorPort
    from pyhpctk.measure.gpu.spec import GpuSpec


def check(spec: GpuSpec) -> None:
    """``gpu=amd`` has no options; whether ROCm is there is said at start."""


def make(spec: GpuSpec) -> Backend:
    return HipBackend()


def hip_available() -> bool:
    """Whether AMD's ``hip-python`` bindings are importable here."""
    return importlib.util.find_spec("hip") is not None


class HipBackend:
    """``gpu=amd``: detects ROCm's Python bindings, then refuses with a clear message."""

    name = "amd"

    def __init__(self) -> None:
        self.monitor: MonitorPort | None = None

    def limits(self) -> DeviceLimits:
        from pyhpctk.measure.gpu.activity import DeviceLimits

        return DeviceLimits(name="AMD", max_threads_per_sm=2048, warp_size=64)

    def start(self, monitor: MonitorPort) -> None:
        if not hip_available():
            raise UsageError(
                "gpu=amd needs AMD's hip-python bindings and a ROCm installation; neither was found"
            )
        importlib.import_module("hip")
        raise UsageError(
            "gpu=amd: ROCm activity tracing (roctracer/rocprofiler-sdk) has no Python "
            "binding pyrun can use yet; use gpu=nvidia or gpu=simulated"
        )

    def flush(self) -> None:
        """Nothing is buffered."""

    def stop(self) -> None:
        """Nothing was started."""

    def take_modules(self) -> list[bytes]:
        return []

    def pc_settings(self, period_exponent: int) -> tuple[int, int, int]:
        return 1 << period_exponent, 0, 0
