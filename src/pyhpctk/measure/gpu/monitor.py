"""The GPU monitor: placeholders at each operation, activities matched back by correlation id.

The paper's design (Zhou et al. 2021; docs/architecture.md "Measurement"), as implemented here:

1. **Application thread T, at a GPU operation I** (the backend calls :meth:`GpuMonitor.operation`
   or :meth:`~GpuMonitor.enter` from inside the runtime API call, on T; or the C hook records
   it without Python): T unwinds its Python stack into its CCT, inserts the placeholder P for
   the operation kind (``GPUKernl``, ``GPUMemst``...) and pushes the operation (I, P) on its
   *operation channel*.
2. **Backend thread** (CUPTI's buffer-completion thread, the simulator's): hands one
   :data:`~pyhpctk.measure.gpu.activity.ACTIVITY_DTYPE` array per completed buffer to
   :meth:`GpuMonitor.buffer_completed`, which queues it and wakes the monitor thread.
3. **Monitor thread**: for each completed buffer, first drains every operation channel (so every
   operation issued before the buffer is known), then matches activities to operations by
   correlation id (:mod:`~pyhpctk.measure.gpu.matching`) and attributes each thread's batch of
   (A, P) into that thread's CCT, under the host's lock; with tracing, each stream's records go
   on that stream's *trace channel* (:mod:`~pyhpctk.measure.gpu.tracing`). Activities whose
   operation is unknown are counted (:attr:`GpuStats.unmatched`) and attributed under a
   ``GPU?????`` placeholder of a separate CCT, never dropped.
4. **Tracing thread**: drains trace channels into per-stream CCTs and trace records.

The paper's application threads attribute their own activities at safe points, so that no lock
guards a CCT; here every CCT change takes the host's lock anyway, and attributing on the
monitor thread keeps that work off the program's threads: with the C hook a thread enters
Python only at a call site it has not seen (issue #18).

Attribution into CCTs is :mod:`~pyhpctk.measure.gpu.attribution`, PC samples and instruction
counts :mod:`~pyhpctk.measure.gpu.instructions`. The monitor talks to its host (the session)
only through :class:`~pyhpctk.measure.extension.Host` and to its backend only through
:mod:`~pyhpctk.measure.gpu.backend`'s protocols. On the application thread's path the host's
lock is taken only when the call path is new, never to talk to the monitor.
"""

from __future__ import annotations

import _thread
import collections
import sys
import threading
from dataclasses import dataclass
from typing import cast

import numpy as np

from pyhpctk.measure.cct import ThreadCCT, python_frame_ips
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.attribution import Attributor, KernelTable, transplant
from pyhpctk.measure.gpu.cubin import kernel_entries, save_gpubin
from pyhpctk.measure.gpu.instructions import FineAttribution
from pyhpctk.measure.gpu.matching import Matcher, SiteOperations, issued_into
from pyhpctk.measure.gpu.operations import (
    DEFERRED,
    FIRST_FOREIGN_THREAD,
    NODE_TAG,
    OP_CALL,
    OP_CCT,
    OP_KIND,
    OP_PLACEHOLDER,
    OP_THREAD,
    SKIP,
    UNCACHED,
    UNKNOWN_PLACEHOLDER,
    GpuStats,
    GpuThread,
)
from pyhpctk.measure.gpu.tracing import TraceRouter
from pyhpctk.measure.thread_names import name_own_thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

    from pyhpctk.instrument.ptx import Instrumented
    from pyhpctk.instrument.ptx.traces import TracePlan
    from pyhpctk.instrument.tracing.decode import WarpEvents
    from pyhpctk.measure.cct import MetricKind
    from pyhpctk.measure.extension import Host
    from pyhpctk.measure.gpu.backend import Backend, NativeHook
    from pyhpctk.measure.gpu.blocks import BlockCounting
    from pyhpctk.measure.gpu.memory import MemoryTracker
    from pyhpctk.measure.gpu.operations import Batch, Operation
    from pyhpctk.measure.gpu.warps import WarpTraces
    from pyhpctk.measure.ranges import Ranges

