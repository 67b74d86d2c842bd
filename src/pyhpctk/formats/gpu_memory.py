"""The GPU memory file (docs/formats.md, "GPU memory"): ``gpumem/memory-PID.json``.

pyrun writes one per measured process with ``-e gpu=...,memory`` (:mod:`pyhpctk.measure.gpu.
memory`); pyprof copies the measurement's ``gpumem/`` into the database; ``pyview``'s trace
export and HTML report read it. JSON: ``format`` (``"pyhpctk gpu memory"``), ``version`` (1),
``pid``, ``sources`` (``torch``, ``cupy``, ``cuda``), ``peak_bytes`` and ``peak_time_ns`` (the
process's most allocated bytes at once, all devices, and when, epoch ns), ``source_peaks``
(each allocator's own peak, by source name), ``devices`` (each ``device``, ``time_ns``,
``allocated``, ``reserved``: equal-length lists, the bytes from each time on), ``top_sites`` (at
most 20, by bytes live at the peak: ``at_peak``, ``at_peak_by_source`` (``at_peak`` by source
name), ``peak``, ``allocated``, ``count``, ``live`` (at exit), ``sources`` (the allocators it
went through), ``stack``: ``function (file:line)`` innermost first, empty for a thread without
Python frames) and ``oom_reports`` (file names beside it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from pyhpctk.errors import FormatError

FORMAT = "pyhpctk gpu memory"
VERSION = 1
DIRECTORY = "gpumem"


@dataclass
class DeviceTimeline:
    """Allocated and reserved bytes of one device, each from its time on."""

    device: int
    time_ns: list[int]
    allocated: list[int]
    reserved: list[int]


@dataclass
class MemoryFile:
    pid: int
    sources: list[str]
    peak_bytes: int
    peak_time_ns: int
    source_peaks: dict[str, int] = field(default_factory=dict)
    devices: list[DeviceTimeline] = field(default_factory=list)
    top_sites: list[dict[str, object]] = field(default_factory=list)
    oom_reports: list[str] = field(default_factory=list)


def write(data: MemoryFile, path: str) -> None:
    """Write ``data`` (through a temporary file: never half a file)."""
    body = {
        "format": FORMAT,
        "version": VERSION,
        "pid": data.pid,
        "sources": data.sources,
        "peak_bytes": data.peak_bytes,
        "peak_time_ns": data.peak_time_ns,
        "source_peaks": data.source_peaks,
        "devices": [vars(line) for line in data.devices],
        "top_sites": data.top_sites,
        "oom_reports": data.oom_reports,
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(body, out, separators=(",", ":"))
        out.write("\n")
    os.replace(path + ".tmp", path)


def _ints(path: Path, where: str, value: object) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise FormatError(path, where, "not a list of integers")
    return value


def read(path: Path) -> MemoryFile:
    """Read one file; a FormatError names what is wrong."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise FormatError(path, "file", str(error)) from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise FormatError(path, "format", f"not a {FORMAT} file")
    if body.get("version") != VERSION:
        raise FormatError(path, "version", f"version {body.get('version')!r}, expected {VERSION}")
    devices = []
    for number, line in enumerate(body.get("devices") or []):
        where = f"devices[{number}]"
        if not isinstance(line, dict) or not isinstance(line.get("device"), int):
            raise FormatError(path, where, "not a device timeline")
        columns = [_ints(path, f"{where}.{name}", line.get(name))
                   for name in ("time_ns", "allocated", "reserved")]  # fmt: skip
        if len({len(column) for column in columns}) != 1:
            raise FormatError(path, where, "time_ns, allocated and reserved differ in length")
        devices.append(DeviceTimeline(line["device"], *columns))
    return MemoryFile(
        pid=int(body.get("pid", 0)),
        sources=list(body.get("sources") or []),
        peak_bytes=int(body.get("peak_bytes", 0)),
        peak_time_ns=int(body.get("peak_time_ns", 0)),
        source_peaks={str(k): int(v) for k, v in (body.get("source_peaks") or {}).items()},
        devices=devices,
        top_sites=list(body.get("top_sites") or []),
        oom_reports=list(body.get("oom_reports") or []),
    )


def paths(directory: Path) -> list[Path]:
    """The ``memory-*.json`` files of a measurement's or database's ``gpumem/`` (none: [])."""
    folder = directory / DIRECTORY
    return sorted(folder.glob("memory-*.json")) if folder.is_dir() else []


def read_all(directory: Path) -> list[MemoryFile]:
    """Every memory file of ``directory`` (a damaged one raises its FormatError)."""
    return [read(path) for path in paths(directory)]
