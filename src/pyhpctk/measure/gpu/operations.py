"""What the GPU monitor's parts share: operations, per-thread state, counters, constants.

An *operation* is a plain tuple (creating one costs a fraction of a slotted object), indexed by
the ``OP_*`` constants: (correlation, kind, call node, placeholder node or -1, the issuing
:class:`GpuThread`, the CCT the nodes belong to, answered by several activities). A *batch* is
what the monitor attributes for a thread or sends a stream: activities, their operations, the
kernel names, each activity's C-hook token (-1 where a Python path recorded the operation) and,
where an activity ran as a node of a CUDA graph, the operation that made the node (its
capture).
"""

from __future__ import annotations

import os

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.channels import SpscChannel

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Sequence
    from typing import Final, TypeAlias

    import numpy as np

    from pyhpctk.measure.cct import ThreadCCT

    Operation: TypeAlias = "tuple[int, int, int, int, GpuThread, ThreadCCT, bool]"
    Batch: TypeAlias = (
        "tuple[np.ndarray, Sequence[Operation], list[str], np.ndarray | None,"
        " list[Operation | None] | None]"
    )

OP_CORRELATION: Final = 0
OP_KIND: Final = 1
OP_CALL: Final = 2
OP_PLACEHOLDER: Final = 3
OP_THREAD: Final = 4
OP_CCT: Final = 5
OP_MULTI: Final = 6

FIRST_STREAM_THREAD = 500  # formats.md §1.3: GPU stream "threads" are numbered from 500
#: Threads with no Python frames that start GPU work get their own profiles from this number
#: (below the GPU streams; the session numbers Python threads 1, 2, ...).
FIRST_FOREIGN_THREAD = 400
UNKNOWN_PLACEHOLDER = "GPU?????"  # activities with no known operation (counted, reported)
#: Frames of files under pyhpctk/measure/ are the measurement's own: operations belong to the
#: program's frame below them (the C hook looks through the same frames).
SKIP = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
COPY_PLACEHOLDER = {act.COPY_H2D: "GPUCpH2D", act.COPY_D2H: "GPUCpD2H"}
# Kinds whose placeholder is inserted when the activity arrives, not at the operation: a copy's
# placeholder names its direction, which only the activity tells; a synchronization API (or an
# event query) often needs no synchronization at all, and then no empty placeholder is left; a
# graph node is no GPU work of its own (its kernels are, when the graph is launched).
DEFERRED = frozenset({act.COPY, act.SYNC, act.GRAPH_NODE})
#: The native hook marks a graph node's creation (correlation = node id | NODE_TAG, token: its
#: site's) and a clone (correlation = clone id | CLONE_TAG, token = the original node's id).
NODE_TAG = 1 << 63
CLONE_TAG = 1 << 62
#: A driver call inside a runtime call of ours (cudaLaunchKernel's cuLaunchKernel): not an
#: operation; the hook sends its id with the runtime call's token, in case an activity carries
#: it (CUPTI gives activities the runtime call's id: ``GpuStats.inner_matched`` says if not).
INNER_TAG = 1 << 61


def placeholder_name(kind: int, detail: int) -> str:
    """The placeholder an activity of ``kind`` goes under (copies: by direction)."""
    if kind == act.COPY:
        return COPY_PLACEHOLDER.get(detail, "GPUCp?2?")
    return act.PLACEHOLDER_OF_KIND.get(kind, UNKNOWN_PLACEHOLDER)


class GpuThread:
    """One application thread as the GPU monitor sees it: its CCT and its operation channel."""

    __slots__ = (
        "call",
        "cct",
        "depth",
        "frame",
        "ident",
        "lasti",
        "live",
        "main",
        "operations",
        "outer",
        "own",
        "placeholders",
        "push",
        "ranges",
        "thread",
    )

    def __init__(
        self, ident: int, cct: ThreadCCT, main: bool, thread: threading.Thread | None = None
    ) -> None:
        self.ident = ident
        self.thread = thread  # idents are reused once a thread ends: this tells threads apart
        self.own = False  # True: a thread with no Python frames; its CCT is the GPU layer's
        self.cct = cct
        self.main = main
        self.operations: SpscChannel[Operation] = SpscChannel("operations")  # T → monitor (C_O)
        self.push = self.operations.append
        self.live: ThreadCCT | None = None  # the session's CCT for this thread when last seen
        self.depth = 0  # nesting of GPU API calls (runtime → driver), enter/exit backends
        self.outer: Operation | None = None
        # The last unwound operation site: (frame, instruction) → call node and placeholders.
        self.frame: object = UNCACHED
        self.lasti = -1
        self.call = -1
        self.placeholders: dict[int, int] = {}
        self.ranges: object = None  # ... and the thread's open ranges then (pyrun --ranges)


UNCACHED = object()  # a "last frame" no frame (nor None) is: the next operation unwinds


class GpuStats:
    """What the monitor counted; :meth:`report` is the line pyrun prints at exit."""

    __slots__ = (
        "activities",
        "buffers",
        "dropped",
        "graph_activities",
        "graph_nodes",
        "inner_matched",
        "internal",
        "matched",
        "operations",
        "outside",
        "own",
        "trace_overflow",
        "unmatched",
        "unmatched_operations",
    )

    def __init__(self) -> None:
        self.operations = 0
        self.activities = 0
        self.matched = 0
        self.unmatched = 0  # activities whose correlation id no operation had
        self.internal = 0  # activities with correlation id 0: the driver's own (not an API call)
        self.own = 0  # activities of the backend's own CUDA calls (left out of the profile)
        self.unmatched_operations = 0  # operations no activity answered (allocation APIs...)
        self.buffers = 0
        self.dropped = 0  # records the backend reported lost (buffer overflow)
        self.trace_overflow = 0  # trace records refused by a full trace channel
        self.graph_nodes = 0  # CUDA graph nodes whose making was seen (captures, adds)
        self.graph_activities = 0  # activities of graph nodes put under their capture's path
        self.inner_matched = 0  # activities that carried an inner driver call's id (INNER_TAG)
        self.outside = 0  # activities of operations issued while pyrun ctl's window was closed

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}

    def report(self) -> str:
        text = (
            f"pyrun: gpu: {self.operations} operations, {self.activities} activities in "
            f"{self.buffers} buffers, {self.matched} attributed to their operation"
        )
        problems = []
        if self.unmatched:
            problems.append(
                f"{self.unmatched} activities without a known operation (under <GPU?????>)"
            )
        if self.internal:
            problems.append(
                f"{self.internal} activities the driver started on its own (under <GPU?????>)"
            )
        if self.dropped:
            problems.append(f"{self.dropped} activity records dropped by the backend")
        if self.trace_overflow:
            problems.append(f"{self.trace_overflow} trace records lost to full channels")
        if self.outside:
            text += f" ({self.outside} of them left out: issued while the window was closed)"
        return text + ("; " + "; ".join(problems) if problems else "")


def site_key(operation: Operation) -> tuple[int, int, int, int, int, bool]:
    """What names a C-hook token: everything of an operation but its correlation id."""
    return (
        operation[OP_KIND],
        operation[OP_CALL],
        operation[OP_PLACEHOLDER],
        id(operation[OP_THREAD]),
        id(operation[OP_CCT]),
        operation[OP_MULTI],
    )
