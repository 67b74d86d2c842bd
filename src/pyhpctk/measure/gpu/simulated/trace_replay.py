"""A chunk-strategy trace recording replayed through pyrun's own launch reader (issue #34).

``gpu=simulated,traces=FILE`` with a recording of the ``chunks`` strategy at block sites (what
``gpu=nvidia,trace`` records) runs each simulated kernel launch through
:class:`~pyhpctk.measure.gpu.cupti.warp_reader.TraceReader`, as a GPU launch under
``gpu=nvidia,trace`` would: the recording's PTX is traced by the reader's collector and loaded
into a device of numpy (:class:`~pyhpctk.instrument.tracing.memory.HostMemory`); at the
launch's entry the reader arms its control block; then "the GPU" leaves the recorded launch's
chunks in the pool and its cursor and lost count in the control block; at the exit the reader
reads, decodes and sends them. So the reader, its pool and its control words are what the
recordings of a real GPU test in CI.
"""

from __future__ import annotations

import numpy as np

from pyhpctk.instrument.ptx import CONTROL, EVENT_DTYPE, Sites, Strategy, TracedModule
from pyhpctk.instrument.tracing.buffers import DEFAULT_CHUNK_EVENTS
from pyhpctk.instrument.tracing.memory import HostMemory
from pyhpctk.measure.gpu.cupti.warp_reader import TraceReader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.instrument.tracing.recording import TraceRecording
    from pyhpctk.measure.gpu.backend import MonitorPort


def replayable(recording: TraceRecording) -> bool:
    """What pyrun's reader records: chunks of the default size at every block's head."""
    return (
        recording.strategy is Strategy.CHUNKS
        and recording.sites is Sites.BLOCKS
        and all(t.chunk_events == DEFAULT_CHUNK_EVENTS for t in recording.launches)
    )


class ChunkReplay:
    """The recording's launches, one a simulated launch, through a :class:`TraceReader`."""

    def __init__(self, recording: TraceRecording) -> None:
        self.recording = recording
        self.memory = HostMemory()
        chunk = DEFAULT_CHUNK_EVENTS * EVENT_DTYPE.itemsize
        largest = max((t.raw.size for t in recording.launches), default=0)
        self.reader = TraceReader(largest + chunk, memory=self.memory)
        self.launches = 0
        self.control = 0

    def _start(self, monitor: MonitorPort) -> None:
        """The reader started with no framework; the recording's module loaded into it."""
        reader = self.reader
        reader.start(monitor, frameworks={})
        assert reader.collector is not None
        traced = reader.collector.rewrite("simulated", self.recording.ptx)
        if not isinstance(traced, TracedModule):
            raise ValueError(f"{self.recording.kernel}: the recording's PTX has no kernel")
        symbols: dict[str, int] = {}

        def locate(symbol: str) -> int:
            if symbol not in symbols:  # a module's .global, zeroed when it loads
                symbols[symbol] = self.memory.alloc(8 * len(CONTROL))
            return symbols[symbol]

        def read(symbol: str, nbytes: int) -> np.ndarray:
            return self.memory.read(locate(symbol), nbytes)

        def zero(symbol: str, nbytes: int) -> None:
            self.memory.zero(locate(symbol), nbytes)

        reader.collector.loaded("simulated", traced, read, zero, locate)
        self.control = locate(traced.plans[self.recording.kernel].control)

    def launched(self, monitor: MonitorPort, correlation: int) -> None:
        """One simulated launch: entry (armed), the recorded chunks written, exit (read)."""
        if self.reader.monitor is None:
            self._start(monitor)
        trace = self.recording.launches[self.launches % len(self.recording.launches)]
        self.launches += 1
        self.reader.kernel_starting()
        memory = self.memory
        if trace.raw.size:
            memory.write(self.reader.pool_at, trace.raw)
        words = memory.read(self.control, 8 * len(CONTROL)).view(np.uint64).copy()
        words[CONTROL.NEXT_CHUNK] = trace.taken
        words[CONTROL.LOST] = trace.lost
        memory.write(self.control, words)
        self.reader.kernel_ended(correlation)

    def stop(self) -> None:
        if self.reader.monitor is not None:
            self.reader.stop()
