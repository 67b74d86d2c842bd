"""Recorded GPU activity: the fixture format the simulated backend replays.

A recording is what a real run saw, in the order it saw it: the GPU operations each application
thread issued (thread, correlation id, kind, call site) and the activity records the GPU
reported, in the buffers they came in. It is JSON with columnar arrays, small and diffable::

    {"format": "pyhpctk-gpu-recording", "version": 1,
     "device": {"name": ..., "sm_count": ..., ...},            # DeviceLimits
     "time_base": 1764480000000000000,                         # ns; record times are relative
     "functions": ["_Z6kernelPf", ...],                        # kernel names
     "operations": {"thread": [...], "correlation": [...], "kind": [...], "site": [...]},
     "activities": {"kind": [...], "correlation": [...], "start": [...], ...},
     "buffers": [records in buffer 0, records in buffer 1, ...],
     "clones": {"node": [...], "original": [...]},               # version 1.1, optional
     "kernel_module": true,                                      # version 1.2, optional
     "dropped": 0, "note": "how it was made"}

Version 1.1 adds CUDA graphs: an operation of kind ``"node"`` is the making of a graph node
(its ``correlation`` is the node's id, its thread and site those of the capture or add), an
operation of kind ``"graph"`` is a graph launch (answered by every activity of the launched
nodes), activities have ``graph`` and ``graph_node`` columns (CUPTI's ``graphId`` and
``graphNodeId``; left out when all are 0), and ``clones`` maps the nodes of an instantiated
graph to the nodes they were cloned from (CUPTI's ``GRAPHNODE_CLONED``).

Version 1.2 adds ``kernel_module``: when true, the simulated driver loads a module holding every
recorded kernel (:func:`~pyhpctk.measure.gpu.cubin.synthetic_cubin`) before the replay, so
kernels get their ``(gpubin, entry)`` node and their names reach the database as on a GPU
(issue #22: pyview tells communication kernels from compute by name). Older recordings replay
as before, every kernel at its ``GPUKernl`` placeholder.

Kinds are :mod:`pyhpctk.measure.gpu.activity` names ("kernel", "copy"...). Bad files raise
:class:`~pyhpctk.errors.FormatError` naming the file, the section and the problem.
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
from typing import Any

import numpy as np

from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.measure.gpu import activity as act

FORMAT_NAME = "pyhpctk-gpu-recording"
VERSION = (1, 2)
#: Activity columns a file may leave out (all 0): version 1.0 files have none of them.
_OPTIONAL = ("graph", "graph_node")
OPERATION_FIELDS = ("thread", "correlation", "kind", "site")
_TIMES = ("start", "end")


class Recording:
    """Operations and activities of one recorded run (see the module docstring)."""

    __slots__ = (
        "activities",
        "buffers",
        "clones",
        "device",
        "dropped",
        "functions",
        "kernel_module",
        "note",
        "operations",
    )

    def __init__(
        self,
        device: act.DeviceLimits,
        functions: list[str],
        operations: np.ndarray,
        activities: np.ndarray,
        buffers: list[int],
        dropped: int = 0,
        note: str = "",
        clones: dict[int, int] | None = None,
        kernel_module: bool = False,
    ) -> None:
        self.device = device
        self.functions = functions
        self.operations = operations  # OPERATION_DTYPE
        self.activities = activities  # ACTIVITY_DTYPE
        self.buffers = buffers
        self.dropped = dropped
        self.note = note
        self.clones = dict(clones or {})  # graph node of an instantiated graph → its original
        self.kernel_module = kernel_module  # replayed with a module naming every kernel (1.2)
        if sum(buffers) != len(activities):
            raise ValueError("buffer sizes do not add up to the number of activities")

    def buffer_slices(self) -> list[slice]:
        bounds = np.concatenate([[0], np.cumsum(self.buffers, dtype=np.int64)]).tolist()
        return [slice(a, b) for a, b in itertools.pairwise(bounds)]

    def threads(self) -> list[int]:
        return sorted(set(self.operations["thread"].tolist()))

    def devices(self) -> list[int]:
        return sorted(set(self.activities["device"].tolist()))

    def threads_of_device(self, device: int) -> list[int]:
        """The recorded threads whose operations ran work on ``device`` (a rank's threads)."""
        ran = self.activities["correlation"][self.activities["device"] == device]
        ops = self.operations
        issued = np.isin(ops["correlation"], ran) & (ops["kind"] != act.GRAPH_NODE)
        return sorted(set(ops["thread"][issued].tolist()))


OPERATION_DTYPE = np.dtype(
    [("thread", "<u4"), ("correlation", "<u8"), ("kind", "<u1"), ("site", "<u2")]
)


def to_json(recording: Recording) -> str:
    records = recording.activities
    base = int(records["start"].min()) if len(records) else 0
    activities: dict[str, list[int] | list[str]] = {}
    for field in act.ACTIVITY_DTYPE.names or ():
        if field in _OPTIONAL and not records[field].any():
            continue
        column = records[field].astype(np.int64)
        if field in _TIMES:
            column = column - base
        if field == "kind":
            activities[field] = [act.KIND_NAMES[int(k)] for k in records["kind"].tolist()]
        else:
            activities[field] = column.tolist()
    operations: dict[str, list[int] | list[str]] = {
        field: recording.operations[field].astype(np.int64).tolist() for field in OPERATION_FIELDS
    }
    operations["kind"] = [act.KIND_NAMES[int(k)] for k in recording.operations["kind"].tolist()]
    document = {
        "format": FORMAT_NAME,
        "version": f"{VERSION[0]}.{VERSION[1]}",
        "note": recording.note,
        "device": recording.device.as_dict(),
        "time_base": base,
        "functions": recording.functions,
        "buffers": recording.buffers,
        "dropped": recording.dropped,
        **(
            {
                "clones": {
                    "node": list(recording.clones),
                    "original": list(recording.clones.values()),
                }
            }
            if recording.clones
            else {}
        ),
        **({"kernel_module": True} if recording.kernel_module else {}),
        "operations": operations,
        "activities": activities,
    }
    return json.dumps(document, separators=(",", ":"))


def save(recording: Recording, path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write(to_json(recording))


def _column(
    path: str, section: str, table: dict[str, object], field: str, count: int
) -> list[object]:
    values = table.get(field)
    if not isinstance(values, list) or len(values) != count:
        raise FormatError(path, section, f"column {field!r} is missing or has the wrong length")
    return values


def _kinds(path: str, section: str, values: list[object]) -> np.ndarray:
    try:
        return np.array([act.KIND_BY_NAME[str(v)] for v in values], dtype=np.uint8)
    except KeyError as error:
        raise FormatError(path, section, f"unknown kind {error.args[0]!r}") from None


def json_document(text: str | bytes, path: str, format_name: str) -> dict[str, Any]:
    """A recording's JSON object whose ``format`` is ``format_name`` (else FormatError)."""
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise FormatError(path, "json", str(error)) from None
    if not isinstance(document, dict) or document.get("format") != format_name:
        raise FormatError(path, "header", f"not a {format_name} file")
    return document


def loads(text: str | bytes, path: str = "<recording>") -> Recording:
    """Parse a recording; bad input raises :class:`FormatError`."""
    document = json_document(text, path, FORMAT_NAME)
    try:
        major, minor = (int(part) for part in str(document.get("version", "")).split("."))
    except ValueError:
        raise FormatError(path, "header", "bad version") from None
    if major != VERSION[0]:
        raise FormatError(path, "header", f"version {major}.{minor} is not supported")
    if minor > VERSION[1]:
        warnings.warn(f"{path}: recording version {major}.{minor} is newer", FormatWarning, 2)
    try:
        functions = [str(name) for name in document["functions"]]
        buffers = [int(size) for size in document["buffers"]]
        device = act.DeviceLimits.from_dict(dict(document["device"]))
        base = int(document["time_base"])
        op_table = dict(document["operations"])
        table = dict(document["activities"])
        clone_table = dict(document.get("clones", {}))
        clones = dict(
            zip(
                (int(n) for n in clone_table.get("node", [])),
                (int(n) for n in clone_table.get("original", [])),
                strict=True,
            )
        )
    except (KeyError, TypeError, ValueError) as error:
        raise FormatError(path, "header", f"missing or malformed field {error}") from None
    n_ops = len(op_table.get("correlation", []))
    operations = np.zeros(n_ops, dtype=OPERATION_DTYPE)
    for field in OPERATION_FIELDS:
        column = _column(path, "operations", op_table, field, n_ops)
        operations[field] = _kinds(path, "operations", column) if field == "kind" else column
    count = len(table.get("correlation", []))
    activities = act.empty_activities(count)
    try:
        for field in act.ACTIVITY_DTYPE.names or ():
            if field in _OPTIONAL and field not in table:
                continue
            column = _column(path, "activities", table, field, count)
            if field == "kind":
                activities[field] = _kinds(path, "activities", column)
            elif field in _TIMES:
                activities[field] = np.asarray(column, dtype=np.int64) + base
            else:
                activities[field] = column
    except (OverflowError, ValueError, TypeError) as error:
        raise FormatError(path, "activities", str(error)) from None
    if sum(buffers) != count:
        raise FormatError(path, "buffers", "buffer sizes do not add up to the activity count")
    bad = activities["function"] >= len(functions)
    if bad.any():
        raise FormatError(path, "activities", "function index outside the function table")
    return Recording(
        device,
        functions,
        operations,
        activities,
        buffers,
        int(document.get("dropped", 0)),
        str(document.get("note", "")),
        clones,
        bool(document.get("kernel_module", False)),
    )


def load(path: str | os.PathLike[str]) -> Recording:
    with open(path, "rb") as stream:
        return loads(stream.read(), os.fspath(path))
