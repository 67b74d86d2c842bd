"""GPU memory timelines (``pyrun -e gpu=...,memory``, :mod:`pyhpctk.formats.gpu_memory`) for the
trace export and the HTML report: a counter track per device (allocated and reserved bytes) in
Perfetto, and the peak, a small plot and the largest sites in the report.
"""

from __future__ import annotations

import html
import warnings
from pathlib import Path
from typing import Any

from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import gpu_memory

#: The Perfetto process that holds the memory counters (after CPU threads and GPU streams).
MEMORY_PID = 1000


def timelines(database: str) -> list[gpu_memory.MemoryFile]:
    """The database's memory files (none: []); a damaged one is a warning, and left out."""
    files = []
    for path in gpu_memory.paths(Path(database)):
        try:
            files.append(gpu_memory.read(path))
        except FormatError as error:
            warnings.warn(f"{error}: this GPU memory timeline is left out", FormatWarning, 2)
    return files


def first_time(files: list[gpu_memory.MemoryFile]) -> int | None:
    starts = [line.time_ns[0] for data in files for line in data.devices if line.time_ns]
    return min(starts) if starts else None


def counter_events(files: list[gpu_memory.MemoryFile], origin: int) -> list[dict[str, Any]]:
    """Chrome trace counter events (``ph: C``), one track per process and device, in bytes."""
    events: list[dict[str, Any]] = []
    if not any(data.devices for data in files):
        return events
    events.append(
        {"ph": "M", "name": "process_name", "pid": MEMORY_PID, "tid": 0,
         "args": {"name": "GPU memory"}}
    )  # fmt: skip
    for data in files:
        for line in data.devices:
            name = f"GPU {line.device} memory (pid {data.pid})"
            for time, allocated, reserved in zip(
                line.time_ns, line.allocated, line.reserved, strict=True
            ):
                events.append(
                    {
                        "ph": "C",
                        "pid": MEMORY_PID,
                        "name": name,
                        "ts": (time - origin) / 1000.0,
                        "args": {"allocated": allocated, "reserved": reserved},
                    }
                )
    return events


def _size(value: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value} B"


def _split(site: dict[str, object]) -> str:
    """A site's bytes at the peak by allocator, where it went through more than one."""
    split = site.get("at_peak_by_source")
    if not isinstance(split, dict) or len(split) < 2:
        return ""
    return "<br>(" + ", ".join(f"{name} {_size(int(value))}" for name, value in split.items()) + ")"


def _plot(line: gpu_memory.DeviceTimeline, width: int = 600, height: int = 120) -> str:
    """An inline SVG of allocated (filled) and reserved (line) bytes over time."""
    times, top = line.time_ns, max(max(line.reserved, default=0), max(line.allocated, default=0))
    if len(times) < 2 or top <= 0:
        return ""
    span = max(times[-1] - times[0], 1)

    def points(values: list[int]) -> str:
        return " ".join(
            f"{(t - times[0]) * width / span:.1f},{height - v * height / top:.1f}"
            for t, v in zip(times, values, strict=True)
        )

    return (
        f'<svg class="memplot" width="{width}" height="{height}" role="img">'
        f'<polyline fill="none" stroke="#888" points="{points(line.reserved)}"/>'
        f'<polyline fill="none" stroke="#c33" points="{points(line.allocated)}"/></svg>'
    )


def report_section(files: list[gpu_memory.MemoryFile]) -> str:
    """The HTML report's "GPU memory" section ('' without memory files)."""
    if not files:
        return ""
    parts = ['<section id="gpu-memory"><h2>GPU memory</h2>']
    for data in files:
        parts.append(
            f"<p>Process {data.pid}: peak {_size(data.peak_bytes)} allocated"
            f" ({', '.join(data.sources) or 'no allocator'}).</p>"
        )
        for line in data.devices:
            parts.append(
                f"<h3>Device {line.device}: allocated (red) and reserved (grey), up to"
                f" {_size(max(line.reserved + line.allocated, default=0))}</h3>{_plot(line)}"
            )
        if data.top_sites:
            parts.append(
                "<table><tr><th>live at peak</th><th>peak live</th><th>allocated</th>"
                "<th>where (innermost first)</th></tr>"
            )
            for site in data.top_sites:
                stack = site.get("stack")
                frames = stack[:6] if isinstance(stack, list) else []
                where = (
                    "<br>".join(html.escape(str(frame)) for frame in frames) or "(no Python frames)"
                )
                parts.append(
                    f"<tr><td>{_size(int(site.get('at_peak', 0)))}{_split(site)}</td>"  # type: ignore[call-overload]
                    f"<td>{_size(int(site.get('peak', 0)))}</td>"  # type: ignore[call-overload]
                    f"<td>{_size(int(site.get('allocated', 0)))}</td><td>{where}</td></tr>"  # type: ignore[call-overload]
                )
            parts.append("</table>")
        for name in data.oom_reports:
            parts.append(f"<p>Out-of-memory report: <code>gpumem/{html.escape(name)}</code></p>")
    parts.append("</section>")
    return "".join(parts)
