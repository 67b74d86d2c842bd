"""Trace recordings: raw buffers of traced launches, kept to be replayed without a GPU.

A recording is one ``.npz`` file (numpy's zip of arrays, read with ``allow_pickle=False``):
``meta``, UTF-8 JSON bytes — the format's name and version, the kernel, the strategy, how its
sites were chosen (``sites``, ``lines``), the device, and per launch its shape, lost events,
chunk size and chunks taken — and per launch ``raw_N`` (the event buffer as the device left
it), with ``table_N`` and ``counted_N`` for the exact strategy. It also holds the kernel's PTX
before tracing (``ptx``), so the plan, and with it each site's block and source line, is
rebuilt by tracing it again (the pass is deterministic). The device script
(``tests/data/gpu/traces_device.py``) writes them; ``pyrun -e gpu=simulated,traces=FILE`` and
the tests read them.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pyhpctk.errors import FormatError
from pyhpctk.instrument.ptx.errors import PtxError
from pyhpctk.instrument.ptx.sites import Sites, line_filter
from pyhpctk.instrument.ptx.traces import Strategy, TracePlan, instrument_traces
from pyhpctk.instrument.tracing.buffers import dim3
from pyhpctk.instrument.tracing.launcher import LaunchTrace

FORMAT = "pyhpctk-warp-traces"
VERSION = 1


@dataclass
class TraceRecording:
    """Traced launches of one kernel, and what is needed to read them."""

    kernel: str
    ptx: str
    strategy: Strategy
    sites: Sites = Sites.BLOCKS
    lines: tuple[str, ...] = ()
    launches: list[LaunchTrace] = field(default_factory=list)
    device: dict[str, Any] = field(default_factory=dict)  # name, sm_count, clock_khz, ...

    def plan(self) -> TracePlan:
        """The kernel's trace plan, rebuilt from its PTX."""
        lines = line_filter(self.lines) if self.sites is Sites.LINES else None
        traced = instrument_traces(self.ptx, self.strategy, self.sites, lines, {self.kernel})
        return traced.plans[self.kernel]


def save(recording: TraceRecording, path: str | Path) -> None:
    """Write ``recording`` to ``path`` (an ``.npz``)."""
    arrays: dict[str, np.ndarray] = {}
    launches = []
    for n, launch in enumerate(recording.launches):
        arrays[f"raw_{n}"] = np.asarray(launch.raw, dtype=np.uint8)
        if launch.table is not None:
            arrays[f"table_{n}"] = np.asarray(launch.table, dtype=np.uint32)
        if launch.counted is not None:
            arrays[f"counted_{n}"] = np.asarray(launch.counted, dtype=np.uint32)
        launches.append({"grid": list(launch.grid), "block": list(launch.block),
                         "lost": launch.lost, "chunk_events": launch.chunk_events,
                         "taken": launch.taken, "saved_bytes": launch.saved_bytes,
                         "extra": launch.extra})  # fmt: skip
    meta = {"format": FORMAT, "version": VERSION, "kernel": recording.kernel,
            "strategy": recording.strategy.value, "sites": recording.sites.value,
            "lines": list(recording.lines), "device": recording.device,
            "launches": launches}  # fmt: skip
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    arrays["ptx"] = np.frombuffer(recording.ptx.encode(), dtype=np.uint8)
    with open(path, "wb") as out:
        np.savez_compressed(out, **arrays)  # type: ignore[arg-type]


def _launch(
    n: int, item: dict[str, Any], data: Any, strategy: Strategy, kernel: str
) -> LaunchTrace:
    table = data[f"table_{n}"] if f"table_{n}" in data.files else None
    counted = data[f"counted_{n}"] if f"counted_{n}" in data.files else None
    if strategy is Strategy.EXACT and table is None:
        raise ValueError(f"launch {n} of the exact strategy has no table")
    return LaunchTrace(kernel, strategy, dim3(item["grid"]), dim3(item["block"]),
                       np.asarray(data[f"raw_{n}"], dtype=np.uint8), int(item["lost"]), table,
                       counted, int(item["chunk_events"]), int(item["taken"]),
                       int(item.get("saved_bytes", 0)),
                       {str(k): float(v) for k, v in item.get("extra", {}).items()})  # fmt: skip


def load(path: str | Path) -> TraceRecording:
    """Read a recording; a :class:`FormatError` (one line) when it is none or is damaged."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            if meta.get("format") != FORMAT or meta.get("version") != VERSION:
                raise ValueError(f"not a {FORMAT} {VERSION} recording")
            strategy = Strategy(meta["strategy"])
            kernel = str(meta["kernel"])
            launches = [_launch(n, item, data, strategy, kernel)
                        for n, item in enumerate(meta["launches"])]  # fmt: skip
            recording = TraceRecording(kernel, bytes(data["ptx"]).decode(), strategy,
                                       Sites(meta["sites"]), tuple(meta["lines"]), launches,
                                       dict(meta["device"]))  # fmt: skip
        recording.plan()  # the PTX must still trace
        for launch in recording.launches:
            launch.decode()
        return recording
    except OSError as error:
        raise FormatError(str(path), "warp trace recording", f"cannot read: {error}") from None
    except (KeyError, ValueError, TypeError, zipfile.BadZipFile, io.UnsupportedOperation,
            json.JSONDecodeError, UnicodeDecodeError, PtxError) as error:  # fmt: skip
        raise FormatError(str(path), "warp trace recording", f"bad content: {error}") from None
