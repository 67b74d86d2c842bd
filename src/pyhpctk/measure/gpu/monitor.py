"""The GPU monitor: placeholders at each operation, activities matched back by correlation id.

The paper's design (Zhou et al. 2021; docs/architecture.md "Measurement"), as implemented here:

1. **Application thread T, at a GPU operation I** (the backend calls :meth:`GpuMonitor.operation`
   or :meth:`~GpuMonitor.enter` from inside the runtime API call, on T): T unwinds its Python
   stack into its CCT, inserts the placeholder P for the operation kind (``GPUKernl``,
   ``GPUMemst``...) and pushes the operation (I, P, C_A) on its *operation channel*. At the same
   safe point it attributes whatever (A, P) pairs wait on its *activity channel*.
2. **Backend thread** (CUPTI's buffer-completion thread, the simulator's): turns a completed
   activity buffer into one :data:`~pyhpctk.measure.gpu.activity.ACTIVITY_DTYPE` array and hands
   it to :meth:`GpuMonitor.buffer_completed`, which queues it and wakes the monitor thread.
3. **Monitor thread**: for each completed buffer, first drains every operation channel (so every
   operation issued before the buffer is known), then matches activities to operations by
   correlation id and sends each thread its batch of (A, P) on its activity channel; with
   tracing, each stream's records go on that stream's *trace channel*. Activities whose
   operation is unknown are counted (:attr:`GpuStats.unmatched`) and attributed under a
   ``GPU?????`` placeholder of a separate CCT, never dropped.
4. **Tracing thread**: drains trace channels into per-stream CCTs and trace records
   (:mod:`pyhpctk.measure.gpu.streams`).

An operation is a plain tuple (creating one costs a fraction of a slotted object), indexed by
the ``OP_*`` constants. Channels are :class:`~pyhpctk.measure.gpu.channels.SpscChannel`. CCT
changes take :attr:`Session.lock`, as the session requires; on the application thread's path the
lock is taken only when the call path is new or activities are waiting, never to talk to the
monitor.
"""

from __future__ import annotations

import _thread
import collections
import dataclasses
import os
import sys
import threading
from typing import cast

import numpy as np

from pyhpctk.measure.cct import (
    MAIN_FENCE,
    THREAD_FENCE,
    ThreadCCT,
    placeholder_ip,
    python_frame_ips,
)
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.channels import SpscChannel
from pyhpctk.measure.gpu.cubin import kernel_entries, save_gpubin
from pyhpctk.measure.gpu.streams import StreamTrace, write_stream_files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import FrameType
    from typing import Final, TypeAlias

    from pyhpctk.measure.cct import MetricKind
    from pyhpctk.measure.session import Session

    #: (correlation, kind, call node, placeholder or -1, thread, CCT of the nodes, multi)
    Operation: TypeAlias = "tuple[int, int, int, int, GpuThread, ThreadCCT, bool]"
    #: What the monitor sends a thread or a stream: activities, their operations, kernel names
    #: (and each activity's C-hook token, -1 where a Python path recorded the operation).
    Batch: TypeAlias = "tuple[np.ndarray, list[Operation], list[str], np.ndarray | None]"

FIRST_STREAM_THREAD = 500  # formats.md §1.3: GPU stream "threads" are numbered from 500
#: Threads with no Python frames that start GPU work get their own profiles from this number
#: (below the GPU streams; the session numbers Python threads 1, 2, ...).
FIRST_FOREIGN_THREAD = 400
UNKNOWN_PLACEHOLDER = "GPU?????"  # activities with no known operation (counted, reported)
#: Frames of files under pyhpctk/measure/ are the measurement's own: operations belong to the
#: program's frame below them (the C hook looks through the same frames).
SKIP = _SKIP = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RESUMABLE = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR
_UNCACHED = object()  # a "last frame" no frame (nor None) is: the next operation unwinds
_COPY_PLACEHOLDER = {act.COPY_H2D: "GPUCpH2D", act.COPY_D2H: "GPUCpD2H"}
# Kinds whose placeholder is inserted when the activity arrives, not at the operation: a copy's
# placeholder names its direction, which only the activity tells; a synchronization API (or an
# event query) often needs no synchronization at all, and then no empty placeholder is left.
_DEFERRED = frozenset({act.COPY, act.SYNC})
#: What the native hook's drain() returns: one (correlation id, token) pair per operation.
_NATIVE_RECORD = np.dtype([("correlation", "<u8"), ("token", "<i8")])
#: The monitor's waiting C-hook operations: the pair and the buffer count when drained.
_PENDING = np.dtype([("correlation", "<u8"), ("token", "<i8"), ("born", "<i8")])
_NATIVE_AGE = 4  # buffers an operation waits in the array before it moves to the dict

# Fields of an operation tuple: (correlation, kind, call node, placeholder node or -1,
# GpuThread, the CCT the nodes belong to, answered by several activities).
OP_CORRELATION: Final = 0
OP_KIND: Final = 1
OP_CALL: Final = 2
OP_PLACEHOLDER: Final = 3
OP_THREAD: Final = 4
OP_CCT: Final = 5
OP_MULTI: Final = 6


@dataclasses.dataclass(frozen=True, slots=True)
class _SiteTable:
    """The C hook's tokens as numpy columns: what matching and attribution need per token."""

    objects: np.ndarray  # token → the operation prototype (an object array of tuples)
    call: np.ndarray
    placeholder: np.ndarray
    thread: np.ndarray  # token → the monitor's number for its GpuThread
    cct: np.ndarray  # token → a number for its CCT (the same number: the same CCT)
    multi: np.ndarray

    @staticmethod
    def empty() -> _SiteTable:
        none = np.zeros(0, dtype=np.int64)
        return _SiteTable(np.zeros(0, dtype=object), none, none, none, none, none.astype(bool))


