"""Recorded block counters: what ``gpu=simulated,blocks=RECORDING`` replays (issue #34).

A recording holds the PTX of each instrumented module as its framework produced it (before
instrumenting), the probe mode, and the counter buffer each launch left, in launch order. It is
JSON, small and diffable::

    {"format": "pyhpctk-block-counts", "version": "1.0", "note": "how it was made",
     "mode": "edges",                                  # or "blocks" (gpu=nvidia,blocks=warps)
     "modules": [{"framework": "triton", "ptx": "...", "kernels": ["bfs"]}],
     "launches": [{"module": 0, "kernel": "bfs", "counters": [w0, t0, w1, t1, ...],
                   "ns": 18432, "threads": 128, "registers": 40}]}

``counters`` are the kernel's counter buffer as read after the launch, two unsigned 64-bit
words per counter (warps, then threads): the plan of ``instrument(ptx, mode, kernels)`` says
which edge or block each counts, so the same PTX and mode give the same plan on any machine.
``ns`` (the launch's time), ``threads`` (a block's) and ``registers`` (a thread's, in the
instrumented kernel) are optional. ``tests/data/gpu/blocks_device.py`` records them on a
GPU. Bad files raise :class:`~pyhpctk.errors.FormatError` naming the file, the part and the
problem.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.errors import FormatError
from pyhpctk.instrument.ptx import Buffer, Instrumented, Mode, PtxError, instrument
from pyhpctk.measure.gpu.simulated.recording import json_document

FORMAT_NAME = "pyhpctk-block-counts"
OPTIONAL = ("ns", "threads", "registers")  # a launch's fields that may be left out
VERSION = (1, 0)


@dataclass(frozen=True)
class RecordedModule:
    framework: str
    ptx: str
    kernels: tuple[str, ...]


@dataclass(frozen=True)
class RecordedLaunch:
    module: int
    kernel: str
    counters: np.ndarray  # (counters, 2) uint64
    ns: int = 0
    threads: int = 0  # threads a block (0: not recorded)
    registers: int = 0  # registers a thread of the instrumented kernel (0: not recorded)


@dataclass
class BlockRecording:
    """Modules and launches of one recorded run (module docstring)."""

    mode: Mode
    modules: list[RecordedModule]
    launches: list[RecordedLaunch]
    note: str = ""
    instrumented: list[Instrumented | None] = field(default_factory=list)

    def instrument(self, kernels: re.Pattern[str] | None = None) -> None:
        """Each module instrumented as it was recorded (only the kernels ``kernels`` matches;
        None where none does)."""
        self.instrumented = []
        for module in self.modules:
            chosen = {k for k in module.kernels if kernels is None or kernels.search(k)}
            done = instrument(module.ptx, self.mode, chosen, Buffer.GLOBAL) if chosen else None
            self.instrumented.append(done)


def to_json(recording: BlockRecording) -> str:
    document = {
        "format": FORMAT_NAME,
        "version": f"{VERSION[0]}.{VERSION[1]}",
        "note": recording.note,
        "mode": recording.mode.value,
        "modules": [
            {"framework": m.framework, "ptx": m.ptx, "kernels": list(m.kernels)}
            for m in recording.modules
        ],
        "launches": [
            {
                "module": launch.module,
                "kernel": launch.kernel,
                "counters": [int(v) for v in np.asarray(launch.counters).reshape(-1).tolist()],
                **{key: value for key in OPTIONAL if (value := getattr(launch, key))},
            }
            for launch in recording.launches
        ],
    }
    return json.dumps(document, indent=None, separators=(",", ":"))


def save(recording: BlockRecording, path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write(to_json(recording))


def _launch(path: str, number: int, item: object, modules: int) -> RecordedLaunch:
    where = f"launch {number}"
    if not isinstance(item, dict):
        raise FormatError(path, where, "not an object")
    try:
        module, kernel = int(item["module"]), str(item["kernel"])
        counters = np.array([int(v) for v in item["counters"]], dtype=np.uint64)
        ns, threads, registers = (max(int(item.get(key, 0)), 0) for key in OPTIONAL)
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise FormatError(path, where, f"missing or malformed field {error}") from None
    if not 0 <= module < modules:
        raise FormatError(path, where, f"module {module} is not one of the {modules} recorded")
    if len(counters) % 2:
        raise FormatError(path, where, "counters are not pairs (warps, threads)")
    return RecordedLaunch(module, kernel, counters.reshape(-1, 2), ns, threads, registers)


def loads(text: str | bytes, path: str = "<recording>") -> BlockRecording:
    """Parse a recording and instrument its modules; bad input raises :class:`FormatError`."""
    document = json_document(text, path, FORMAT_NAME)
    version = str(document.get("version", ""))
    if not version.startswith(f"{VERSION[0]}."):
        raise FormatError(path, "header", f"version {version!r} is not supported")
    try:
        mode = Mode(document["mode"])
        modules = [
            RecordedModule(str(m["framework"]), str(m["ptx"]), tuple(str(k) for k in m["kernels"]))
            for m in document["modules"]
        ]
        items = list(document["launches"])
    except (KeyError, TypeError, ValueError) as error:
        raise FormatError(path, "header", f"missing or malformed field {error}") from None
    launches = [_launch(path, i, item, len(modules)) for i, item in enumerate(items)]
    recording = BlockRecording(mode, modules, launches, str(document.get("note", "")))
    try:
        recording.instrument()
    except PtxError as error:
        raise FormatError(path, "modules", f"the PTX pass refuses a module: {error}") from None
    for number, launch in enumerate(launches):
        done = recording.instrumented[launch.module]
        plan = done.plans.get(launch.kernel) if done is not None else None
        if plan is None:
            raise FormatError(path, f"launch {number}", f"module {launch.module} has no "
                                                       f"kernel {launch.kernel!r}")  # fmt: skip
        if len(launch.counters) != plan.counters:
            raise FormatError(
                path,
                f"launch {number}",
                f"{len(launch.counters)} counters for {launch.kernel}, whose plan has "
                f"{plan.counters} in {mode.value} mode",
            )
    return recording


def load(path: str | os.PathLike[str]) -> BlockRecording:
    with open(path, "rb") as stream:
        return loads(stream.read(), os.fspath(path))
