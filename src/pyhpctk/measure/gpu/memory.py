"""GPU memory with its stacks (issue #37 item 2): ``-e gpu=nvidia,memory`` (or ``simulated``).

Allocators tell a :class:`MemoryTracker` of every allocation and free, each with the Python
calling context that asked for it (a *site*: the thread and its call path, innermost first):

- CuPy's memory pool, through its public ``cupy.cuda.MemoryHook`` (:mod:`.memory_hooks`):
  ``malloc``/``free`` of the pool (allocated), ``alloc`` of the pool's own ``cudaMalloc``
  (reserved), each on the application thread, unwound there (:meth:`MemoryTracker.site_here`).
- PyTorch's caching allocator, through its own allocation history
  (``_record_memory_history``, Python stacks, no ``torch.profiler``), read back at exit and at an
  out-of-memory error (:meth:`MemoryTracker.take_torch`): ``alloc``/``free_completed``
  (allocated), ``segment_alloc``/``segment_free`` (reserved); its frames are named as pyrun
  names code objects (:meth:`MemoryTracker.site_of_frames`).
- Any caller of :meth:`MemoryTracker.allocated` / :meth:`~MemoryTracker.freed` /
  :meth:`~MemoryTracker.reserved` / :meth:`~MemoryTracker.released` (the tests' fake allocator).

Nothing is computed on the program's path but the site. At exit
(:func:`.memory_hooks.finish`) :func:`replay` walks every
event in time order and gives, per site: bytes allocated and allocations (``GMEMLIVE:ALLOC``,
``GMEMLIVE:COUNT``), the most bytes the site held live at once (``GMEMLIVE:PEAK``), and the
bytes it held at the process's peak (``GMEMLIVE:ATPEAK``: what the peak was made of); and per
device a timeline of allocated and reserved bytes. The metrics go into the CCT of the thread
that allocated (kind ``gpu-memory``), the timeline and the largest sites into
``MEAS/gpumem/memory-PID.json`` (docs/formats.md, "GPU memory"), which pyprof copies into the
database for ``pyview --trace-export`` and ``--html``. On an out-of-memory error,
:func:`.memory_files.out_of_memory` writes ``MEAS/gpumem/oom-PID-N.txt`` at once: what was
live, by site, with the stacks.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.formats.gpu_memory import DIRECTORY
from pyhpctk.measure.cct import MetricKind, python_frame_ips
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.metrics import GpuMetricSpec
from pyhpctk.measure.gpu.operations import OP_CALL, OP_CCT, OP_THREAD, SKIP

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

    from pyhpctk.measure.cct import ThreadCCT
    from pyhpctk.measure.extension import Host
    from pyhpctk.measure.gpu.matching import SiteOperations
    from pyhpctk.measure.gpu.operations import Operation

MEMORY_KIND_NAME = "gpu-memory"
#: The kind's metrics (integers; summed over contexts, so a caller's PEAK is the sum of its
#: callees' peaks, an upper bound of its own).
MEMORY_METRICS = tuple(
    GpuMetricSpec(name, text, False)
    for name, text in (
        ("GMEMLIVE:ALLOC (B)", "GPU memory allocated here (bytes, summed)"),
        ("GMEMLIVE:COUNT", "GPU memory allocations made here"),
        ("GMEMLIVE:PEAK (B)", "most GPU memory allocated here and live at once (bytes)"),
        ("GMEMLIVE:ATPEAK (B)", "GPU memory allocated here and live at the process's peak"),
    )
)
ALLOC_BYTES, ALLOC_COUNT, PEAK, AT_PEAK = range(4)

#: Where an event came from.
TORCH, CUPY, CUDA = 0, 1, 2
SOURCE_NAMES = ("torch", "cupy", "cuda")
#: What it did: a block handed out or given back (allocated), a segment taken from or given back
#: to the driver (reserved). A raw ``cudaMalloc`` outside the pools is both.
ALLOC, FREE, RESERVE, RELEASE = 0, 1, 2, 3
TIMELINE_POINTS = 100_000  # per device; more events are folded into their buckets' maxima
TOP_SITES = 20


def memory_metric_kind() -> MetricKind:
    """A fresh memory kind (``gpu=...,memory``)."""
    return MetricKind(MEMORY_KIND_NAME, MEMORY_METRICS)


@dataclass
class Site:
    """Where allocations came from: a thread and its Python call path (``fid << 32 | line``,
    innermost first, as :func:`~pyhpctk.measure.cct.python_frame_ips` gives it)."""

    ident: int
    ips: tuple[int, ...]


@dataclass
class Replayed:
    """What :func:`replay` found: per site (arrays indexed by site) and per device."""

    alloc_bytes: np.ndarray
    alloc_count: np.ndarray
    peak: np.ndarray
    at_peak: np.ndarray
    live: np.ndarray  # bytes each site holds at the end of the events
    sources: np.ndarray  # the allocators each site allocated through: 1 << source, or-ed
    #: ``at_peak`` split by allocator: a row per SOURCE_NAMES index (a Python line may allocate
    #: through PyTorch's pool and, in a library it calls, raw cudaMalloc: cuBLAS's workspace)
    at_peak_by_source: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    peak_bytes: int = 0  # the process's most allocated bytes at once (all devices)
    peak_time: int = 0
    timelines: dict[int, tuple[list[int], list[int], list[int]]] = field(default_factory=dict)
    #: Each device's (allocated, reserved) bytes after the last event.
    final: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: The peak of each allocator's own bytes (by SOURCE_NAMES index), each at its own moment.
    source_peaks: list[int] = field(default_factory=lambda: [0] * len(SOURCE_NAMES))
    events: int = 0
    unknown_frees: int = 0


class Events:
    """Events as rows (time, action, source, device, address, size, site), appended to from
    any thread: one ``list.append`` of a tuple each, atomic under the GIL."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int, int, int, int]] = []

    def add(
        self, time: int, action: int, source: int, device: int, address: int, size: int, site: int
    ) -> None:
        self.rows.append((time, action, source, device, address, size, site))

    def __len__(self) -> int:
        return len(self.rows)


