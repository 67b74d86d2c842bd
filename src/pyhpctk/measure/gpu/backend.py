"""The backend interface: what a GPU backend gives the monitor and what the monitor offers back.

Four roles meet here, each declared once as a typed protocol (docs/style.md, "Seams as
declared interfaces"):

- :class:`Backend` (``cupti``, ``simulated``, ``hip``): sees the runtime. :func:`install`
  makes one from the ``gpu=`` spec through the module its row of the backend table names
  (:class:`BackendModule`), hands it the monitor with :meth:`Backend.start`, and
  :meth:`Backend.stop` ends it.
- :class:`MonitorPort`: what the monitor offers a backend. Operations come in on the
  application thread that issues them (:meth:`~MonitorPort.operation`,
  :meth:`~MonitorPort.enter` / :meth:`~MonitorPort.exit`, or the native hook's slow path
  :meth:`~MonitorPort.operation_token`), CUDA graph nodes where they are made
  (:meth:`~MonitorPort.graph_node`), activity buffers from any thread
  (:meth:`~MonitorPort.buffer_completed`), GPU binaries, PC samples, instruction counts and
  per-warp traces.
- :class:`NativeHook`: the C CUPTI hook (``_cuptihook``). A backend that uses it passes it to
  :meth:`MonitorPort.attach_hook`; the monitor drains its operations before it matches each
  buffer. No backend sets attributes on the monitor.

The protocols are for type checking: nothing here is imported when a program is measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    import numpy as np

    from pyhpctk.instrument.ptx import Instrumented
    from pyhpctk.instrument.ptx.traces import TracePlan
    from pyhpctk.instrument.tracing.decode import WarpEvents
    from pyhpctk.measure.gpu.activity import DeviceLimits
    from pyhpctk.measure.gpu.spec import GpuSpec


class NativeHook(Protocol):
    """The C CUPTI hook's functions (``_cuptihook.c``; its ``.pyi`` stub says the same)."""

    def configure(
        self,
        entries: Iterable[tuple[int, int, int, int, int]],
        slow: Callable[[int, int, bool], int],
        every: Callable[[int, int, int, int, int], None] | None,
        module_loaded_cbid: int,
        context_created_cbid: int,
        skip_prefix: str | None = None,
        graph_node_created_cbid: int = 0xFFFFFFFF,
        graph_node_cloned_cbid: int = 0xFFFFFFFF,
    ) -> None: ...

    def subscribe(self, libcupti_path: str) -> int: ...

    def unsubscribe(self) -> None: ...

    def bump(self) -> int: ...

    def set_range(self, range: object) -> None: ...

    def drain(self) -> bytes: ...

    def take_modules(self) -> list[bytes]: ...

    def stats(self) -> dict[str, int]: ...

    def invoke(
        self,
        domain: int,
        cbid: int,
        site: int = 0,
        correlation: int = 0,
        context: int = 0,
        cubin: bytes = b"",
        stream: int = 0,
    ) -> None: ...

    def reset(self) -> None: ...

    def sync_apis(self, entries: Iterable[tuple[int, int, int, int, int]]) -> None: ...

    def take_syncs(self) -> bytes: ...

    def sync_stats(self) -> tuple[int, int]: ...

    def register_buffers(self, libcupti_path: str, size: int = ...) -> None: ...

    def take_buffers(self, timeout: float = 0.0) -> list[tuple[int, int]]: ...

    def free_buffer(self, address: int) -> None: ...

    def wake_buffers(self) -> None: ...

    def flush_all(self, flag: int = 1) -> int: ...

    def record_offsets(
        self, address: int, valid: int, sizes: bytes, start: int = 0
    ) -> tuple[bytes, int]: ...

    def convert_records(
        self,
        address: int,
        valid: int,
        offsets: np.ndarray,
        stride: int,
        plan: np.ndarray,
        kind: int,
        free_kind: int,
        names: np.ndarray,
        indices: np.ndarray,
        out: np.ndarray,
    ) -> bytes: ...

    def activity_sums(
        self,
        rows: np.ndarray,
        targets: np.ndarray,
        groups: int,
        width: int,
        layout: bytes,
        limits: bytes,
    ) -> bytes: ...


