"""The monitor's per-record work in C against its numpy oracle (issue #18).

``convert_records()`` (CUPTI records to activity rows) and ``activity_sums()`` (a batch's
metrics per node) must give exactly what the numpy paths give: the same bytes for every row,
the same floating-point sums, whatever the values (negative signed fields, wrapping products,
copy and memory kinds out of range, allocations and frees mixed).
"""

from __future__ import annotations

import ctypes
import tempfile
import threading

import numpy as np
import pytest

from cupti_layouts import GRAPH_KERNEL, MEMCPY
from pyhpctk.measure.cct import ThreadCCT
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu.attribution import Attributor, KernelTable
from pyhpctk.measure.gpu.cupti.backend import CuptiBackend, Gather, load_hook
from pyhpctk.measure.gpu.cupti.buffers import BufferReader
from pyhpctk.measure.gpu.cupti.records import Converter, plan
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

KERNEL = GRAPH_KERNEL  # the layout with graph ids: every field the C pass converts
SYNC = np.dtype(
    [
        ("kind", "<u4"),
        ("type", "<u4"),
        ("start", "<u8"),
        ("end", "<u8"),
        ("correlation_id", "<u4"),
        ("context_id", "<u4"),
        ("stream_id", "<u4"),
        ("pad", "<u4"),
    ]
)
MEMORY = np.dtype(
    [
        ("kind", "<u4"),
        ("memory_operation_type", "<u4"),
        ("memory_kind", "<u2"),
        ("pad", "<u2", 3),
        ("correlation_id", "<u4"),
        ("timestamp", "<u8"),
        ("bytes", "<u8"),
        ("address", "<u8"),  # an allocation's address: the row's act.ADDRESS (issue #37)
        ("device_id", "<u4"),
        ("context_id", "<u4"),
        ("stream_id", "<u4"),
        ("pad2", "<u4"),
    ]
)
# CUPTI activity kinds of the stand-ins, and the activity kind each becomes.
LAYOUTS = {10: (KERNEL, act.KERNEL), 1: (MEMCPY, act.COPY), 38: (SYNC, act.SYNC)}
LAYOUTS[49] = (MEMORY, act.ALLOC)
NAMES = [ctypes.create_string_buffer(f"kernel_{i}".encode()) for i in range(300)]


def _random_records(dtype: np.dtype, cupti_kind: int, count: int, seed: int) -> np.ndarray:
    """Records with every field random (all bit patterns), kind word and name pointer valid."""
    generator = np.random.default_rng(seed)
    raw = generator.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8)
    records = raw.view(dtype).copy()
    records["kind"] = cupti_kind
    if "name" in (dtype.names or ()):
        chosen = generator.integers(0, len(NAMES), size=count)
        records["name"] = [ctypes.addressof(NAMES[i]) for i in chosen.tolist()]
    if "memory_operation_type" in (dtype.names or ()):
        records["memory_operation_type"] = generator.integers(0, 4, size=count)
    return records


