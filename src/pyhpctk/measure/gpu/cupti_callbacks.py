"""The CUPTI backend's callbacks: operations as the program starts them, and fine-grained counts.

A CUPTI subscriber gets a callback on entry to every CUDA runtime and driver API that starts GPU
work, classified once, by name (:func:`classify_api`); either the C hook ``_cuptihook`` or
cupti-python's ``subscribe`` (:meth:`ApiCallbacks._start_python`) is subscribed. Resource
callbacks copy loaded cubins and CUDA graph node ids. With PC sampling or instruction counting
("fine" mode) every API call is seen in Python, which starts and reads the samplers and counters.

These callbacks run on the program's threads, inside the CUDA driver: they never block and
never raise into CUPTI. The state they use is :class:`~.cupti_backend.CuptiBackend`'s.
"""

from __future__ import annotations

import ctypes
import re
import threading

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import syncapi
from pyhpctk.measure.gpu.cupti_lib import NO_CBID, loaded_library
from pyhpctk.measure.gpu.operations import SKIP

TYPE_CHECKING = False
if TYPE_CHECKING:
    import collections
    from collections.abc import Callable
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


class ApiCallbacks:
    """Subscribing to CUPTI's callbacks and answering them (a part of the backend class)."""

    # The backend's state these methods use (set in CuptiBackend.__init__ and start()).
    inst: bool
    inst_counters: dict[int, SassCounter]
    inst_launches: dict[int, int]
    _inst_first: dict[int, int]
    _profiler_starts: set[tuple[int, int]]
    _fine_busy: threading.local
    native: NativeHook | None
    _modules: collections.deque[bytes]
    pc_mode: str
    pc_period: int
    pc_samplers: dict[int, PcSampler]
    pc_errors: list[str]
    _context_created: int
    monitor: MonitorPort | None
    _operation: Callable[[int, int, bool], None]
    api_kinds: dict[tuple[int, int], int]
    sync: str
    api_syncs: syncapi.ApiSyncs | None
    _api_names: dict[tuple[int, int], str]
    api_multi: set[tuple[int, int]]
    _subscriber: object
    _domain_resource: int
    _domain_driver: int
    _enter: int
    _module_loaded: int
    _nest: threading.local
    _graph_created: int
    _graph_cloned: int
    _node_id: Any
    unknown_apis: int

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
        context_created = int(cupti.CallbackIdResource.CONTEXT_CREATED) if fine else NO_CBID
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
        path = loaded_library("libcupti")
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
        path = loaded_library("libcupti")
        if path is not None and self._graph_created != NO_CBID:
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

        path = loaded_library("libcupti")
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

        path = loaded_library("libcupti")
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
