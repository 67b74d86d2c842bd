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

The backend is three rooms: :mod:`.cupti_callbacks` (subscribing and the callbacks, PC sampling
and instruction counts), :mod:`.cupti_buffers` (reading activity buffers) and this module (the
backend's state, start and stop); :mod:`.cupti_lib` has what they share.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import threading

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import syncapi
from pyhpctk.measure.gpu.cupti_buffers import ActivityBuffers, Gather
from pyhpctk.measure.gpu.cupti_callbacks import ApiCallbacks, classify_api
from pyhpctk.measure.gpu.cupti_lib import (
    BUFFER_COMPLETED,
    BUFFER_REQUESTED,
    NO_CBID,
    load_hook,
    loaded_library,
)
from pyhpctk.measure.gpu.records import Converter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pyhpctk.measure.gpu.backend import MonitorPort, NativeHook
    from pyhpctk.measure.gpu.pcsampling import PcSampler
    from pyhpctk.measure.gpu.sassmetrics import SassCounter

__all__ = ["BUFFER_COMPLETED", "BUFFER_REQUESTED", "CuptiBackend", "classify_api", "load_hook"]

# Names tests, benchmarks and the device scripts import from here (tests/data/gpu/).
_Gather = Gather
_loaded_library = loaded_library


class CuptiBackend(ApiCallbacks, ActivityBuffers):
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
    ) -> None:
        self.sync = sync  # "api": the C hook times synchronizations (syncapi); "activity": CUPTI
        self.api_syncs: syncapi.ApiSyncs | None = None  # once the hook times them
        self._api_names: dict[tuple[int, int], str] = {}  # GPU operations' callback-id names
        self.inst = inst  # issue #7: exact instruction counts (cuptiSassMetrics*)
        self.inst_counters: dict[int, SassCounter] = {}  # CUcontext → sassmetrics.SassCounter
        self._inst_first: dict[int, int] = {}  # CUcontext → the counted window's first launch
        self._profiler_starts: set[tuple[int, int]] = set()  # cu/cudaProfilerStart (inst)
        self.inst_launches: dict[int, int] = {}  # CUcontext → kernel launches while counting
        self._fine_busy = threading.local()  # inside a counter's own CUDA calls
        self.hook = hook  # "c": the C callback (_cuptihook), "python": cupti-python's; "auto"
        self.native: NativeHook | None = None  # the _cuptihook module once subscribed through it
        self._modules: collections.deque[bytes] = collections.deque()  # cubins (Python hook)
        self.pc_mode = pc_mode
        self.buffer_bytes = buffer_bytes
        self.pc_period = pc_period  # issue #7: PC sampling period exponent (2^N cycles); 0 = off
        self.pc_samplers: dict[int, PcSampler] = {}  # CUcontext → pcsampling.PcSampler
        self.pc_errors: list[str] = []
        self._exit = -1
        self._context_created = -1
        self.records = records
        self.monitor: MonitorPort | None = None
        self.dropped = 0
        self.record_counts: dict[str, int] = {}
        self.api_kinds: dict[tuple[int, int], int] = {}
        self.api_multi: set[tuple[int, int]] = set()  # CUDA graph launches: many activities
        self._cupti: Any = None  # cupti-python's module (untyped), once started
        self._subscriber: object = None
        self._buffers: dict[int, ctypes.Array[ctypes.c_uint8]] = {}
        self._native_buffers = False  # CUPTI's buffers go through the C hook's callbacks
        self._buffers_stopping = False
        self._buffer_done = threading.Event()
        self._delivering = threading.Lock()  # one reader of taken buffers at a time
        self._callbacks: tuple[object, ...] = ()
        self._lib: ctypes.CDLL | None = None
        self._names: dict[int, int] = {}  # kernel name pointer → index in self.functions
        self.functions: list[str] = []
        self._limits = act.DeviceLimits(name="NVIDIA (defaults until a kernel runs)")
        self._limits_known = False
        self._excluded: set[int] = set()
        self._kinds: dict[int, int] = {}
        self._domain_resource = self._enter = self._module_loaded = -1
        self._domain_driver = -1
        self._nest = threading.local()  # hook=python: runtime calls each thread is inside
        self._graph_created = self._graph_cloned = NO_CBID
        self._node_id: Any = None  # cuptiGetGraphNodeId (ctypes), for hook=python
        self.unknown_apis = 0  # callback ids CUPTI refused to enable
        self.record_sizes: dict[int, int] = {}  # CUPTI activity kind → record size in buffers
        self.fast_walk = True
        # The C walk of a buffer's records (record_offsets), where the hook is built; the numpy
        # walk run by run otherwise.
        built = load_hook()  # (a hook built from older sources has no record_offsets)
        self.walker: NativeHook | None = built if hasattr(built, "record_offsets") else None
        self.converter = Converter(built)  # records to rows in C, where built
        # record_sizes as record_offsets() reads them, and the sizes it was made from
        self._size_table: tuple[bytes, tuple[tuple[int, int], ...]] = (b"", ())
        self.checks_left = 1  # buffers walked both ways before the fast walk is trusted alone
        self.walk_mismatches = 0

    def limits(self) -> act.DeviceLimits:
        return self._limits

    # -- start / stop --

    def learn_apis(self, domain: int, members: dict[str, int]) -> None:
        """Which callbacks of ``domain`` (CUPTI's callback-id names → ids) start what.

        Fills :attr:`api_kinds` (kind of each GPU operation's API), :attr:`api_multi` (graph
        launches: several activities per call) and, with ``inst``, the profiler starts where
        counting begins; with ``inst``, copies and memsets are left out (not traced: start()).
        """
        for name, cbid in members.items():
            kind = classify_api(name)
            if self.inst and kind in (act.COPY, act.MEMSET):
                continue
            if kind is not None and "SIZE" not in name and "INVALID" not in name:
                self.api_kinds[(domain, cbid)] = kind
                self._api_names[(domain, cbid)] = name
                if "GraphLaunch" in name:
                    self.api_multi.add((domain, cbid))
            elif self.inst and name.startswith(("cuProfilerStart", "cudaProfilerStart")):
                self._profiler_starts.add((domain, cbid))

    def take_modules(self) -> list[bytes]:
        """The cubins loaded since the last call (the monitor saves them on its own thread)."""
        native = self.native
        taken: list[bytes] = native.take_modules() if native is not None else []
        modules = self._modules
        while modules:
            taken.append(modules.popleft())
        return taken

    def pc_settings(self, period_exponent: int) -> tuple[int, int, int]:
        """The period asked for, the device's SM clock; its SM count comes with a kernel."""
        return 1 << period_exponent, self.clock_khz(), 0

    def start(self, monitor: MonitorPort) -> None:
        from cupti import cupti

        self._cupti = cupti
        self.monitor = monitor
        self._operation = monitor.operation
        for domain, enum in (
            (cupti.CallbackDomain.RUNTIME_API, cupti.RuntimeApiTraceCbid),
            (cupti.CallbackDomain.DRIVER_API, cupti.DriverApiTraceCbid),
        ):
            self.learn_apis(int(domain), {n: int(m) for n, m in enum.__members__.items()})
        self._domain_resource = int(cupti.CallbackDomain.RESOURCE)
        self._domain_driver = int(cupti.CallbackDomain.DRIVER_API)
        self._enter = int(cupti.ApiCallbackSite.API_ENTER)
        self._module_loaded = int(cupti.CallbackIdResource.MODULE_LOADED)
        # CUDA graphs: where each node was made, and which node each instantiated one copies
        resources = cupti.CallbackIdResource
        self._graph_created = int(getattr(resources, "GRAPHNODE_CREATED", NO_CBID))
        self._graph_cloned = int(getattr(resources, "GRAPHNODE_CLONED", NO_CBID))
        self._exit = int(cupti.ApiCallbackSite.API_EXIT)
        native = None if self.hook == "python" else load_hook()
        if native is None and self.hook == "c":
            raise OSError(
                "gpu=nvidia,hook=c: the C hook pyhpctk.measure.gpu._cuptihook is not built "
                "(reinstall pyhpctk where a C compiler and the Python headers are present)"
            )
        if native is not None:
            self._start_native(cupti, native, monitor)
        else:
            self._start_python(cupti)
        if self.records == "raw":
            self._register_raw(cupti)
        else:
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        # Instruction counting (issue #7): with CONCURRENT_KERNEL activity on, CUPTI's SASS
        # counters read zero, and with MEMCPY or MEMSET activity on it counts nothing at all
        # (H200, CUPTI 13.0: tests/data/gpu/probe_from_python.py, PFP_ACTIVITY). The KERNEL
        # kind (serialized kernels, the same records) leaves them intact: inst traces kernels,
        # synchronizations and allocations, not copies or memsets.
        kernels = cupti.ActivityKind.KERNEL if self.inst else cupti.ActivityKind.CONCURRENT_KERNEL
        self._kinds = {int(kernels): act.KERNEL, int(cupti.ActivityKind.MEMORY2): act.ALLOC}
        if self.api_syncs is None or self.api_syncs.mode == syncapi.SYNC_BOTH:
            self._kinds[int(cupti.ActivityKind.SYNCHRONIZATION)] = act.SYNC  # ~30 % (syncapi)
        if not self.inst:
            self._kinds[int(cupti.ActivityKind.MEMCPY)] = act.COPY
            self._kinds[int(cupti.ActivityKind.MEMSET)] = act.MEMSET
        for kind in self._kinds:
            cupti.activity_enable(kind)

    def stop(self) -> None:
        cupti = self._cupti
        if cupti is None:
            return
        for context in list(self.pc_samplers):
            self._pc_collect(context, final=True)
        for context in list(self.inst_counters):
            self._inst_collect(context)
        if self.inst and not self.inst_counters:
            self._pc_error(
                "pyrun: gpu: instruction counts: none — counting starts when the program calls"
                " cudaProfilerStart() (cupy.cuda.runtime.profilerStart(),"
                " torch.cuda.profiler.start()) right before the kernel to count (docs/gpu.md)"
            )
        released: set[int] = set()
        for counter in self.inst_counters.values():
            device = int(counter.device)
            if device not in released:
                released.add(device)
                with contextlib.suppress(Exception):
                    counter.release()
        try:
            self.flush()
        except Exception as error:  # CUDA may already be torn down
            if self.monitor is not None:
                self.monitor.errors.append(f"pyrun: gpu: final CUPTI flush failed: {error!r}")
        for kind in self._kinds:
            try:
                cupti.activity_disable(kind)
            except Exception:  # already disabled, or CUDA torn down
                continue
        self._stop_buffer_thread()
        native = self.native
        if native is not None:
            try:
                native.unsubscribe()
            except OSError as error:
                if self.monitor is not None:
                    self.monitor.errors.append(f"pyrun: gpu: {error}")
            self._deliver_syncs()  # those timed since the last flush
            counts = native.stats()
            counts["lost"] += native.sync_stats()[1] if self.api_syncs is not None else 0
            if self.monitor is not None and (counts["errors"] or counts["lost"]):
                self.monitor.errors.append(
                    f"pyrun: gpu: the C hook lost {counts['lost']} operations (out of memory) "
                    f"and its Python slow path failed {counts['errors']} times"
                )
        else:
            with contextlib.suppress(Exception):
                cupti.unsubscribe(self._subscriber)
        self._cupti = None
