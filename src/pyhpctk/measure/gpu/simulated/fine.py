"""Replayed PC samples, instruction counts and warp traces of the simulated runtime (issues #7
and #34).

Each simulated kernel launch takes the next recorded launch's PC samples (sent to the monitor at
once) or instruction counts (summed over the counting window and sent once at the end, as the
first launch's, the way CUPTI's SASS metrics come: ``sassmetrics``' docstring). With a warp
trace recording (``traces=FILE``, :mod:`pyhpctk.instrument.tracing.recording`), each launch is
the recorded kernel's, as long as the next recorded launch's events span, and its raw buffer is
decoded and sent with it, as a traced launch on a GPU would be: a chunk recording at block sites
(what ``gpu=nvidia,trace`` records) through pyrun's own launch reader (:mod:`.trace_replay`).
"""

from __future__ import annotations

import numpy as np

from pyhpctk.measure.gpu.simulated.trace_replay import ChunkReplay, replayable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.instrument.ptx.traces import TracePlan
    from pyhpctk.instrument.tracing.decode import WarpEvents
    from pyhpctk.instrument.tracing.recording import TraceRecording
    from pyhpctk.measure.gpu.backend import MonitorPort
    from pyhpctk.measure.gpu.cupti.pcsampling import PcRecording
    from pyhpctk.measure.gpu.cupti.sassmetrics import InstRecording


class FineReplay:
    """The PC samples or counts replayed with each simulated kernel launch."""

    def __init__(
        self,
        functions: list[str],
        pc: PcRecording | None,
        inst: InstRecording | None,
        traces: TraceRecording | None = None,
    ) -> None:
        self.pc = pc
        self.inst = inst
        self.traces = traces
        self.function = -1  # launches are the recorded kernel's (index in ``functions``)
        recorded = pc or inst or traces
        if recorded is not None:
            if recorded.kernel not in functions:
                functions.append(recorded.kernel)
            self.function = functions.index(recorded.kernel)
        self._plan: TracePlan | None = traces.plan() if traces is not None else None
        self._reader: ChunkReplay | None = None  # chunk recordings: through pyrun's reader
        if traces is not None and replayable(traces):
            self._reader = ChunkReplay(traces)
        self._decoded: list[WarpEvents] = [t.decode() for t in traces.launches] if traces else []
        self._trace_launch = 0
        self._pc_launch = 0
        self._inst_launch = 0
        self._inst_rows: list[np.ndarray] = []  # the counting window's launches (CUPTI's way)
        self._inst_first = 0

    @property
    def recorded(self) -> PcRecording | InstRecording | None:
        return self.pc or self.inst

    def trace_span(self) -> int:
        """How long (ns) the next replayed traced launch runs: its events' span (0: none)."""
        if not self._decoded:
            return 0
        rows = self._decoded[self._trace_launch % len(self._decoded)].rows
        return int(rows["time"].max() - rows["time"].min()) if len(rows) else 0

    def launched(self, monitor: MonitorPort, correlation: int) -> None:
        """A simulated kernel launch: its samples to the monitor, its counts to the window,
        its warp trace to the monitor."""
        if self._reader is not None:
            self._trace_launch += 1
            self._reader.launched(monitor, correlation)
        elif self._decoded and self._plan is not None:
            events = self._decoded[self._trace_launch % len(self._decoded)]
            self._trace_launch += 1
            monitor.warp_trace(correlation, self._plan, events)
        if self.pc is not None:
            self._replay_pc(monitor, self.pc, correlation)
        if self.inst is not None:
            self._replay_inst(self.inst, correlation)

    def _replay_pc(self, monitor: MonitorPort, pc: PcRecording, correlation: int) -> None:
        """The recorded samples of the next recorded launch, as this launch's (issue #7)."""
        groups = pc.launch_groups()
        if not groups:
            return
        rows = groups[self._pc_launch % len(groups)].copy()
        self._pc_launch += 1
        rows["correlation"] = correlation
        dropped = pc.dropped_samples // max(len(groups), 1)
        monitor.pc_samples(rows, pc.functions, pc.reasons, dropped)

    def _replay_inst(self, inst: InstRecording, correlation: int) -> None:
        """The recorded counts of the next recorded launch join the counting window (#7).

        As CUPTI does (``sassmetrics``' docstring), the counts add up over the launches and
        reach the monitor once, at :meth:`flush`, as the first launch's.
        """
        groups = inst.launch_groups()
        if not groups:
            return
        if not self._inst_rows:
            self._inst_first = correlation
        self._inst_rows.append(groups[self._inst_launch % len(groups)])
        self._inst_launch += 1

    def flush(self, monitor: MonitorPort | None) -> None:
        """The counting window's totals to the monitor (once, at the end)."""
        from pyhpctk.measure.gpu.cupti.sassmetrics import summed_rows

        if self._reader is not None:
            self._reader.stop()  # what the reader has to say, to the summary
        inst, parts = self.inst, self._inst_rows
        if monitor is None or inst is None or not parts:
            return
        self._inst_rows = []
        rows = summed_rows(np.concatenate(parts))
        rows["correlation"] = self._inst_first
        monitor.inst_counts(rows, inst.functions, len(parts))
