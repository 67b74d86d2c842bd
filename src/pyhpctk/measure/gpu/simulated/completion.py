"""The simulated runtime's activity buffers and its completion thread (CUPTI's, simulated).

Records join a live buffer; a full buffer (``buffer_records``) or a flush completes it, and the
completion thread hands completed buffers to the monitor, CUPTI's lock held while it delivers,
as CUPTI's buffer thread does. With ``max_pending`` set, records that find more than that many
undelivered records ahead of them are dropped and reported with the next buffer.
"""

from __future__ import annotations

import _thread
import collections
import threading

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.thread_names import name_own_thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.backend import MonitorPort
    from pyhpctk.measure.gpu.syncapi import ApiSyncs


class CompletionQueue:
    """Live and completed buffers, and the thread that delivers them (module docstring)."""

    def __init__(self, functions: list[str], buffer_records: int = 0, max_pending: int = 0):
        self.functions = functions  # the recording's kernel names, as delivered with each buffer
        self.buffer_records = buffer_records  # 0: the caller completes buffers
        self.max_pending = max_pending  # 0: never drop
        self.dropped = 0
        self.api_syncs: ApiSyncs | None = None  # sync=api: the hook's rows join each buffer
        self.monitor: MonitorPort | None = None
        self.lock = threading.Lock()  # the simulated driver's own lock (like CUDA's)
        #: CUPTI's lock: held by the buffer thread while it delivers, taken by flush().
        self._cupti_lock = threading.Lock()
        self._queue: collections.deque[tuple[np.ndarray, int]] = collections.deque()
        self._live: list[np.ndarray] = []
        self._live_count = 0
        self._lost = 0
        self._worker: threading.Event | None = None
        self._stop = False
        self._wake = threading.Semaphore(0)

    def start(self, monitor: MonitorPort, api_syncs: ApiSyncs | None) -> None:
        self.monitor, self.api_syncs = monitor, api_syncs
        self._stop = False

    def resume(self) -> None:
        """Start the completion thread (buffers completed so far are delivered now)."""
        if self._worker is not None:
            return
        # A raw thread, like CUPTI's own: the program's threading.enumerate() never lists it.
        self._worker = threading.Event()  # set when the completion thread has ended
        _thread.start_new_thread(self._completion_main, (self._worker,))

    def _completion_main(self, ended: threading.Event) -> None:
        """The simulated runtime's buffer thread: deliver queued buffers to the monitor."""
        name_own_thread("pyrun-gpusim")
        monitor = self.monitor
        assert monitor is not None
        try:
            monitor.exclude_current_thread()
            while True:
                self._wake.acquire()
                with self._cupti_lock:  # as CUPTI's thread: its lock held while it delivers
                    self._deliver_queued(monitor)
                if self._stop and not self._queue:
                    return
        finally:
            ended.set()

    def flush(self) -> None:
        """Complete the partly filled buffer and hand every completed buffer to the monitor."""
        with self.lock:
            if self.api_syncs is not None:  # synchronizations timed since the last buffer
                self.deliver(act.empty_activities())
            self.complete_live()
        self.resume()
        monitor = self.monitor
        if monitor is None or self._worker is None:
            return
        # As cuptiActivityFlushAll: take the buffer thread's lock, deliver what is pending.
        with self._cupti_lock:
            self._deliver_queued(monitor)

    def _deliver_queued(self, monitor: MonitorPort) -> None:
        while self._queue:
            try:
                records, dropped = self._queue.popleft()
            except IndexError:  # the other deliverer took the last one
                return
            monitor.buffer_completed(records, self.functions, dropped)

    def stop(self) -> None:
        """End the completion thread (after it delivered everything)."""
        self._stop = True
        self._wake.release()
        if self._worker is not None:
            self._worker.wait(5.0)
            self._worker = None

    def deliver(self, records: np.ndarray) -> None:
        """Append records to the live buffer (call with :attr:`lock`); complete it when full."""
        if self.api_syncs is not None:  # the hook's rows join the buffer, as CUPTI's came
            records = self.api_syncs.joined(records)
        if self.max_pending and self._pending_records() + len(records) > self.max_pending:
            room = max(0, self.max_pending - self._pending_records())
            self._lost += len(records) - room
            self.dropped += len(records) - room
            records = records[:room]
        if len(records):
            self._live.append(records)
            self._live_count += len(records)
        if self.buffer_records and self._live_count >= self.buffer_records:
            self.complete_live()

    def _pending_records(self) -> int:
        return self._live_count + sum(len(records) for records, _ in self._queue)

    def complete_live(self) -> None:
        """The live buffer is complete: queue it for the completion thread."""
        if not self._live and not self._lost:
            return
        records = np.concatenate(self._live) if self._live else act.empty_activities()
        self._queue.append((records, self._lost))
        self._live, self._live_count, self._lost = [], 0, 0
        self._wake.release()
