"""Per-warp traces of instrumented kernels, written as one trace line per SM and warp slot
(issue #34 item 4).

A backend hands each traced launch's decoded events (:meth:`WarpTraces.add`, any thread); they
wait until the launch has been attributed (:meth:`WarpTraces.kernels_attributed`, the monitor
thread with the session's lock), then go into the line of the (device, SM, warp slot) each warp
ran on. The line is a profile of its own, written as hpcrun writes a GPU stream
(:func:`~pyhpctk.measure.gpu.streams.write_trace_files`) with the id tuple
``NODE / GPUDEVICE / [RANK] / CORE(sm) / THREAD(warp slot)``: an SM is the GPU's core and a
warp slot its hardware thread, the kinds HPCToolkit's tuples already have (docs/formats.md,
"Warp traces"). A slot holds one warp at a time, so the warps that ran in it follow one another
on its line, idle (``NoActvty``) between them.

Each event is a trace record at its time (:func:`~pyhpctk.instrument.tracing.decode.times`,
aligned to the kernel's activity: the events of a launch that fall outside its start and end
are shifted so that its first event is the kernel's start) pointing at its site's node: below a
copy of the launch's calling context (its ``GPUKernl`` placeholder and kernel), the kernel's
source lines as logical frames (the kernel's function at the line of its code, each inlined
function at the line of its own, from the PTX's ``.loc``), and last a frame ``block N`` of the
pseudo-file ``KERNEL.ptx``, the PTX basic block. A warp's record ends (``NoActvty``) when the
exit events it wrote cover every lane it started with, or at its last event when events were
lost.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.formats.hpcrun_constants import (
    INTERP_LOGIC_LOCAL,
    INTERP_LOGIC_ONLY,
    KIND_CORE,
    KIND_GPUDEVICE,
    KIND_NODE,
    KIND_RANK,
    KIND_THREAD,
    MAIN_FENCE,
    placeholder_ip,
)
from pyhpctk.instrument.ptx.lines import Location
from pyhpctk.instrument.ptx.sites import SiteKind
from pyhpctk.instrument.ptx.traces import TracePlan
from pyhpctk.instrument.tracing.decode import WarpEvents, times
from pyhpctk.measure.cct import ThreadCCT
from pyhpctk.measure.encode import ProfileIdentity
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.streams import copy_call_path, write_trace_files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyhpctk.measure.cct import MetricKind
    from pyhpctk.measure.extension import Host

#: Warp lines' thread numbers (file names only: their id tuple says SM and slot).
FIRST_WARP_THREAD = 10_000
#: How far (ns) a launch's events may fall outside its kernel's activity before they are moved.
ALIGN_SLACK_NS = 1_000_000
#: Kernel launches remembered, after their attribution, for traces that come later.
SEEN_LAUNCHES = 4096
Key = tuple[int, int, int]  # (device, SM, warp slot)


class WarpIdentity(ProfileIdentity):
    """A warp line's identity: NODE, GPUDEVICE, optional RANK, CORE (SM), THREAD (warp slot)."""

    __slots__ = ("device", "slot", "sm")

    def __init__(self, base: ProfileIdentity, key: Key) -> None:
        super().__init__(base.program_name, base.program_path, base.env_path, base.job_id,
                         base.mpi_rank, base.thread, base.host_id, base.pid)  # fmt: skip
        self.device, self.sm, self.slot = key

    def id_tuple(self) -> list[tuple[int, int, int]]:
        only = INTERP_LOGIC_ONLY << 14
        elements = [((INTERP_LOGIC_LOCAL << 14) | KIND_NODE, self.host_id, 0)]
        elements.append((only | KIND_GPUDEVICE, self.device, self.device))
        if self.mpi_rank is not None:
            elements.append((only | KIND_RANK, self.mpi_rank, self.mpi_rank))
        elements.append((only | KIND_CORE, self.sm, self.sm))
        elements.append((only | KIND_THREAD, self.slot, self.slot))
        return elements