COLUMNS = ("time", "action", "source", "device", "address", "size", "site")


def _merged(parts: Sequence[Events]) -> dict[str, list[int]]:
    rows = [row for part in parts for row in part.rows[: len(part.rows)]]
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in COLUMNS]
    return {name: list(column) for name, column in zip(COLUMNS, columns, strict=True)}


def replay(parts: Sequence[Events], sites: int) -> Replayed:
    """Walk every event in time order (ties: as recorded); see the module docstring.

    A raw ``cudaMalloc`` (source ``CUDA``) at the address of a pool's segment is the pool's own
    and is left out (the pool reports it); a free of an address not live is counted, not used.
    """
    columns = _merged(parts)
    order = sorted(range(len(columns["time"])), key=columns["time"].__getitem__)
    time, action, source = columns["time"], columns["action"], columns["source"]
    device, address, size, site = (
        columns["device"],
        columns["address"],
        columns["size"],
        columns["site"],
    )
    pool_segments = {
        (device[i], address[i]) for i in order if action[i] == RESERVE and source[i] != CUDA
    }
    zeros = [np.zeros(sites, dtype=np.int64) for _ in range(6)]
    result = Replayed(zeros[0], zeros[1], zeros[2], zeros[3], zeros[4], zeros[5])
    result.at_peak_by_source = np.zeros((len(SOURCE_NAMES), sites), dtype=np.int64)
    site_live = [0] * sites
    live: dict[tuple[int, int, int], tuple[int, int]] = {}  # (source, device, address) -> ...
    segments: dict[tuple[int, int, int], int] = {}
    allocated: dict[int, int] = {}
    reserved: dict[int, int] = {}
    total = 0
    by_source = [0] * len(SOURCE_NAMES)
    peak_at = -1
    kept: list[int] = []
    for position, i in enumerate(order):
        what, src, dev = action[i], source[i], device[i]
        if src == CUDA and (dev, address[i]) in pool_segments:
            continue
        kept.append(i)
        key = (src, dev, address[i])
        if what == ALLOC or (src == CUDA and what == RESERVE):
            where, bytes_ = site[i], size[i]
            live[key] = (bytes_, where)
            allocated[dev] = allocated.get(dev, 0) + bytes_
            total += bytes_
            by_source[src] += bytes_
            result.source_peaks[src] = max(result.source_peaks[src], by_source[src])
            if src == CUDA:
                reserved[dev] = reserved.get(dev, 0) + bytes_
            if where >= 0:
                result.alloc_bytes[where] += bytes_
                result.alloc_count[where] += 1
                result.sources[where] |= 1 << src
                site_live[where] += bytes_
                if site_live[where] > result.peak[where]:
                    result.peak[where] = site_live[where]
            if total > result.peak_bytes:
                result.peak_bytes, result.peak_time, peak_at = total, time[i], position
        elif what == FREE or (src == CUDA and what == RELEASE):
            held = live.pop(key, None)
            if held is None:
                result.unknown_frees += 1
                continue
            allocated[dev] -= held[0]
            total -= held[0]
            by_source[src] -= held[0]
            if src == CUDA:
                reserved[dev] -= held[0]
            if held[1] >= 0:
                site_live[held[1]] -= held[0]
        elif what == RESERVE:
            segments[key] = size[i]
            reserved[dev] = reserved.get(dev, 0) + size[i]
        else:  # RELEASE of a pool segment (or of a range of it: its own size)
            whole = segments.pop(key, 0)
            reserved[dev] = reserved.get(dev, 0) - (size[i] or whole)
        line = result.timelines.setdefault(dev, ([], [], []))
        line[0].append(time[i])
        line[1].append(allocated.get(dev, 0))
        line[2].append(reserved.get(dev, 0))
    result.live[:] = site_live
    result.final = {dev: (allocated.get(dev, 0), reserved.get(dev, 0)) for dev in result.timelines}
    result.events = len(kept)
    if peak_at >= 0:  # again up to the peak: what each site held then
        _live_at(result, order[: peak_at + 1], columns, pool_segments)
    for dev, line in result.timelines.items():
        result.timelines[dev] = _thinned(line, TIMELINE_POINTS)
    return result