class GpuThread:
    """One application thread as the GPU monitor sees it: its CCT and its two channels."""

    __slots__ = (
        "activities",
        "call",
        "cct",
        "consumer",
        "depth",
        "frame",
        "ident",
        "inbox",
        "lasti",
        "live",
        "main",
        "operations",
        "outer",
        "own",
        "placeholders",
        "push",
        "thread",
    )

    def __init__(
        self, ident: int, cct: ThreadCCT, main: bool, thread: threading.Thread | None = None
    ) -> None:
        self.ident = ident
        self.thread = thread  # idents are reused once a thread ends: this tells threads apart
        self.own = False  # True: a thread with no Python frames; its CCT is the GPU layer's
        self.cct = cct
        self.main = main
        self.operations: SpscChannel[Operation] = SpscChannel("operations")  # T → monitor (C_O)
        self.push = self.operations.append
        self.activities: SpscChannel[Batch] = SpscChannel("activities")  # monitor → T (C_A)
        self.inbox = self.activities.items  # truthy when batches wait (a C-level check)
        self.live: object = None  # the session's ThreadState whose CCT this state uses
        self.consumer = _thread.allocate_lock()  # T, or shutdown on T's behalf, consumes C_A
        self.depth = 0  # nesting of GPU API calls (runtime → driver), enter/exit backends
        self.outer: Operation | None = None
        # The last unwound operation site: (frame, instruction) → call node and placeholders.
        self.frame: object = _UNCACHED
        self.lasti = -1
        self.call = -1
        self.placeholders: dict[int, int] = {}


class GpuStats:
    """What the monitor counted; :meth:`report` is the line pyrun prints at exit."""

    __slots__ = (
        "activities",
        "buffers",
        "dropped",
        "internal",
        "matched",
        "operations",
        "own",
        "trace_overflow",
        "unmatched",
        "unmatched_operations",
    )

    def __init__(self) -> None:
        self.operations = 0
        self.activities = 0
        self.matched = 0
        self.unmatched = 0  # activities whose correlation id no operation had
        self.internal = 0  # activities with correlation id 0: the driver's own (not an API call)
        self.own = 0  # activities of the backend's own CUDA calls (left out of the profile)
        self.unmatched_operations = 0  # operations no activity answered (allocation APIs...)
        self.buffers = 0
        self.dropped = 0  # records the backend reported lost (buffer overflow)
        self.trace_overflow = 0  # trace records refused by a full trace channel

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}

    def report(self) -> str:
        text = (
            f"pyrun: gpu: {self.operations} operations, {self.activities} activities in "
            f"{self.buffers} buffers, {self.matched} attributed to their operation"
        )
        problems = []
        if self.unmatched:
            problems.append(
                f"{self.unmatched} activities without a known operation (under <GPU?????>)"
            )
        if self.internal:
            problems.append(
                f"{self.internal} activities the driver started on its own (under <GPU?????>)"
            )
        if self.dropped:
            problems.append(f"{self.dropped} activity records dropped by the backend")
        if self.trace_overflow:
            problems.append(f"{self.trace_overflow} trace records lost to full channels")
        return text + ("; " + "; ".join(problems) if problems else "")


