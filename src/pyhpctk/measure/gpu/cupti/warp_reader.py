"""``gpu=nvidia,trace``: per-warp traces of the kernels the framework hooks load, around each of
the program's own launches (issue #34, item 4).

The hooks (:mod:`pyhpctk.instrument.frameworks`) trace every kernel they reach
(:func:`~pyhpctk.instrument.ptx.instrument_traces`, the ``chunks`` strategy, a site at every
block's head): the kernel's signature is unchanged, its control block is a module ``.global``.
One pool of chunks (the cap's bytes) serves every traced kernel of the process:

- at a launch's entry (:meth:`TraceReader.kernel_starting`) every traced kernel loaded since the
  last launch is *armed*: its control block points at the pool, its cursor at chunk 0;
- at the launch's exit (:meth:`TraceReader.kernel_ended`) the reader waits for the GPU, reads
  the armed control blocks: the one whose cursor moved ran (only the kernel just launched can
  have run since the last wait). Its chunks are read, decoded and handed to the monitor with
  the launch's correlation id (:meth:`~.backend.MonitorPort.warp_trace`); the chunks are zeroed
  and its control block re-armed.

The exact strategy (two passes, the memory saved between them) relaunches the kernel, which a
launch callback cannot do: it stays with :mod:`pyhpctk.instrument.tracing`'s launcher, from
Python. Its own CUDA calls are the backend's (``FineCounting.busy``); nothing here raises into
CUPTI.
"""

from __future__ import annotations

import sys

from pyhpctk.measure.gpu.cupti.blocks import BlockReader
from pyhpctk.measure.gpu.kernel_filter import KernelFilter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.instrument.frameworks import Collector, LoadedModule
    from pyhpctk.instrument.ptx import TracePlan
    from pyhpctk.instrument.tracing.buffers import ChunkPool
    from pyhpctk.instrument.tracing.decode import WarpEvents
    from pyhpctk.instrument.tracing.memory import DeviceMemory

#: Why ``trace=exact`` is refused under pyrun (docs/gpu.md, "Per-warp traces").
EXACT_REFUSED = (
    "gpu=nvidia: trace=exact runs each launch twice (a counting pass, then the traced one), "
    "which pyrun cannot do from the program's own launch: say trace (chunks), or trace exactly "
    "from Python with pyhpctk.instrument.tracing (docs/gpu.md, 'Per-warp traces')"
)


