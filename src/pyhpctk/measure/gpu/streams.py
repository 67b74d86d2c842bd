"""Per-GPU-stream profiles and traces, written as hpcrun writes them.

hpcrun writes each GPU stream as its own "thread" (formats.md §0.1, §1.3, §1.5, §1.8, §2):

- thread ids from 500, in the order streams are first seen;
- id tuple ``NODE / GPUDEVICE(device) / [RANK] / GPUCONTEXT(ctx) / GPUSTREAM(stream)``, the last
  three LOGIC_ONLY. hpcrun 2024's ``gpu_compute_profile_name`` leaves GPUDEVICE out (its line is
  ``#if 0``) and tells devices apart only by CUPTI's context ids, which no view can turn back
  into a device; pyrun writes it where hpcrun's disabled line and hpcprof's converter of
  version-2 profiles put it, after NODE and before RANK (docs/gpu.md, "Several devices");
- a CCT holding ``NoActvty`` under the root and, under a copy of each launching thread's calling
  context, the trace placeholders (``GPUTrace → gpubin@entry`` for kernels); no metric values;
- a ``.hpctrace`` with the call-trace flag (0x4) whose records alternate between an operation's
  node at its start and ``NoActvty`` at its end;
- header nv-pair ``trace-disorder`` non-zero when records arrived out of time order (activity
  buffers from several engines can complete out of order); pyprof sorts them.

The bytes come from :mod:`pyhpctk.measure.encode` (the same encoder the session uses) with an
identity that says "GPU stream" instead of "thread".
"""

from __future__ import annotations

import os
import struct

import numpy as np

from pyhpctk.formats.hpcrun_constants import (
    INTERP_LOGIC_LOCAL,
    INTERP_LOGIC_ONLY,
    KIND_GPUCONTEXT,
    KIND_GPUDEVICE,
    KIND_GPUSTREAM,
    KIND_NODE,
    KIND_RANK,
    TRACE_FLAG_CALL_TRACE,
)
from pyhpctk.measure import naming
from pyhpctk.measure.cct import THREAD_FENCE, ThreadCCT
from pyhpctk.measure.encode import TRACE_HEADER_PREFIX, ProfileIdentity, encode_profile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pyhpctk.measure.cct import MetricKind
    from pyhpctk.measure.extension import Host
    from pyhpctk.measure.gpu.channels import SpscChannel

_TRACE_RECORD = np.dtype([("time", ">u8"), ("node_id", ">u4")])
assert _TRACE_RECORD.itemsize == 12


class StreamIdentity(ProfileIdentity):
    """A GPU stream's identity: thread number 500+, device, context and stream in the id tuple."""

    __slots__ = ("context", "device", "disorder", "stream")

    def __init__(
        self, base: ProfileIdentity, context: int, stream: int, disorder: int, device: int = 0
    ) -> None:
        super().__init__(
            base.program_name,
            base.program_path,
            base.env_path,
            base.job_id,
            base.mpi_rank,
            base.thread,
            base.host_id,
            base.pid,
        )
        self.device = device
        self.context = context
        self.stream = stream
        self.disorder = disorder

    def nvpairs(self, trace_min: int, trace_max: int) -> list[tuple[str, str]]:
        pairs = super().nvpairs(trace_min, trace_max)
        return [
            (name, str(self.disorder) if name == "trace-disorder" else value)
            for name, value in pairs
        ]

    def id_tuple(self) -> list[tuple[int, int, int]]:
        """formats.md §1.8: NODE, GPUDEVICE, optional RANK, GPUCONTEXT, GPUSTREAM."""
        elements = [((INTERP_LOGIC_LOCAL << 14) | KIND_NODE, self.host_id, 0)]
        elements.append(((INTERP_LOGIC_ONLY << 14) | KIND_GPUDEVICE, self.device, self.device))
        if self.mpi_rank is not None:
            elements.append(((INTERP_LOGIC_ONLY << 14) | KIND_RANK, self.mpi_rank, self.mpi_rank))
        elements.append(((INTERP_LOGIC_ONLY << 14) | KIND_GPUCONTEXT, self.context, self.context))
        elements.append(((INTERP_LOGIC_ONLY << 14) | KIND_GPUSTREAM, self.stream, self.stream))
        return elements


