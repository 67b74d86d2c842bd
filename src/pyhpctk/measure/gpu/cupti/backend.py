"""The NVIDIA backend: CUPTI callbacks for operations, CUPTI activity buffers for activities.

- **Operations**: a CUPTI subscriber gets a callback on entry to every CUDA runtime and driver
  API that starts GPU work (launches, copies, memsets, allocations, frees, synchronizations;
  classified once, by name, from CUPTI's callback-id enums). Two subscribers (``hook=``):

  ``c`` (default where built): the C hook ``_cuptihook`` records repeated operations of a call
  site without entering Python and calls :meth:`GpuMonitor.operation_token` for new ones
  (docs/gpu.md, "The C hook").

  ``python``: cupti-python's ``subscribe``; the callback runs on the application thread and
  calls :meth:`GpuMonitor.operation` with CUPTI's correlation id.

  Nested calls (runtime → driver) each get their own id.
- **GPU binaries**: the resource callback for ``MODULE_LOADED`` copies each cubin; the monitor
  thread saves it as ``gpubins/<md5>.gpubin`` (:meth:`take_modules`), never inside the driver's
  callback.
- **Activities**: ``CONCURRENT_KERNEL``, ``MEMCPY``, ``MEMSET``, ``SYNCHRONIZATION`` and
  ``MEMORY2`` records (with ``inst``: ``KERNEL``, ``SYNCHRONIZATION`` and ``MEMORY2``, the only
  kinds under which CUPTI's SASS counters work). Two ways to read a completed buffer:

  ``raw`` (default): libcupti's own ``cuptiActivityRegisterCallbacks`` through ctypes; the
  completed buffer is viewed as bytes, cut into runs of one record kind (record sizes learned
  from ``cuptiActivityGetNextRecord``) and each run read in place through a strided view with
  ``cupti-python``'s structured dtypes (``activity_kernel*_dtype``...), never one Python object
  per record.

  ``objects``: ``cupti-python``'s documented callback, one Python object per record (the
  fallback, and the oracle the raw path is checked against on the device).

Threads CUPTI creates are not application threads: the buffer thread tells the session to leave
it out of sampling when the session offers that.

The backend owns three parts, each an object of its own: a :class:`~.callbacks.CallbackSubscriber`
(subscribing and the callbacks), a :class:`~.buffers.BufferReader` (reading activity buffers)
and a :class:`~.fine.FineCounting` (PC sampling and instruction counts); this module starts and
stops them in order and hands each what it needs; :mod:`.lib` has what they share.
"""

from __future__ import annotations

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import syncapi
from pyhpctk.measure.gpu.cupti.buffers import BufferReader, Gather
from pyhpctk.measure.gpu.cupti.callbacks import CallbackSubscriber, classify_api
from pyhpctk.measure.gpu.cupti.fine import FineCounting, clock_khz
from pyhpctk.measure.gpu.cupti.lib import BUFFER_COMPLETED, BUFFER_REQUESTED, load_hook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pyhpctk.measure.gpu.backend import MonitorPort, NativeHook
    from pyhpctk.measure.gpu.cupti.blocks import BlockReader

__all__ = [
    "BUFFER_COMPLETED",
    "BUFFER_REQUESTED",
    "CuptiBackend",
    "Gather",
    "classify_api",
    "load_hook",
]

_DEFAULT_LIMITS = act.DeviceLimits(name="NVIDIA (defaults until a kernel runs)")


