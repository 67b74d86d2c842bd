"""The files GPU memory tracking writes (:mod:`.memory`): the timeline and largest sites
(``gpumem/memory-PID.json``, :mod:`pyhpctk.formats.gpu_memory`), and the out-of-memory report
(``gpumem/oom-PID-N.txt``), written the moment the allocator fails, before the program can die
of the exception; and pyrun's lines about them at exit.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator

import numpy as np

from pyhpctk.formats import gpu_memory
from pyhpctk.measure.gpu.memory import (
    SOURCE_NAMES,
    TOP_SITES,
    MemoryTracker,
    Replayed,
    output_directory,
)

NO_FRAMES = "<no Python frames> (a thread of the runtime)"


def site_frames(tracker: MemoryTracker, site: int) -> list[str]:
    """A site's stack, innermost first, as ``function (file:line)`` ([]: a thread without
    Python frames, such as PyTorch's autograd threads)."""
    stanzas = tracker.session.functions.stanzas
    frames = []
    for ip in tracker.sites[site].ips:
        fid, line = ip >> 32, ip & 0xFFFFFFFF
        stanza = stanzas[fid - 1] if 0 < fid <= len(stanzas) else None
        if stanza is None:
            frames.append(f"<unknown> (line {line})")
        else:
            frames.append(f"{stanza.funcname or '<module>'} ({stanza.filename}:{line})")
    return frames


def _top(tracker: MemoryTracker, values: np.ndarray, result: Replayed) -> list[dict[str, object]]:
    order = np.argsort(-values, kind="stable")[:TOP_SITES]

    def sources(i: int) -> list[int]:
        return [bit for bit in range(len(SOURCE_NAMES)) if int(result.sources[i]) >> bit & 1]

    return [
        {
            "at_peak": int(result.at_peak[i]),
            "at_peak_by_source": {
                SOURCE_NAMES[bit]: int(result.at_peak_by_source[bit, i]) for bit in sources(i)
            },
            "peak": int(result.peak[i]),
            "allocated": int(result.alloc_bytes[i]),
            "count": int(result.alloc_count[i]),
            "live": int(result.live[i]),
            "sources": [SOURCE_NAMES[bit] for bit in sources(i)],
            "stack": site_frames(tracker, int(i)),
        }
        for i in order.tolist()
        if values[i] > 0
    ]


def write_timeline(tracker: MemoryTracker, result: Replayed) -> str:
    """``gpumem/memory-PID.json``: the peak, the timelines per device, the largest sites."""
    sources = sorted({SOURCE_NAMES[row[2]] for part in (tracker.events, tracker.torch_events)
                      for row in part.rows})  # fmt: skip
    data = gpu_memory.MemoryFile(
        pid=os.getpid(),
        sources=sources,
        peak_bytes=result.peak_bytes,
        peak_time_ns=result.peak_time,
        source_peaks={
            name: peak for name, peak in zip(SOURCE_NAMES, result.source_peaks, strict=True) if peak
        },
        devices=[
            gpu_memory.DeviceTimeline(device, *line)
            for device, line in sorted(result.timelines.items())
        ],
        top_sites=_top(tracker, result.at_peak, result),
        oom_reports=[os.path.basename(path) for path in tracker.oom_reports],
    )
    pid = os.getpid()
    names = (f"memory-{pid}{'' if n == 1 else f'-{n}'}.json" for n in itertools.count(1))
    path = claim(output_directory(tracker), names)
    try:
        gpu_memory.write(data, path)
    except OSError:
        os.unlink(path)  # the claimed name, empty: no damaged file left
        raise
    return path


def claim(directory: str, names: Iterator[str]) -> str:
    """The first of ``names`` in ``directory`` no file holds, created empty (``O_EXCL``): a
    process that ``exec``'d under the same pid never overwrites what the one before it wrote."""
    os.makedirs(directory, exist_ok=True)
    for name in names:
        path = os.path.join(directory, name)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            continue
        return path
    raise OSError(f"{directory}: no free name")


def _size(value: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value} B"


def write_oom_report(tracker: MemoryTracker, device: int, requested: int, message: str) -> str:
    """``gpumem/oom-PID-N.txt``: what was live when the allocator failed, by site."""
    result = tracker.replay()
    live = result.live
    total = int(live.sum())
    lines = [
        f"out of memory on device {device}: {_size(requested)} asked for"
        + (f" ({requested} bytes)" if requested else ""),
    ]
    if message:
        lines.append("error: " + " ".join(message.split())[:500])
    lines += [
        f"live when it failed: {_size(total)} ({total} bytes) in"
        f" {int(np.count_nonzero(live))} allocation sites (all devices);"
        f" the process's peak so far: {_size(result.peak_bytes)}",
    ]
    for number, (allocated, reserved) in sorted(result.final.items()):
        lines.append(  # reserved far above allocated: the pool's blocks are fragmented
            f"device {number}: {_size(allocated)} allocated, {_size(reserved)} reserved"
            " by the allocators"
        )
    lines += [
        "",
        "sites by live bytes (innermost frame first):",
    ]
    for rank, index in enumerate(np.argsort(-live, kind="stable").tolist(), 1):
        if live[index] <= 0:
            break
        share = 100.0 * int(live[index]) / total if total else 0.0
        lines.append(
            f"{rank:3d}. {_size(int(live[index]))} live ({int(live[index])} bytes, {share:.1f} %),"
            f" {_size(int(result.alloc_bytes[index]))} allocated here in"
            f" {int(result.alloc_count[index])} allocations"
        )
        lines += [f"       {frame}" for frame in site_frames(tracker, index) or [NO_FRAMES]]
    pid = os.getpid()
    path = claim(output_directory(tracker), (f"oom-{pid}-{n}.txt" for n in itertools.count(1)))
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(path + ".tmp", path)
    return path


def out_of_memory(tracker: MemoryTracker, device: int, requested: int, message: str = "") -> str:
    """Write what is live now, by site with stacks (``gpumem/oom-PID-N.txt``); its path ('' when
    it cannot be written: said at exit). Said at once on stderr too: the process may not
    reach its exit."""
    try:
        tracker.refresh()
        path = write_oom_report(tracker, device, requested, message)
    except Exception as error:  # never in the program's way: said at exit
        tracker.problems.append(
            f"pyrun: gpu memory: cannot write the out-of-memory report: {error}"
        )
        return ""
    tracker.oom_reports.append(path)
    sys.stderr.write(
        f"pyrun: gpu memory: out of memory on device {device}: what was live and where it"
        f" came from: {path}\n"
    )
    return path


def summary(tracker: MemoryTracker, result: Replayed) -> list[str]:
    """pyrun's lines at exit: the peak, and each out-of-memory report's path."""
    lines = []
    if result.events:
        lines.append(
            f"pyrun: gpu memory: peak {_size(result.peak_bytes)} allocated"
            f" ({result.events} allocator events; timeline in {output_directory(tracker)})"
        )
    if result.unknown_frees:
        lines.append(
            f"pyrun: gpu memory: {result.unknown_frees} frees of memory allocated before"
            " tracking began (left out)"
        )
    lines += [f"pyrun: gpu memory: out-of-memory report: {path}" for path in tracker.oom_reports]
    return lines
