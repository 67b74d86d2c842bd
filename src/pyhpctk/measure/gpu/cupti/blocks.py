"""``gpu=nvidia,blocks``: kernels instrumented at load time, each launch's counters read after it
(issue #34, items 3 and 5).

At start the framework hooks (:mod:`pyhpctk.instrument.frameworks`: Triton, CuPy, Numba) are
installed in the measured process; every module they instrument is announced to the monitor
as it loads (:meth:`~.backend.MonitorPort.instrumented_module`). At the exit of every kernel
launch (the callback subscriber sees it: "fine" mode, :mod:`.fine`) the reader waits for the
GPU (``cuCtxSynchronize``), reads the counter arrays of the loaded instrumented kernels, hands
the one that ran to the monitor with the launch's correlation id and zeroes it: exact
per-launch counts, placed under the line that launched the kernel. The launch needs no name:
after a synchronized read and reset, only the kernel that just ran has counts.

Its own CUDA calls are the backend's (``FineCounting.busy``): their activities are left out.
Launches before ``launch-skip=`` are read and zeroed, not counted; after the window
(``launch-count=``) nothing is read (no synchronization). The cost of a counted launch is a
synchronization and two small copies per loaded instrumented kernel: choose kernels with
``kernel-name=`` where many are loaded. Nothing here raises into CUPTI.
"""

from __future__ import annotations

from pyhpctk.measure.gpu.kernel_filter import KernelFilter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from pyhpctk.instrument.frameworks import Collector, Framework, LoadedModule
    from pyhpctk.measure.gpu.backend import MonitorPort


class BlockReader:
    """The hooks and the per-launch reads of one process (see the module docstring)."""

    def __init__(self, mode: str, kernels: KernelFilter | None = None) -> None:
        self.mode = mode  # the PTX pass's Mode value: "edges" or "blocks"
        self.filter = kernels or KernelFilter()
        self.collector: Collector | None = None
        self.hooks: list[Framework] = []
        self.monitor: MonitorPort | None = None
        self.index = 0  # launches of instrumented kernels read so far (the filter's index)
        self.lines: list[str] = []  # said at stop
        self.synchronize: Callable[[], None] = _synchronize

    def start(
        self, monitor: MonitorPort, frameworks: dict[str, type[Framework]] | None = None
    ) -> None:
        """Install every hook whose framework is here (a version never tested: one line)."""
        from pyhpctk.instrument.frameworks import FRAMEWORKS, FrameworkError, installed_version

        self.monitor = monitor
        self.collector = self.new_collector()
        self.collector.listener = self._loaded
        for name, kind in (frameworks or FRAMEWORKS).items():
            hook = kind()
            if not any(installed_version(d) for d in hook.distributions):
                continue  # not installed: nothing of it can run
            try:
                hook.install(self.collector)
            except FrameworkError as error:
                self.say(str(error))
            except Exception as error:  # a hook point that moved: the program still runs
                self.say(f"{name}: its hook failed to install ({error!r}); not counted")
            else:
                self.hooks.append(hook)

    def new_collector(self) -> Collector:
        """What the hooks feed: counters in ``self.mode``, kernels the filter names, a loop's
        counters in registers (added to the buffer where threads exit): on the H100 the
        Triton set's median kernel time was 1.07x plain with them, 4.31x with an atomic per
        warp on every trip (benchmarks/RESULTS.md)."""
        from pyhpctk.instrument.frameworks import Collector
        from pyhpctk.instrument.ptx import Mode

        return Collector(Mode(self.mode), self.filter.pattern, registers=True)

    def kernel_starting(self) -> None:
        """A launch's API call is entered (its kernel not yet queued): nothing to do here."""

    def _loaded(self, module: LoadedModule) -> None:
        """Told by the collector, inside the framework's load: nothing may raise into it."""
        if self.monitor is not None:
            try:
                self.monitor.instrumented_module(module.instrumented)
            except Exception as error:
                self.say(f"{module.framework}: a module's kernels not counted ({error!r})")

    def kernel_ended(self, correlation: int) -> None:
        """A launch's API call returned (on the launching thread, inside CUPTI's callback)."""
        collector, monitor = self.collector, self.monitor
        if collector is None or monitor is None or not collector.loaded_modules:
            return
        if self.filter.finished(self.index):
            return
        try:
            self.synchronize()
            ran = self._ran(collector)
        except Exception as error:
            self.say(f"reading counters failed ({error}); later launches are not counted")
            self.index = 1 << 62
            return
        if not ran:
            return  # no instrumented kernel ran: another kernel's launch
        index = self.index
        self.index += 1
        if len(ran) > 1:
            self.say(
                f"{len(ran)} instrumented kernels ran between two reads (launches from several "
                "threads at once?): their counts were left out"
            )
            return
        module, kernel, counters = ran[0]
        if self.filter.counted(index):
            try:
                monitor.block_counts(correlation, module.instrumented, kernel, counters)
            except Exception as error:  # never into CUPTI's callback
                self.say(f"{kernel}: a launch's counts were lost ({error!r})")

    @staticmethod
    def _ran(collector: Collector) -> list[tuple[LoadedModule, str, np.ndarray]]:
        """The kernels with counts since the last read (their modules then zeroed)."""
        ran = []
        for module in list(collector.loaded_modules):
            found = False
            for kernel in module.kernels:
                counters = module.counters(kernel)
                if counters.any():
                    ran.append((module, kernel, counters.copy()))
                    found = True
            if found:
                module.reset()
        return ran

    def uninstall(self) -> None:
        """Every hook uninstalled (a failure said, the others still uninstalled)."""
        for hook in reversed(self.hooks):
            try:
                hook.uninstall()
            except Exception as error:
                self.say(f"{hook.name}: uninstalling its hook failed ({error!r})")
        self.hooks.clear()

    def stop(self) -> None:
        """Uninstall the hooks; say what was not instrumented, and why."""
        self.uninstall()
        monitor, collector = self.monitor, self.collector
        if monitor is not None and collector is not None:
            for skip in collector.skips:
                monitor.instrumentation_skipped(skip.what, f"{skip.framework}: {skip.reason}")
        for line in self.lines:
            if monitor is not None:
                monitor.instrumentation_skipped("", line)

    def say(self, text: str) -> None:
        if text not in self.lines:
            self.lines.append(text)


def _synchronize() -> None:
    from pyhpctk.instrument.frameworks.driver import synchronize

    synchronize()