class MonitorPort(Protocol):
    """What the GPU monitor offers the backend it was given."""

    @property
    def errors(self) -> list[str]: ...

    def operation(self, kind: int, correlation: int, multi: bool = False) -> None:
        """The calling thread starts GPU operation ``correlation`` (callback at API entry)."""
        ...

    def operation_token(self, kind: int, correlation: int, multi: bool = False) -> int:
        """The native hook's slow path: record the operation, return its site's token."""
        ...

    def enter(self, kind: int, correlation: int, multi: bool = False) -> None:
        """The calling thread enters a GPU API call (nested calls share its context)."""
        ...

    def exit(self) -> None:
        """The calling thread leaves the call :meth:`enter` announced."""
        ...

    def graph_node(self, node: int, original: int = 0) -> None:
        """CUDA graph node ``node`` was made here (``original``: the node it was cloned from)."""
        ...

    def buffer_completed(
        self, records: np.ndarray, functions: Sequence[str] = (), dropped: int = 0
    ) -> None:
        """A completed activity buffer (``ACTIVITY_DTYPE`` rows; any thread; never blocks)."""
        ...

    def own_call(self, correlation: int) -> None:
        """A GPU operation of the backend itself: its activity is left out of the profile."""
        ...

    def module_loaded(self, cubin: bytes) -> None:
        """A GPU binary was loaded."""
        ...

    def set_limits(self, limits: DeviceLimits) -> None:
        """The device's occupancy limits, once the backend knows them."""
        ...

    def pc_samples(
        self, rows: np.ndarray, functions: Sequence[str], reasons: Sequence[str], dropped: int = 0
    ) -> None:
        """PC sample rows (``pcsampling.SAMPLE_DTYPE``; any thread)."""
        ...

    def inst_counts(self, rows: np.ndarray, functions: Sequence[str], launches: int = 1) -> None:
        """Instruction counts (``sassmetrics.INST_DTYPE``; any thread)."""
        ...

    def instrumented_module(self, module: Instrumented) -> None:
        """A module instrumented by the PTX pass was loaded (any thread; issue #34): its
        kernels' launches are named by its PTX from now on. Call it before their launches."""
        ...

    def block_counts(
        self, correlation: int, module: Instrumented, kernel: str, counters: np.ndarray
    ) -> None:
        """The counter buffer of one launch of ``kernel`` (``plan.counters`` rows of uint64
        warps, threads; read after the launch finished), launch ``correlation``'s (any
        thread; issue #34): attributed below that launch once its activity is."""
        ...

    def instrumentation_skipped(self, what: str, reason: str) -> None:
        """``what`` (a kernel, a module; "" for the whole) was not instrumented, and why:
        pyrun says so at exit (issue #34)."""
        ...

    def warp_trace(
        self, correlation: int, plan: TracePlan, events: WarpEvents, device: int = 0
    ) -> None:
        """A traced launch's per-warp events (any thread; issue #34)."""
        ...

    def exclude_current_thread(self) -> None:
        """The calling thread is the backend's own: never measure it as the program's."""
        ...

    def attach_hook(self, hook: NativeHook) -> None:
        """The backend records operations through ``hook``: drain it before each buffer."""
        ...


class Backend(Protocol):
    """A GPU runtime seen by pyrun (``gpu=nvidia``, ``gpu=simulated``, ``gpu=amd``)."""

    @property
    def name(self) -> str: ...

    def limits(self) -> DeviceLimits:
        """Occupancy limits (defaults until the device is known)."""
        ...

    def start(self, monitor: MonitorPort) -> None:
        """Start seeing operations and activities; report them to ``monitor``."""
        ...

    def flush(self) -> None:
        """Hand every activity recorded so far to the monitor. Never called under a lock the
        backend's buffer thread could need (the GIL included: see docs/gpu.md, "No hang")."""
        ...

    def stop(self) -> None:
        """Flush, then stop seeing anything."""
        ...

    def take_modules(self) -> list[bytes]:
        """GPU binaries loaded since the last call (the monitor saves them on its thread)."""
        ...

    def pc_settings(self, period_exponent: int) -> tuple[int, int, int]:
        """PC sampling's (period in cycles, SM clock in kHz, SM count; 0: learn it later)."""
        ...


class BackendModule(Protocol):
    """The module a row of :data:`~pyhpctk.measure.gpu.spec.BACKENDS` names (cheap to import:
    it imports what the backend needs only in :func:`make`)."""

    def check(self, spec: GpuSpec) -> None:
        """Refuse bad option values and missing files now (pyrun, before the command runs)."""
        ...

    def make(self, spec: GpuSpec) -> Backend:
        """The backend ``spec`` asks for (the same checks run again here)."""
        ...
