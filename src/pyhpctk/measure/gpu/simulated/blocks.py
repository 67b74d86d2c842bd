"""Replayed block counters of the simulated runtime (``gpu=simulated,blocks=RECORDING``, #34).

At start the simulated driver "loads" the recording's instrumented modules (the monitor names
their kernels by their PTX from then on); each simulated kernel launch runs the next recorded
launch: its activity names the recorded kernel (and lasts its recorded time), and, once the
activity is delivered, its counters go to the monitor as that launch's. The kernel filter of
``kernel-name=``, ``launch-skip=``, ``launch-count=`` chooses what is counted, as on a GPU.
"""

from __future__ import annotations

from pyhpctk.measure.gpu.kernel_filter import KernelFilter

TYPE_CHECKING = False
if TYPE_CHECKING:
    import numpy as np

    from pyhpctk.measure.gpu.backend import MonitorPort
    from pyhpctk.measure.gpu.simulated.block_recording import BlockRecording, RecordedLaunch


class BlockReplay:
    """The recorded launches, replayed one per simulated kernel launch."""

    def __init__(
        self, recording: BlockRecording, functions: list[str], kernels: KernelFilter | None = None
    ) -> None:
        self.recording = recording
        self.filter = kernels or KernelFilter()
        recording.instrument(self.filter.pattern)
        self.functions = functions  # the completion queue's names: launches name their kernel
        for launch in recording.launches:
            if launch.kernel not in functions:
                functions.append(launch.kernel)
        self._next = 0
        self._counted = 0  # launches of instrumented kernels so far (the filter's index)

    def start(self, monitor: MonitorPort) -> None:
        """The driver loads the instrumented modules (before any launch)."""
        from pyhpctk.instrument.frameworks.base import LEFT_OUT

        for module, done in zip(self.recording.modules, self.recording.instrumented, strict=True):
            if done is not None:
                monitor.instrumented_module(done)
            for kernel in module.kernels:
                if done is None or kernel not in done.plans:
                    reason = f"{module.framework}: {LEFT_OUT.format(self.filter.regex)}"
                    monitor.instrumentation_skipped(kernel, reason)

    def next_launch(self) -> RecordedLaunch | None:
        """The recorded launch the next simulated launch runs (cycling), None without any."""
        launches = self.recording.launches
        if not launches:
            return None
        launch = launches[self._next % len(launches)]
        self._next += 1
        return launch

    def stamp(self, row: np.ndarray, launch: RecordedLaunch) -> None:
        """The launch's activity row names its kernel and lasts its recorded time."""
        row["function"] = self.functions.index(launch.kernel)
        if launch.ns:
            row["end"] = row["start"] + launch.ns
        row["block_threads"] = launch.threads or row["block_threads"]
        row["registers"] = launch.registers  # the instrumented kernel's, if recorded

    def launched(self, monitor: MonitorPort, correlation: int, launch: RecordedLaunch) -> None:
        """Launch ``correlation`` finished: its counters to the monitor, if the filter counts it."""
        done = self.recording.instrumented[launch.module]
        if done is None or launch.kernel not in done.plans:
            return  # a kernel -k leaves out runs uninstrumented
        index = self._counted
        self._counted += 1
        if self.filter.counted(index):
            monitor.block_counts(correlation, done, launch.kernel, launch.counters)