__all__ = ["SKIP", "GpuMonitor", "GpuStats", "GpuThread", "transplant"]

_RESUMABLE = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


@dataclass
class KernelInsides:
    """What instrumented kernels report (issue #34): block counts (``gpu=...,blocks``, made by
    :meth:`GpuMonitor.enable_blocks`) and per-warp traces (made at the first traced launch);
    and what the allocators' hooks report (``gpu=...,memory``, issue #37: :mod:`.memory`)."""

    blocks: BlockCounting | None = None
    warps: WarpTraces | None = None
    memory: MemoryTracker | None = None  # and what allocators report (gpu=...,memory; .memory)


class GpuMonitor:
    """The GPU measurement of one process (see the module docstring)."""

    def __init__(
        self,
        session: Host,
        kind: MetricKind,
        limits: act.DeviceLimits | None = None,
        trace: bool | None = None,
        trace_capacity: int = 0,
        backend: Backend | None = None,
    ) -> None:
        self.session = session
        self.kind = kind
        self.trace = session.options.trace if trace is None else trace
        self.stats = GpuStats()
        self.threads: list[GpuThread] = []  # appended by application threads, read by monitor
        self._by_ident: dict[int, GpuThread] = {}
        self._completed: collections.deque[
            tuple[np.ndarray, Sequence[str], int] | threading.Event
        ] = collections.deque()
        self._wake = threading.Semaphore(0)
        self.kernels = KernelTable()
        limits = limits or act.DeviceLimits()
        self.matcher = Matcher(self.stats)
        self.attributor = Attributor(session, kind, self.kernels, limits)
        self.attributor.trace = self.trace
        self.attributor.table = lambda: self.matcher.table
        self.fine = FineAttribution(self.kernels, limits)
        self.inside = KernelInsides()  # what instrumented kernels report (issue #34)
        self.tracer = TraceRouter(session, self.kernels, self.stats, trace_capacity)
        self._unknown: GpuThread | None = None
        self._foreign = 0  # threads without Python frames given a CCT of their own
        self._stopping = False
        self._service_idents: list[int] = []  # the monitor's and the tracer's threads
        self._monitor_done = threading.Event()
        self._tracer_done = threading.Event()
        self.closed = False
        self.errors: list[str] = []
        self.backend = backend  # what install() made; it is started after the monitor
        self.hook: NativeHook | None = None  # the C hook, when the backend attached one
        self.paused = False  # pyrun ctl's window is closed: see window()
        self._start_threads()

    @property
    def ranges(self) -> Ranges | None:
        """The threads' open ranges (pyrun --ranges): part of each operation's context."""
        return getattr(self.session, "ranges", None)

    @property
    def limits(self) -> act.DeviceLimits:
        return self.attributor.limits

    def set_limits(self, limits: act.DeviceLimits) -> None:
        """The device's occupancy limits (the backend learns them with the first kernel)."""
        self.attributor.limits = self.fine.limits = limits

    def attach_hook(self, hook: NativeHook) -> None:
        """Operations come through the C hook too: drain it before matching each buffer."""
        self.hook = self.matcher.hook = hook
        if self.ranges is not None:  # each thread's ranges become part of its sites
            self.ranges.listeners.append(hook.set_range)

    # -- threads of the monitor --

    def _start_threads(self) -> None:
        started = threading.Semaphore(0)
        _thread.start_new_thread(self._monitor_main, (started,))
        _thread.start_new_thread(self._tracer_main, (started,))
        started.acquire()
        started.acquire()

    def service_idents(self) -> tuple[int, ...]:
        """Thread idents of the monitor and tracer threads (not application threads)."""
        return tuple(self._service_idents)

    def exclude_current_thread(self) -> None:
        """Tell the session the calling thread is not an application thread."""
        self.session.exclude_thread(_thread.get_ident())

    def _monitor_main(self, started: threading.Semaphore) -> None:
        name_own_thread("pyrun-gpumon")
        self._service_idents.append(_thread.get_ident())
        self.exclude_current_thread()
        started.release()
        try:
            while True:
                self._wake.acquire()
                while self._completed:
                    item = self._completed.popleft()
                    if isinstance(item, threading.Event):
                        item.set()  # a flush barrier: everything before it is processed
                    else:
                        self._process(*item)
                if self._stopping:
                    return
        except Exception as error:  # never kill the program; say why GPU measurement stopped
            self.errors.append(f"pyrun: gpu monitor stopped: {error!r}")
            sys.stderr.write(self.errors[-1] + "\n")
        finally:
            self._monitor_done.set()

    def _tracer_main(self, started: threading.Semaphore) -> None:
        name_own_thread("pyrun-gputrace")
        self._service_idents.append(_thread.get_ident())
        self.exclude_current_thread()
        started.release()
        try:
            while True:
                self.tracer.wake.acquire()
                self.tracer.drain()
                if self._stopping and self._monitor_done.is_set():
                    self.tracer.drain()
                    return
        except Exception as error:
            self.errors.append(f"pyrun: gpu tracer stopped: {error!r}")
            sys.stderr.write(self.errors[-1] + "\n")
        finally:
            self._tracer_done.set()

    # -- application thread side (the hot path) --

    def _live_cct(self, ident: int) -> ThreadCCT | None:
        live = self.session.live_thread(ident)
        return None if live is None else live[0]

    def _thread_state(self, ident: int, frameless: bool = False) -> GpuThread:
        """The calling thread's GPU state, created (with its CCT) on first use.

        A new thread that got the ident of one that ended gets a state of its own; the old one
        stays in :attr:`threads` until its activities are attributed. A thread with no Python
        frames at all (a runtime's C++ worker, such as PyTorch's autograd thread) that the
        session does not measure gets a CCT of its own, written as its own profile, rather
        than being registered with the session, whose sampler would write it out and forget
        it every time the thread is seen without Python frames.
        """
        state = self._by_ident.get(ident)
        current = threading.current_thread()
        if state is None or state.thread is not current:
            session = self.session
            with session.lock:
                if frameless and session.live_thread(ident) is None:
                    number = FIRST_FOREIGN_THREAD + self._foreign
                    self._foreign += 1
                    cct = session.open_stream(number)
                    state = GpuThread(ident, cct, False, current)
                    state.own = True
                    state.call = cct.fence
                    state.frame = None  # frameless operations all hang from the fence
                else:
                    cct, _ = session.current_context(skip=0)
                    state = GpuThread(ident, cct, current is threading.main_thread(), current)
                    state.live = self._live_cct(ident)
                self._by_ident[ident] = state
                self.threads.append(state)
        return state

    def operation(self, kind: int, correlation: int, multi: bool = False) -> None:
        """Application thread T starts GPU operation ``correlation`` (a launch, a copy...).

        Repeated operations from the same bytecode instruction of the same live frame (a launch
        loop) reuse the unwound call path: a live frame's callers cannot change, so neither can
        the path (generator and coroutine frames, whose callers can change, are always
        unwound). Everything else takes the session lock and unwinds.
        """
        ident = _thread.get_ident()
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(SKIP):
            frame = frame.f_back
        state = self._by_ident.get(ident) or self._thread_state(ident, frame is None)
        ranges = self.ranges
        # The fast path: same site as last time, under the same ranges, and the session still
        # has this thread's CCT (it may retire and replace it).
        if (
            frame is state.frame
            and (ranges is None or state.ranges is ranges.current())
            and (state.own or self._live_cct(ident) is state.live)
            and (frame is None or frame.f_lasti == state.lasti)
        ):
            placeholder = -1 if kind in DEFERRED else state.placeholders.get(kind, -2)
            if placeholder != -2:
                state.push((correlation, kind, state.call, placeholder, state, state.cct, multi))
                return
        operation = self._slow_operation(state, frame, kind, correlation, multi)
        operation[OP_THREAD].push(operation)

    def _slow_operation(
        self,
        state: GpuThread,
        frame: FrameType | None,
        kind: int,
        correlation: int,
        multi: bool,
    ) -> Operation:
        session = self.session
        if state.thread is not threading.current_thread():
            state = self._thread_state(state.ident, frame is None)
        if self.paused:
            return self._outside_operation(state, kind, correlation, multi)
        open_ranges = self.ranges
        ranges = open_ranges.current() if open_ranges is not None else None
        with session.lock:
            if state.own:  # the GPU layer's CCT: unwind into it ourselves
                cct = state.cct
                ips = python_frame_ips(frame, session.functions, session.functions.fid_of)
                if ranges and open_ranges is not None:
                    ips = open_ranges.under(ips)
                call = cct.path(session.python_lm, ips) if ips else cct.fence
                placeholder = -1
                if kind not in DEFERRED:
                    placeholder = cct.placeholder(call, act.PLACEHOLDER_OF_KIND[kind])
                if frame is None and placeholder >= 0:  # the site is the ranges alone
                    if state.ranges is not ranges or state.call != call:
                        state.ranges, state.call, state.placeholders = ranges, call, {}
                    state.placeholders[kind] = placeholder
                return (correlation, kind, call, placeholder, state, cct, multi)
            same_site = (
                frame is state.frame
                and (frame is None or frame.f_lasti == state.lasti)
                and self._live_cct(state.ident) is state.live
                and state.ranges is ranges
            )
            if same_site:
                cct, call = state.cct, state.call
            else:
                cct, call = session.current_context(skip=0)
                state.cct = cct
                state.live = self._live_cct(state.ident)
                resumable = frame is not None and frame.f_code.co_flags & _RESUMABLE
                state.frame = UNCACHED if resumable else frame
                state.lasti = frame.f_lasti if frame is not None else -1
                state.call = call
                state.ranges = ranges
                state.placeholders = {}
            if kind in DEFERRED:  # placed when (if) an activity comes: see DEFERRED
                placeholder = -1
            else:
                placeholder = state.placeholders.get(kind, -2)
                if placeholder == -2:
                    placeholder = cct.placeholder(call, act.PLACEHOLDER_OF_KIND[kind])
                    state.placeholders[kind] = placeholder
        return (correlation, kind, call, placeholder, state, cct, multi)

    def operation_token(self, kind: int, correlation: int, multi: bool = False) -> int:
        """The native hook's slow path: record operation ``correlation``; return its token.

        Called by the C callback (``_cuptihook``) on the application thread for a call site the
        thread does not remember (or has no token for this kind in the current epoch). The
        operation goes on the thread's channel as :meth:`operation` sends it; the
        returned token names its (kind, call node, placeholder, thread, CCT) so that the hook
        can record later operations from the same site as (correlation, token) pairs without
        entering Python.
        """
        caller = sys._getframe(0).f_back  # the hook calls from C: the program's own frame
        frame = caller
        while frame is not None and frame.f_code.co_filename.startswith(SKIP):
            frame = frame.f_back
        ident = _thread.get_ident()
        state = self._by_ident.get(ident) or self._thread_state(ident, frame is None)
        operation = self._slow_operation(state, frame, kind, correlation, multi)
        operation[OP_THREAD].push(operation)
        # A generator's or coroutine's frame is cached too: the hook compares every frame down
        # to a non-resumable anchor, so a generator resumed from elsewhere is another site.
        with self.session.lock:
            return self.matcher.token(operation)

    def graph_node(self, node: int, original: int = 0) -> None:
        """CUDA graph node ``node`` is made on this thread (``original``: cloned from it).

        A node made by a capture or an add is recorded as an operation of kind ``GRAPH_NODE``
        at the calling context (its activities come when the graph is launched, and go below
        this context's copy under the launch, docs/gpu.md "CUDA graphs"); a clone made by an
        instantiation only maps the clone to its original.
        """
        if original:
            self.matcher.add_clone(node, original)
            return
        ident = _thread.get_ident()
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(SKIP):
            frame = frame.f_back
        state = self._by_ident.get(ident) or self._thread_state(ident, frame is None)
        operation = self._slow_operation(state, frame, act.GRAPH_NODE, node | NODE_TAG, False)
        operation[OP_THREAD].push(operation)

    def enter(self, kind: int, correlation: int, multi: bool = False) -> None:
        """T enters a GPU API call (backends that see entry and exit, and nested calls).

        Calls nested inside it (a runtime call making driver calls) share its call path and
        placeholder: every correlation id of the nest maps to the same place.
        """
        ident = _thread.get_ident()
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(SKIP):
            frame = frame.f_back
        state = self._by_ident.get(ident) or self._thread_state(ident, frame is None)
        outer = state.outer
        if state.depth and outer is not None:
            placeholder = outer[OP_PLACEHOLDER] if outer[OP_KIND] == kind else -1
            if placeholder == -1 and kind not in DEFERRED and kind != act.KERNEL:
                with self.session.lock:
                    cct = outer[OP_CCT]
                    placeholder = cct.placeholder(outer[OP_CALL], act.PLACEHOLDER_OF_KIND[kind])
            operation = (
                correlation,
                kind,
                outer[OP_CALL],
                placeholder,
                state,
                outer[OP_CCT],
                multi,
            )
        else:
            operation = self._slow_operation(state, frame, kind, correlation, multi)
            state = operation[OP_THREAD]
            state.outer = operation
        state.depth += 1
        state.push(operation)

    def exit(self) -> None:
        """T leaves the GPU API call :meth:`enter` announced."""
        state = self._by_ident.get(_thread.get_ident())
        if state is not None and state.depth:
            state.depth -= 1
            if not state.depth:
                state.outer = None

    # -- windows (pyrun ctl start|stop: docs/pyrun.md, "Windows of long jobs") --

    def window(self, paused: bool) -> None:
        """The window closed (``paused``) or opened. Operations issued while it is closed go
        into a CCT that is never written, their activities counted in ``stats.outside``; each
        thread's cached call site is forgotten and the C hook starts a new epoch, so that every
        site goes through :meth:`_slow_operation` once on each side of the change."""
        self.paused = paused
        for state in list(self.threads):
            state.frame = UNCACHED
            state.placeholders = {}
        if self.hook is not None:
            self.hook.bump()

    def _outside_operation(
        self, state: GpuThread, kind: int, correlation: int, multi: bool
    ) -> Operation:
        with self.session.lock:
            cct = self.attributor.outside
            if cct is None:  # the CCT of what is issued outside windows: never written
                cct = self.attributor.outside = ThreadCCT(self.session.ids, main=True)
            placeholder = -1
            if kind not in DEFERRED:
                placeholder = cct.placeholder(cct.fence, act.PLACEHOLDER_OF_KIND[kind])
        return (correlation, kind, cct.fence, placeholder, state, cct, multi)

    def _inside_window(
        self, records: np.ndarray, operations: Sequence[Operation | None]
    ) -> tuple[np.ndarray, Sequence[Operation | None]]:
        """The activities whose operation was issued inside the window (all, if it never
        closed); the others are counted in ``stats.outside``."""
        away = self.attributor.outside
        if away is None:
            return records, operations
        keep = ~issued_into(away, operations)
        if keep.all():
            return records, operations
        self.stats.outside += int(len(keep) - keep.sum())
        return records[keep], [operations[i] for i in np.flatnonzero(keep).tolist()]

    # -- backend side --

    def buffer_completed(
        self, records: np.ndarray, functions: Sequence[str] = (), dropped: int = 0
    ) -> None:
        """A backend delivers one completed activity buffer (any thread; never blocks)."""
        self._completed.append((records, functions, dropped))
        self._wake.release()

    def own_call(self, correlation: int) -> None:
        """A backend's own GPU operation (a counter's synchronize): its activity record is not
        the program's and is left out of the profile, counted in ``stats.own`` (any thread).
        Each id is forgotten once its record came, so the set stays as small as what waits."""
        if correlation:
            self.matcher.own_calls.add(correlation)

    def module_loaded(self, cubin: bytes) -> None:
        """A GPU binary was loaded: save it under ``gpubins/`` and learn its kernels' entries."""
        try:
            path = save_gpubin(self.session.options.output_dir, cubin)
            entries = kernel_entries(cubin, path)
        except (OSError, ValueError) as error:
            self.errors.append(f"pyrun: gpu: cannot save a GPU binary: {error}")
            return
        self.kernels.add(self.session.add_load_module(path), entries)

    def enable_pc(
        self, kind: MetricKind, period_cycles: int, clock_khz: int = 0, sm_count: int = 0
    ) -> None:
        """Attribute PC samples or instruction counts into ``kind`` (``pc_metric_kind``).

        ``period_cycles`` is 0 for instruction counts (``gpu=...,inst``): no GSAMP metrics.
        """
        fine = self.fine
        fine.pc_kind = kind
        fine.pc_sm_count = sm_count
        fine.pc_period = period_cycles
        fine.pc_clock_khz = clock_khz
        warps = self.inside.warps
        if warps is None:
            self.attributor.kernels_attributed = fine.kernels_attributed
        else:  # warp traces came first: both hear of attributed kernels

            def attributed(
                cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray, names: list[str]
            ) -> None:
                fine.kernels_attributed(cct, rows, targets, names)
                warps.kernels_attributed(cct, rows, targets, names)

            self.attributor.kernels_attributed = attributed

    def enable_blocks(self, kind: MetricKind) -> None:
        """Attribute instrumented kernels' block counts into ``kind`` (``block_metric_kind``)."""
        from pyhpctk.measure.gpu.blocks import BlockCounting

        blocks = self.inside.blocks = BlockCounting(self.session, self.kernels, kind)
        before = self.attributor.kernels_attributed

        def both(cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray, names: list[str]) -> None:
            before(cct, rows, targets, names)
            blocks.kernels_attributed(cct, rows, targets, names)

        self.attributor.kernels_attributed = both

    def instrumented_module(self, module: Instrumented) -> None:
        """An instrumented module was loaded (any thread; issue #34, :mod:`.blocks`)."""
        if self.inside.blocks is not None:
            self.inside.blocks.module(module)

    def block_counts(
        self, correlation: int, module: Instrumented, kernel: str, counters: np.ndarray
    ) -> None:
        """One instrumented launch's counters, read after it finished (any thread)."""
        if self.inside.blocks is not None:
            self.inside.blocks.counts(correlation, module, kernel, counters)

    def instrumentation_skipped(self, what: str, reason: str) -> None:
        """``what`` was not instrumented, and why (said at exit with the counts)."""
        if self.inside.blocks is not None:
            self.inside.blocks.skipped.append((what, reason))

    def pc_samples(
        self, rows: np.ndarray, functions: Sequence[str], reasons: Sequence[str], dropped: int = 0
    ) -> None:
        """A backend delivers PC sample rows (``pcsampling.SAMPLE_DTYPE``; any thread)."""
        self.fine.pc_samples(rows, functions, reasons, dropped)

    def inst_counts(self, rows: np.ndarray, functions: Sequence[str], launches: int = 1) -> None:
        """A backend delivers instruction counts (``sassmetrics.INST_DTYPE``; any thread)."""
        self.fine.inst_counts(rows, functions, launches)

    def warp_trace(
        self, correlation: int, plan: TracePlan, events: WarpEvents, device: int = 0
    ) -> None:
        """A backend delivers a traced launch's per-warp events (any thread; issue #34): they
        go into trace lines per SM and warp slot once the launch is attributed (:mod:`.warps`)."""
        if self.inside.warps is None:
            from pyhpctk.measure.gpu.warps import WarpTraces

            warps = self.inside.warps = WarpTraces(self.session)
            chained = self.attributor.kernels_attributed

            def attributed(
                cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray, names: list[str]
            ) -> None:
                chained(cct, rows, targets, names)
                warps.kernels_attributed(cct, rows, targets, names)

            self.attributor.kernels_attributed = attributed
        self.inside.warps.add(correlation, plan, events, device)

    # -- monitor thread: one completed buffer --

    def _drain_operations(self) -> None:
        backend = self.backend
        if backend is not None:  # cubins the backend captured: known before their kernels match
            for cubin in backend.take_modules():
                self.module_loaded(cubin)
        self.matcher.drain(list(self.threads))

    def _process(self, records: np.ndarray, functions: Sequence[str], dropped: int) -> None:
        stats = self.stats
        stats.buffers += 1
        stats.dropped += dropped
        stats.activities += len(records)
        self._drain_operations()
        matcher = self.matcher
        records = matcher.forget_own(records)
        if not len(records):
            return
        matched = matcher.match(records)
        operations, owners, tokens = matched.operations, matched.owners, matched.tokens
        unknown, captures = matched.unknown, matched.captures
        stats.matched += len(records) - len(unknown)
        names = list(functions)
        batches: list[Batch] = []
        threads = np.flatnonzero(np.bincount(owners[owners >= 0]))  # (no sort: few threads)
        if len(threads) == 1 and not unknown:  # the common case: one thread, all matched
            batches.append((records, cast("list[Operation]", operations), names, tokens, captures))
        elif len(threads):
            every = (
                operations
                if isinstance(operations, SiteOperations)
                else np.fromiter(operations, dtype=object, count=len(operations))
            )
            for number in threads.tolist():
                indices = np.flatnonzero(owners == number)
                ops = cast(
                    "list[Operation]",
                    every.take(indices)
                    if isinstance(every, SiteOperations)
                    else every[indices].tolist(),
                )
                caught = None if captures is None else [captures[i] for i in indices.tolist()]
                batches.append((records[indices], ops, names, tokens[indices], caught))
        unknown_ops: list[Operation] = []
        if unknown:
            correlations = records["correlation"]
            internal = int((correlations[unknown] == 0).sum())
            stats.internal += internal
            stats.unmatched += len(unknown) - internal
            unknown_ops = self._unknown_operations(records[unknown])
            assert isinstance(operations, list)  # (SiteOperations: every one was matched)
            for position, index in enumerate(unknown):
                operations[index] = unknown_ops[position]
        attribute = self.attributor.attribute
        with self.session.lock:
            for batch in batches:
                attribute(*batch)
            if unknown:
                attribute(records[unknown], unknown_ops, names)
        self._renew_sites(batches)
        if self.inside.memory is not None:  # raw cudaMalloc/cudaFree with their call paths
            self.inside.memory.take_cuda(records, operations)
        if self.trace:
            records, kept = self._inside_window(records, operations)
            if len(records):
                self.tracer.route(records, kept, names)
        elif self.attributor.outside is not None:
            self._inside_window(records, operations)  # (counted only)

    def _renew_sites(self, batches: list[Batch]) -> None:
        """A new epoch for the C hook when the session replaced a thread's CCT.

        The hook's tokens name the CCT a site was unwound into; attribution moves activities
        of a retired CCT into the live one (:meth:`Attributor.live_cct`), and a new epoch sends
        each site through Python once, so later operations are recorded in the live CCT.
        """
        hook = self.hook
        if hook is None:
            return
        for _, ops, _, _, _ in batches:
            latest = ops[-1]
            state: GpuThread = latest[OP_THREAD]
            if state.own or state.ident < 0 or self.paused:
                continue
            live = self.session.live_thread(state.ident)
            if live is not None and live[0] is not latest[OP_CCT] and live[1] is state.thread:
                hook.bump()
                return

    def _unknown_operations(self, records: np.ndarray) -> list[Operation]:
        with self.session.lock:
            if self._unknown is None:
                self._unknown = GpuThread(-1, ThreadCCT(self.session.ids, main=True), main=True)
            state = self._unknown
            call = state.cct.placeholder(state.cct.fence, UNKNOWN_PLACEHOLDER)
        return [
            (0, int(kind), call, -1, state, state.cct, False) for kind in records["kind"].tolist()
        ]

    # -- flush and shutdown --

    def wait_processed(self, timeout: float = 10.0) -> bool:
        """Block until the monitor has processed every buffer delivered so far."""
        if self._monitor_done.is_set():
            return True
        barrier = threading.Event()
        self._completed.append(barrier)
        self._wake.release()
        return barrier.wait(timeout)

    def thread_ending(self, timeout: float = 10.0) -> None:
        """The calling thread is about to end and have its profile written: finish its GPU work.

        Flushes the backend (CUPTI delivers every buffer it holds) and waits for the monitor to
        match and attribute them, so they land in this thread's profile.
        """
        state = self._by_ident.get(_thread.get_ident())
        if state is None or self.closed:
            return
        if self.backend is not None:
            self.backend.flush()
        self.wait_processed(timeout)

    def close(self, write: bool = True, timeout: float = 10.0) -> None:
        """Stop the monitor and tracer threads, attribute everything, write stream files."""
        if self.closed:
            return
        self.wait_processed(timeout)
        self._stopping = True
        self._wake.release()
        self._monitor_done.wait(timeout)
        self.tracer.wake.release()
        self._tracer_done.wait(timeout)
        if self.fine.pc_kind is not None:
            with self.session.lock:
                self.fine.attribute_pc(final=True)
        if self.inside.blocks is not None:
            with self.session.lock:
                self.inside.blocks.attribute(final=True)
        self.tracer.drain()  # whatever the tracer left (it has stopped: we are the consumer)
        self._drain_operations()  # operations no buffer came for: counted, not matched
        hook = self.hook
        if hook is not None:  # the hook's records are all here: free it
            self.hook = self.matcher.hook = None
            if self.ranges is not None and hook.set_range in self.ranges.listeners:
                self.ranges.listeners.remove(hook.set_range)
            try:
                hook.reset()
            except RuntimeError as error:  # still subscribed: the backend did not stop
                self.errors.append(f"pyrun: gpu: {error}")
        stats = self.stats
        stats.unmatched_operations = self.matcher.unanswered()
        stats.trace_overflow = self.tracer.overflowed()
        self.closed = True
        if write and self.trace:
            self.write_streams()
        if write and self.inside.warps is not None:
            self.inside.warps.write(self.kind, self.errors)

    def finish(self, report: bool = True) -> GpuStats:
        """Stop the backend, attribute everything, write stream files; say what went missing."""
        from pyhpctk.measure.gpu.report import report_problems

        backend = self.backend
        if backend is not None:
            try:
                backend.stop()
            except Exception as error:  # the program's results matter more than ours
                self.errors.append(f"pyrun: gpu: backend stop failed: {error!r}")
        self.close()
        if self.inside.memory is not None:  # before the threads' CCTs are written
            from pyhpctk.measure.gpu.memory_hooks import finish

            finish(self.inside.memory, report)
        if report:
            report_problems(self.stats, self.errors, self.fine)
            if self.inside.blocks is not None:
                from pyhpctk.measure.gpu.blocks_report import report_blocks

                report_blocks(self.inside.blocks, self.limits)
            for line in self.inside.warps.problems() if self.inside.warps is not None else ():
                sys.stderr.write(line + "\n")
        return self.stats

    def write_streams(self) -> list[str]:
        """Write every stream's ``.hpcrun`` and ``.hpctrace`` (formats.md §1, §2)."""
        return self.tracer.write(self.kind, self.errors)

    def unknown_cct(self) -> ThreadCCT | None:
        """The CCT holding activities no operation claimed (None when every one matched)."""
        return self._unknown.cct if self._unknown is not None else None

    def operation_count(self) -> int:
        """Operations announced so far (drained by the monitor or still in channels)."""
        return self.stats.operations
