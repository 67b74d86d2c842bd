"""The CUPTI backend's callback subscriber: operations as the program starts them.

A CUPTI subscriber gets a callback on entry to every CUDA runtime and driver API that starts GPU
work, classified once, by name (:func:`classify_api`); either the C hook ``_cuptihook`` or
cupti-python's ``subscribe`` (:meth:`CallbackSubscriber._start_python`) is subscribed. Resource
callbacks copy loaded cubins and CUDA graph node ids. With PC sampling or instruction counting
("fine" mode) every API call is seen in Python and handed to the backend's
:class:`~.fine.FineCounting`, which starts and reads the samplers and counters.

These callbacks run on the program's threads, inside the CUDA driver: they never block and
never raise into CUPTI.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import re
import threading

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import syncapi
from pyhpctk.measure.gpu.cupti.lib import NO_CBID, loaded_library
from pyhpctk.measure.gpu.operations import SKIP

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from pyhpctk.measure.gpu.backend import MonitorPort, NativeHook
    from pyhpctk.measure.gpu.cupti.fine import FineCounting

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


class CallbackSubscriber:
    """Subscribes to CUPTI's callbacks and answers them (see the module docstring)."""

    def __init__(self, fine: FineCounting, sync: str = syncapi.DEFAULT_SYNC) -> None:
        self.fine = fine  # PC sampling and instruction counts, read where the callbacks say
        self.sync = sync  # "api": the C hook times synchronizations (syncapi)
        self.api_syncs: syncapi.ApiSyncs | None = None  # once the hook times them
        self.api_kinds: dict[tuple[int, int], int] = {}  # GPU operations' callbacks → kind
        self._api_names: dict[tuple[int, int], str] = {}  # GPU operations' callback-id names
        self.api_multi: set[tuple[int, int]] = set()  # CUDA graph launches: many activities
        self._profiler_starts: set[tuple[int, int]] = set()  # cu/cudaProfilerStart (inst)
        self.native: NativeHook | None = None  # the _cuptihook module once subscribed through it
        self.modules: collections.deque[bytes] = collections.deque()  # cubins (Python hook)
        self.monitor: MonitorPort | None = None
        self._operation: Callable[[int, int, bool], None] = lambda kind, correlation, multi: None
        self._subscriber: object = None
        self._domain_resource = self._enter = self._module_loaded = -1
        self._domain_driver = -1
        self._exit = -1
        self._context_created = -1
        self._nest = threading.local()  # hook=python: runtime calls each thread is inside
        self._graph_created = self._graph_cloned = NO_CBID
        self._node_id: Any = None  # cuptiGetGraphNodeId (ctypes), for hook=python
        self.unknown_apis = 0  # callback ids CUPTI refused to enable

    def learn_apis(self, domain: int, members: dict[str, int]) -> None:
        """Which callbacks of ``domain`` (CUPTI's callback-id names → ids) start what.

        Fills :attr:`api_kinds` (kind of each GPU operation's API), :attr:`api_multi` (graph
        launches: several activities per call) and, with ``inst``, the profiler starts where
        counting begins; with ``inst``, copies and memsets are left out (not traced: start()).
        """
        inst = self.fine.inst
        for name, cbid in members.items():
            kind = classify_api(name)
            if inst and kind in (act.COPY, act.MEMSET):
                continue
            if kind is not None and "SIZE" not in name and "INVALID" not in name:
                self.api_kinds[(domain, cbid)] = kind
                self._api_names[(domain, cbid)] = name
                if "GraphLaunch" in name:
                    self.api_multi.add((domain, cbid))
            elif inst and name.startswith(("cuProfilerStart", "cudaProfilerStart")):
                self._profiler_starts.add((domain, cbid))

    def start(self, cupti: Any, monitor: MonitorPort, native: NativeHook | None) -> None:
        """Learn CUPTI's callback ids and subscribe: the C hook where given, else Python's."""
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
        if native is not None:
            self._start_native(cupti, native, monitor)
        else:
            self._start_python(cupti)

    def stop(self, cupti: Any) -> None:
        """Unsubscribe (the C hook's own losses said in the monitor's errors)."""
        native, monitor = self.native, self.monitor
        if native is None:
            with contextlib.suppress(Exception):
                cupti.unsubscribe(self._subscriber)
            return
        try:
            native.unsubscribe()
        except OSError as error:
            if monitor is not None:
                monitor.errors.append(f"pyrun: gpu: {error}")

    def take_modules(self) -> list[bytes]:
        """The cubins loaded since the last call (the monitor saves them on its own thread)."""
        native = self.native
        taken: list[bytes] = native.take_modules() if native is not None else []
        modules = self.modules
        while modules:
            taken.append(modules.popleft())
        return taken

    def _start_native(self, cupti: Any, native: NativeHook, monitor: MonitorPort) -> None:
        """Subscribe the C callback: repeated operations never enter Python (_cuptihook.c)."""
        fine = self.fine.on
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
        if self.fine.on:
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
        if self.fine.busy:  # a CUDA call of the counters themselves
            if (
                site == self._enter
                and (domain, cbid) in self.api_kinds
                and self.monitor is not None
            ):
                self.monitor.own_call(correlation)  # a GPU operation (a synchronize): its record
            return
        if domain == self._domain_resource:
            if cbid == self._context_created:
                self.fine.context_seen(context)
            return
        key = (domain, cbid)
        if key in self._profiler_starts:
            if site != self._enter:
                self.fine.profiler_started(context)
            return
        kind = self.api_kinds.get(key)
        if site != self._enter:
            if kind == act.KERNEL:
                self.fine.kernel_ended(context, correlation)
            return
        self.fine.context_seen(context)
        if kind == act.KERNEL:
            self.fine.kernel_starting()
        if kind is not None:
            self._operation(kind, correlation, key in self.api_multi)

    # -- callbacks on application threads --

    def _callback(self, userdata: object, domain: int, cbid: int, data: Any) -> None:
        # Called twice per API call (entry and exit) on the application thread: keep it short.
        if domain == self._domain_resource:
            if cbid == self._module_loaded:
                self._module(data)
            elif cbid in (self._graph_created, self._graph_cloned):
                self._graph(data, cbid == self._graph_cloned)
            elif cbid == self._context_created:
                self.fine.context_seen(int(data.context))
            return
        if self._inside_runtime(domain, data.callback_site):
            return
        if self.fine.on:
            if self.fine.busy:  # a CUDA call of the counters themselves
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
                    self.fine.profiler_started(context)
                return
            if data.callback_site != self._enter:
                if self.api_kinds.get((domain, cbid)) == act.KERNEL:
                    self.fine.kernel_ended(context, int(data.correlation_id))
                return
            self.fine.context_seen(context)
            if self.api_kinds.get((domain, cbid)) == act.KERNEL:
                self.fine.kernel_starting()
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
            self.modules.append(cubin)

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
