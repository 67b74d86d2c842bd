"""GPU operations and activities, backend-neutral: one numpy record layout for every backend.

An *operation* is what an application thread asks the GPU runtime to do (launch, copy, memset,
allocate, synchronize); the runtime tags it with a *correlation id*. An *activity* is what the GPU
reports back later, in buffers, with the same correlation id: start/end times, stream, bytes, and
for kernels their static properties. Backends (CUPTI, HIP, the simulated one) translate their
records into :data:`ACTIVITY_DTYPE` arrays so the monitor handles a whole buffer with numpy
instead of one Python object per record.

Kind numbering follows CUPTI where hpcrun's metrics do (copy kinds ``CUpti_ActivityMemcpyKind``,
memory kinds ``CUpti_ActivityMemoryKind``, synchronization types
``CUpti_ActivitySynchronizationType``), so the GXCOPY/GMEM/GMSET/GSYNC metric suffixes index
directly (:mod:`pyhpctk.measure.gpu.metrics`).

This module imports numpy; the monitor imports it lazily, only when a GPU event is asked for.
"""

from __future__ import annotations

import numpy as np

# Operation / activity kinds.
KERNEL, COPY, MEMSET, ALLOC, FREE, SYNC = 1, 2, 3, 4, 5, 6
# Operations with no activity of their own kind: a CUDA graph's launch (its nodes' activities
# answer it) and the making of a graph node (a capture or an add; its activities come when the
# graph is launched, under the launch and the node's capture path, docs/gpu.md).
GRAPH, GRAPH_NODE = 7, 8
KIND_NAMES = {
    KERNEL: "kernel",
    COPY: "copy",
    MEMSET: "memset",
    ALLOC: "alloc",
    FREE: "free",
    SYNC: "sync",
    GRAPH: "graph",
    GRAPH_NODE: "node",
}
KIND_BY_NAME = {name: kind for kind, name in KIND_NAMES.items()}

# A SYNC row's sync_kind: CUpti_ActivitySynchronizationType (cupti_activity.h).
SYNC_UNKNOWN, SYNC_EVENT, SYNC_STREAM_WAIT, SYNC_STREAM, SYNC_CONTEXT = 0, 1, 2, 3, 4
#: CUPTI_SYNCHRONIZATION_INVALID_VALUE: a SYNC row's stream where the API names none.
NO_STREAM = 0xFFFFFFFF

# Placeholder names (formats.md §1.5) for each operation kind. Copies get their direction's
# placeholder when the activity arrives; at launch time only "a copy" is known.
PLACEHOLDER_OF_KIND = {
    KERNEL: "GPUKernl",
    COPY: "GPUCp?2?",
    MEMSET: "GPUMemst",
    ALLOC: "GPUAlloc",
    FREE: "GPUDelte",
    SYNC: "GPU Sync",
    GRAPH: "GPUGraph",
}
TRACE_PLACEHOLDER = "GPUTrace"

# CUpti_ActivityMemcpyKind values that have their own placeholder.
COPY_H2D, COPY_D2H = 1, 2

#: One activity, whatever the backend (little-endian, packed; 96 bytes).
ACTIVITY_DTYPE = np.dtype(
    [
        ("kind", "<u1"),  # KERNEL, COPY, ...
        ("copy_kind", "<u1"),  # CUpti_ActivityMemcpyKind (0 unknown, 1 H2D, 2 D2H, ... 10 P2P)
        ("memory_kind", "<u1"),  # CUpti_ActivityMemoryKind (0..7)
        ("sync_kind", "<u1"),  # CUpti_ActivitySynchronizationType (0..4)
        ("device", "<u4"),
        ("context", "<u4"),
        ("stream", "<u4"),
        ("correlation", "<u8"),
        ("start", "<u8"),  # ns; the CUPTI clock is the epoch clock in ns
        ("end", "<u8"),
        ("bytes", "<u8"),
        ("registers", "<u4"),  # per thread
        ("static_smem", "<u4"),  # per block
        ("dynamic_smem", "<u4"),  # per block
        ("local_mem", "<u8"),  # kernels: local memory total; ALLOC/FREE: the address (ADDRESS)
        ("block_threads", "<u4"),
        ("grid_blocks", "<u8"),
        ("function", "<i4"),  # index into the batch's function table, -1 unknown
        ("graph", "<u4"),  # CUPTI's graphId: the graph whose launch ran this (0: none)
        ("graph_node", "<u8"),  # graphNodeId: the node of that graph (0: not from a graph)
    ],
    align=False,
)
assert ACTIVITY_DTYPE.itemsize == 96
#: The column that holds an ALLOC or FREE row's address (CUPTI's MEMORY2 ``address``; 0 where
#: the backend does not know it): kernels' ``local_mem``, unused by memory rows.
ADDRESS = "local_mem"


def empty_activities(count: int = 0) -> np.ndarray:
    """A zeroed activity array (``function`` -1: unknown)."""
    records = np.zeros(count, dtype=ACTIVITY_DTYPE)
    records["function"] = -1
    return records


class DeviceLimits:
    """What theoretical occupancy needs to know about a device (CUDA device attributes)."""

    __slots__ = (
        "max_blocks_per_sm",
        "max_threads_per_sm",
        "name",
        "registers_per_sm",
        "shared_per_sm",
        "sm_count",
        "warp_size",
    )

    def __init__(
        self,
        name: str = "unknown",
        sm_count: int = 132,
        max_threads_per_sm: int = 2048,
        max_blocks_per_sm: int = 32,
        registers_per_sm: int = 65536,
        shared_per_sm: int = 233472,
        warp_size: int = 32,
    ) -> None:
        self.name = name
        self.sm_count = sm_count
        self.max_threads_per_sm = max_threads_per_sm
        self.max_blocks_per_sm = max_blocks_per_sm
        self.registers_per_sm = registers_per_sm
        self.shared_per_sm = shared_per_sm
        self.warp_size = warp_size

    def as_dict(self) -> dict[str, int | str]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> DeviceLimits:
        known = {name: data[name] for name in cls.__slots__ if name in data}
        return cls(**known)  # type: ignore[arg-type]


def occupancy(kernels: np.ndarray, limits: DeviceLimits) -> tuple[np.ndarray, np.ndarray]:
    """Theoretical occupancy of each kernel: (active warps per SM, maximum warps per SM).

    Resident blocks per SM are the least of the hardware block limit, the warps the SM holds, its
    register file and its shared memory; active warps are that many blocks' warps (CUDA's
    occupancy calculator, which hpcrun's FGP_ACT / FGP_MAX follow).
    """
    warp = limits.warp_size
    block_threads = np.maximum(kernels["block_threads"].astype(np.int64), 1)
    warps_per_block = (block_threads + warp - 1) // warp
    max_warps = limits.max_threads_per_sm // warp
    by_warps = max_warps // warps_per_block
    registers = kernels["registers"].astype(np.int64) * warps_per_block * warp
    by_registers = np.where(
        registers > 0, limits.registers_per_sm // np.maximum(registers, 1), limits.max_blocks_per_sm
    )
    shared = kernels["static_smem"].astype(np.int64) + kernels["dynamic_smem"].astype(np.int64)
    by_shared = np.where(
        shared > 0, limits.shared_per_sm // np.maximum(shared, 1), limits.max_blocks_per_sm
    )
    blocks = np.minimum(np.minimum(by_warps, by_registers), by_shared)
    blocks = np.minimum(blocks, limits.max_blocks_per_sm)
    active = blocks * warps_per_block
    return active, np.full(len(kernels), max_warps, dtype=np.int64)
