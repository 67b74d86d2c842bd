"""Trace routing: each matched activity goes to its GPU stream's trace (with ``-t``).

The monitor thread sends each stream's records, with their operations, on that stream's trace
channel (:meth:`TraceRouter.route`); the tracing thread copies each operation's calling context
into the stream's CCT and records (start, node) and (end, ``NoActvty``)
(:meth:`TraceRouter.drain`). Streams are written as hpcrun writes them
(:mod:`pyhpctk.measure.gpu.streams`).
"""

from __future__ import annotations

import threading
from typing import cast

import numpy as np

from pyhpctk.measure.cct import ThreadCCT
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.channels import SpscChannel
from pyhpctk.measure.gpu.operations import (
    FIRST_STREAM_THREAD,
    OP_CALL,
    OP_CCT,
    OP_THREAD,
    placeholder_name,
)
from pyhpctk.measure.gpu.streams import StreamTrace, write_stream_files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyhpctk.measure.cct import MetricKind
    from pyhpctk.measure.extension import Host
    from pyhpctk.measure.gpu.attribution import KernelTable
    from pyhpctk.measure.gpu.operations import Batch, GpuStats, GpuThread, Operation


class TraceRouter:
    """Every GPU stream's trace channel, CCT and records (see the module docstring)."""

    def __init__(
        self, host: Host, kernels: KernelTable, stats: GpuStats, capacity: int = 0
    ) -> None:
        self.host = host
        self.kernels = kernels
        self.stats = stats
        self.capacity = capacity
        self.streams: dict[tuple[int, int, int], StreamTrace] = {}
        self.wake = threading.Semaphore(0)  # the tracing thread waits on it

    def route(
        self, records: np.ndarray, operations: Sequence[Operation | None], names: list[str]
    ) -> None:
        """Monitor thread: each stream's records and operations on its trace channel."""
        keys = np.stack([records["device"], records["context"], records["stream"]], axis=1)
        unique, inverse = np.unique(keys.astype(np.int64), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for group, key in enumerate(unique.tolist()):
            indices = np.flatnonzero(inverse == group)
            stream_key = (int(key[0]), int(key[1]), int(key[2]))
            stream = self.streams.get(stream_key)
            if stream is None:
                number = FIRST_STREAM_THREAD + len(self.streams)
                cct = ThreadCCT(self.host.ids, main=True, with_no_activity=True)
                channel: SpscChannel[Batch] = SpscChannel(f"trace {stream_key}", self.capacity)
                stream = self.streams[stream_key] = StreamTrace(number, stream_key, cct, channel)
            # Every activity has its operation by now (unknown ones: the GPU????? one).
            ops = cast("list[Operation]", [operations[i] for i in indices.tolist()])
            batch: Batch = (records[indices], ops, names, None, None)
            if not stream.channel.push(batch):
                self.stats.trace_overflow += len(indices)
        self.wake.release()

    def drain(self) -> None:
        """Tracing thread (or shutdown): record every batch waiting on any stream's channel."""
        for stream in list(self.streams.values()):
            for rows, ops, names, _, _ in stream.channel.drain():
                self._trace_batch(stream, rows, ops, names)

    def _trace_batch(
        self, stream: StreamTrace, rows: np.ndarray, ops: list[Operation], names: list[str]
    ) -> None:
        """Copy each operation's calling context into the stream's CCT and record its interval."""
        cct = stream.cct
        kinds = rows["kind"].tolist()
        details = np.where(rows["kind"] == act.KERNEL, rows["function"], rows["copy_kind"]).tolist()
        nodes: list[int] = []
        with self.host.lock:
            for index, operation in enumerate(ops):
                thread: GpuThread = operation[OP_THREAD]
                source: ThreadCCT = operation[OP_CCT]
                call = stream.copy_path(source, operation[OP_CALL], thread.main)
                node = self._trace_node(cct, call, kinds[index], details[index], names)
                cct.retain(node)
                nodes.append(node)
        stream.record(rows["start"], rows["end"], nodes)

    def _trace_node(
        self, cct: ThreadCCT, call: int, kind: int, detail: int, names: list[str]
    ) -> int:
        """The node a stream trace record points at: ``GPUTrace → gpubin@entry`` for kernels."""
        if kind == act.KERNEL:
            placeholder = cct.placeholder(call, act.TRACE_PLACEHOLDER)
            entry = self.kernels.get(names[detail]) if 0 <= detail < len(names) else None
            return placeholder if entry is None else cct.child(placeholder, *entry)
        return cct.placeholder(call, placeholder_name(kind, detail))

    def overflowed(self) -> int:
        return sum(stream.channel.overflowed for stream in self.streams.values())

    def write(self, kind: MetricKind, errors: list[str]) -> list[str]:
        """Write every stream's ``.hpcrun`` and ``.hpctrace`` (formats.md §1, §2)."""
        written: list[str] = []
        for stream in self.streams.values():
            try:
                written += write_stream_files(self.host, kind, stream)
            except OSError as error:
                errors.append(f"pyrun: gpu: cannot write stream {stream.number}: {error}")
        return written
