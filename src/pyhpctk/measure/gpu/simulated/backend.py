"""The simulated GPU backend: replays recorded activity through the real monitor code.

CI has no GPU, so this backend plays the GPU runtime's part with a :class:`Recording` made on a
real one (``tests/data/gpu/``): application threads issue the recorded operations (the monitor's
:meth:`~GpuMonitor.enter` / :meth:`~GpuMonitor.exit`, exactly as the CUPTI callbacks call them),
and a *completion thread* (CUPTI's buffer thread in a real run) delivers the recorded activities
in buffers, each buffer only once every operation it answers has been issued, as on a real GPU.

Synchronizations (``sync=api``, with the C hook): each recorded synchronization that CUPTI
answered is issued through a callback id of its type, lasts its recorded time, and the hook's
own row (:mod:`.syncapi`) answers it instead of the recorded record, as under ``gpu=nvidia``.

Buffers can overflow: with ``max_pending`` set, records that find more than that many
undelivered records ahead of them are dropped and reported with the next buffer, the way CUPTI
reports dropped records.

Two ways to drive it:

- :meth:`SimulatedBackend.replay_thread` (tests): issue one recorded thread's operations, in
  order, optionally through a call-site function per recorded site and a pause hook between
  operations (hypothesis picks interleavings through it); :meth:`SimulatedBackend.replay` does
  that and delivers the activities answering them, at their recorded times (a program under
  ``pyrun -e gpu=simulated`` replaying one rank of a recording of several devices, issue #22);
- :meth:`SimulatedBackend.launch` & co. (``pyrun -e gpu=simulated``, the demo): a program calls
  a simulated runtime; each call issues a new operation and takes the next recorded activity of
  that kind as its answer, shifted to the current time.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.simulated.completion import CompletionQueue
from pyhpctk.measure.gpu.simulated.fine import FineReplay

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pyhpctk.instrument.tracing.recording import TraceRecording
    from pyhpctk.measure.gpu.backend import MonitorPort, NativeHook
    from pyhpctk.measure.gpu.cupti.pcsampling import PcRecording
    from pyhpctk.measure.gpu.cupti.sassmetrics import InstRecording
    from pyhpctk.measure.gpu.simulated.blocks import BlockReplay
    from pyhpctk.measure.gpu.simulated.recording import Recording
    from pyhpctk.measure.gpu.syncapi import ApiSyncs


_DRIVER = 1  # CUPTI_CB_DOMAIN_DRIVER_API: the simulated runtime's calls come as driver calls
_FIRST_CBID = 3000  # + the operation kind: callback ids no CUDA API has
_RESOURCE = 3  # CUPTI_CB_DOMAIN_RESOURCE
_GRAPH_NODE_CREATED, _GRAPH_NODE_CLONED = 13, 20  # CUPTI_CBID_RESOURCE_GRAPHNODE_*
_SYNC_CBID = 3100  # + the sync type (act.SYNC_*): a synchronization the hook times (sync=api)
_SYNC_TYPES = range(act.SYNC_CONTEXT + 1)


class SimulatedBackend:
    """Replays a :class:`Recording` (see the module docstring)."""

    name = "simulated"

    def __init__(
        self,
        recording: Recording,
        buffer_records: int = 0,
        max_pending: int = 0,
        clock: Callable[[], int] = time.time_ns,
        pc: PcRecording | None = None,
        hook: str = "python",
        inst: InstRecording | None = None,
        sync: str = "activity",
        blocks: BlockReplay | None = None,
        traces: TraceRecording | None = None,
    ) -> None:
        self.recording = recording
        self.blocks = blocks  # recorded counters of instrumented kernels (issue #34)
        self.sync = sync  # "api": the C hook times synchronizations (module docstring)
        self.api_syncs: ApiSyncs | None = None
        self._sync_answers: dict[int, np.ndarray] = {}  # correlation → the record CUPTI gave
        self._sync_timed: set[int] = set()  # those the hook has timed
        # "c" / "auto": operations go through the C CUPTI hook (_cuptihook) as under gpu=nvidia,
        # called as CUPTI would call it, with made-up callback ids; "python": monitor.enter().
        self.hook = hook
        self.native: NativeHook | None = None
        self.fine = FineReplay(recording.functions, pc, inst, traces)  # issues #7, #34
        self.completion = CompletionQueue(recording.functions, buffer_records, max_pending)
        self.clock = clock
        self.monitor: MonitorPort | None = None
        self._issued: set[int] = set()
        self._cloned = False  # the recording's graph clones issued (before the first launch)
        self._issued_changed = threading.Condition()
        self._correlation = itertools.count(1 << 31)  # far above recorded ids; CUPTI ids are u32
        self._next_template: dict[int, itertools.cycle[np.ndarray]] = {}
        for kind in np.unique(recording.activities["kind"]).tolist():
            rows = recording.activities[recording.activities["kind"] == kind]
            self._next_template[int(kind)] = itertools.cycle(list(rows))

    @property
    def pc(self) -> PcRecording | None:
        return self.fine.pc

    @property
    def inst(self) -> InstRecording | None:
        return self.fine.inst

    @property
    def dropped(self) -> int:
        """Records dropped because too many were pending (``pending=N``)."""
        return self.completion.dropped

    def limits(self) -> act.DeviceLimits:
        return self.recording.device

    def functions(self) -> list[str]:
        return list(self.recording.functions)

    def take_modules(self) -> list[bytes]:
        """The simulated driver loads its modules at start (``module_loaded``): none later."""
        return []

    def pc_settings(self, period_exponent: int) -> tuple[int, int, int]:
        """A PC recording's own period, clock and SM count; else the asked period."""
        pc = self.pc
        if pc is not None:
            return 1 << int(pc.period_exponent), int(pc.clock_khz), int(pc.sm_count)
        return 1 << period_exponent, 0, 0

    # -- lifecycle --

    def start(self, monitor: MonitorPort, paused: bool = False) -> None:
        """Connect to ``monitor``; ``paused`` holds completed buffers until :meth:`resume`."""
        self.monitor = monitor
        if self.hook != "python":
            self._start_native(monitor)
        self.completion.start(monitor, self.api_syncs)
        if self.blocks is not None:
            self.blocks.start(monitor)
        fine = self.fine.recorded
        if fine is not None:
            for cubin in fine.cubins:  # the simulated driver loads the recorded modules
                monitor.module_loaded(cubin)
        elif self.recording.kernel_module and self.recording.functions:
            # A module holding the recorded kernels, as the driver loads one before a launch:
            # kernels get their (gpubin, entry) node and their names reach the database.
            from pyhpctk.measure.gpu.cubin import synthetic_cubin

            monitor.module_loaded(synthetic_cubin(self.recording.functions))
        if not paused:
            self.resume()

    def _start_native(self, monitor: MonitorPort) -> None:
        from pyhpctk.measure.gpu.cupti.lib import load_hook
        from pyhpctk.measure.gpu.operations import SKIP

        native = load_hook()
        if native is None:
            if self.hook == "c":
                raise OSError("gpu=simulated,hook=c: the C hook _cuptihook is not built")
            return
        entries = [
            (_DRIVER, _FIRST_CBID + kind, kind, int(kind == act.GRAPH), 0)
            for kind in act.KIND_NAMES
            if kind != act.GRAPH_NODE  # made in resource callbacks, as CUPTI reports them
        ]
        entries += [(_DRIVER, _SYNC_CBID + kind, act.SYNC, 0, 0) for kind in _SYNC_TYPES]
        native.configure(
            entries,
            monitor.operation_token,
            None,
            0xFFFFFFFF,
            0xFFFFFFFF,
            SKIP,
            _GRAPH_NODE_CREATED,
            _GRAPH_NODE_CLONED,
        )
        self.native = native
        self._start_syncs(native)
        monitor.attach_hook(native)

    def _start_syncs(self, native: NativeHook) -> None:
        """``sync=api``: the synchronizations' types get callback ids of their own."""
        from pyhpctk.measure.gpu import syncapi

        if not syncapi.timed_at_api(self.sync, True, self.fine.recorded is not None):
            return
        self.api_syncs = syncapi.ApiSyncs(native, self.sync)
        ops, rows = self.recording.operations, self.recording.activities
        synchronizations = ops["correlation"][ops["kind"] == act.SYNC]
        answered = rows[(rows["kind"] == act.SYNC) & np.isin(rows["correlation"], synchronizations)]
        self._sync_answers = {int(row["correlation"]): row for row in answered}
        stream = (act.SYNC_STREAM_WAIT, act.SYNC_STREAM)
        self.api_syncs.configure(
            [(_DRIVER, _SYNC_CBID + k, k, int(k in stream), 0) for k in _SYNC_TYPES]
        )

    def _timed_sync(self, correlation: int, answer: np.ndarray) -> None:
        """A synchronization the hook times: entry, its recorded duration (spun), exit."""
        native = self.native
        assert native is not None
        cbid = _SYNC_CBID + int(answer["sync_kind"])
        context, stream = int(answer["context"]), int(answer["stream"])
        native.invoke(_DRIVER, cbid, 0, correlation, context, b"", stream)
        until = time.perf_counter_ns() + max(int(answer["end"]) - int(answer["start"]), 0)
        while time.perf_counter_ns() < until:
            pass
        native.invoke(_DRIVER, cbid, 1, correlation, context, b"", stream)

    def _issue(self, kind: int, correlation: int) -> None:
        """The runtime API call of one operation, as the monitor sees it."""
        native = self.native
        if kind == act.GRAPH_NODE:  # a node made (captured): ``correlation`` is its id
            if native is not None:
                native.invoke(_RESOURCE, _GRAPH_NODE_CREATED, 0, correlation)
            else:
                assert self.monitor is not None
                self.monitor.graph_node(correlation)
            return
        if kind == act.GRAPH and not self._cloned:  # instantiated before its first launch
            self._issue_clones()
        answer = self._sync_answers.get(correlation) if kind == act.SYNC else None
        if answer is not None and correlation not in self._sync_timed:
            self._sync_timed.add(correlation)  # (recorded twice: CUPTI answered one of them)
            self._timed_sync(correlation, answer)  # sync=api: the hook's row answers it
            return
        if native is not None:
            native.invoke(_DRIVER, _FIRST_CBID + kind, 0, correlation)
            native.invoke(_DRIVER, _FIRST_CBID + kind, 1, correlation)
            return
        monitor = self.monitor
        assert monitor is not None
        monitor.enter(kind, correlation, kind == act.GRAPH)
        monitor.exit()

    def _issue_clones(self) -> None:
        """The recording's graph instantiations: each exec node → the node it copies."""
        self._cloned = True
        native, monitor = self.native, self.monitor
        for node, original in self.recording.clones.items():
            if native is not None:
                native.invoke(_RESOURCE, _GRAPH_NODE_CLONED, 0, node, original)
            elif monitor is not None:
                monitor.graph_node(node, original)

    def resume(self) -> None:
        """Start the completion thread (buffers completed so far are delivered now)."""
        self.completion.resume()

    def flush(self) -> None:
        """Complete the partly filled buffer and hand every completed buffer to the monitor."""
        self.completion.flush()

    def stop(self) -> None:
        """Flush, then end the completion thread (after it delivered everything)."""
        self.completion.flush()
        self.fine.flush(self.monitor)
        self.completion.stop()
        self.native = None  # the monitor drains the hook's last records, then resets it

    # -- replay of a recording (tests) --

    def replay_thread(
        self,
        thread: int,
        sites: Sequence[Callable[[Callable[[], None]], None]] = (),
        pause: Callable[[int], None] | None = None,
    ) -> int:
        """Issue recorded thread ``thread``'s operations on the calling thread; return how many.

        ``sites[site % len(sites)]`` is called with a thunk that issues the operation, so each
        recorded call site gets its own Python calling context. ``pause(i)`` runs before the
        i-th operation (tests use it to force interleavings).
        """
        monitor = self.monitor
        assert monitor is not None
        ops = self.recording.operations[self.recording.operations["thread"] == thread]
        issued = self._issued
        changed = self._issued_changed
        for index, (correlation, kind, site) in enumerate(
            zip(
                ops["correlation"].tolist(), ops["kind"].tolist(), ops["site"].tolist(), strict=True
            )
        ):
            if pause is not None:
                pause(index)

            def issue(correlation: int = correlation, kind: int = kind) -> None:
                self._issue(kind, correlation)

            if sites:
                sites[site % len(sites)](issue)
            else:
                issue()
            with changed:
                issued.add(correlation)
                changed.notify_all()
        return len(ops)

    def replay(
        self, thread: int, sites: Sequence[Callable[[Callable[[], None]], None]] = ()
    ) -> int:
        """Issue recorded thread ``thread``'s operations here, then deliver their activities.

        Only the activities answering those operations are delivered, in their recorded
        buffers and at their recorded times: a process replaying one rank's threads of a
        recording of several devices sees that rank's GPU work alone.
        """
        count = self.replay_thread(thread, sites)
        self.deliver_recorded(threads=(thread,))
        return count

    def deliver_recorded(self, timeout: float = 30.0, threads: Sequence[int] = ()) -> None:
        """Deliver the recorded activities buffer by buffer (the GPU's side of a replay).

        Each buffer waits until every recorded operation it answers has been issued; activities
        whose correlation id no recorded operation has are delivered as they come (the monitor
        counts them as unmatched). With ``threads``, only the activities answering those
        recorded threads' operations are delivered.
        """
        recording = self.recording
        ops = recording.operations
        if threads:
            ops = ops[np.isin(ops["thread"], np.asarray(threads, dtype=ops["thread"].dtype))]
        known = set(ops["correlation"][ops["kind"] != act.GRAPH_NODE].tolist())  # not node ids
        activities = recording.activities
        slices = (
            [slice(i, i + size) for i in range(0, len(activities), size)]
            if (size := self.completion.buffer_records)
            else recording.buffer_slices()
        )
        timed = np.fromiter(self._sync_answers, np.uint64, len(self._sync_answers))
        deadline = time.monotonic() + timeout
        for part in slices:
            rows = activities[part]
            if len(timed):  # sync=api: those the hook answers (the module docstring)
                rows = rows[(rows["kind"] != act.SYNC) | ~np.isin(rows["correlation"], timed)]
            if threads:
                rows = rows[np.isin(rows["correlation"], np.fromiter(known, np.uint64))]
                if not len(rows):
                    continue
            needed = {c for c in rows["correlation"].tolist() if c in known}
            with self._issued_changed:
                while not needed <= self._issued:
                    if not self._issued_changed.wait(max(0.0, deadline - time.monotonic())):
                        raise TimeoutError("replayed operations never issued")
            with self.completion.lock:
                self.completion.deliver(rows.copy())
                self.completion.complete_live()

    # -- a simulated runtime for programs (pyrun -e gpu=simulated) --

    def _operation(self, kind: int, stream: int | None = None) -> int:
        monitor = self.monitor
        assert monitor is not None
        correlation = next(self._correlation)
        if kind == act.SYNC and self.api_syncs is not None:
            self._runtime_sync(correlation, stream)
            return correlation
        native = self.native
        if native is not None:
            native.invoke(_DRIVER, _FIRST_CBID + kind, 0, correlation)
        else:
            monitor.enter(kind, correlation)
        try:
            template = next(self._next_template[kind]) if kind in self._next_template else None
            row = act.empty_activities(1)
            if template is not None:
                row[0] = template
            row["kind"] = kind
            row["correlation"] = correlation
            duration = int(row["end"][0]) - int(row["start"][0])
            now = self.clock()
            row["start"] = now
            row["end"] = now + max(duration, 0)
            if stream is not None:
                row["stream"] = stream
            fine = self.fine.recorded if kind == act.KERNEL else None
            traced = kind == act.KERNEL and self.fine.traces is not None
            if fine is not None:
                row["function"] = self.fine.function
                row["end"] = now + fine.kernels_ns // max(fine.launches, 1)
            counted = self.blocks.next_launch() if self.blocks and kind == act.KERNEL else None
            if counted is not None and self.blocks is not None:
                self.blocks.stamp(row, counted)
            if traced:  # the recorded launch's kernel and duration; its events come with it
                row["function"] = self.fine.function
                row["end"] = now + max(self.fine.trace_span(), 1)
            with self.completion.lock:
                self.completion.deliver(row)
            if fine is not None or traced:
                self.fine.launched(monitor, correlation)
            if counted is not None and self.blocks is not None:
                self.blocks.launched(monitor, correlation, counted)
        finally:
            if native is None:
                monitor.exit()
        return correlation

    def _runtime_sync(self, correlation: int, stream: int | None) -> None:
        """``synchronize()`` with sync=api: as long as the next recorded one, timed by the hook
        (a stream's, or the context's without ``stream``)."""
        template = act.empty_activities(1)
        if act.SYNC in self._next_template:
            template[0] = next(self._next_template[act.SYNC])
        template["sync_kind"] = act.SYNC_CONTEXT if stream is None else act.SYNC_STREAM
        template["stream"] = 0 if stream is None else stream
        self._timed_sync(correlation, template[0])
        with self.completion.lock:
            self.completion.deliver(act.empty_activities())  # the hook's row joins the buffer

    def launch(self, stream: int | None = None) -> int:
        """A kernel launch answered by the next recorded kernel; its correlation id."""
        return self._operation(act.KERNEL, stream)

    def copy(self, stream: int | None = None) -> int:
        return self._operation(act.COPY, stream)

    def memset(self, stream: int | None = None) -> int:
        return self._operation(act.MEMSET, stream)

    def synchronize(self, stream: int | None = None) -> int:
        return self._operation(act.SYNC, stream)