class StreamTrace:
    """One GPU stream: its CCT, its trace channel and the trace records written so far."""

    __slots__ = ("_copied", "cct", "channel", "ends", "key", "nodes", "number", "starts", "stem")

    def __init__(
        self, number: int, key: tuple[int, int, int], cct: ThreadCCT, channel: SpscChannel[Any]
    ) -> None:
        self.number = number
        self.key = key  # (device, context, stream)
        self.cct = cct
        self.channel = channel
        self.starts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.nodes: list[np.ndarray] = []
        self._copied: dict[tuple[int, int], int] = {}
        self.stem = ""

    def copy_path(self, source: ThreadCCT, node: int, main: bool) -> int:
        """The node in this stream's CCT for ``source``'s call path ending at ``node``."""
        return copy_call_path(self.cct, self._copied, source, node, main)

    def record(self, starts: np.ndarray, ends: np.ndarray, nodes: list[int]) -> None:
        self.starts.append(np.asarray(starts, dtype=np.uint64))
        self.ends.append(np.asarray(ends, dtype=np.uint64))
        self.nodes.append(np.asarray(nodes, dtype=np.int64))

    def records(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(times, node indices, disorder): start/NoActvty pairs in arrival order.

        ``disorder`` is the largest number of positions by which a record follows the first
        record later than it (0 when the trace is sorted): pyprof sorts within that window.
        """
        if not self.starts:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64), 0
        self.cct.retain(self.cct.no_activity)  # every operation's end points at NoActvty
        starts = np.concatenate(self.starts)
        ends = np.concatenate(self.ends)
        nodes = np.concatenate(self.nodes)
        times = np.empty(2 * len(starts), dtype=np.uint64)
        times[0::2] = starts
        times[1::2] = np.maximum(ends, starts)
        which = np.empty(2 * len(starts), dtype=np.int64)
        which[0::2] = nodes
        which[1::2] = self.cct.no_activity
        # A record may be preceded by later records up to `disorder` positions back: for each
        # record, the first earlier position holding a later time (prefix maxima are sorted).
        latest = np.maximum.accumulate(times)
        first_later = np.searchsorted(latest, times, side="right")
        back = np.arange(len(times)) - first_later
        disorder = int(back.max()) if len(back) and back.max() > 0 else 0
        return times, which, disorder


def copy_call_path(
    cct: ThreadCCT, copied: dict[tuple[int, int], int], source: ThreadCCT, node: int, main: bool
) -> int:
    """The node in ``cct`` for ``source``'s call path ending at ``node`` (below ``cct``'s main
    fence for the main thread's, else below a thread fence); ``copied`` remembers the answers."""
    key = (id(source), node)
    found = copied.get(key)
    if found is not None:
        return found
    path: list[tuple[int, int]] = []
    walk = node
    parent = source.parent
    while walk >= 0 and walk != source.fence and parent[walk] >= 0:
        path.append((source.lm[walk], source.ip[walk]))
        walk = parent[walk]
    target = cct.fence if main else cct.placeholder(cct.root, THREAD_FENCE)
    for lm, ip in reversed(path):
        target = cct.child(target, lm, ip)
    copied[key] = target
    return target


def encode_stream_trace(cct: ThreadCCT, times: np.ndarray, nodes: np.ndarray) -> bytes:
    """The ``.hpctrace`` bytes of a GPU stream: flags 0x4, ``(time, node id)`` records."""
    records = np.empty(len(times), dtype=_TRACE_RECORD)
    records["time"] = times
    written = np.array([cct.written_id(node) for node in range(len(cct))], dtype=np.uint32)
    records["node_id"] = written[nodes] if len(nodes) else []
    return TRACE_HEADER_PREFIX + struct.pack(">Q", TRACE_FLAG_CALL_TRACE) + records.tobytes()


def write_stream_files(session: Host, kind: MetricKind, stream: StreamTrace) -> list[str]:
    """Write ``<stem>.hpcrun`` and ``<stem>.hpctrace`` for ``stream``; return their paths."""
    times, nodes, disorder = stream.records()
    with session.lock:
        base = session.stream_identity(stream.number)
        device, context, stream_id = stream.key
        identity = StreamIdentity(base, context, stream_id, disorder, device)
    stream.stem, paths = write_trace_files(session, kind, stream.cct, identity, times, nodes)
    return paths


def write_trace_files(
    session: Host,
    kind: MetricKind,
    cct: ThreadCCT,
    identity: ProfileIdentity,
    times: np.ndarray,
    nodes: np.ndarray,
) -> tuple[str, list[str]]:
    """Write a GPU profile's ``.hpcrun`` (no metric values) and ``.hpctrace`` (``(time, node)``
    records) under ``identity``; return the file stem and the paths."""
    with session.lock:
        span = (int(times.min()), int(times.max())) if len(times) else (0, 0)
        profile = encode_profile(cct, identity, session.load_modules, session.kinds, span)
        trace = encode_stream_trace(cct, times, nodes)
    stem = naming.file_stem(
        identity.program_name,
        identity.mpi_rank or 0,
        identity.thread,
        identity.host_id,
        identity.pid,
        0,
    )
    directory = session.options.output_dir
    os.makedirs(directory, exist_ok=True)
    paths = []
    for suffix, data in ((".hpcrun", profile), (".hpctrace", trace)):
        path = os.path.join(directory, stem + suffix)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
        paths.append(path)
    return stem, paths
