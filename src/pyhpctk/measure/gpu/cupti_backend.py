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
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import ctypes
import importlib
import re
import sys
import threading

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import syncapi
from pyhpctk.measure.gpu.operations import SKIP
from pyhpctk.measure.gpu.records import Converter, convert

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from pyhpctk.measure.gpu.backend import MonitorPort, NativeHook
    from pyhpctk.measure.gpu.pcsampling import PcSampler
    from pyhpctk.measure.gpu.sassmetrics import SassCounter

# Classification of API names (CUPTI's callback-id enum member names), first match wins.
_API_RULES: tuple[tuple[str, int | None], ...] = (
    (r"Graph(Exec)?(Add|Get|Set|Mem|Node|Instantiate|Create|Destroy|Clone|Upload|Debug)", None),
    (r"GraphLaunch", act.GRAPH),
    (r"HostFunc|LaunchAttribute|GetAttribute|SetAttribute|Occupancy", None),
    # Synchronizations, and the event calls that can report one (seen on the H200: EVENT
    # synchronization records whose correlation id no Synchronize call had).
    (r"Synchronize|WaitEvent|EventQuery|EventRecord|StreamQuery", act.SYNC),
    (r"Launch", act.KERNEL),
    (r"Memcpy", act.COPY),
    (r"Memset", act.MEMSET),
    (r"FreeAsync|Free(Host|Array|Mipmapped)?(_|$)|MemFree|MemRelease", act.FREE),
    (r"Malloc|MemAlloc(?!ationGranularity)|MemCreate|HostAlloc|HostRegister", act.ALLOC),
    # Loading a module allocates its static device memory (MEMORY2 records of kind
    # DEVICE_STATIC carry the load call's correlation id).
    (r"ModuleLoad|LibraryLoad", act.ALLOC),
)
_COMPILED = tuple((re.compile(pattern), kind) for pattern, kind in _API_RULES)


def classify_api(name: str) -> int | None:
    """The operation kind a CUDA API starts, from its name (None: not a GPU operation)."""
    for pattern, kind in _COMPILED:
        if pattern.search(name):
            return kind
    return None


class _Gather:
    """Pull records of one activity kind out of a raw buffer with one numpy gather.

    CUPTI's record versions of a kind (``CUpti_ActivityKernel9`` ... ``13``) only ever append
    fields, so any version no longer than the records' stride reads the fields used here.
    """

    def __init__(self, candidates: list[np.dtype]) -> None:
        self.candidates = sorted(candidates, key=lambda dtype: dtype.itemsize)
        self._padded: dict[int, np.dtype | None] = {}

    def rows(self, raw: np.ndarray, offsets: np.ndarray, strides: np.ndarray) -> np.ndarray | None:
        stride = int(strides.min()) if len(strides) else 0
        fitting = [d for d in self.candidates if d.itemsize <= stride]
        if not fitting:
            return None
        dtype = fitting[-1]
        index = offsets[:, None] + np.arange(dtype.itemsize)[None, :]
        return np.ascontiguousarray(raw[index]).view(dtype).reshape(-1)

    def padded(self, stride: int) -> np.dtype | None:
        """The longest version fitting ``stride``, padded to it (a strided view's dtype)."""
        if stride not in self._padded:
            fitting = [d for d in self.candidates if d.itemsize <= stride]
            padded = None
            if fitting:
                fields: Mapping[str, tuple[Any, ...]] = fitting[-1].fields or {}
                padded = np.dtype(
                    {
                        "names": list(fields),
                        "formats": [fields[n][0] for n in fields],
                        "offsets": [int(fields[n][1]) for n in fields],
                        "itemsize": stride,
                    }
                )
            self._padded[stride] = padded
        return self._padded[stride]


