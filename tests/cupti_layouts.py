"""Stand-ins for cupti-python's activity record layouts (CUPTI's field order, the field types
that matter: signed dimensions and shared memory, a 2-byte register count), for the tests of the
CUPTI backend's buffer reading (``test_gpu_raw``) and of the per-record C pass
(``test_gpu_records``)."""

import numpy as np

_KERNEL_HEAD = [
    ("kind", "<u4"),
    ("registers_per_thread", "<u2"),
    ("pad0", "<u2"),
    ("start", "<u8"),
    ("end", "<u8"),
    ("device_id", "<u4"),
    ("context_id", "<u4"),
    ("stream_id", "<u4"),
    ("grid_x", "<i4"),
    ("grid_y", "<i4"),
    ("grid_z", "<i4"),
    ("block_x", "<i4"),
    ("block_y", "<i4"),
    ("block_z", "<i4"),
    ("static_shared_memory", "<i4"),
    ("dynamic_shared_memory", "<i4"),
    ("local_memory_total", "<u4"),
    ("correlation_id", "<u4"),
]
# A kernel record without graph ids.
SMALL_KERNEL = np.dtype([*_KERNEL_HEAD, ("pad1", "<u4"), ("name", "<u8")])
# A later version of the same record: the same fields, more after them.
LONG_KERNEL = np.dtype([*SMALL_KERNEL.descr, ("extra", "<u8"), ("extra2", "<u8")])
# A kernel record with the graph and graph-node ids (replays of CUDA graphs).
GRAPH_KERNEL = np.dtype(
    [
        *_KERNEL_HEAD,
        ("graph_node_id", "<u8"),
        ("name", "<u8"),
        ("graph_id", "<u4"),
        ("pad1", "<u4"),
    ]
)
MEMCPY = np.dtype(
    [
        ("kind", "<u4"),
        ("copy_kind", "<u1"),
        ("pad", "<u1", 3),
        ("bytes", "<u8"),
        ("start", "<u8"),
        ("end", "<u8"),
        ("device_id", "<u4"),
        ("context_id", "<u4"),
        ("stream_id", "<u4"),
        ("correlation_id", "<u4"),
    ]
)
