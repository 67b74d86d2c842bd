"""Fine-grained GPU measurement under CUPTI: PC sampling and instruction counts (issue #7).

One :class:`FineCounting` per backend owns the PC samplers (:mod:`.pcsampling`) and the SASS
counters (:mod:`.sassmetrics`) of each CUDA context: the callback subscriber
(:mod:`.callbacks`) tells it where contexts appear, kernels end and the program's profiler
starts; it reads samples and counts there and hands them to the monitor. Its own CUDA calls
(a counter's synchronize) are marked :attr:`FineCounting.busy` so the callbacks leave them out.

Nothing here raises into CUPTI: a failure is said once, in the monitor's errors.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

from pyhpctk.measure.gpu.cupti.lib import loaded_library

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.gpu.backend import MonitorPort
    from pyhpctk.measure.gpu.cupti.blocks import BlockReader
    from pyhpctk.measure.gpu.cupti.pcsampling import PcSampler
    from pyhpctk.measure.gpu.cupti.sassmetrics import SassCounter


class FineCounting:
    """PC samplers and instruction counters per CUDA context (see the module docstring)."""

    def __init__(
        self,
        pc_period: int = 0,
        pc_mode: str = "serialized",
        inst: bool = False,
        blocks: BlockReader | None = None,
    ):
        self.pc_period = pc_period  # PC sampling period exponent (2^N cycles); 0 = off
        self.pc_mode = pc_mode
        self.inst = inst  # exact instruction counts (cuptiSassMetrics*)
        self.blocks = blocks  # instrumented kernels' counters, read at each launch (issue #34)
        self.pc_samplers: dict[int, PcSampler] = {}  # CUcontext → pcsampling.PcSampler
        self.inst_counters: dict[int, SassCounter] = {}  # CUcontext → sassmetrics.SassCounter
        self.inst_launches: dict[int, int] = {}  # CUcontext → kernel launches while counting
        self._inst_first: dict[int, int] = {}  # CUcontext → the counted window's first launch
        self.errors: list[str] = []
        self._busy = threading.local()  # inside a counter's own CUDA calls
        self.monitor: MonitorPort | None = None

    @property
    def on(self) -> bool:
        """PC sampling, instruction or block counting: every API call is seen in Python."""
        return bool(self.pc_period or self.inst or self.blocks)

    @property
    def busy(self) -> bool:
        """The calling thread is inside a CUDA call of the samplers or counters themselves."""
        return bool(getattr(self._busy, "on", False))

    def start(self, monitor: MonitorPort) -> None:
        self.monitor = monitor
        if self.blocks is not None:  # the framework hooks, before any kernel is compiled
            self.blocks.start(monitor)

    def context_seen(self, context: int) -> None:
        """A CUDA context the program uses: PC sampling starts on it (once)."""
        if self.pc_period and context not in self.pc_samplers:
            self._pc_enable(context)

    def profiler_started(self, context: int) -> None:
        """At the exit of the program's first cu/cudaProfilerStart: counting starts (once)."""
        if not context:
            cuda = ctypes.CDLL("libcuda.so.1")
            current = ctypes.c_void_p(0)
            if cuda.cuCtxGetCurrent(ctypes.byref(current)) == 0:
                context = int(current.value or 0)
        if context and not self.inst_counters:
            self._inst_enable(context)

    def kernel_starting(self) -> None:
        """A kernel launch's API call is entered: traced kernels get their buffers (#34)."""
        if self.blocks is not None:
            self._busy.on = True  # its copies are ours: left out
            try:
                self.blocks.kernel_starting()
            finally:
                self._busy.on = False

    def kernel_ended(self, context: int, correlation: int) -> None:
        """A kernel launch's API call returned: its PC samples are read, its launch counted."""
        if self.pc_period:
            self._pc_collect(context)
        if self.inst and context in self.inst_counters:
            self._inst_first.setdefault(context, correlation)
            self.inst_launches[context] = self.inst_launches.get(context, 0) + 1
        if self.blocks is not None:
            self._busy.on = True  # its synchronize and copies are ours: left out
            try:
                self.blocks.kernel_ended(correlation)
            finally:
                self._busy.on = False

    def finish(self) -> None:
        """The last samples and the counting window's totals to the monitor; counters freed;
        the framework hooks uninstalled."""
        if self.blocks is not None:
            self.blocks.stop()
        for context in list(self.pc_samplers):
            self._pc_collect(context, final=True)
        for context in list(self.inst_counters):
            self._inst_collect(context)
        if self.inst and not self.inst_counters:
            self.error(
                "pyrun: gpu: instruction counts: none — counting starts when the program calls"
                " cudaProfilerStart() (cupy.cuda.runtime.profilerStart(),"
                " torch.cuda.profiler.start()) right before the kernel to count (docs/gpu.md)"
            )
        released: set[int] = set()
        for counter in self.inst_counters.values():
            device = int(counter.device)
            if device not in released:
                released.add(device)
                with contextlib.suppress(Exception):
                    counter.release()

    # -- instruction counts --

    def _inst_enable(self, context: int) -> None:
        """Start counting on ``context``: at the exit of the program's profiler start (once).

        CUPTI counts only the first device work after SetConfig — which must be a kernel, in
        an enabled window — and nothing when that is a memset or a kernel launched before
        Enable; enabling inside the launch's own API callback gave records with zero counts
        on the H200 (``sassmetrics``' docstring). So the program says where: the kernel it
        launches next after ``cudaProfilerStart()`` is counted, with its later launches.
        """
        from pyhpctk.measure.gpu.cupti.sassmetrics import SassCounter

        path = loaded_library("libcupti")
        counter = SassCounter(ctypes.CDLL(path or "libcupti.so"), context, _device_of(context))
        self.inst_counters[context] = counter
        self._busy.on = True
        try:
            counter.synchronize()
            counter.enable()
        except Exception as error:
            self.error(f"pyrun: gpu: instruction counting unavailable: {error}")
            counter.enabled = False
        finally:
            self._busy.on = False

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
        self._busy.on = True
        try:
            counter.synchronize()
            batch = counter.disable(correlation)
        except Exception as error:
            self.error(f"pyrun: gpu: reading instruction counts failed: {error}")
            return
        finally:
            self._busy.on = False
        if len(batch.rows):
            monitor.inst_counts(batch.rows, batch.functions, self.inst_launches.get(context, 0))

    # -- PC sampling --

    def _pc_enable(self, context: int) -> None:
        """Start kernel-serialized PC sampling on ``context`` (once per context)."""
        if not context or context in self.pc_samplers:
            return
        from pyhpctk.measure.gpu.cupti.pcsampling import PcSampler

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
            self.error(f"pyrun: gpu: PC sampling unavailable: {error}")
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
            self.error(f"pyrun: gpu: reading PC samples failed: {error}")
            return
        if len(batch.rows) or batch.dropped_samples:
            monitor.pc_samples(
                batch.rows,
                batch.functions,
                sampler.reasons,
                batch.dropped_samples,
            )

    def error(self, text: str) -> None:
        """Say ``text`` once, in the monitor's errors."""
        if text not in self.errors:
            self.errors.append(text)
            if self.monitor is not None:
                self.monitor.errors.append(text)


def _device_of(context: int) -> int:
    """The device ordinal of ``context`` (cuCtxGetDevice on the current context; 0)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        device = ctypes.c_int(0)
        if cuda.cuCtxGetDevice(ctypes.byref(device)) == 0:
            return int(device.value)
    except OSError:
        pass
    return 0


def clock_khz() -> int:
    """The SM clock of device 0 in kHz (CU_DEVICE_ATTRIBUTE_CLOCK_RATE), 0 if unknown."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        value = ctypes.c_int(0)
        if cuda.cuDeviceGetAttribute(ctypes.byref(value), 13, 0) != 0:
            return 0
        return int(value.value)
    except OSError:
        return 0