class CuptiBackend:
    """CUPTI through ``cupti-python`` (see the module docstring)."""

    name = "nvidia"

    def __init__(
        self,
        buffer_bytes: int = 8 << 20,
        records: str = "raw",
        pc_period: int = 0,
        pc_mode: str = "serialized",
        hook: str = "auto",
        inst: bool = False,
        sync: str = syncapi.DEFAULT_SYNC,
        blocks: BlockReader | None = None,
    ) -> None:
        self.hook = hook  # "c": the C callback (_cuptihook), "python": cupti-python's; "auto"
        self.records = records  # "raw": libcupti's buffers read in place; "objects"
        self.fine = FineCounting(pc_period, pc_mode, inst, blocks)  # issues #7, #34
        self.callbacks = CallbackSubscriber(self.fine, sync)
        self.buffers = BufferReader(buffer_bytes)
        self.monitor: MonitorPort | None = None
        self._cupti: Any = None  # cupti-python's module (untyped), once started

    @property
    def native(self) -> NativeHook | None:
        """The C hook, once subscribed through it."""
        return self.callbacks.native

    @property
    def sync(self) -> str:
        """Who times synchronizations (``sync=``: :mod:`~pyhpctk.measure.gpu.syncapi`)."""
        return self.callbacks.sync

    @property
    def api_syncs(self) -> syncapi.ApiSyncs | None:
        """The synchronizations the C hook times (``sync=api``), once subscribed."""
        return self.callbacks.api_syncs

    def limits(self) -> act.DeviceLimits:
        return self.buffers.learned_limits or _DEFAULT_LIMITS

    def take_modules(self) -> list[bytes]:
        """The cubins loaded since the last call (the monitor saves them on its own thread)."""
        return self.callbacks.take_modules()

    def pc_settings(self, period_exponent: int) -> tuple[int, int, int]:
        """The period asked for, the device's SM clock; its SM count comes with a kernel."""
        return 1 << period_exponent, clock_khz(), 0

    def flush(self) -> None:
        """Every activity buffer CUPTI holds, to the monitor (:meth:`BufferReader.flush`)."""
        self.buffers.flush()

    def start(self, monitor: MonitorPort) -> None:
        from cupti import cupti

        self._cupti = cupti
        self.monitor = monitor
        self.fine.start(monitor)
        native = None if self.hook == "python" else load_hook()
        if native is None and self.hook == "c":
            raise OSError(
                "gpu=nvidia,hook=c: the C hook pyhpctk.measure.gpu.cupti._cuptihook is not "
                "built (reinstall pyhpctk where a C compiler and the Python headers are present)"
            )
        self.callbacks.start(cupti, monitor, native)
        self.buffers.start(
            cupti,
            monitor,
            self._activity_kinds(cupti),
            raw=self.records == "raw",
            native=self.callbacks.native,
            api_syncs=self.callbacks.api_syncs,
        )

    def _activity_kinds(self, cupti: Any) -> dict[int, int]:
        """CUPTI's activity kinds to enable → ours.

        Instruction counting (issue #7): with CONCURRENT_KERNEL activity on, CUPTI's SASS
        counters read zero, and with MEMCPY or MEMSET activity on it counts nothing at all
        (H200, CUPTI 13.0: tests/data/gpu/probe_from_python.py, PFP_ACTIVITY). The KERNEL
        kind (serialized kernels, the same records) leaves them intact: inst traces kernels,
        synchronizations and allocations, not copies or memsets.
        """
        inst = self.fine.inst
        kernels = cupti.ActivityKind.KERNEL if inst else cupti.ActivityKind.CONCURRENT_KERNEL
        kinds = {int(kernels): act.KERNEL, int(cupti.ActivityKind.MEMORY2): act.ALLOC}
        api_syncs = self.callbacks.api_syncs
        if api_syncs is None or api_syncs.mode == syncapi.SYNC_BOTH:
            kinds[int(cupti.ActivityKind.SYNCHRONIZATION)] = act.SYNC  # ~30 % (syncapi)
        if not inst:
            kinds[int(cupti.ActivityKind.MEMCPY)] = act.COPY
            kinds[int(cupti.ActivityKind.MEMSET)] = act.MEMSET
        return kinds

    def stop(self) -> None:
        cupti = self._cupti
        if cupti is None:
            return
        self.fine.finish()
        self.buffers.stop()
        self.callbacks.stop(cupti)
        native = self.callbacks.native
        if native is not None:
            self.buffers.deliver_syncs()  # those timed since the last flush
            counts = native.stats()
            counts["lost"] += native.sync_stats()[1] if self.api_syncs is not None else 0
            if self.monitor is not None and (counts["errors"] or counts["lost"]):
                self.monitor.errors.append(
                    f"pyrun: gpu: the C hook lost {counts['lost']} operations (out of memory) "
                    f"and its Python slow path failed {counts['errors']} times"
                )
        self.buffers.finished()
        self._cupti = None