@dataclass
class WarpLine:
    """One SM's warp slot: its CCT and its records."""

    number: int
    key: Key
    cct: ThreadCCT
    times: list[np.ndarray] = field(default_factory=list)
    nodes: list[np.ndarray] = field(default_factory=list)
    copied: dict[tuple[int, int], int] = field(default_factory=dict)
    sites: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (base, plan, site)

    def records(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.times:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        t, n = np.concatenate(self.times), np.concatenate(self.nodes)
        order = np.argsort(t, kind="stable")
        return t[order].astype(np.uint64), n[order]


@dataclass
class _Pending:
    plan: TracePlan
    events: WarpEvents
    device: int


@dataclass
class WarpStats:
    launches: int = 0
    events: int = 0
    lost: int = 0
    lossy_launches: int = 0
    kernels: set[str] = field(default_factory=set)


class WarpTraces:
    """Every traced launch's warps, as trace lines per (device, SM, warp slot)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.lines: dict[Key, WarpLine] = {}
        self.stats = WarpStats()
        self._pending: dict[int, _Pending] = {}
        self._seen: dict[int, tuple[ThreadCCT, int, tuple[int, int]]] = {}  # attributed, no trace
        self._lock = threading.Lock()

    def add(self, correlation: int, plan: TracePlan, events: WarpEvents, device: int = 0) -> None:
        """A traced launch's events (any thread): attributed with its kernel's activity, now if
        that came first."""
        pending = _Pending(plan, events, device)
        with self._lock:
            self.stats.lost += events.lost
            self.stats.lossy_launches += events.lost > 0
            self.stats.kernels.add(plan.kernel)
            seen = self._seen.pop(correlation, None)
            if seen is None:
                self._pending[correlation] = pending
                return
        with self.host.lock:
            self._attribute(*seen, pending)

    def kernels_attributed(
        self, cct: ThreadCCT, rows: np.ndarray, targets: np.ndarray, names: list[str]
    ) -> None:
        """Kernels were attributed to ``targets`` of ``cct`` (with the session's lock)."""
        for index in np.flatnonzero(rows["kind"] == act.KERNEL).tolist():
            correlation = int(rows["correlation"][index])
            span = (int(rows["start"][index]), int(rows["end"][index]))
            with self._lock:
                pending = self._pending.pop(correlation, None)
                if pending is None:  # its events may come later (read after the launch)
                    self._seen[correlation] = (cct, int(targets[index]), span)
                    while len(self._seen) > SEEN_LAUNCHES:
                        del self._seen[next(iter(self._seen))]
            if pending is not None:
                self._attribute(cct, int(targets[index]), span, pending)

    def _line(self, key: Key) -> WarpLine:
        line = self.lines.get(key)
        if line is None:
            cct = ThreadCCT(self.host.ids, main=True, with_no_activity=True)
            line = self.lines[key] = WarpLine(FIRST_WARP_THREAD + len(self.lines), key, cct)
        return line

    def _site_node(self, line: WarpLine, base: int, plan: TracePlan, site: int) -> int:
        key = (base, id(plan), site)
        node = line.sites.get(key)
        if node is None:
            node = line.sites[key] = self._frames(line.cct, base, plan, site)
        return node

    def _frames(self, cct: ThreadCCT, base: int, plan: TracePlan, site: int) -> int:
        """The logical frames of ``site``'s code below ``base`` (the module docstring)."""
        host, lm = self.host, self.host.python_lm
        where = plan.sites[site]
        node = base
        for function, file, line in source_frames(plan.kernel, where.location):
            node = cct.child(node, lm, host.functions.named(function, file) << 32 | line)
        block = host.functions.named(f"block {where.block}", f"{plan.kernel}.ptx")
        return cct.child(node, lm, block << 32)

    def _attribute(self, source: ThreadCCT, target: int, span: tuple[int, int],
                   pending: _Pending) -> None:  # fmt: skip
        rows, plan = pending.events.rows, pending.plan
        self.stats.launches += 1
        self.stats.events += len(rows)
        if not len(rows):
            return
        when = aligned(times(rows), span)
        main = source.ip[source.fence] == placeholder_ip(MAIN_FENCE)
        exits = {s.id for s in plan.sites if s.kind is SiteKind.EXIT}
        starts = np.flatnonzero(np.r_[True, rows["warp"][1:] != rows["warp"][:-1]])
        for first, end in zip(starts.tolist(), [*starts[1:].tolist(), len(rows)], strict=True):
            warp = rows[first:end]
            line = self._line((pending.device, int(warp["sm"][0]), int(warp["slot"][0])))
            base = copy_call_path(line.cct, line.copied, source, target, main)
            nodes = functools.partial(self._site_node, line, base, plan)
            t, n = warp_records(warp, when[first:end], exits, nodes, line.cct)
            line.times.append(t)
            line.nodes.append(n)

    def write(self, kind: MetricKind, errors: list[str]) -> list[str]:
        """Write every warp line's ``.hpcrun`` and ``.hpctrace``."""
        written: list[str] = []
        for line in self.lines.values():
            t, n = line.records()
            if len(n):
                line.cct.retain(line.cct.no_activity)
                for node in np.unique(n).tolist():
                    line.cct.retain(int(node))
            try:
                with self.host.lock:
                    identity = WarpIdentity(self.host.stream_identity(line.number), line.key)
                written += write_trace_files(self.host, kind, line.cct, identity, t, n)[1]
            except OSError as error:
                errors.append(f"pyrun: gpu: cannot write warp line {line.key}: {error}")
        return written

    def problems(self) -> list[str]:
        """What pyrun's summary says of lost events (none is lost silently)."""
        s = self.stats
        if not s.lost:
            return []
        return [f"pyrun: gpu: warp traces: {s.lost} events found no room in the trace buffer "
                f"({s.lossy_launches} of {s.launches} traced launches); they are counted, "
                "not traced: raise the trace buffer's cap"]  # fmt: skip


def source_frames(kernel: str, location: Location | None) -> list[tuple[str, str, int]]:
    """(function, file, line) from the kernel's own frame to the innermost inlined function's,
    for code at ``location`` (the kernel alone, at no line, without one)."""
    if location is None:
        return [(kernel, "", 0)]
    calls = list(reversed(location.inlined))  # outermost call site first
    functions = [kernel, *(f.function for f in calls)]
    sites = [(f.file, f.line) for f in calls] + [(location.file, location.line)]
    return [(fn, file, line) for fn, (file, line) in zip(functions, sites, strict=True)]


def aligned(when: np.ndarray, span: tuple[int, int]) -> np.ndarray:
    """``when`` as is if it lies within the kernel's ``span`` (give or take
    :data:`ALIGN_SLACK_NS`), else shifted so that its first time is the span's start."""
    start, end = span
    first, last = int(when.min()), int(when.max())
    if end <= start or (first >= start - ALIGN_SLACK_NS and last <= end + ALIGN_SLACK_NS):
        return when
    return when - first + start


def warp_records(
    warp: np.ndarray,
    when: np.ndarray,
    exits: set[int],
    node_of: Callable[[int], int],
    cct: ThreadCCT,
) -> tuple[np.ndarray, np.ndarray]:
    """One warp's trace records: each event at its site's node, until exit events cover every
    lane seen active (then ``NoActvty``); a partial exit adds no record."""
    alive = 0
    out_t: list[int] = []
    out_n: list[int] = []
    for i, (site, mask) in enumerate(
        zip(warp["site"].tolist(), warp["mask"].tolist(), strict=True)
    ):
        if site in exits:
            alive &= ~mask
            if alive == 0:
                out_t.append(int(when[i]))
                out_n.append(cct.no_activity)
                break
            continue
        alive |= mask
        out_t.append(int(when[i]))
        out_n.append(node_of(site))
    else:  # no exit ended it: events were lost, or it left without an exit event
        out_t.append(out_t[-1] if out_t else int(when[-1]))
        out_n.append(cct.no_activity)
    return np.asarray(out_t, np.uint64), np.asarray(out_n, np.int64)
