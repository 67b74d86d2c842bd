"""Exact block counts of instrumented kernels, below the launches that ran them (issue #34, item 3).

A backend that runs kernels instrumented by the PTX pass (``gpu=nvidia,blocks``: the framework
hooks of :mod:`pyhpctk.instrument.frameworks`; ``gpu=simulated,blocks=RECORDING``: recorded
counters) tells the monitor two things, the seam :class:`~.backend.MonitorPort` declares:

- :meth:`BlockCounting.module`: an instrumented module was loaded. Its original PTX is saved as
  ``ptxbins/<md5>.ptx``, a load module of the measurement, and its kernels' launches are named
  by (that PTX, the kernel's first instruction) from now on (:meth:`KernelTable.prefer`), so
  that the kernel's time and its counts meet in one function when pyprof reads the PTX's
  structure (:mod:`pyhpctk.structure.ptx`).
- :meth:`BlockCounting.counts`: one launch's counter buffer, read after it finished, with the
  launch's correlation id. It waits until that launch's kernel activity is attributed, then
  goes below its ``GPUKernl`` placeholder: the counts derived from the counters
  (:func:`~pyhpctk.instrument.ptx.derive`) at the addresses of
  :mod:`pyhpctk.instrument.ptx.layout`, one node per run of instructions of one source line.

Metrics (kind ``gpu-blocks``, pyrun's own; integers): ``GPTX:BLK`` and ``GPTX:BLK_WARP``, how
often threads and warps entered the blocks that start at a node; ``GPTX:INST`` and
``GPTX:INST_WARP``, PTX instructions executed by threads and issued by warps; ``GPTX:COUNT``,
the launches counted (at the kernel's entry). Warp metrics need ``blocks=warps`` (a counter in
every block): edges mode derives threads only (docs/gpu.md).
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.instrument.frameworks.base import NO_PTX
from pyhpctk.instrument.ptx import Instrumented, PtxError, build, derive, parse
from pyhpctk.instrument.ptx.layout import KernelLayout, layout
from pyhpctk.measure.cct import MetricKind
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.cubin import save_once
from pyhpctk.measure.gpu.metrics import GpuMetricSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.cct import ThreadCCT
    from pyhpctk.measure.extension import Host
    from pyhpctk.measure.gpu.attribution import KernelTable

BLOCK_KIND_NAME = "gpu-blocks"
BLOCK_METRICS: tuple[GpuMetricSpec, ...] = (
    GpuMetricSpec("GPTX:BLK", "PTX basic blocks starting here: executions by threads", False),
    GpuMetricSpec("GPTX:BLK_WARP", "PTX basic blocks starting here: executions by warps", False),
    GpuMetricSpec("GPTX:INST", "PTX instructions executed, summed over threads", False),
    GpuMetricSpec("GPTX:INST_WARP", "PTX instructions issued, summed over warps", False),
    GpuMetricSpec("GPTX:COUNT", "instrumented kernel launches counted", False, move_to_proc=True),
)
BLK, BLK_WARP, INST, INST_WARP, COUNT = range(5)
PTX_DIRECTORY = "ptxbins"
_STAT_NAMES = ("launches", "attributed", "unmatched", "refused", "unknown_kernel")


def block_metric_kind() -> MetricKind:
    """A fresh block-count kind (``gpu=...,blocks``)."""
    return MetricKind(BLOCK_KIND_NAME, BLOCK_METRICS)


def save_ptx(output_dir: str, text: str) -> str:
    """Write ``output_dir/ptxbins/<md5>.ptx`` once (as gpubins are saved); return its path."""
    data = text.encode("utf-8")
    name = hashlib.md5(data, usedforsecurity=False).hexdigest() + ".ptx"
    return save_once(os.path.join(output_dir, PTX_DIRECTORY), name, data)


@dataclass
class CountedModule:
    """An instrumented module as the measurement names it."""

    instrumented: Instrumented
    lm: int
    path: str
    layouts: dict[str, KernelLayout]


@dataclass
class KernelStats:
    """What pyrun says about one counted kernel at exit."""

    launches: int = 0
    module: CountedModule | None = None
    config: tuple[int, int, int] = (0, 0, 0)  # last launch: block threads, static, dynamic smem
    registers: int = 0  # as the launch record says (the instrumented kernel's)


@dataclass
class _Waiting:
    correlation: int
    module: CountedModule
    kernel: str
    counters: np.ndarray


@dataclass
class BlockCounting:
    """Block counts of one measurement (see the module docstring)."""

    session: Host
    kernels: KernelTable
    kind: MetricKind | None = None
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_STAT_NAMES, 0))
    per_kernel: dict[str, KernelStats] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (what, why): not instrumented
    _modules: dict[int, CountedModule] = field(default_factory=dict)  # id(Instrumented) →
    _failed: dict[int, Instrumented] = field(default_factory=dict)  # modules not placed
    _waiting: list[_Waiting] = field(default_factory=list)
    _launches: dict[int, tuple[ThreadCCT, int]] = field(default_factory=dict)  # corr → kernel
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def module(self, instrumented: Instrumented) -> CountedModule | None:
        """Register an instrumented module (any thread; once per module object); None when
        its PTX cannot be saved or placed (said at exit; its kernels are not counted)."""
        with self._lock:
            known = self._modules.get(id(instrumented))
            if known is not None and known.instrumented is instrumented:
                return known
            if self._failed.get(id(instrumented)) is instrumented:
                return None
        try:
            counted = self._register(instrumented)
        except (PtxError, OSError) as error:
            kernels = ", ".join(sorted(instrumented.plans))
            with self._lock:
                self._failed[id(instrumented)] = instrumented
                self.errors.append(f"pyrun: gpu: blocks: {kernels}: {error}; not counted")
            return None
        with self._lock:
            self._modules[id(instrumented)] = counted
        return counted

    def _register(self, instrumented: Instrumented) -> CountedModule:
        source = parse(instrumented.source)
        layouts = {}
        for function in source.kernels:
            if function.name in instrumented.plans:
                layouts[function.name] = layout(source, build(function))
        path = save_ptx(self.session.options.output_dir, instrumented.source)
        lm = self.session.add_load_module(path)
        self.kernels.prefer(lm, {name: placed.entry for name, placed in layouts.items()})
        return CountedModule(instrumented, lm, path, layouts)

    def counts(
        self, correlation: int, instrumented: Instrumented, kernel: str, counters: np.ndarray
    ) -> None:
        """One launch's counters (any thread): attributed once its kernel activity is."""
        counted = self.module(instrumented)
        if counted is None:
            self.stats["refused"] += 1
            return
        if kernel not in counted.layouts:
            self.stats["unknown_kernel"] += 1
            return
        with self._lock:
            self._waiting.append(_Waiting(correlation, counted, kernel, np.array(counters)))
            self.stats["launches"] += 1

    def kernels_attributed(
        self, cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray, names: list[str]
    ) -> None:
        """Kernels were attributed to ``targets`` (with the session lock): the counts of those
        launches go below them."""
        for index in np.flatnonzero(rows["kind"] == act.KERNEL).tolist():
            self._launches[int(rows["correlation"][index])] = (cct, int(targets[index]))
            function = int(rows["function"][index])
            if 0 <= function < len(names):
                row = rows[index]
                stats = self.per_kernel.setdefault(names[function], KernelStats())
                stats.config = (
                    int(row["block_threads"]),
                    int(row["static_smem"]),
                    int(row["dynamic_smem"]),
                )
                stats.registers = int(row["registers"])
        if self._waiting:
            self.attribute()

    def attribute(self, final: bool = False) -> None:
        """Attribute the waiting counts whose launch is known (with the session lock held)."""
        kind = self.kind
        if kind is None:
            return
        with self._lock:
            waiting, self._waiting = self._waiting, []
        left = []
        for item in waiting:
            known = self._launches.pop(item.correlation, None)
            if known is None:
                if final:
                    self.stats["unmatched"] += 1
                else:
                    left.append(item)
                continue
            self._place(kind, *known, item)
        if left:
            with self._lock:
                self._waiting[:0] = left

    def _place(self, kind: MetricKind, cct: ThreadCCT, kernel: int, item: _Waiting) -> None:
        counted = item.module
        plan = counted.instrumented.plans[item.kernel]
        try:
            counts = derive(plan, item.counters)
        except PtxError as error:
            self.stats["refused"] += 1
            message = f"pyrun: gpu: blocks: {error}"
            if message not in self.errors:
                self.errors.append(message)
            return
        placed = counted.layouts[item.kernel]
        parent = int(cct.parent[kernel]) if cct.lm[kernel] else kernel  # not a placeholder
        store = cct.values_of(kind)
        warps = counts.block_warps
        for block, segments in enumerate(placed.blocks):
            threads = counts.block_threads[block]
            warp = warps[block] if warps is not None else 0
            if not threads and not warp:
                continue
            for number, segment in enumerate(segments):
                node = cct.child(parent, counted.lm, segment.address)
                if number == 0:
                    store.add(node, BLK, threads)
                    if warp:
                        store.add(node, BLK_WARP, warp)
                if segment.instructions:
                    store.add(node, INST, threads * segment.instructions)
                    if warp:
                        store.add(node, INST_WARP, warp * segment.instructions)
        store.add(cct.child(parent, counted.lm, placed.entry), COUNT, 1)
        stats = self.per_kernel.setdefault(item.kernel, KernelStats())
        stats.launches += 1
        stats.module = counted
        self.stats["attributed"] += 1

    def uncounted(self) -> list[tuple[str, str]]:
        """Each kernel that ran but was never counted, with why (at exit)."""
        instrumented = {k for m in self._modules.values() for k in m.layouts}
        out = []
        for name, stats in sorted(self.per_kernel.items()):
            if stats.launches:
                continue
            known = [why for what, why in self.skipped if name in what.split(", ")]
            if known:
                out.append((name, known[0]))
            elif name in instrumented:
                out.append((name, "instrumented; its launches fell outside launch-skip/count"))
            else:
                out.append((name, NO_PTX))
        return out