class GpuMonitor:
    """The GPU measurement of one process (see the module docstring)."""

    def __init__(
        self,
        session: Session,
        kind: MetricKind,
        limits: act.DeviceLimits | None = None,
        trace: bool | None = None,
        trace_capacity: int = 0,
    ) -> None:
        self.session = session
        self.kind = kind
        self.limits = limits or act.DeviceLimits()
        self.trace = session.options.trace if trace is None else trace
        self.trace_capacity = trace_capacity
        self.stats = GpuStats()
        self.threads: list[GpuThread] = []  # appended by application threads, read by monitor
        self._by_ident: dict[int, GpuThread] = {}
        self._pending: dict[int, Operation] = {}  # correlation → op (monitor-owned)
        self._completed: collections.deque[
            tuple[np.ndarray, Sequence[str], int] | threading.Event
        ] = collections.deque()
        self._wake = threading.Semaphore(0)
        self._functions: dict[str, tuple[int, int]] = {}  # kernel name → (lm id, offset)
        self._module_lock = threading.Lock()
        self.streams: dict[tuple[int, int, int], StreamTrace] = {}
        self._trace_wake = threading.Semaphore(0)
        self._unknown: GpuThread | None = None
        self._foreign = 0  # threads without Python frames given a CCT of their own
        self._stopping = False
        self._monitor_ident: int | None = None
        self._tracer_ident: int | None = None
        self._monitor_done = threading.Event()
        self._tracer_done = threading.Event()
        self.closed = False
        self.errors: list[str] = []
        self.backend: object | None = None  # set by install()
        # A native hook (the C CUPTI callback, _cuptihook) records repeated operations itself:
        # drain() gives (correlation, token) pairs, bump() invalidates its per-thread caches,
        # and cubins it captured wait in take_modules() (set by the backend; see operation_token).
        self.native_drain: Callable[[], bytes] | None = None
        self.native_bump: Callable[[], int] | None = None
        self.native_reset: Callable[[], None] | None = None  # after the last drain (close)
        self.take_modules: Callable[[], list[bytes]] | None = None
        self._sites: list[Operation] = []  # token → operation prototype (correlation 0)
        self._table = _SiteTable.empty()  # the same as arrays (monitor thread)
        self._native_pending = np.zeros(0, dtype=_PENDING)  # the hook's operations, unmatched
        self._thread_numbers: dict[int, int] = {}
        self._numbered: list[GpuThread] = []
        self._token_of: dict[tuple[int, int, int, int, int, bool], int] = {}
        # PC sampling (issue #7): off unless enable_pc() is called.
        self.pc_kind: MetricKind | None = None
        self.pc_period = 0
        self.pc_clock_khz = 0
        self.pc_sm_count = 0
        self.pc_stats = {"rows": 0, "samples": 0, "attributed": 0, "unmatched": 0, "dropped": 0}
        self.inst_functions: list[str] = []  # the device functions instruction counts came from
        self._own_calls: set[int] = set()  # correlation ids of the backend's own CUDA calls
        self._pc_lock = threading.Lock()
        self._pc_rows: list[tuple[np.ndarray, list[str], list[str], int]] = []
        self._pc_kernels: dict[int, tuple[ThreadCCT, int, int]] = {}
        self._pc_last_launch: dict[str, int] = {}  # kernel name → its latest launch
        self._inst_launches: dict[str, list[int]] = {}  # counting: kernel name → its launches
        self._start_threads()

    # -- threads of the monitor --

    def _start_threads(self) -> None:
        started = threading.Semaphore(0)
        _thread.start_new_thread(self._monitor_main, (started,))
        _thread.start_new_thread(self._tracer_main, (started,))
        started.acquire()
        started.acquire()

    def service_idents(self) -> tuple[int, ...]:
        """Thread idents of the monitor and tracer threads (not application threads)."""
        return tuple(i for i in (self._monitor_ident, self._tracer_ident) if i is not None)

    def exclude_current_thread(self) -> None:
        """Tell the session the calling thread is not an application thread (if it can)."""
        exclude = getattr(self.session, "exclude_thread", None)
        if exclude is not None:
            exclude(_thread.get_ident())

    def _monitor_main(self, started: threading.Semaphore) -> None:
        self._monitor_ident = _thread.get_ident()
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
        self._tracer_ident = _thread.get_ident()
        self.exclude_current_thread()
        started.release()
        try:
            while True:
                self._trace_wake.acquire()
                self._drain_traces()
                if self._stopping and self._monitor_done.is_set():
                    self._drain_traces()
                    return
        except Exception as error:
            self.errors.append(f"pyrun: gpu tracer stopped: {error!r}")
            sys.stderr.write(self.errors[-1] + "\n")
        finally:
            self._tracer_done.set()

    # -- application thread side (the hot path) --

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
                if frameless and session.states.get(ident) is None:
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
                    state.live = session.states.get(ident)
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
        while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
            frame = frame.f_back
        state = self._by_ident.get(ident) or self._thread_state(ident, frame is None)
        # The fast path: same site as last time, the session still has this thread's CCT
        # (it may retire and replace it), and no activities wait to be attributed.
        if (
            frame is state.frame
            and not state.inbox
            and (state.own or self.session.states.get(ident) is state.live)
            and (frame is None or frame.f_lasti == state.lasti)
        ):
            placeholder = -1 if kind in _DEFERRED else state.placeholders.get(kind, -2)
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
        with session.lock:
            if len(state.activities):
                self._attribute_pending(state)
            if state.own:  # the GPU layer's CCT: unwind into it ourselves
                cct = state.cct
                ips = python_frame_ips(frame, session.functions, session.functions.fid_of)
                call = cct.path(session.python_lm, ips) if ips else cct.fence
                placeholder = -1
                if kind not in _DEFERRED:
                    placeholder = cct.placeholder(call, act.PLACEHOLDER_OF_KIND[kind])
                if call == cct.fence and placeholder >= 0:
                    state.placeholders[kind] = placeholder
                return (correlation, kind, call, placeholder, state, cct, multi)
            same_site = (
                frame is state.frame
                and (frame is None or frame.f_lasti == state.lasti)
                and session.states.get(state.ident) is state.live
            )
            if same_site:
                cct, call = state.cct, state.call
            else:
                cct, call = session.current_context(skip=0)
                state.cct = cct
                state.live = session.states.get(state.ident)
                resumable = frame is not None and frame.f_code.co_flags & _RESUMABLE
                state.frame = _UNCACHED if resumable else frame
                state.lasti = frame.f_lasti if frame is not None else -1
                state.call = call
                state.placeholders = {}
            if kind in _DEFERRED:  # placed when (if) an activity comes: see _DEFERRED
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
        while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
            frame = frame.f_back
        ident = _thread.get_ident()
        state = self._by_ident.get(ident) or self._thread_state(ident, frame is None)
        operation = self._slow_operation(state, frame, kind, correlation, multi)
        state = operation[OP_THREAD]
        state.push(operation)
        # A generator's or coroutine's frame is cached too: the hook compares every frame down
        # to a non-resumable anchor, so a generator resumed from elsewhere is another site.
        key = _site_key(operation)
        token = self._token_of.get(key)
        if token is None:
            token = self._token_of[key] = len(self._sites)
            self._sites.append((0, *operation[1:]))
        return token

    def enter(self, kind: int, correlation: int, multi: bool = False) -> None:
        """T enters a GPU API call (backends that see entry and exit, and nested calls).

        Calls nested inside it (a runtime call making driver calls) share its call path and
        placeholder: every correlation id of the nest maps to the same place.
        """
        ident = _thread.get_ident()
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
            frame = frame.f_back
        state = self._by_ident.get(ident) or self._thread_state(ident, frame is None)
        outer = state.outer
        if state.depth and outer is not None:
            placeholder = outer[OP_PLACEHOLDER] if outer[OP_KIND] == kind else -1
            if placeholder == -1 and kind not in _DEFERRED and kind != act.KERNEL:
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
            self._own_calls.add(correlation)

    def module_loaded(self, cubin: bytes) -> None:
        """A GPU binary was loaded: save it under ``gpubins/`` and learn its kernels' entries."""
        try:
            path = save_gpubin(self.session.options.output_dir, cubin)
            entries = kernel_entries(cubin, path)
        except (OSError, ValueError) as error:
            self.errors.append(f"pyrun: gpu: cannot save a GPU binary: {error}")
            return
        lm_id = self.session.add_load_module(path)
        with self._module_lock:
            for name, offset in entries.items():
                self._functions.setdefault(name, (lm_id, offset))

    # -- monitor thread: matching --

    def _process(self, records: np.ndarray, functions: Sequence[str], dropped: int) -> None:
        stats = self.stats
        stats.buffers += 1
        stats.dropped += dropped
        stats.activities += len(records)
        pending = self._pending
        self._drain_operations()
        own = self._own_calls
        if own and len(records):  # the backend's own CUDA calls (PC sampling, counting)
            mine = np.isin(records["correlation"], np.fromiter(own, np.uint64, len(own)))
            if mine.any():
                stats.own += int(mine.sum())
                own.difference_update(records["correlation"][mine].tolist())  # one record each
                records = records[~mine]
        if not len(records):
            return
        correlations = records["correlation"]
        tokens = self._match_native(correlations)
        table = self._site_table()
        operations: list[Operation | None] = (
            table.objects[np.maximum(tokens, 0)].tolist()
            if len(table.objects)
            else [None] * len(records)
        )
        owners = table.thread[np.maximum(tokens, 0)] if len(table.objects) else tokens.copy()
        owners[tokens < 0] = -1
        unknown: list[int] = []
        if (tokens < 0).any():  # operations the Python paths recorded (new sites, hook=python)
            pop = pending.pop
            token_of = self._token_of
            for index in np.flatnonzero(tokens < 0).tolist():
                operation = pop(int(correlations[index]), None)
                operations[index] = operation
                if operation is None:
                    unknown.append(index)
                    continue
                if operation[OP_MULTI]:
                    pending[operation[OP_CORRELATION]] = operation  # more activities will come
                owners[index] = self._thread_number(operation[OP_THREAD])
                # The C hook's slow path gave this site a token (operation_token).
                tokens[index] = token_of.get(_site_key(operation), -1)
            self._site_table()  # tokens newer than the table: rebuilt now, not per batch
        stats.matched += len(records) - len(unknown)
        names = list(functions)
        known = owners >= 0
        threads = np.unique(owners[known])
        for number in threads.tolist():
            if len(threads) == 1 and not unknown:  # the common case: one thread, all matched
                rows, ops, mine = records, cast("list[Operation]", operations), tokens
            else:
                indices = np.flatnonzero(owners == number)
                rows, mine = records[indices], tokens[indices]
                ops = [cast("Operation", operations[i]) for i in indices.tolist()]
            ops[0][OP_THREAD].activities.push((rows, ops, names, mine))
        if self.native_bump is not None:
            self.native_bump()  # each thread's next operation takes the slow path: attributes
        if unknown:
            internal = int((correlations[unknown] == 0).sum())
            stats.internal += internal
            stats.unmatched += len(unknown) - internal
            unknown_ops = self._unknown_operations(records[unknown])
            for position, index in enumerate(unknown):
                operations[index] = unknown_ops[position]
            with self.session.lock:
                self._attribute(records[unknown], unknown_ops, names)
        if self.trace:
            self._route_traces(records, operations, names)

    def _match_native(self, correlations: np.ndarray) -> np.ndarray:
        """Each record's token from the C hook's operations (-1: none), with numpy.

        Matched operations leave the pending array, except those several activities answer
        (CUDA graph launches), which stay for the buffers to come.
        """
        waiting = self._native_pending
        tokens = np.full(len(correlations), -1, dtype=np.int64)
        if not len(waiting):
            return tokens
        order = np.argsort(waiting["correlation"], kind="stable")
        ordered = waiting["correlation"][order]
        at = np.minimum(np.searchsorted(ordered, correlations), len(ordered) - 1)
        hit = ordered[at] == correlations
        tokens[hit] = waiting["token"][order[at[hit]]]
        multi = self._site_table().multi
        taken = order[at[hit]]
        taken = taken[~multi[waiting["token"][taken]]]
        keep = np.ones(len(waiting), dtype=bool)
        keep[taken] = False
        # Operations no activity answered within _NATIVE_AGE buffers (nested driver calls of a
        # runtime call, event queries...) move to the dict of Python-recorded operations, so
        # the array searched at every buffer stays the size of the recent operations.
        old = keep & (waiting["born"] < self.stats.buffers - _NATIVE_AGE)
        if old.any():
            sites = self._sites
            pending = self._pending
            for correlation, token in zip(
                waiting["correlation"][old].tolist(), waiting["token"][old].tolist(), strict=True
            ):
                pending[correlation] = (correlation, *sites[token][1:])
            keep &= ~old
        if not keep.all():
            self._native_pending = waiting[keep]
        return tokens

    def _thread_number(self, state: GpuThread) -> int:
        number = self._thread_numbers.get(id(state))
        if number is None:
            number = self._thread_numbers[id(state)] = len(self._thread_numbers)
            self._numbered.append(state)  # keeps the id from being reused
        return number

    def _site_table(self) -> _SiteTable:
        """The C hook's sites as arrays (rebuilt when new sites appeared; sites are few)."""
        table = self._table
        sites = self._sites
        if len(table.objects) != len(sites):
            count = len(sites)
            objects = np.empty(count, dtype=object)
            for index in range(count):
                objects[index] = sites[index]
            ccts: dict[int, int] = {}
            table = _SiteTable(
                objects=objects,
                call=np.array([site[OP_CALL] for site in sites[:count]], dtype=np.int64),
                placeholder=np.array(
                    [site[OP_PLACEHOLDER] for site in sites[:count]], dtype=np.int64
                ),
                thread=np.array(
                    [self._thread_number(site[OP_THREAD]) for site in sites[:count]],
                    dtype=np.int64,
                ),
                cct=np.array(
                    [ccts.setdefault(id(site[OP_CCT]), len(ccts)) for site in sites[:count]],
                    dtype=np.int64,
                ),
                multi=np.array([site[OP_MULTI] for site in sites[:count]], dtype=bool),
            )
            self._table = table
        return table

    def _drain_operations(self) -> None:
        take = self.take_modules
        if take is not None:  # cubins the backend captured: known before their kernels match
            for cubin in take():
                self.module_loaded(cubin)
        pending = self._pending
        for state in list(self.threads):
            drained = state.operations.drain()
            self.stats.operations += len(drained)
            for operation in drained:
                pending[operation[OP_CORRELATION]] = operation
        drain = self.native_drain
        if drain is not None:
            raw = np.frombuffer(drain(), dtype=_NATIVE_RECORD)
            if len(raw):
                self.stats.operations += len(raw)
                fresh = np.empty(len(raw), dtype=_PENDING)
                fresh["correlation"] = raw["correlation"]
                fresh["token"] = raw["token"]
                fresh["born"] = self.stats.buffers
                waiting = self._native_pending
                self._native_pending = np.concatenate([waiting, fresh]) if len(waiting) else fresh

    def _unknown_operations(self, records: np.ndarray) -> list[Operation]:
        with self.session.lock:
            if self._unknown is None:
                self._unknown = GpuThread(-1, ThreadCCT(self.session.ids, main=True), main=True)
            state = self._unknown
            call = state.cct.placeholder(state.cct.fence, UNKNOWN_PLACEHOLDER)
        return [
            (0, int(kind), call, -1, state, state.cct, False) for kind in records["kind"].tolist()
        ]

    def _route_traces(
        self, records: np.ndarray, operations: list[Operation | None], names: list[str]
    ) -> None:
        keys = np.stack([records["device"], records["context"], records["stream"]], axis=1)
        unique, inverse = np.unique(keys.astype(np.int64), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for group, key in enumerate(unique.tolist()):
            indices = np.flatnonzero(inverse == group)
            stream_key = (int(key[0]), int(key[1]), int(key[2]))
            stream = self.streams.get(stream_key)
            if stream is None:
                number = FIRST_STREAM_THREAD + len(self.streams)
                cct = ThreadCCT(self.session.ids, main=True, with_no_activity=True)
                channel: SpscChannel[Batch] = SpscChannel(
                    f"trace {stream_key}", self.trace_capacity
                )
                stream = self.streams[stream_key] = StreamTrace(number, stream_key, cct, channel)
            batch = (records[indices], [operations[i] for i in indices.tolist()], names, None)
            if not stream.channel.push(batch):
                self.stats.trace_overflow += len(indices)
        self._trace_wake.release()

    # -- attribution (application thread at a safe point, or shutdown on its behalf) --

    def _attribute_pending(self, state: GpuThread) -> None:
        """Attribute every batch on ``state``'s activity channel (call with the session lock)."""
        if not state.consumer.acquire(False):
            return  # someone else is already attributing this thread's activities
        try:
            for item in state.activities.drain():
                rows, ops, names, tokens = item
                self._attribute(rows, ops, names, tokens)
        finally:
            state.consumer.release()

    def _live_cct(self, operation: Operation) -> tuple[ThreadCCT, int, int]:
        """The CCT, call node and placeholder to attribute ``operation`` to now.

        When the session has retired the thread's CCT since the operation (the thread left
        Python for a while and was written out), the call path is copied into the thread's
        current CCT so the values land in a profile that will still be written.
        """
        cct: ThreadCCT = operation[OP_CCT]
        state: GpuThread = operation[OP_THREAD]
        call: int = operation[OP_CALL]
        placeholder: int = operation[OP_PLACEHOLDER]
        if state.ident < 0 or state.own:
            return cct, call, placeholder
        live = self.session.states.get(state.ident)
        if live is None or live.cct is cct:
            return cct, call, placeholder
        if live.thread is not None and live.thread is not state.thread:
            return cct, call, placeholder  # the ident now belongs to another thread
        return live.cct, transplant(cct, call, live.cct, state.main), -1

    def _attribute(
        self,
        rows: np.ndarray,
        ops: Sequence[Operation],
        names: list[str],
        tokens: np.ndarray | None = None,
    ) -> None:
        """Add the metrics of ``rows`` to their operations' CCTs (call with the session lock).

        Activities are grouped by (CCT, call node, placeholder, kind, kernel or copy direction)
        with numpy; the CCT is consulted once per group, not once per activity. ``tokens`` (the
        C hook's, -1 where a Python path recorded the operation) let the columns come from the
        site table instead of one tuple per activity.
        """
        if not len(ops):
            return
        table = self._table
        if tokens is not None and ((tokens < 0).any() or tokens.max() >= len(table.objects)):
            tokens = None  # some operations have no token: read them all from their tuples
        if tokens is not None:
            cct_numbers = table.cct[tokens]
            several = bool((cct_numbers != cct_numbers[0]).any())
        else:
            first_cct = ops[0][OP_CCT]
            several = not all(operation[OP_CCT] is first_cct for operation in ops)
        if several:  # rare: several CCTs
            groups: dict[int, list[int]] = {}
            for index, operation in enumerate(ops):
                groups.setdefault(id(operation[OP_CCT]), []).append(index)
            for indices in groups.values():
                part = None if tokens is None else tokens[indices]
                self._attribute(rows[indices], [ops[i] for i in indices], names, part)
            return
        first = ops[0][OP_CCT]
        # One int64 key per activity: the placeholder (or, for copies, the call node), then the
        # kind and the kernel / copy direction (a placeholder is its call node's child, so the
        # call node adds nothing once the placeholder is known).
        if tokens is not None:
            placeholders = table.placeholder[tokens]
            calls = table.call[tokens]
        else:
            placeholders = np.array([op[OP_PLACEHOLDER] for op in ops], dtype=np.int64)
            calls = np.array([op[OP_CALL] for op in ops], dtype=np.int64)
        copies = placeholders < 0
        anchor = np.where(copies, calls, placeholders)
        detail = np.where(rows["kind"] == act.KERNEL, rows["function"], rows["copy_kind"])
        keys = (
            (anchor << 24)
            | (copies.astype(np.int64) << 23)
            | (rows["kind"].astype(np.int64) << 20)
            | ((detail.astype(np.int64) + 1) & 0xFFFFF)
        )
        _, where, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        kinds = rows["kind"].tolist()
        details = detail.tolist()
        cct = first
        nodes = np.empty(len(where), dtype=np.int64)
        for group, index in enumerate(where.tolist()):
            cct, call, placeholder = self._live_cct(ops[index])
            nodes[group] = self._metric_node(
                cct, call, placeholder, kinds[index], details[index], names
            )
        self._add_metrics(cct, rows, nodes[inverse])
        if self.pc_kind is not None:
            targets = nodes[inverse]
            for index in np.flatnonzero(rows["kind"] == act.KERNEL).tolist():
                duration = int(rows["end"][index]) - int(rows["start"][index])
                correlation = int(rows["correlation"][index])
                self._pc_kernels[correlation] = (cct, int(targets[index]), max(duration, 0))
                function = int(rows["function"][index])
                if 0 <= function < len(names):  # continuous mode: samples carry no id
                    self._pc_last_launch[names[function]] = correlation
                    if not self.pc_period:  # counting: the window's totals may be split
                        self._inst_launches.setdefault(names[function], []).append(correlation)
            if self._pc_rows:
                self._attribute_pc()

    def _metric_node(
        self, cct: ThreadCCT, call: int, placeholder: int, kind: int, detail: int, names: list[str]
    ) -> int:
        """The node an activity's metrics go to: ``GPUKernl → gpubin@entry`` for kernels."""
        if kind == act.COPY:
            name = _COPY_PLACEHOLDER.get(detail, "GPUCp?2?")
        else:
            name = act.PLACEHOLDER_OF_KIND.get(kind, UNKNOWN_PLACEHOLDER)
        if placeholder < 0 or cct.ip[placeholder] != placeholder_ip(name):
            placeholder = cct.placeholder(call, name)
        if kind != act.KERNEL:
            return placeholder
        entry = self._functions.get(names[detail]) if 0 <= detail < len(names) else None
        if entry is None:
            return placeholder
        kernel = cct.child(placeholder, *entry)
        if self.trace:  # hpcrun also keeps the traced twin GPUTrace → gpubin@entry, retained
            traced = cct.child(cct.placeholder(call, act.TRACE_PLACEHOLDER), *entry)
            cct.retain(traced)
        return kernel

    def _add_metrics(self, cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray) -> None:
        """Sum each metric per target node with numpy and add the sums to ``cct``."""
        nodes, inverse = np.unique(targets, return_inverse=True)
        inverse = inverse.reshape(-1)
        width = len(nodes)
        columns: dict[int, np.ndarray] = {}

        def add(metric: int, mask: np.ndarray | None, values: np.ndarray) -> None:
            if mask is not None and not mask.any():
                return
            selected = inverse if mask is None else inverse[mask]
            sums = np.bincount(selected, weights=values.astype(np.float64), minlength=width)
            previous = columns.get(metric)
            columns[metric] = sums if previous is None else previous + sums

        kinds = rows["kind"]
        duration = (rows["end"].astype(np.int64) - rows["start"].astype(np.int64)).clip(0) / 1e9
        add(gm.GPUOP, None, duration)
        is_kernel = kinds == act.KERNEL
        if is_kernel.any():
            kernels = rows[is_kernel]
            add(gm.GKER, is_kernel, duration[is_kernel])
            add(gm.GKER_COUNT, is_kernel, np.ones(int(is_kernel.sum())))
            add(gm.GKER_STMEM_ACUMU, is_kernel, kernels["static_smem"])
            add(gm.GKER_DYMEM_ACUMU, is_kernel, kernels["dynamic_smem"])
            add(gm.GKER_LMEM_ACUMU, is_kernel, kernels["local_mem"])
            active, maximum = act.occupancy(kernels, self.limits)
            add(gm.GKER_FGP_ACT_ACUMU, is_kernel, active)
            add(gm.GKER_FGP_MAX_ACUMU, is_kernel, maximum)
            add(gm.GKER_THR_REG_ACUMU, is_kernel, kernels["registers"])
            add(gm.GKER_BLK_THR_ACUMU, is_kernel, kernels["block_threads"])
            shared = kernels["static_smem"].astype(np.int64) + kernels["dynamic_smem"]
            add(gm.GKER_BLK_SM_ACUMU, is_kernel, shared)
            add(gm.GKER_BLKS_ACUMU, is_kernel, kernels["grid_blocks"])
        for kind, time_metric, bytes_metric, count_metric, field, limit in (
            (act.COPY, gm.GXCOPY, gm.GXCOPY_BYTES, gm.GXCOPY_COUNT, "copy_kind", 11),
            (act.MEMSET, gm.GMSET, gm.GMSET_BYTES, gm.GMSET_COUNT, "memory_kind", 8),
            (act.ALLOC, gm.GMEM, gm.GMEM_BYTES, gm.GMEM_COUNT, "memory_kind", 8),
            (act.FREE, gm.GMEM, gm.GMEM_BYTES, gm.GMEM_COUNT, "memory_kind", 8),
        ):
            mask = kinds == kind
            if not mask.any():
                continue
            add(time_metric, mask, duration[mask])
            add(count_metric, mask, np.ones(int(mask.sum())))
            sub = np.where(rows[field][mask] < limit, rows[field][mask], 0)
            for value in np.unique(sub).tolist():
                part = mask.copy()
                part[mask] = sub == value
                add(bytes_metric + int(value), part, rows["bytes"][part])
        is_sync = kinds == act.SYNC
        if is_sync.any():
            add(gm.GSYNC, is_sync, duration[is_sync])
            add(gm.GSYNC_COUNT, is_sync, np.ones(int(is_sync.sum())))
            sub = np.where(rows["sync_kind"][is_sync] < 5, rows["sync_kind"][is_sync], 0)
            for value in np.unique(sub).tolist():
                part = is_sync.copy()
                part[is_sync] = sub == value
                add(gm.GSYNC_TIME + int(value), part, duration[part])
        node_list = nodes.tolist()
        store = cct.values_of(self.kind)
        for metric, sums in columns.items():
            for slot, value in enumerate(sums.tolist()):
                if value:
                    store.add(node_list[slot], metric, value)

    # -- tracing thread --

    def _drain_traces(self) -> None:
        for stream in list(self.streams.values()):
            for item in stream.channel.drain():
                rows, ops, names, _ = item
                self._trace_batch(stream, rows, ops, names)

    def _trace_batch(
        self,
        stream: StreamTrace,
        rows: np.ndarray,
        ops: list[Operation],
        names: list[str],
    ) -> None:
        """Copy each operation's calling context into the stream's CCT and record its interval."""
        cct = stream.cct
        kinds = rows["kind"].tolist()
        details = np.where(rows["kind"] == act.KERNEL, rows["function"], rows["copy_kind"]).tolist()
        nodes: list[int] = []
        with self.session.lock:
            for index, operation in enumerate(ops):
                thread: GpuThread = operation[OP_THREAD]
                source: ThreadCCT = operation[OP_CCT]
                call = stream.copy_path(source, operation[OP_CALL], thread.main)
                node = self._trace_node(cct, call, kinds[index], details[index], names)
                cct.retain(node)
                nodes.append(node)
        stream.record(rows["start"], rows["end"], nodes)

    def _trace_node(
        self, cct: ThreadCCT, call: int, kind: int, detail: int, names: list[str]
    ) -> int:
        """The node a stream trace record points at: ``GPUTrace → gpubin@entry`` for kernels."""
        if kind == act.KERNEL:
            placeholder = cct.placeholder(call, act.TRACE_PLACEHOLDER)
            entry = self._functions.get(names[detail]) if 0 <= detail < len(names) else None
            return placeholder if entry is None else cct.child(placeholder, *entry)
        if kind == act.COPY:
            name = _COPY_PLACEHOLDER.get(detail, "GPUCp?2?")
        else:
            name = act.PLACEHOLDER_OF_KIND.get(kind, UNKNOWN_PLACEHOLDER)
        return cct.placeholder(call, name)

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

        Flushes the backend (CUPTI delivers every buffer it holds), waits for the monitor to
        match them, and attributes this thread's activities, so they land in its profile.
        """
        state = self._by_ident.get(_thread.get_ident())
        if state is None or self.closed:
            return
        flush = getattr(self.backend, "flush", None)
        if flush is not None:
            flush()
        self.wait_processed(timeout)
        with self.session.lock:
            self._attribute_pending(state)

    def attribute_all(self) -> None:
        """Attribute every thread's waiting activities now (threads that ended, shutdown)."""
        with self.session.lock:
            for state in list(self.threads):
                self._attribute_pending(state)

    def close(self, write: bool = True, timeout: float = 10.0) -> None:
        """Stop the monitor and tracer threads, attribute everything, write stream files."""
        if self.closed:
            return
        self.wait_processed(timeout)
        self._stopping = True
        self._wake.release()
        self._monitor_done.wait(timeout)
        self._trace_wake.release()
        self._tracer_done.wait(timeout)
        self.attribute_all()
        if self.pc_kind is not None:
            with self.session.lock:
                self._attribute_pc(final=True)
        self._drain_traces()  # whatever the tracer left (it has stopped: we are the consumer)
        self._drain_operations()  # operations no buffer came for: counted, not matched
        if self.native_reset is not None:  # the hook's records are all here: free it
            self.native_drain = self.native_bump = None
            try:
                self.native_reset()
            except RuntimeError as error:  # still subscribed: the backend did not stop
                self.errors.append(f"pyrun: gpu: {error}")
            self.native_reset = None
        stats = self.stats
        stats.unmatched_operations = sum(not op[OP_MULTI] for op in self._pending.values())
        waiting = self._native_pending
        if len(waiting):
            stats.unmatched_operations += int((~self._site_table().multi[waiting["token"]]).sum())
        stats.trace_overflow = sum(s.channel.overflowed for s in self.streams.values())
        self.closed = True
        if write and self.trace:
            self.write_streams()

    # -- PC sampling (issue #7) --

    def enable_pc(
        self, kind: MetricKind, period_cycles: int, clock_khz: int = 0, sm_count: int = 0
    ) -> None:
        """Attribute PC samples or instruction counts into ``kind`` (``pc_metric_kind``).

        ``period_cycles`` is 0 for instruction counts (``gpu=...,inst``): no GSAMP metrics.
        """
        self.pc_kind = kind
        self.pc_sm_count = sm_count
        self.pc_period = period_cycles
        self.pc_clock_khz = clock_khz

    def pc_samples(
        self, rows: np.ndarray, functions: Sequence[str], reasons: Sequence[str], dropped: int = 0
    ) -> None:
        """A backend delivers PC sample rows (``pcsampling.SAMPLE_DTYPE``; any thread).

        They wait until the kernel launch with their correlation id has been attributed, then
        go below that launch's ``GPUKernl`` placeholder (:meth:`_attribute_pc`).
        """
        from pyhpctk.measure.gpu.pcsampling import sample_count

        with self._pc_lock:
            self._pc_rows.append((rows, list(functions), list(reasons), dropped))
            self.pc_stats["rows"] += len(rows)
            self.pc_stats["samples"] += sample_count(rows, reasons)
            self.pc_stats["dropped"] += dropped

    def inst_counts(self, rows: np.ndarray, functions: Sequence[str], launches: int = 1) -> None:
        """A backend delivers instruction counts (``sassmetrics.INST_DTYPE``; any thread).

        Like :meth:`pc_samples`: the rows wait for the launch with their correlation id, then
        go below its ``GPUKernl`` placeholder as hpcrun's instrumentation metrics (``GINS``,
        ``GINS:SIMD_*``). They share the PC queue; their dtype tells them apart. ``launches``:
        how many kernel launches ran while CUPTI counted (its counts are their totals).
        """
        with self._pc_lock:
            self._pc_rows.append((rows, list(functions), [], 0))
            stats = self.pc_stats
            stats["rows"] += len(rows)
            stats["instructions"] = stats.get("instructions", 0) + int(
                rows["inst"].astype(np.int64).sum()
            )
            stats["inst_launches"] = stats.get("inst_launches", 0) + launches
            counted = sorted({functions[f] for f in rows["function"].tolist() if f >= 0})
            self.inst_functions.extend(n for n in counted if n not in self.inst_functions)

    def _attribute_pc(self, final: bool = False) -> None:
        """Attribute waiting PC samples / counts whose kernel is known (with the session lock)."""
        from pyhpctk.measure.gpu import pcsampling as pcs
        from pyhpctk.measure.gpu import sassmetrics as sm

        kind = self.pc_kind
        if kind is None:
            return
        with self._pc_lock:
            batches, self._pc_rows = self._pc_rows, []
        waiting: list[tuple[np.ndarray, list[str], list[str], int]] = []
        index = gm.PC_INDEX
        stats = self.pc_stats
        for rows, functions, reasons, dropped in batches:
            counts = rows.dtype == sm.INST_DTYPE
            if not counts and not rows["correlation"].all():  # continuous: the latest launch
                names = np.array([*functions, "?"], dtype=object)
                named = names[np.where(rows["function"] >= 0, rows["function"], len(functions))]
                latest = [self._pc_last_launch.get(str(n), 0) for n in named.tolist()]
                rows = rows.copy()
                rows["correlation"] = np.where(
                    rows["correlation"] == 0, latest, rows["correlation"]
                )
            correlations = rows["correlation"]
            pieces: list[tuple[int, np.ndarray]] = []
            for correlation in np.unique(correlations).tolist():
                part = rows[correlations == correlation]
                if not counts:
                    pieces.append((correlation, part))
                elif not final:  # CUPTI's totals: split once every counted launch is known
                    waiting.append((part, functions, reasons, 0))
                else:
                    pieces += self._inst_pieces(int(correlation), part)
            for correlation, part in pieces:
                amount = (
                    int(part["inst"].astype(np.int64).sum())
                    if counts
                    else pcs.sample_count(part, reasons)
                )
                unmatched = "inst_unmatched" if counts else "unmatched"
                known = self._pc_kernels.get(int(correlation))
                if known is None:
                    if final or not correlation:
                        stats[unmatched] = stats.get(unmatched, 0) + amount
                    else:
                        waiting.append((part, functions, reasons, 0))
                    continue
                cct, kernel, duration = known
                lm = int(cct.lm[kernel])
                placeholder = int(cct.parent[kernel])
                with self._module_lock:
                    entries = {n: off for n, (m, off) in self._functions.items() if m == lm}
                if not entries:
                    stats[unmatched] = stats.get(unmatched, 0) + amount
                    continue
                if counts:
                    values = sm.attribute_counts(part, functions, entries)
                else:
                    expected = pcs.expected_samples(
                        duration,
                        self.pc_clock_khz,
                        self.pc_sm_count or self.limits.sm_count,
                        self.pc_period,
                    )
                    values = pcs.attribute_samples(
                        part, reasons, functions, entries, self.pc_period, amount, dropped, expected
                    )
                    dropped = 0  # a batch's dropped samples go to its first kernel
                store = cct.values_of(kind)
                entry = int(cct.ip[kernel])
                for (offset, name), value in values.values.items():
                    node = (
                        kernel
                        if offset == entry
                        else cct.child(placeholder, lm, offset, unwound=False)
                    )
                    store.add(node, index[name], value)
                for name, value in values.kernel_values.items():
                    metric = index[name]
                    if name == "GSAMP:PER (cyc)":  # a setting, not a count: as hpcrun, once
                        value -= int(store.get(kernel, metric))
                    if value:
                        store.add(kernel, metric, value)
                attributed = "inst_attributed" if counts else "attributed"
                stats[attributed] = stats.get(attributed, 0) + amount
        if waiting:
            with self._pc_lock:
                self._pc_rows[:0] = waiting

    def _inst_pieces(self, first: int, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """A counting window's totals as (launch, rows) pieces, one per calling context.

        CUPTI sums every launch of the counted kernel into one total per instruction, given as
        the window's ``first`` launch's. When the counted launches (that kernel's launches from
        ``first`` on) all have one calling context, the totals are exact there. When they came
        from several, each context gets a share in proportion to its launches' GPU time.
        Instrumented kernels spend their time counting, so time follows the number of
        executions. A context with no measured time makes it a share by launch count.
        Identical launches then split exactly.
        """
        from pyhpctk.measure.gpu import sassmetrics as sm

        name = next((n for n, seen in self._inst_launches.items() if first in seen), None)
        groups: dict[tuple[int, int], list[int]] = {}  # (CCT, kernel node) → launch, ns, count
        for correlation in self._inst_launches.get(name, []) if name is not None else []:
            known = self._pc_kernels.get(correlation)
            if correlation < first or known is None:
                continue
            cct, kernel, duration = known
            group = groups.setdefault((id(cct), kernel), [correlation, 0, 0])
            group[1] += duration
            group[2] += 1
        if len(groups) <= 1:
            return [(first, rows)]
        split = sorted(groups.values())  # contexts in the order of their first launch
        by_time = all(ns > 0 for _, ns, _ in split)
        weights = [ns if by_time else launches for _, ns, launches in split]
        stats = self.pc_stats
        stats["inst_contexts"] = stats.get("inst_contexts", 0) + len(split)
        stats["inst_split_by_time"] = int(by_time)
        parts = sm.split_counts(rows, weights)
        return [(launch, part) for (launch, _, _), part in zip(split, parts, strict=True)]

    def write_streams(self) -> list[str]:
        """Write every stream's ``.hpcrun`` and ``.hpctrace`` (formats.md §1, §2)."""
        written: list[str] = []
        for stream in self.streams.values():
            try:
                written += write_stream_files(self.session, self.kind, stream)
            except OSError as error:
                self.errors.append(f"pyrun: gpu: cannot write stream {stream.number}: {error}")
        return written

    def unknown_cct(self) -> ThreadCCT | None:
        """The CCT holding activities no operation claimed (None when every one matched)."""
        return self._unknown.cct if self._unknown is not None else None

    def operation_count(self) -> int:
        """Operations announced so far (drained by the monitor or still in channels)."""
        return self.stats.operations


def _site_key(operation: Operation) -> tuple[int, int, int, int, int, bool]:
    """What names a C-hook token: everything of an operation but its correlation id."""
    return (
        operation[OP_KIND],
        operation[OP_CALL],
        operation[OP_PLACEHOLDER],
        id(operation[OP_THREAD]),
        id(operation[OP_CCT]),
        operation[OP_MULTI],
    )


def transplant(source: ThreadCCT, node: int, target: ThreadCCT, main: bool) -> int:
    """The node in ``target`` for ``source``'s call path ending at ``node`` (created as needed).

    The path below the fence is copied frame by frame; it hangs from ``target``'s fence of the
    same kind (``| Main`` or ``| Thread``).
    """
    path: list[tuple[int, int]] = []
    parent = source.parent
    walk = node
    while walk >= 0 and walk != source.fence and parent[walk] >= 0:
        path.append((source.lm[walk], source.ip[walk]))
        walk = parent[walk]
    fence_ip = placeholder_ip(MAIN_FENCE if main else THREAD_FENCE)
    into = target.fence if target.ip[target.fence] == fence_ip else None
    if into is None:
        into = target.placeholder(target.root, MAIN_FENCE if main else THREAD_FENCE)
    for lm, ip in reversed(path):
        into = target.child(into, lm, ip)
    return into