def _live_at(
    result: Replayed,
    order: list[int],
    columns: dict[str, list[int]],
    pool_segments: set[tuple[int, int]],
) -> None:
    action, source, device = columns["action"], columns["source"], columns["device"]
    address, size, site = columns["address"], columns["size"], columns["site"]
    live: dict[tuple[int, int, int], tuple[int, int]] = {}
    for i in order:
        src, what = source[i], action[i]
        if src == CUDA and (device[i], address[i]) in pool_segments:
            continue
        key = (src, device[i], address[i])
        if what == ALLOC or (src == CUDA and what == RESERVE):
            live[key] = (size[i], site[i])
        elif what == FREE or (src == CUDA and what == RELEASE):
            live.pop(key, None)
    for (src, _, _), (bytes_, where) in live.items():
        if where >= 0:
            result.at_peak[where] += bytes_
            result.at_peak_by_source[src, where] += bytes_


def _thinned(
    line: tuple[list[int], list[int], list[int]], points: int
) -> tuple[list[int], list[int], list[int]]:
    """At most ``points`` points: each bucket of consecutive events keeps its largest values
    at its first time (a peak is never thinned away)."""
    times, allocated, reserved = line
    if len(times) <= points:
        return line
    step = -(-len(times) // points)
    return (
        times[::step],
        [max(allocated[i : i + step]) for i in range(0, len(times), step)],
        [max(reserved[i : i + step]) for i in range(0, len(times), step)],
    )


class MemoryTracker:
    """Every allocation and free of the measured process (see the module docstring)."""

    def __init__(self, session: Host, kind: MetricKind) -> None:
        self.session = session
        self.kind = kind
        self.sites: list[Site] = []
        self._site_of: dict[tuple[int, tuple[int, ...]], int] = {}
        self._torch_sites: dict[tuple[tuple[str, int, str], ...], int] = {}
        self.events = Events()  # CuPy's and the CUDA records', as they come
        self.torch_events = Events()  # the latest full read of PyTorch's history
        self._lock = threading.Lock()
        self.time_ns = _epoch_ns
        self.oom_reports: list[str] = []
        self.problems: list[str] = []
        self.hooks: list[object] = []  # what memory_hooks installed (undone at finish)
        self._frame_fids: dict[tuple[str, str], list[tuple[int, int]]] = {}
        self._indexed = 0  # stanzas of the function table indexed so far

    # -- the program's path --

    def site_here(self, skip: int = 1) -> int:
        """The site of the calling thread's Python stack (pyrun's own frames left out).

        Unwound every time (each frame one lookup in the function table's cache): no frame is
        kept, since a frame kept after its function returned keeps its locals, the program's
        arrays among them, alive.
        """
        frame: FrameType | None = sys._getframe(skip)
        while frame is not None and frame.f_code.co_filename.startswith(SKIP):
            frame = frame.f_back
        functions = self.session.functions
        ips = python_frame_ips(frame, functions, functions.fid_of)
        return self._site(_thread.get_ident(), tuple(ips))

    def _site(self, ident: int, ips: tuple[int, ...]) -> int:
        key = (ident, ips)
        site = self._site_of.get(key)
        if site is None:
            with self._lock:
                site = self._site_of.get(key)
                if site is None:
                    site = self._site_of[key] = len(self.sites)
                    self.sites.append(Site(ident, ips))
        return site

    def allocated(
        self, source: int, device: int, address: int, size: int, site: int = -2, time: int = 0
    ) -> None:
        """``size`` bytes at ``address`` handed out (site -2: the caller's stack)."""
        if site == -2:
            site = self.site_here(2)
        self.events.add(time or self.time_ns(), ALLOC, source, device, address, size, site)

    def freed(self, source: int, device: int, address: int, time: int = 0) -> None:
        """The allocation at ``address`` given back."""
        self.events.add(time or self.time_ns(), FREE, source, device, address, 0, -1)

    def reserved(self, source: int, device: int, address: int, size: int, time: int = 0) -> None:
        """A pool took a segment of ``size`` bytes from the driver (a raw ``cudaMalloc``
        outside the pools: ``source`` CUDA, with the caller's site)."""
        site = self.site_here(2) if source == CUDA else -1
        self.events.add(time or self.time_ns(), RESERVE, source, device, address, size, site)

    def released(self, source: int, device: int, address: int, time: int = 0) -> None:
        """A segment given back to the driver."""
        self.events.add(time or self.time_ns(), RELEASE, source, device, address, 0, -1)

    # -- CUPTI's memory records (the monitor thread) --

    def take_cuda(
        self, records: np.ndarray, operations: list[Operation | None] | SiteOperations
    ) -> None:
        """``cudaMalloc``/``cudaFree`` of device memory (CUPTI's MEMORY2 records as ALLOC/FREE
        rows with their address), each allocation at the call path of its matched operation.
        Rows without an address (a recording made before addresses were kept) are left out."""
        rows = np.flatnonzero(
            ((records["kind"] == act.ALLOC) | (records["kind"] == act.FREE))
            & (records["memory_kind"] == DEVICE_MEMORY)
            & (records[act.ADDRESS] != 0)
        )
        for index in rows.tolist():
            row = records[index]
            device, address, time = int(row["device"]), int(row[act.ADDRESS]), int(row["start"])
            if row["kind"] == act.FREE:
                self.events.add(time, RELEASE, CUDA, device, address, 0, -1)
                continue
            operation = operations[index]
            if operation is None:
                continue
            state = operation[OP_THREAD]
            ips = _path_ips(operation[OP_CCT], operation[OP_CALL], self.session.python_lm)
            site = self._site(state.ident if state.ident >= 0 else _main_ident(), ips)
            self.events.add(time, RESERVE, CUDA, device, address, int(row["bytes"]), site)

    # -- PyTorch's history --

    def site_of_frames(self, frames: Sequence[dict[str, object]], ident: int = 0) -> int:
        """The site of PyTorch's frames (``filename``, ``line``, ``name``; innermost first),
        named by the functions pyrun saw run where it can (pyrun's own frames left out)."""
        ips: list[int] = []
        for frame in frames:
            filename, name = str(frame.get("filename", "")), str(frame.get("name", ""))
            if filename.startswith(SKIP) or filename.startswith("??"):
                continue
            line = frame.get("line", 0)
            line = line if isinstance(line, int) else 0
            ips.append(self._fid_of(filename, name, line) << 32 | line)
        return self._site(ident or _main_ident(), tuple(ips))

    def _fid_of(self, filename: str, name: str, line: int) -> int:
        """The fid of the function named ``name`` in ``filename`` that starts last at or before
        ``line`` among those pyrun registered; else a stanza of that name (first line 0)."""
        functions = self.session.functions
        stanzas = functions.stanzas
        index, count = self._frame_fids, len(stanzas)
        for stanza in stanzas[self._indexed : count]:  # those registered since the last call
            short = stanza.funcname.rpartition(".")[2] or "<module>"
            index.setdefault((stanza.filename, short), []).append((stanza.lineno, stanza.fid))
        self._indexed = count
        starts = [entry for entry in index.get((filename, name), ()) if entry[0] <= line]
        if starts:
            return max(starts)[1]
        return functions.named("" if name == "<module>" else name, filename, 0)

    def take_torch(self, snapshot: dict[str, object]) -> None:
        """Read PyTorch's allocation history (``torch.cuda.memory._snapshot()``'s dict) in
        place of what was read before (the history holds everything since it was enabled)."""
        events = Events()
        traces = snapshot.get("device_traces") or []
        assert isinstance(traces, list)
        for dev, entries in enumerate(traces):
            for entry in entries:
                what = TORCH_ACTIONS.get(entry.get("action"))
                if what is None:
                    continue
                site = -1
                if what == ALLOC:
                    frames = entry.get("frames") or ()
                    key = tuple((f.get("filename"), f.get("line"), f.get("name")) for f in frames)
                    site = self._torch_sites.get(key, -1)
                    if site < 0:
                        site = self._torch_sites[key] = self.site_of_frames(frames)
                time = int(entry.get("time_us", 0)) * 1000
                address, size = int(entry.get("addr", 0)), int(entry.get("size", 0))
                events.add(time, what, TORCH, dev, address, size, site)
        self.torch_events = events

    # -- results --

    def refresh(self) -> None:
        """Read what allocators keep themselves (PyTorch's history) up to now."""
        for hook in self.hooks:
            read = getattr(hook, "read", None)
            if callable(read):
                read()

    def replay(self) -> Replayed:
        return replay([self.torch_events, self.events], len(self.sites))

    def attribute(self, result: Replayed) -> None:
        """Each site's metrics into the CCT of its thread (the main thread's once it ended;
        a profile of its own without one). Take the session's lock."""
        session = self.session
        fallback: ThreadCCT | None = None
        for index in np.flatnonzero(result.alloc_count).tolist():
            site = self.sites[index]
            live = session.live_thread(site.ident) or session.live_thread(_main_ident())
            if live is not None:
                cct = live[0]
            else:
                if fallback is None:
                    fallback = session.open_stream(FIRST_MEMORY_THREAD)
                cct = fallback
            node = cct.path(session.python_lm, list(site.ips)) if site.ips else cct.fence
            for metric, values in enumerate(
                (result.alloc_bytes, result.alloc_count, result.peak, result.at_peak)
            ):
                value = int(values[index])
                if value:
                    cct.add(self.kind, node, metric, float(value))


#: A profile of the allocations of threads that ended before exit (beside GPU streams' 500...).
FIRST_MEMORY_THREAD = 450
TORCH_ACTIONS = {
    "alloc": ALLOC,
    "free_completed": FREE,
    "segment_alloc": RESERVE,
    "segment_free": RELEASE,
    "segment_map": RESERVE,  # expandable segments: a range mapped into one
    "segment_unmap": RELEASE,
}


#: CUpti_ActivityMemoryKind of device memory (cudaMalloc); pinned host memory and a module's
#: static memory are not the program's allocations.
DEVICE_MEMORY = 3


def _path_ips(cct: ThreadCCT, node: int, python_lm: int) -> tuple[int, ...]:
    """The Python frames of ``node``'s call path (innermost first), up to the thread's fence."""
    ips = []
    while node >= 0 and node not in (cct.fence, cct.phase, cct.root):
        if cct.lm[node] == python_lm:
            ips.append(int(cct.ip[node]))
        node = int(cct.parent[node])
    return tuple(ips)


def _epoch_ns() -> int:
    import time

    return time.time_ns()


def _main_ident() -> int:
    return threading.main_thread().ident or 0


def current() -> MemoryTracker | None:
    """The memory tracker of this process (``gpu=...,memory``), None when there is none."""
    from pyhpctk.measure import hooks

    session = hooks.current_session()
    monitor = getattr(session, "gpu", None) if session is not None else None
    tracker = getattr(getattr(monitor, "inside", None), "memory", None)
    return tracker if isinstance(tracker, MemoryTracker) else None


def output_directory(tracker: MemoryTracker) -> str:
    return os.path.join(tracker.session.options.output_dir, DIRECTORY)
