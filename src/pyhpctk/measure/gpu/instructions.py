"""PC samples and instruction counts attributed below their kernel launches (issue #7).

A backend delivers PC sample rows (``pcsampling.SAMPLE_DTYPE``) or instruction counts
(``sassmetrics.INST_DTYPE``) from any thread; they wait until the launch with their
correlation id has been attributed, then go below that launch's ``GPUKernl`` placeholder: one
node per instruction (load module = the gpubin, offset = ``.text.<kernel>`` + ``pcOffset``).
Counts wait for the end of the measurement, when every counted launch is known, and are split
between the launches' calling contexts when they came from several (:meth:`_inst_pieces`).

Attribution runs with the session lock held (from the attributor, after kernels).
"""

from __future__ import annotations

import threading

import numpy as np

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyhpctk.measure.cct import MetricKind, ThreadCCT
    from pyhpctk.measure.gpu.attribution import KernelTable


class FineAttribution:
    """PC samples and instruction counts of one measurement (see the module docstring)."""

    def __init__(self, kernels: KernelTable, limits: act.DeviceLimits) -> None:
        self.kernels = kernels
        self.limits = limits
        self.pc_kind: MetricKind | None = None
        self.pc_period = 0
        self.pc_clock_khz = 0
        self.pc_sm_count = 0
        self.pc_stats = {"rows": 0, "samples": 0, "attributed": 0, "unmatched": 0, "dropped": 0}
        self.inst_functions: list[str] = []  # the device functions instruction counts came from
        self._pc_lock = threading.Lock()
        self._pc_rows: list[tuple[np.ndarray, list[str], list[str], int]] = []
        self._pc_kernels: dict[int, tuple[ThreadCCT, int, int]] = {}
        self._pc_last_launch: dict[str, int] = {}  # kernel name → its latest launch
        self._inst_launches: dict[str, list[int]] = {}  # counting: kernel name → its launches

    def kernels_attributed(
        self, cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray, names: list[str]
    ) -> None:
        """Kernels were attributed to ``targets``: remember where, attribute waiting rows."""
        if self.pc_kind is None:
            return
        for index in np.flatnonzero(rows["kind"] == act.KERNEL).tolist():
            duration = int(rows["end"][index]) - int(rows["start"][index])
            correlation = int(rows["correlation"][index])
            self._pc_kernels[correlation] = (cct, int(targets[index]), max(duration, 0))
            function = int(rows["function"][index])
            if 0 <= function < len(names):  # continuous mode: samples carry no id
                self._pc_last_launch[names[function]] = correlation
                if not self.pc_period:  # counting: the window's totals may be split
                    self._inst_launches.setdefault(names[function], []).append(correlation)
        if self._pc_rows:
            self.attribute_pc()

    def enable_pc(
        self, kind: MetricKind, period_cycles: int, clock_khz: int = 0, sm_count: int = 0
    ) -> None:
        """Attribute PC samples or instruction counts into ``kind`` (``pc_metric_kind``).

        ``period_cycles`` is 0 for instruction counts (``gpu=...,inst``): no GSAMP metrics.
        """
        self.pc_kind = kind
        self.pc_sm_count = sm_count
        self.pc_period = period_cycles
        self.pc_clock_khz = clock_khz

    def pc_samples(
        self, rows: np.ndarray, functions: Sequence[str], reasons: Sequence[str], dropped: int = 0
    ) -> None:
        """A backend delivers PC sample rows (``pcsampling.SAMPLE_DTYPE``; any thread).

        They wait until the kernel launch with their correlation id has been attributed, then
        go below that launch's ``GPUKernl`` placeholder (:meth:`_attribute_pc`).
        """
        from pyhpctk.measure.gpu.cupti.pcsampling import sample_count

        with self._pc_lock:
            self._pc_rows.append((rows, list(functions), list(reasons), dropped))
            self.pc_stats["rows"] += len(rows)
            self.pc_stats["samples"] += sample_count(rows, reasons)
            self.pc_stats["dropped"] += dropped

    def inst_counts(self, rows: np.ndarray, functions: Sequence[str], launches: int = 1) -> None:
        """A backend delivers instruction counts (``sassmetrics.INST_DTYPE``; any thread).

        Like :meth:`pc_samples`: the rows wait for the launch with their correlation id, then
        go below its ``GPUKernl`` placeholder as hpcrun's instrumentation metrics (``GINS``,
        ``GINS:SIMD_*``). They share the PC queue; their dtype tells them apart. ``launches``:
        how many kernel launches ran while CUPTI counted (its counts are their totals).
        """
        with self._pc_lock:
            self._pc_rows.append((rows, list(functions), [], 0))
            stats = self.pc_stats
            stats["rows"] += len(rows)
            stats["instructions"] = stats.get("instructions", 0) + int(
                rows["inst"].astype(np.int64).sum()
            )
            stats["inst_launches"] = stats.get("inst_launches", 0) + launches
            counted = sorted({functions[f] for f in rows["function"].tolist() if f >= 0})
            self.inst_functions.extend(n for n in counted if n not in self.inst_functions)

    def attribute_pc(self, final: bool = False) -> None:
        """Attribute waiting PC samples / counts whose kernel is known (with the session lock)."""
        from pyhpctk.measure.gpu.cupti import pcsampling as pcs
        from pyhpctk.measure.gpu.cupti import sassmetrics as sm

        kind = self.pc_kind
        if kind is None:
            return
        with self._pc_lock:
            batches, self._pc_rows = self._pc_rows, []
        waiting: list[tuple[np.ndarray, list[str], list[str], int]] = []
        index = gm.PC_INDEX
        stats = self.pc_stats
        for rows, functions, reasons, dropped in batches:
            counts = rows.dtype == sm.INST_DTYPE
            if not counts and not rows["correlation"].all():  # continuous: the latest launch
                names = np.array([*functions, "?"], dtype=object)
                named = names[np.where(rows["function"] >= 0, rows["function"], len(functions))]
                latest = [self._pc_last_launch.get(str(n), 0) for n in named.tolist()]
                rows = rows.copy()
                rows["correlation"] = np.where(
                    rows["correlation"] == 0, latest, rows["correlation"]
                )
            correlations = rows["correlation"]
            pieces: list[tuple[int, np.ndarray]] = []
            for correlation in np.unique(correlations).tolist():
                part = rows[correlations == correlation]
                if not counts:
                    pieces.append((correlation, part))
                elif not final:  # CUPTI's totals: split once every counted launch is known
                    waiting.append((part, functions, reasons, 0))
                else:
                    pieces += self._inst_pieces(int(correlation), part)
            for correlation, part in pieces:
                amount = (
                    int(part["inst"].astype(np.int64).sum())
                    if counts
                    else pcs.sample_count(part, reasons)
                )
                unmatched = "inst_unmatched" if counts else "unmatched"
                known = self._pc_kernels.get(int(correlation))
                if known is None:
                    if final or not correlation:
                        stats[unmatched] = stats.get(unmatched, 0) + amount
                    else:
                        waiting.append((part, functions, reasons, 0))
                    continue
                cct, kernel, duration = known
                lm = int(cct.lm[kernel])
                placeholder = int(cct.parent[kernel])
                entries = self.kernels.of_module(lm)
                if not entries:
                    stats[unmatched] = stats.get(unmatched, 0) + amount
                    continue
                if counts:
                    values = sm.attribute_counts(part, functions, entries)
                else:
                    expected = pcs.expected_samples(
                        duration,
                        self.pc_clock_khz,
                        self.pc_sm_count or self.limits.sm_count,
                        self.pc_period,
                    )
                    values = pcs.attribute_samples(
                        part, reasons, functions, entries, self.pc_period, amount, dropped, expected
                    )
                    dropped = 0  # a batch's dropped samples go to its first kernel
                store = cct.values_of(kind)
                entry = int(cct.ip[kernel])
                for (offset, name), value in values.values.items():
                    node = (
                        kernel
                        if offset == entry
                        else cct.child(placeholder, lm, offset, unwound=False)
                    )
                    store.add(node, index[name], value)
                for name, value in values.kernel_values.items():
                    metric = index[name]
                    if name == "GSAMP:PER (cyc)":  # a setting, not a count: as hpcrun, once
                        value -= int(store.get(kernel, metric))
                    if value:
                        store.add(kernel, metric, value)
                attributed = "inst_attributed" if counts else "attributed"
                stats[attributed] = stats.get(attributed, 0) + amount
        if waiting:
            with self._pc_lock:
                self._pc_rows[:0] = waiting

    def _inst_pieces(self, first: int, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """A counting window's totals as (launch, rows) pieces, one per calling context.

        CUPTI sums every launch of the counted kernel into one total per instruction, given as
        the window's ``first`` launch's. When the counted launches (that kernel's launches from
        ``first`` on) all have one calling context, the totals are exact there. When they came
        from several, each context gets a share in proportion to its launches' GPU time.
        Instrumented kernels spend their time counting, so time follows the number of
        executions. A context with no measured time makes it a share by launch count.
        Identical launches then split exactly.
        """
        from pyhpctk.measure.gpu.cupti import sassmetrics as sm

        name = next((n for n, seen in self._inst_launches.items() if first in seen), None)
        groups: dict[tuple[int, int], list[int]] = {}  # (CCT, kernel node) → launch, ns, count
        for correlation in self._inst_launches.get(name, []) if name is not None else []:
            known = self._pc_kernels.get(correlation)
            if correlation < first or known is None:
                continue
            cct, kernel, duration = known
            group = groups.setdefault((id(cct), kernel), [correlation, 0, 0])
            group[1] += duration
            group[2] += 1
        if len(groups) <= 1:
            return [(first, rows)]
        split = sorted(groups.values())  # contexts in the order of their first launch
        by_time = all(ns > 0 for _, ns, _ in split)
        weights = [ns if by_time else launches for _, ns, launches in split]
        stats = self.pc_stats
        stats["inst_contexts"] = stats.get("inst_contexts", 0) + len(split)
        stats["inst_split_by_time"] = int(by_time)
        parts = sm.split_counts(rows, weights)
        return [(launch, part) for (launch, _, _), part in zip(split, parts, strict=True)]