class TraceReader(BlockReader):
    """The hooks in trace mode and the pool around each launch (the module docstring)."""

    def __init__(
        self,
        cap_bytes: int,
        kernels: KernelFilter | None = None,
        memory: DeviceMemory | None = None,
    ) -> None:
        super().__init__("edges", kernels)
        self.cap_bytes = cap_bytes
        self.memory = memory
        self.pool: ChunkPool | None = None
        self.pool_at = 0  # device address of the pool
        self.waiting: list[LoadedModule] = []  # loaded, not yet armed
        self.armed: list[tuple[TracePlan, int]] = []  # (plan, control block address)
        self.traced = 0  # launches whose events reached the monitor
        self.device = 0

    def new_collector(self) -> Collector:
        from pyhpctk.instrument.frameworks import Collector
        from pyhpctk.instrument.ptx import Strategy

        return Collector(kernels=self.filter.pattern, traces=Strategy.CHUNKS)

    def _loaded(self, module: LoadedModule) -> None:
        """Told inside the framework's load (no CUDA call of ours there): armed at the next
        launch's entry."""
        self.waiting.append(module)

    def _device_memory(self) -> DeviceMemory:
        if self.memory is None:
            from pyhpctk.instrument.tracing.memory import CudaMemory

            self.memory = CudaMemory()
        return self.memory

    def _arm(self, control: int, off: bool = False) -> None:
        """Point ``control`` at the pool (its cursor at chunk 0), or at no chunk (``off``: every
        event is only counted as lost, nothing written)."""
        from pyhpctk.instrument.ptx import Strategy
        from pyhpctk.instrument.tracing.buffers import control_words

        pool = self.pool
        if off or pool is None:
            words = control_words(Strategy.CHUNKS)
        else:
            words = control_words(Strategy.CHUNKS, self.pool_at, chunk_events=pool.chunk_events,
                                  chunks=pool.chunks)  # fmt: skip
        self._device_memory().write(control, words)

    def kernel_starting(self) -> None:
        """Arm the kernels loaded since the last launch (the pool made at the first)."""
        if not self.waiting:
            return
        try:
            memory = self._device_memory()
            if self.pool is None:
                from pyhpctk.instrument.tracing.buffers import ChunkPool

                pool = ChunkPool.for_bytes(self.cap_bytes)
                self.pool_at = memory.alloc(pool.nbytes)
                memory.zero(self.pool_at, pool.nbytes)
                self.pool = pool
            while self.waiting:
                module = self.waiting.pop(0)
                traced = module.traced
                if traced is None or module.locate is None:
                    continue
                for kernel in module.kernels:
                    plan = traced.plans[kernel]
                    control = module.locate(plan.control)
                    self._arm(control)
                    self.armed.append((plan, control))
        except Exception as error:
            self.say(f"arming the trace buffers failed ({error}); later launches are not traced")
            self.waiting.clear()
            self.armed.clear()

    def kernel_ended(self, correlation: int) -> None:
        """A launch returned: the kernel whose cursor moved ran; its events to the monitor."""
        if not self.armed or self.monitor is None or self.filter.finished(self.index):
            return
        try:
            self._device_memory().synchronize()
            ran = self._ran_traced()
        except Exception as error:
            self.say(f"reading trace buffers failed ({error}); later launches are not traced")
            self.armed.clear()
            return
        if not ran:
            return
        index = self.index
        self.index += 1
        if len(ran) > 1:
            self.say(f"{len(ran)} traced kernels ran between two reads (launches from several "
                     "threads at once?): their traces were left out")  # fmt: skip
            return
        plan, events = ran[0]
        if self.filter.counted(index):
            try:
                self.monitor.warp_trace(correlation, plan, events, self.device)
                self.traced += 1
            except Exception as error:  # never into CUPTI's callback
                self.say(f"{plan.kernel}: a launch's warp trace was lost ({error!r})")

    def _ran_traced(self) -> list[tuple[TracePlan, WarpEvents]]:
        """Each armed kernel that ran since the last read, its events decoded; its chunks
        zeroed and its control block re-armed."""
        import numpy as np

        from pyhpctk.instrument.ptx import CONTROL
        from pyhpctk.instrument.ptx.traces import EVENT_BYTES
        from pyhpctk.instrument.tracing.decode import decode_chunks

        memory, pool = self._device_memory(), self.pool
        assert pool is not None
        ran: list[tuple[TracePlan, WarpEvents]] = []
        for plan, control in self.armed:
            words = memory.read(control, 8 * len(CONTROL)).view(np.uint64)
            cursor = int(words[CONTROL.NEXT_CHUNK]) & 0xFFFFFFFF
            lost = int(words[CONTROL.LOST])
            if not cursor and not lost:
                continue
            taken = min(cursor, pool.chunks)
            nbytes = taken * pool.chunk_events * EVENT_BYTES
            raw = memory.read(self.pool_at, nbytes) if nbytes else np.zeros(0, np.uint8)
            if nbytes:
                memory.zero(self.pool_at, nbytes)
            self._arm(control)
            ran.append((plan, decode_chunks(raw, pool.chunk_events, taken, lost)))
        return ran

    def summary(self) -> list[str]:
        """pyrun's lines at exit: launches traced, then what was not traced and why."""
        collector = self.collector
        lines = [f"pyrun: gpu: trace: {self.traced} launches traced (chunks, a pool of "
                 f"{self.cap_bytes >> 20} MiB)"]  # fmt: skip
        if collector is not None:
            lines += [f"pyrun: gpu: trace: not traced: {skip.what}: {skip.framework}: "
                      f"{skip.reason}" for skip in collector.skips]  # fmt: skip
        return lines + [f"pyrun: gpu: trace: {line}" for line in self.lines]

    def stop(self) -> None:
        """Uninstall the hooks, free the pool, say what was traced and what was not."""
        self.release()
        sys.stderr.write("".join(line + "\n" for line in self.summary()))

    def release(self) -> None:
        """Every control block disarmed, the pool freed, the hooks uninstalled."""
        if self.pool is not None and self.memory is not None:
            try:
                for _, control in self.armed:  # kernels still loaded write nothing from now on
                    self._arm(control, off=True)
                self.memory.free(self.pool_at)
            except Exception as error:  # the context may be gone at exit
                self.say(f"freeing the trace pool failed ({error!r})")
            self.pool = None
        self.uninstall()