_LOOKAHEAD = 4096  # at most, records checked per numpy step of the numpy walk
_CHECKED = 256  # records of the first buffer also walked with CUPTI


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
        self._graph_created = self._graph_cloned = _NO_CBID
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
        self._graph_created = int(getattr(resources, "GRAPHNODE_CREATED", _NO_CBID))
        self._graph_cloned = int(getattr(resources, "GRAPHNODE_CLONED", _NO_CBID))
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

    def _start_native(self, cupti: Any, native: NativeHook, monitor: MonitorPort) -> None:
        """Subscribe the C callback: repeated operations never enter Python (_cuptihook.c)."""
        fine = self.fine
        entries = [  # PC samples and instruction counts are read at kernel launches' exits
            (key[0], key[1], kind, int(key in self.api_multi), int(fine and kind == act.KERNEL))
            for key, kind in self.api_kinds.items()
        ]
        # instruction counting starts at a profiler start's exit (its kind is never used: in
        # fine mode every call goes to _native_every, which takes these first)
        entries += [(key[0], key[1], act.SYNC, 0, 1) for key in self._profiler_starts]
        context_created = int(cupti.CallbackIdResource.CONTEXT_CREATED) if fine else _NO_CBID
        self._context_created = context_created if fine else -1
        every = self._native_every if fine else None
        native.configure(
            entries,
            monitor.operation_token,
            every,
            self._module_loaded,
            context_created,
            SKIP,
            self._graph_created,
            self._graph_cloned,
        )
        if syncapi.timed_at_api(self.sync, True, fine):  # before subscribe(): see syncapi
            self.api_syncs = syncapi.ApiSyncs(native, self.sync)
            self.api_syncs.configure(syncapi.sync_entries(self._api_names, self.api_kinds))
        cupti.get_timestamp()  # loads libcupti
        path = _loaded_library("libcupti")
        if path is None:
            raise OSError("libcupti is not loaded (is cupti-python installed?)")
        self.unknown_apis = int(native.subscribe(path))
        self.native = native
        monitor.attach_hook(native)

    def _start_python(self, cupti: Any) -> None:
        """Subscribe cupti-python's callback (one Python call per API entry and exit)."""
        self._subscriber = cupti.subscribe(self._callback, None)
        if self.fine:
            self._context_created = int(cupti.CallbackIdResource.CONTEXT_CREATED)
            cupti.enable_callback(
                1,
                self._subscriber,
                cupti.CallbackDomain.RESOURCE,
                cupti.CallbackIdResource.CONTEXT_CREATED,
            )
        for key in list(self.api_kinds):
            try:
                cupti.enable_callback(1, self._subscriber, *key)
            except cupti.cuptiError:  # an id this libcupti lacks
                del self.api_kinds[key]
                self.unknown_apis += 1
        for key in list(self._profiler_starts):
            try:
                cupti.enable_callback(1, self._subscriber, *key)
            except cupti.cuptiError:
                self._profiler_starts.discard(key)
        cupti.enable_callback(
            1,
            self._subscriber,
            cupti.CallbackDomain.RESOURCE,
            cupti.CallbackIdResource.MODULE_LOADED,
        )
        path = _loaded_library("libcupti")
        if path is not None and self._graph_created != _NO_CBID:
            lib = ctypes.CDLL(path)
            self._node_id = lib.cuptiGetGraphNodeId
            self._node_id.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
            for cbid in (self._graph_created, self._graph_cloned):
                cupti.enable_callback(1, self._subscriber, cupti.CallbackDomain.RESOURCE, cbid)

    def _native_every(
        self, domain: int, cbid: int, site: int, correlation: int, context: int
    ) -> None:
        """The C hook hands over every call while PC sampling is on (as :meth:`_callback`)."""
        if getattr(self._fine_busy, "on", False):  # a CUDA call of the counters themselves
            if (
                site == self._enter
                and (domain, cbid) in self.api_kinds
                and self.monitor is not None
            ):
                self.monitor.own_call(correlation)  # a GPU operation (a synchronize): its record
            return
        if domain == self._domain_resource:
            if cbid == self._context_created:
                self._fine_enable(context)
            return
        key = (domain, cbid)
        if key in self._profiler_starts:
            if site != self._enter:
                self._inst_start(context)
            return
        kind = self.api_kinds.get(key)
        if site != self._enter:
            if kind == act.KERNEL:
                self._fine_collect(context, correlation)
            return
        self._fine_enable(context)
        if kind is not None:
            self._operation(kind, correlation, key in self.api_multi)

    @property
    def fine(self) -> bool:
        """PC sampling or instruction counting: every API call is seen in Python."""
        return bool(self.pc_period or self.inst)

    def _fine_enable(self, context: int) -> None:
        if self.pc_period and context not in self.pc_samplers:
            self._pc_enable(context)

    def _inst_start(self, context: int) -> None:
        """At the exit of the program's first cu/cudaProfilerStart: counting starts (once)."""
        if not context:
            cuda = ctypes.CDLL("libcuda.so.1")
            current = ctypes.c_void_p(0)
            if cuda.cuCtxGetCurrent(ctypes.byref(current)) == 0:
                context = int(current.value or 0)
        if context and not self.inst_counters:
            self._inst_enable(context)

    def _fine_collect(self, context: int, correlation: int) -> None:
        if self.pc_period:
            self._pc_collect(context)
        if self.inst and context in self.inst_counters:
            self._inst_first.setdefault(context, correlation)
            self.inst_launches[context] = self.inst_launches.get(context, 0) + 1

    # -- instruction counts (issue #7) --

    def _inst_enable(self, context: int) -> None:
        """Start counting on ``context``: at the exit of the program's profiler start (once).

        CUPTI counts only the first device work after SetConfig — which must be a kernel, in
        an enabled window — and nothing when that is a memset or a kernel launched before
        Enable; enabling inside the launch's own API callback gave records with zero counts
        on the H200 (``sassmetrics``' docstring). So the program says where: the kernel it
        launches next after ``cudaProfilerStart()`` is counted, with its later launches.
        """
        from pyhpctk.measure.gpu.sassmetrics import SassCounter

        path = _loaded_library("libcupti")
        counter = SassCounter(ctypes.CDLL(path or "libcupti.so"), context, self._device_of(context))
        self.inst_counters[context] = counter
        self._fine_busy.on = True
        try:
            counter.synchronize()
            counter.enable()
        except Exception as error:
            self._pc_error(f"pyrun: gpu: instruction counting unavailable: {error}")
            counter.enabled = False
        finally:
            self._fine_busy.on = False

    def _device_of(self, context: int) -> int:
        """The device ordinal of ``context`` (cuCtxGetDevice on the current context; 0)."""
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            device = ctypes.c_int(0)
            if cuda.cuCtxGetDevice(ctypes.byref(device)) == 0:
                return int(device.value)
        except OSError:
            pass
        return 0

    def _inst_collect(self, context: int) -> None:
        """At the end: wait for the kernels, read the window's totals (one flush), disable.

        The totals go to the monitor as the window's first launch's. The monitor splits them
        between the counted launches' calling contexts (``GpuMonitor._inst_pieces``).
        """
        counter = self.inst_counters.get(context)
        monitor = self.monitor
        if counter is None or monitor is None or not counter.enabled:
            return
        correlation = self._inst_first.get(context, 0)
        self._fine_busy.on = True
        try:
            counter.synchronize()
            batch = counter.disable(correlation)
        except Exception as error:
            self._pc_error(f"pyrun: gpu: reading instruction counts failed: {error}")
            return
        finally:
            self._fine_busy.on = False
        if len(batch.rows):
            monitor.inst_counts(batch.rows, batch.functions, self.inst_launches.get(context, 0))

    def flush(self) -> None:
        """Every activity buffer CUPTI holds, to the monitor; the GIL released meanwhile.

        CUPTI's thread holds its own lock while it completes a buffer, and
        ``cuptiActivityFlushAll`` waits for that lock: flushing with the GIL held deadlocked
        with a completion callback that needed the GIL (docs/gpu.md, "No hang"). With the C
        hook the callbacks need no GIL at all, and the buffers the flush completed are
        delivered here, before this returns; otherwise libcupti is called through ctypes,
        which releases the GIL.
        """
        if self._cupti is None:
            return
        native = self.native if self._native_buffers else None
        if native is not None:
            native.flush_all(1)
            with self._delivering:
                self._deliver_buffers(native, native.take_buffers(0.0))
                self._deliver_syncs()
            return
        lib = self._lib
        if lib is None:
            path = _loaded_library("libcupti")
            lib = self._lib = ctypes.CDLL(path) if path is not None else None
        if lib is not None:
            lib.cuptiActivityFlushAll(1)  # a ctypes.CDLL call: the GIL is released
        self._deliver_syncs()

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

    # -- callbacks on application threads --

    def _callback(self, userdata: object, domain: int, cbid: int, data: Any) -> None:
        # Called twice per API call (entry and exit) on the application thread: keep it short.
        if domain == self._domain_resource:
            if cbid == self._module_loaded:
                self._module(data)
            elif cbid in (self._graph_created, self._graph_cloned):
                self._graph(data, cbid == self._graph_cloned)
            elif cbid == self._context_created:
                self._fine_enable(int(data.context))
            return
        if self._inside_runtime(domain, data.callback_site):
            return
        if self.fine:
            if getattr(self._fine_busy, "on", False):  # a CUDA call of the counters themselves
                site = data.callback_site
                if (
                    site == self._enter
                    and (domain, cbid) in self.api_kinds
                    and self.monitor is not None
                ):
                    self.monitor.own_call(int(data.correlation_id))
                return
            context = int(data.context)
            if (domain, cbid) in self._profiler_starts:
                if data.callback_site != self._enter:
                    self._inst_start(context)
                return
            if data.callback_site != self._enter:
                if self.api_kinds.get((domain, cbid)) == act.KERNEL:
                    self._fine_collect(context, int(data.correlation_id))
                return
            self._fine_enable(context)
        elif data.callback_site != self._enter:
            return
        key = (domain, cbid)
        kind = self.api_kinds.get(key)
        if kind is not None:
            self._operation(kind, data.correlation_id, key in self.api_multi)

    def _inside_runtime(self, domain: int, site: int) -> bool:
        """A driver call inside a runtime call of ours: part of that call, not an operation.

        The runtime call's correlation id is the one its activities carry (docs/gpu.md, "The C
        hook"); each thread counts the runtime calls it is inside, from their entries and exits.
        """
        nest = self._nest
        depth: int = getattr(nest, "depth", 0)
        if domain == self._domain_driver:
            return depth > 0
        nest.depth = depth + 1 if site == self._enter else max(depth - 1, 0)
        return False

    def _module(self, data: Any) -> None:
        """A module was loaded: read its cubin from ``CUpti_ModuleResourceData``.

        ``{u32 moduleId; size_t cubinSize; const char *pCubin;}`` (cupti_callbacks.h), read at
        its address: the bindings turn ``pCubin`` into a string that stops at the first NUL.
        """
        monitor = self.monitor
        assert monitor is not None
        try:
            descriptor = int(data.resource_descriptor)
            size = ctypes.c_uint64.from_address(descriptor + 8).value
            pointer = ctypes.c_void_p.from_address(descriptor + 16).value
            cubin = ctypes.string_at(pointer, size) if size and pointer else b""
        except Exception as error:
            monitor.errors.append(f"pyrun: gpu: cannot read a loaded module: {error!r}")
            return
        if cubin:  # saved on the monitor thread: no lock is taken inside the driver's callback
            self._modules.append(cubin)

    def _graph(self, data: Any, cloned: bool) -> None:
        """A graph node was made here, or cloned: ``CUpti_GraphData`` read at its address.

        ``{CUgraph graph, originalGraph; CUgraphNode node, originalNode; ...}``
        (cupti_callbacks.h): the node at offset 16, the original at 24.
        """
        monitor, node_id = self.monitor, self._node_id
        if monitor is None or node_id is None:
            return
        descriptor = int(data.resource_descriptor)
        ids = []
        for offset in (16, 24) if cloned else (16,):
            handle = ctypes.c_void_p.from_address(descriptor + offset).value
            value = ctypes.c_uint64(0)
            if not handle or node_id(handle, ctypes.byref(value)) != 0:
                return
            ids.append(int(value.value))
        monitor.graph_node(ids[0], ids[1] if cloned else 0)

    # -- PC sampling (issue #7) --

    def _pc_enable(self, context: int) -> None:
        """Start kernel-serialized PC sampling on ``context`` (once per context)."""
        if not context or context in self.pc_samplers:
            return
        from pyhpctk.measure.gpu.pcsampling import PcSampler

        path = _loaded_library("libcupti")
        sampler = PcSampler(
            ctypes.CDLL(path or "libcupti.so"),
            context,
            self.pc_period,
            start_stop=False,
            mode=self.pc_mode,
        )
        self.pc_samplers[context] = sampler
        try:
            sampler.enable()
        except Exception as error:
            self._pc_error(f"pyrun: gpu: PC sampling unavailable: {error}")
            sampler.enabled = False

    def _pc_collect(self, context: int, final: bool = False) -> None:
        """Read the samples CUPTI has for ``context`` and hand them to the monitor."""
        sampler = self.pc_samplers.get(context)
        monitor = self.monitor
        if sampler is None or monitor is None or not sampler.enabled:
            return
        try:
            batch = sampler.collect()
            if final:
                rest = sampler.disable()
                if len(rest.rows):
                    monitor.pc_samples(rest.rows, rest.functions, sampler.reasons, 0)
        except Exception as error:
            self._pc_error(f"pyrun: gpu: reading PC samples failed: {error}")
            return
        if len(batch.rows) or batch.dropped_samples:
            monitor.pc_samples(
                batch.rows,
                batch.functions,
                sampler.reasons,
                batch.dropped_samples,
            )

    def _pc_error(self, text: str) -> None:
        if text not in self.pc_errors:
            self.pc_errors.append(text)
            if self.monitor is not None:
                self.monitor.errors.append(text)

    def clock_khz(self) -> int:
        """The SM clock of device 0 in kHz (CU_DEVICE_ATTRIBUTE_CLOCK_RATE), 0 if unknown."""
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            value = ctypes.c_int(0)
            if cuda.cuDeviceGetAttribute(ctypes.byref(value), 13, 0) != 0:
                return 0
            return int(value.value)
        except OSError:
            return 0

    # -- activity buffers: cupti-python objects --

    def _buffer_requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0

    def _exclude_current(self) -> None:
        ident = threading.get_ident()
        if ident not in self._excluded:
            self._excluded.add(ident)
            if self.monitor is not None:
                self.monitor.exclude_current_thread()

    def _buffer_completed(self, activities: list[Any]) -> None:
        self._exclude_current()
        records = act.empty_activities(len(activities))
        keep = np.zeros(len(activities), dtype=bool)
        for index, record in enumerate(activities):
            kind = self._kinds.get(int(record.kind))
            if kind is None:
                continue
            keep[index] = True
            row = records[index]
            row["kind"] = kind
            row["correlation"] = record.correlation_id
            row["context"] = getattr(record, "context_id", 0)
            row["stream"] = getattr(record, "stream_id", 0)
            row["device"] = getattr(record, "device_id", 0)
            row["graph"] = getattr(record, "graph_id", 0)
            row["graph_node"] = getattr(record, "graph_node_id", 0)
            if kind == act.ALLOC:
                if int(record.memory_operation_type) == 2:
                    row["kind"] = act.FREE  # CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE
                row["start"] = row["end"] = record.timestamp
                row["bytes"] = record.bytes
                row["memory_kind"] = record.memory_kind
                continue
            row["start"] = record.start
            row["end"] = record.end
            if kind == act.KERNEL:
                row["registers"] = record.registers_per_thread
                row["static_smem"] = record.static_shared_memory
                row["dynamic_smem"] = record.dynamic_shared_memory
                row["local_mem"] = record.local_memory_total
                row["block_threads"] = record.block_x * record.block_y * record.block_z
                row["grid_blocks"] = record.grid_x * record.grid_y * record.grid_z
                row["function"] = self._function_index(str(record.name))
            elif kind == act.COPY:
                row["bytes"] = record.bytes
                row["copy_kind"] = record.copy_kind
            elif kind == act.MEMSET:
                row["bytes"] = record.bytes
                row["memory_kind"] = record.memory_kind
            elif kind == act.SYNC:
                row["sync_kind"] = record.type
        self._deliver(records[keep])

    def _function_index(self, name: str) -> int:
        index = self._names.get(hash(name))
        if index is None:
            index = self._names[hash(name)] = len(self.functions)
            self.functions.append(name)
        return index

    def _deliver_syncs(self) -> None:
        """The synchronizations the hook timed since the last buffer, alone (a flush)."""
        if self.api_syncs is not None:
            rows = self.api_syncs.take()
            if len(rows):
                self._deliver(rows)

    def _deliver(self, records: np.ndarray) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        if self.api_syncs is not None:  # sync=api: as CUPTI's records came, with a buffer
            records = self.api_syncs.joined(records)
        if not self._limits_known and (records["kind"] == act.KERNEL).any():
            self._learn_limits(int(records["device"][records["kind"] == act.KERNEL][0]))
        monitor.buffer_completed(records, self.functions, self._take_dropped())

    def _take_dropped(self) -> int:
        cupti = self._cupti
        if cupti is None:
            return 0
        dropped = ctypes.c_size_t(0)
        try:
            cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
        except Exception:
            return 0
        return int(dropped.value)

    def _learn_limits(self, device: int) -> None:
        self._limits_known = True
        try:
            runtime = importlib.import_module("cuda.bindings.runtime")
            error, props = runtime.cudaGetDeviceProperties(device)
            if int(error) != 0:
                return
            limits = act.DeviceLimits(
                name=props.name.decode(errors="replace")
                if isinstance(props.name, bytes)
                else str(props.name),
                sm_count=int(props.multiProcessorCount),
                max_threads_per_sm=int(props.maxThreadsPerMultiProcessor),
                max_blocks_per_sm=int(props.maxBlocksPerMultiProcessor),
                registers_per_sm=int(props.regsPerMultiprocessor),
                shared_per_sm=int(props.sharedMemPerMultiprocessor),
                warp_size=int(props.warpSize),
            )
        except Exception:  # keep the defaults
            return
        self._limits = limits
        if self.monitor is not None:
            self.monitor.set_limits(limits)

    # -- activity buffers: raw, through libcupti and numpy --

    def _register_raw(self, cupti: object) -> None:
        path = _loaded_library("libcupti")
        if path is None:
            raise OSError("libcupti is not loaded (is cupti-python installed?)")
        lib = ctypes.CDLL(path)
        self._lib = lib
        lib.cuptiActivityGetNextRecord.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.cuptiActivityGetNextRecord.restype = ctypes.c_int
        if self.native is not None:  # the C hook's callbacks: CUPTI's thread needs no GIL
            self.native.register_buffers(path, self.buffer_bytes)
            self._native_buffers = True
            self._buffer_done.clear()
            _thread.start_new_thread(self._buffer_main, (self.native,))
        else:
            requested = BUFFER_REQUESTED(self._raw_requested)
            completed = BUFFER_COMPLETED(self._raw_completed)
            self._callbacks = (requested, completed)
            status = lib.cuptiActivityRegisterCallbacks(requested, completed)
            if status != 0:
                raise OSError(f"cuptiActivityRegisterCallbacks failed with status {status}")
        names = [name for name in dir(cupti) if name.endswith("_dtype")]
        self._gathers = {
            kind: _Gather([getattr(cupti, name) for name in names if re.fullmatch(pattern, name)])
            for kind, pattern in (
                (act.KERNEL, r"activity_kernel\d*_dtype"),
                (act.COPY, r"activity_memcpy\d*_dtype"),
                (act.MEMSET, r"activity_memset\d*_dtype"),
                (act.SYNC, r"activity_synchronization\d*_dtype"),
                (act.ALLOC, r"activity_memory\d+_dtype"),
            )
        }

    def _buffer_main(self, native: NativeHook) -> None:
        """The buffer thread: completed buffers from the C hook's queue, read and delivered."""
        try:
            if self.monitor is not None:
                self.monitor.exclude_current_thread()
            while True:
                taken = native.take_buffers(0.25)  # waits without the GIL
                with self._delivering:
                    self._deliver_buffers(native, taken)
                if self._buffers_stopping and not taken:
                    return
        finally:
            self._buffer_done.set()

    def _deliver_buffers(self, native: NativeHook, taken: list[tuple[int, int]]) -> None:
        for address, valid in taken:
            try:
                if valid:
                    self._deliver(self.parse_raw(address, valid))
            except Exception as error:  # one bad buffer must not stop the others
                if self.monitor is not None:
                    self.monitor.errors.append(f"pyrun: gpu: bad activity buffer: {error!r}")
                sys.stderr.write(f"pyrun: gpu: bad activity buffer: {error!r}\n")
            finally:
                native.free_buffer(address)

    def _stop_buffer_thread(self) -> None:
        native = self.native
        if native is None or not self._native_buffers:
            return
        self._buffers_stopping = True
        native.wake_buffers()
        self._buffer_done.wait(5.0)
        with self._delivering:  # what came after the thread's last look
            self._deliver_buffers(native, native.take_buffers(0.0))
        self._native_buffers = False

    def _raw_requested(self, buffer: Any, size: Any, max_records: Any) -> None:
        block = (ctypes.c_uint8 * (self.buffer_bytes + 8))()
        address = (ctypes.addressof(block) + 7) & ~7  # CUPTI wants 8-byte aligned buffers
        self._buffers[address] = block
        buffer[0] = address
        size[0] = self.buffer_bytes
        max_records[0] = 0

    def _raw_completed(self, context: int, stream: int, buffer: int, size: int, valid: int) -> None:
        try:
            self._exclude_current()
            block = self._buffers.pop(buffer, None)
            if not valid or block is None:
                return
            self._deliver(self.parse_raw(buffer, valid))
        except Exception as error:  # never raise into CUPTI
            if self.monitor is not None:
                self.monitor.errors.append(f"pyrun: gpu: bad activity buffer: {error!r}")
            sys.stderr.write(f"pyrun: gpu: bad activity buffer: {error!r}\n")

    def _walk_next_record(self, buffer: int, valid: int, limit: int = 0) -> np.ndarray:
        """Record offsets, one ``cuptiActivityGetNextRecord`` call each (``limit``: at most)."""
        lib = self._lib
        assert lib is not None
        record = ctypes.c_void_p(0)
        next_record = lib.cuptiActivityGetNextRecord
        offsets: list[int] = []
        append = offsets.append
        while next_record(buffer, valid, ctypes.byref(record)) == 0:
            append(int(record.value or 0) - buffer)
            if limit and len(offsets) >= limit:
                break
        return np.asarray(offsets, dtype=np.int64)

    def _learn_size(self, buffer: int, valid: int, at: int) -> int | None:
        """The size of the record at offset ``at``: where CUPTI puts the next one (one call)."""
        lib = self._lib
        if lib is None:
            return None
        record = ctypes.c_void_p(buffer + at)
        if lib.cuptiActivityGetNextRecord(buffer, valid, ctypes.byref(record)) != 0:
            return valid - at if at else None  # the last record: it ends the valid bytes
        size = int(record.value or 0) - buffer - at
        return size if size > 0 else None

    def _runs(
        self, words: np.ndarray, valid: int, buffer: int = 0
    ) -> list[tuple[int, int, int, int]] | None:
        """The buffer as runs of one record kind: ``(kind, offset, count, size)``, in order.

        Record sizes are learned once per kind (from CUPTI, one call at the first record of a
        kind not seen before); None when a size cannot be learned (the caller walks with
        CUPTI record by record). Each step looks ahead twice as far as the last, from 8 up to
        ``_LOOKAHEAD`` records, so long runs take few steps and alternating kinds short ones.
        """
        sizes = self.record_sizes
        runs: list[tuple[int, int, int, int]] = []
        at = 0
        while valid - at >= 8:
            kind = int(words[at // 4])
            size = sizes.get(kind)
            if size is None:
                size = self._learn_kind(kind, buffer, valid, at)
                if size is None:
                    return None
            count = (valid - at) // size
            run = 0
            step = 8
            while run < count:
                ahead = min(count - run, step)
                first = (at + run * size) // 4
                same = words[first : first + ahead * (size // 4) : size // 4] == kind
                if same.all():
                    run += ahead
                    step = min(2 * step, _LOOKAHEAD)
                    continue
                run += int(np.argmin(same))
                break
            if run == 0:
                return None
            runs.append((kind, at, run, size))
            at += size * run
        return runs

    def _learn_kind(self, kind: int, buffer: int, valid: int, at: int) -> int | None:
        """The record size of ``kind``, from CUPTI at the record at ``at`` (None: unknown).

        Only kinds this backend enabled are asked about: a kind word that is none of them means
        the walk is lost, and CUPTI must not be handed a non-record.
        """
        known = buffer and kind in self._kinds
        learned = self._learn_size(buffer, valid, at) if known else None
        if learned is None or learned % 8 or at + learned > valid:
            return None
        self.record_sizes[kind] = learned
        return learned

    def record_offsets(self, words: np.ndarray, valid: int, buffer: int) -> np.ndarray | None:
        """Where each record of a buffer starts (None: a record size could not be learned).

        With the C hook, one C walk over the buffer (``record_offsets``), resumed after
        learning the size of each kind met for the first time; otherwise run by run in numpy.
        """
        walker = self.walker
        if walker is None:
            runs = self._runs(words, valid, buffer)
            if runs is None:
                return None
            return np.concatenate(
                [start + size * np.arange(count, dtype=np.int64) for _, start, count, size in runs]
                or [np.zeros(0, np.int64)]
            )
        pieces = []
        at = 0
        while True:
            known = tuple(sorted(self.record_sizes.items()))
            if self._size_table[1] != known:
                table = np.zeros(256, dtype=np.uint32)
                for kind, size in known:
                    if 0 <= kind < 256:
                        table[kind] = size
                self._size_table = (table.tobytes(), known)
            found, stop = walker.record_offsets(buffer, valid, self._size_table[0], at)
            pieces.append(np.frombuffer(found, dtype=np.int64))
            if stop >= valid:
                return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
            kind = int(words[stop // 4])
            if kind in self.record_sizes or self._learn_kind(kind, buffer, valid, stop) is None:
                return None  # a size CUPTI's own walk must settle
            at = stop

    def parse_raw(self, buffer: int, valid: int) -> np.ndarray:
        """Every known record of a completed buffer as an :data:`ACTIVITY_DTYPE` array.

        Records are located from each kind's size (:meth:`record_offsets`) and read in place,
        each kind in one pass of the C hook's ``convert_records()`` (:mod:`.records`; without
        the hook, with numpy through a strided view of the buffer): no per-record Python work,
        rows grouped by kind. The first buffer is also walked with CUPTI for its first ``_CHECKED``
        records, and a disagreement turns the fast walk off for the process.
        """
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * valid).from_address(buffer))
        words = raw[: valid - valid % 4].view("<u4")
        offsets = self.record_offsets(words, valid, buffer) if self.fast_walk else None
        if offsets is not None and self.checks_left > 0:
            self.checks_left -= 1
            slow = self._walk_next_record(buffer, valid, _CHECKED)
            if not np.array_equal(offsets[: len(slow)], slow):
                self.fast_walk = False  # never trust it again in this process
                self.walk_mismatches += 1
                offsets = None
        if offsets is None:
            return self._parse_walked(raw, words, buffer, valid)
        kinds = words[offsets // 4] if len(offsets) else np.zeros(0, np.uint32)
        chosen: list[tuple[int, np.dtype, np.ndarray]] = []
        for cupti_kind, kind in self._kinds.items():
            mine = offsets[kinds == cupti_kind]
            if not len(mine):
                continue
            name = act.KIND_NAMES[kind]
            self.record_counts[name] = self.record_counts.get(name, 0) + len(mine)
            dtype = self._gathers[kind].padded(self.record_sizes[cupti_kind])
            if dtype is not None:
                chosen.append((kind, dtype, mine))
        # One array for the rows of every kind, each kind's written in place (C or numpy).
        out = np.empty(sum(len(mine) for _, _, mine in chosen), dtype=act.ACTIVITY_DTYPE)
        at = 0
        for kind, dtype, mine in chosen:
            part = out[at : at + len(mine)]
            at += len(mine)
            if self.converter.rows(kind, dtype, buffer, valid, mine, self._name_index, part):
                continue
            first, count, size = int(mine[0]), len(mine), dtype.itemsize
            if int(mine[-1]) - first == (count - 1) * size:  # one run: read in place
                rows = np.ndarray((count,), dtype=dtype, buffer=raw, offset=first)
            else:
                # Every 8-byte boundary as the start of a record of this kind (records are
                # 8-byte aligned): one gather of opaque records picks them out of the buffer.
                opaque = np.dtype((np.void, size))
                slots = np.ndarray(((valid - size) // 8 + 1,), opaque, buffer=raw, strides=(8,))
                rows = slots[mine // 8].view(dtype)
            part[:] = self._convert(kind, rows)
        return out

    def _parse_walked(
        self, raw: np.ndarray, words: np.ndarray, buffer: int, valid: int
    ) -> np.ndarray:
        """:meth:`parse_raw` with every record located by CUPTI (unknown or untrusted sizes)."""
        at = self._walk_next_record(buffer, valid)
        kinds_slow = words[at // 4] if len(at) else np.zeros(0, np.uint32)
        for kind, stride in zip(kinds_slow[:-1].tolist(), np.diff(at).tolist(), strict=True):
            self.record_sizes[int(kind)] = int(stride)  # CUPTI's own walk: the truth
        strides = np.diff(np.append(at, valid))
        pieces = []
        for cupti_kind, kind in self._kinds.items():
            mask = kinds_slow == cupti_kind
            if not mask.any():
                continue
            name = act.KIND_NAMES[kind]
            self.record_counts[name] = self.record_counts.get(name, 0) + int(mask.sum())
            rows = self._gathers[kind].rows(raw, at[mask], strides[mask])
            if rows is not None:
                pieces.append(self._convert(kind, rows))
        return np.concatenate(pieces) if pieces else act.empty_activities()

    def _convert(self, kind: int, rows: np.ndarray) -> np.ndarray:
        return convert(kind, rows, self._name_index)

    def _name_index(self, pointer: int) -> int:
        index = self._names.get(pointer)
        if index is None:
            name = ctypes.string_at(pointer).decode("utf-8", "replace") if pointer else "?"
            index = self._names[pointer] = len(self.functions)
            self.functions.append(name)
        return index


_NO_CBID = 0xFFFFFFFF  # "no such callback" for the C hook's configure()
#: cuptiActivityRegisterCallbacks' two callbacks (cupti_activity.h): a buffer is wanted
#: (buffer, size, maxNumRecords out) / a buffer is complete (ctx, streamId, buffer, size, valid).
BUFFER_REQUESTED = ctypes.CFUNCTYPE(
    None,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_size_t),
)
BUFFER_COMPLETED = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)


def load_hook() -> NativeHook | None:
    """The C CUPTI hook (``_cuptihook``), None where it was not built (no compiler at install)."""
    try:
        from pyhpctk.measure.gpu import _cuptihook
    except ImportError:
        return None
    return _cuptihook


def _loaded_library(stem: str) -> str | None:
    """The path of a shared library this process has loaded (from ``/proc/self/maps``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if stem in path.rsplit("/", 1)[-1] and path.startswith("/"):
                    return path
    except OSError:
        return None
    return None