def _backend(converter: bool) -> BufferReader:
    backend = CuptiBackend().buffers
    hook = load_hook()
    assert hook is not None, "the C hook is not built"
    backend.walker = hook
    backend.converter = Converter(hook if converter else None)
    backend.record_sizes = {kind: -(-d.itemsize // 8) * 8 for kind, (d, _) in LAYOUTS.items()}
    backend.checks_left = 0
    backend._kinds = {cupti: kind for cupti, (_, kind) in LAYOUTS.items()}
    backend._gathers = {kind: Gather([dtype]) for dtype, kind in LAYOUTS.values()}
    return backend


def _padded(records: np.ndarray) -> np.ndarray:
    """The records as CUPTI lays them out: each padded to 8 bytes."""
    raw = records.view(np.uint8).reshape(len(records), records.dtype.itemsize)
    padding = np.zeros((len(records), -records.dtype.itemsize % 8), np.uint8)
    return np.ascontiguousarray(np.concatenate([raw, padding], axis=1)).reshape(-1)


def _buffer(pattern: list[int], seed: int) -> np.ndarray:
    """A buffer of random records of the CUPTI kinds in ``pattern``."""
    pieces = []
    for index, cupti_kind in enumerate(pattern):
        dtype = LAYOUTS[cupti_kind][0]
        pieces.append(_padded(_random_records(dtype, cupti_kind, 1, seed * 100_003 + index)))
    return np.concatenate(pieces)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_records_converted_in_c_are_the_rows_numpy_makes(seed: int) -> None:
    generator = np.random.default_rng(seed)
    kinds = list(LAYOUTS)
    pattern = [kinds[i] for i in generator.integers(0, len(kinds), size=600).tolist()]
    raw = _buffer(pattern, seed)
    in_c, in_numpy = _backend(converter=True), _backend(converter=False)
    rows = in_c.parse_raw(raw.ctypes.data, len(raw))
    expected = in_numpy.parse_raw(raw.ctypes.data, len(raw))
    assert len(rows) == len(pattern)
    unnamed, expected_unnamed = rows.copy(), expected.copy()
    unnamed["function"] = expected_unnamed["function"] = 0  # indices: in the order first met
    assert unnamed.tobytes() == expected_unnamed.tobytes()
    named = [in_c.functions[i] if i >= 0 else None for i in rows["function"].tolist()]
    assert named == [in_numpy.functions[i] if i >= 0 else None for i in expected["function"]]
    kernels = rows["kind"] == act.KERNEL
    assert (rows["function"][kernels] >= 0).all() and (rows["function"][~kernels] == -1).all()
    assert set(rows["kind"].tolist()) == {act.KERNEL, act.COPY, act.SYNC, act.ALLOC, act.FREE}


def test_a_buffer_with_more_new_kernel_names_than_one_call_reports_is_still_read() -> None:
    records = _random_records(KERNEL, 10, 600, 7)
    records["name"] = [ctypes.addressof(NAMES[i % 300]) for i in range(600)]  # 300 new names
    raw = _padded(records)
    backend = _backend(converter=True)
    rows = backend.parse_raw(raw.ctypes.data, len(raw))
    assert [backend.functions[i] for i in rows["function"].tolist()] == [
        f"kernel_{i % 300}" for i in range(600)
    ]
    again = backend.parse_raw(raw.ctypes.data, len(raw))  # every name known now: in C
    assert again.tobytes() == rows.tobytes()


def test_the_c_conversion_refuses_records_outside_the_buffer_and_bad_plans() -> None:
    hook = load_hook()
    assert hook is not None, "the C hook is not built"
    raw = _random_records(MEMCPY, 1, 2, 3).view(np.uint8)
    steps = plan(act.COPY, MEMCPY)
    assert steps is not None
    out = np.empty(2, act.ACTIVITY_DTYPE)
    names, indices = np.zeros(0, np.uint64), np.zeros(0, np.int32)
    beyond = np.array([0, MEMCPY.itemsize + 8], dtype=np.int64)
    with pytest.raises(ValueError, match="outside"):
        hook.convert_records(
            raw.ctypes.data, len(raw), beyond, MEMCPY.itemsize, steps, act.COPY, act.FREE,
            names, indices, out,
        )  # fmt: skip
    wrong = steps.copy()
    wrong[0, 3] = MEMCPY.itemsize  # a field past the record's end
    inside = np.array([0, MEMCPY.itemsize], dtype=np.int64)
    with pytest.raises(ValueError, match="plan"):
        hook.convert_records(
            raw.ctypes.data, len(raw), inside, MEMCPY.itemsize, wrong, act.COPY, act.FREE,
            names, indices, out,
        )  # fmt: skip


def _random_rows(count: int, seed: int) -> np.ndarray:
    generator = np.random.default_rng(seed)
    rows = generator.integers(0, 256, size=count * 96, dtype=np.uint8).view(act.ACTIVITY_DTYPE)
    rows["kind"] = generator.choice(
        [act.KERNEL, act.COPY, act.MEMSET, act.ALLOC, act.FREE, act.SYNC], size=count
    )
    for name, top in (("copy_kind", 14), ("memory_kind", 10), ("sync_kind", 7)):
        rows[name] = generator.integers(0, top, size=count)
    start = generator.integers(0, 1 << 62, size=count, dtype=np.uint64)
    rows["start"] = start
    rows["end"] = start + generator.integers(-1000, 10**9, size=count).astype(np.uint64)
    rows["bytes"] = generator.integers(0, 1 << 40, size=count, dtype=np.uint64)
    for name, top in (("registers", 256), ("static_smem", 1 << 17), ("dynamic_smem", 1 << 17)):
        rows[name] = generator.integers(0, top, size=count)
    rows["block_threads"] = generator.integers(0, 1025, size=count)
    rows["grid_blocks"] = generator.integers(0, 1 << 31, size=count, dtype=np.uint64)
    rows["local_mem"] = generator.integers(0, 1 << 33, size=count, dtype=np.uint64)
    return rows


@pytest.mark.parametrize("seed", [1, 2])
def test_metrics_summed_in_c_are_the_sums_numpy_makes(seed: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        session = Session(MeasureOptions(directory, trace=False, checkpoint_s=0))
        session.register_thread(threading.current_thread(), main=True)
        kind = session.add_metric_kind(gm.gpu_metric_kind())
        limits = act.DeviceLimits(shared_per_sm=100_000, registers_per_sm=50_000)
        attributor = Attributor(session, kind, KernelTable(), limits)
        assert attributor.sums is not None, "the C hook is not built"
        rows = _random_rows(5000, seed)
        targets = np.random.default_rng(seed).integers(0, 40, size=len(rows)) * 3 + 1
        stores = []
        for sums in (attributor.sums, None):
            attributor.sums = sums
            cct = ThreadCCT(session.ids, main=True)
            for part in range(3):  # several batches into the same nodes
                chosen = slice(part * 1500, (part + 1) * 1500 + 500 * (part == 2))
                attributor.add_metrics(cct, rows[chosen], targets[chosen])
            stores.append(cct.values_of(kind))
        c, numpy = stores
        assert c.slot_of == numpy.slot_of
        assert np.array_equal(np.frombuffer(c.values), np.frombuffer(numpy.values))
        count = np.frombuffer(c.values).reshape(-1, kind.width)[:, gm.GKER_COUNT].sum()
        assert count == (rows["kind"] == act.KERNEL).sum()
