"""The CUPTI backend's pure parts, without a GPU: API classification and raw buffer parsing.

The record layouts here are small stand-ins for cupti-python's ``activity_*_dtype`` (same field
names, snake case as the bindings spell them); the real layouts were checked on the H200 by
``tests/data/gpu/record_cupy.py --raw`` (raw and per-object paths agree).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cupti_layouts import LONG_KERNEL, MEMCPY, SMALL_KERNEL
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.cupti.backend import CuptiBackend, Gather, classify_api, load_hook
from pyhpctk.measure.gpu.cupti.buffers import BufferReader

KERNEL_KIND, MEMCPY_KIND = 10, 1  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, _MEMCPY


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("cuLaunchKernel", act.KERNEL),
        ("cudaLaunchKernel_v7000", act.KERNEL),
        ("cuGraphLaunch", act.GRAPH),  # its nodes' activities go below GPUGraph (issue #18)
        ("cuMemcpyHtoDAsync_v2", act.COPY),
        ("cudaMemsetAsync_v3020", act.MEMSET),
        ("cudaMalloc_v3020", act.ALLOC),
        ("cuMemHostAlloc", act.ALLOC),
        ("cuModuleLoadData", act.ALLOC),
        ("cudaFree_v3020", act.FREE),
        ("cuMemFreeAsync", act.FREE),
        ("cudaStreamSynchronize_v3020", act.SYNC),
        ("cuStreamWaitEvent", act.SYNC),
        ("cuGraphAddMemcpyNode", None),
        ("cuLaunchHostFunc", None),
        ("cuMemGetAllocationGranularity", None),
        ("cuCtxGetCurrent", None),
        ("cudaGetDevice_v3020", None),
    ],
)
def test_apis_are_classified_by_name(name: str, kind: int | None) -> None:
    assert classify_api(name) == kind


NAMES = {  # CUPTI callback-id names → ids, as in cupti-python's enums (ids made up)
    "cuLaunchKernel": 1,
    "cuGraphLaunch": 2,
    "cuMemcpyHtoD_v2": 3,
    "cuMemsetD8_v2": 4,
    "cuCtxSynchronize": 5,
    "cuProfilerStart": 6,
    "cudaProfilerStart_v4000": 7,
    "SIZE": 8,
    "cuCtxGetCurrent": 9,
}


@pytest.mark.parametrize("inst", [False, True])
def test_callbacks_are_learned_from_their_names(inst: bool) -> None:
    """Graph launches are multi-activity; with inst, copies and memsets are not traced and
    the profiler starts (where counting begins) are watched."""
    backend = CuptiBackend(inst=inst).callbacks
    backend.learn_apis(2, NAMES)
    kinds = {name: backend.api_kinds.get((2, cbid)) for name, cbid in NAMES.items()}
    assert kinds["cuLaunchKernel"] == act.KERNEL and kinds["cuGraphLaunch"] == act.GRAPH
    assert kinds["cuCtxSynchronize"] == act.SYNC
    assert kinds["SIZE"] is kinds["cuCtxGetCurrent"] is kinds["cuProfilerStart"] is None
    assert backend.api_multi == {(2, 2)}
    if inst:
        assert kinds["cuMemcpyHtoD_v2"] is kinds["cuMemsetD8_v2"] is None
        assert backend._profiler_starts == {(2, 6), (2, 7)}
    else:
        assert (kinds["cuMemcpyHtoD_v2"], kinds["cuMemsetD8_v2"]) == (act.COPY, act.MEMSET)
        assert backend._profiler_starts == set()


def _buffer(layout: list[tuple[np.dtype, int]]) -> tuple[np.ndarray, list[int]]:
    """Records packed one after another (8-byte aligned), as CUPTI fills a buffer."""
    sizes = [-(-dtype.itemsize // 8) * 8 for dtype, _ in layout]
    raw = np.zeros(sum(sizes), dtype=np.uint8)
    offsets = []
    at = 0
    for (dtype, kind), size in zip(layout, sizes, strict=True):
        record = np.zeros(1, dtype=dtype)
        record["kind"] = kind
        record["correlation_id"] = len(offsets) + 100
        raw[at : at + dtype.itemsize] = record.view(np.uint8)
        offsets.append(at)
        at += size
    return raw, offsets


def test_record_offsets_follow_runs_of_learned_sizes() -> None:
    layout = [(SMALL_KERNEL, KERNEL_KIND)] * 3 + [(MEMCPY, MEMCPY_KIND)] * 2
    layout += [(SMALL_KERNEL, KERNEL_KIND)]
    raw, offsets = _buffer(layout)
    backend = CuptiBackend().buffers
    sizes = {KERNEL_KIND: _padded(SMALL_KERNEL), MEMCPY_KIND: _padded(MEMCPY)}
    backend.record_sizes = dict(sizes)
    runs = backend._runs(raw.view("<u4"), len(raw))
    assert runs == [
        (KERNEL_KIND, 0, 3, sizes[KERNEL_KIND]),
        (MEMCPY_KIND, offsets[3], 2, sizes[MEMCPY_KIND]),
        (KERNEL_KIND, offsets[5], 1, sizes[KERNEL_KIND]),
    ]
    backend.record_sizes = {KERNEL_KIND: sizes[KERNEL_KIND]}  # memcpy's size not learned
    assert backend._runs(raw.view("<u4"), len(raw)) is None  # and no CUPTI to ask


def _padded(dtype: np.dtype) -> int:
    return -(-dtype.itemsize // 8) * 8


#: The walks of a buffer's records: the C hook's record_offsets(), and numpy's run by run.
WALKERS = ("c", "numpy")


def _parsing_backend(walker: str = "c") -> BufferReader:
    backend = CuptiBackend().buffers
    backend.walker = load_hook() if walker == "c" else None
    assert walker == "numpy" or backend.walker is not None, "the C hook is not built"
    backend.record_sizes = {KERNEL_KIND: _padded(SMALL_KERNEL), MEMCPY_KIND: _padded(MEMCPY)}
    backend.checks_left = 0  # no libcupti here to walk the buffer with
    backend._kinds = {KERNEL_KIND: act.KERNEL, MEMCPY_KIND: act.COPY}
    backend._gathers = {act.KERNEL: Gather([SMALL_KERNEL]), act.COPY: Gather([MEMCPY])}
    return backend


@pytest.mark.parametrize("walker", WALKERS)
@pytest.mark.parametrize(
    "pattern",
    [
        [KERNEL_KIND] * 9000 + [MEMCPY_KIND] * 3 + [KERNEL_KIND] * 2,  # runs past the lookahead
        [KERNEL_KIND, MEMCPY_KIND] * 700,  # alternating kinds
        [MEMCPY_KIND],
    ],
)
def test_a_raw_buffer_is_read_in_place(pattern: list[int], walker: str) -> None:
    dtypes = {KERNEL_KIND: SMALL_KERNEL, MEMCPY_KIND: MEMCPY}
    raw, _ = _buffer([(dtypes[kind], kind) for kind in pattern])
    backend = _parsing_backend(walker)
    out = backend.parse_raw(raw.ctypes.data, len(raw))
    correlations = np.arange(len(pattern)) + 100  # what _buffer wrote, record by record
    kinds = np.array(pattern)
    expected = np.concatenate(
        [correlations[kinds == KERNEL_KIND], correlations[kinds == MEMCPY_KIND]]
    )
    assert out["correlation"].tolist() == expected.tolist()
    assert (out["kind"] == act.KERNEL).sum() == (kinds == KERNEL_KIND).sum()
    assert backend.record_counts.get("copy", 0) == (kinds == MEMCPY_KIND).sum()


def test_the_longest_record_version_that_fits_the_stride_is_read() -> None:
    raw, offsets = _buffer([(SMALL_KERNEL, KERNEL_KIND)] * 2)
    gather = Gather([LONG_KERNEL, SMALL_KERNEL])
    at = np.asarray(offsets)
    rows = gather.rows(raw, at, np.diff(np.append(at, len(raw))))
    assert rows is not None and rows.dtype == SMALL_KERNEL
    assert rows["correlation_id"].tolist() == [100, 101]
    assert gather.rows(raw, at, np.array([8, 8])) is None  # nothing that short


def test_kernel_records_become_activities() -> None:
    names = [ctypes.create_string_buffer(b"kernel_a"), ctypes.create_string_buffer(b"kernel_b")]
    rows = np.zeros(3, dtype=SMALL_KERNEL)
    rows["correlation_id"] = [7, 8, 9]
    rows["start"] = [10, 20, 30]
    rows["end"] = [15, 26, 37]
    rows["grid_x"], rows["grid_y"], rows["grid_z"] = 4, 2, 1
    rows["block_x"], rows["block_y"], rows["block_z"] = 32, 4, 1
    rows["registers_per_thread"] = 40
    rows["static_shared_memory"] = 1024
    rows["name"] = [
        ctypes.addressof(names[0]),
        ctypes.addressof(names[1]),
        ctypes.addressof(names[0]),
    ]
    backend = CuptiBackend().buffers
    out = backend._convert(act.KERNEL, rows)
    assert out["kind"].tolist() == [act.KERNEL] * 3
    assert out["correlation"].tolist() == [7, 8, 9]
    assert (out["end"] - out["start"]).tolist() == [5, 6, 7]
    assert out["grid_blocks"].tolist() == [8] * 3 and out["block_threads"].tolist() == [128] * 3
    assert out["registers"].tolist() == [40] * 3 and out["static_smem"].tolist() == [1024] * 3
    assert [backend.functions[i] for i in out["function"].tolist()] == [
        "kernel_a",
        "kernel_b",
        "kernel_a",
    ]


def test_copy_records_keep_direction_and_bytes() -> None:
    rows = np.zeros(2, dtype=MEMCPY)
    rows["copy_kind"] = [1, 2]
    rows["bytes"] = [4096, 512]
    rows["stream_id"] = [7, 13]
    out = CuptiBackend().buffers._convert(act.COPY, rows)
    assert out["copy_kind"].tolist() == [1, 2] and out["bytes"].tolist() == [4096, 512]
    assert out["stream"].tolist() == [7, 13] and out["function"].tolist() == [-1, -1]


class FakeCupti:
    """``cuptiActivityGetNextRecord`` over a buffer of known record sizes (libcupti's walk)."""

    def __init__(self, sizes: dict[int, int]) -> None:
        self.sizes = sizes
        self.calls = 0

    def cuptiActivityGetNextRecord(self, buffer: int, valid: int, record: object) -> int:
        self.calls += 1
        pointer: ctypes.c_void_p = record._obj
        current = pointer.value
        if not current:
            following = buffer
        else:
            following = current + self.sizes[ctypes.c_uint32.from_address(current).value]
        if following - buffer >= valid:
            return 3  # CUPTI_ERROR_MAX_LIMIT_REACHED
        pointer.value = following
        return 0


@pytest.mark.parametrize("walker", WALKERS)
@pytest.mark.parametrize("wrong", [False, True])
def test_sizes_are_learned_from_cupti_and_the_first_buffer_is_checked(
    wrong: bool, walker: str
) -> None:
    pattern = [KERNEL_KIND] * 300 + [MEMCPY_KIND] * 5 + [KERNEL_KIND] * 4
    dtypes = {KERNEL_KIND: SMALL_KERNEL, MEMCPY_KIND: MEMCPY}
    raw, _ = _buffer([(dtypes[kind], kind) for kind in pattern])
    backend = _parsing_backend(walker)
    truth = dict(backend.record_sizes)
    backend.record_sizes = {KERNEL_KIND: truth[KERNEL_KIND] + 8} if wrong else {}
    fake = FakeCupti(truth)
    backend._lib = fake  # type: ignore[assignment]
    backend.checks_left = 1
    out = backend.parse_raw(raw.ctypes.data, len(raw))
    assert sorted(out["correlation"].tolist()) == list(range(100, 100 + len(pattern)))
    assert backend.record_sizes == truth  # learned, or corrected by CUPTI's own walk
    if not wrong:
        assert backend.fast_walk and backend.walk_mismatches == 0
        assert fake.calls <= 256 + 1 + 2  # the checked prefix and one call per new kind
    again = backend.parse_raw(raw.ctypes.data, len(raw))  # now in place, run by run
    assert again["correlation"].tolist() == out["correlation"].tolist()


def test_the_c_walk_finds_records_from_their_sizes_and_stops_where_one_is_not_known() -> None:
    hook = load_hook()
    assert hook is not None, "the C hook is not built"
    kernel, memcpy = (SMALL_KERNEL, KERNEL_KIND), (MEMCPY, MEMCPY_KIND)
    layout = [kernel, kernel, kernel, memcpy, kernel]
    raw, offsets = _buffer(layout)
    sizes = np.zeros(256, dtype=np.uint32)
    sizes[KERNEL_KIND] = _padded(SMALL_KERNEL)

    def walk(start: int = 0) -> tuple[list[int], int]:
        found, stop = hook.record_offsets(raw.ctypes.data, len(raw), sizes.tobytes(), start)
        return np.frombuffer(found, dtype=np.int64).tolist(), stop

    assert walk() == (offsets[:3], offsets[3])  # the memcpy's size is not known
    sizes[MEMCPY_KIND] = _padded(MEMCPY)
    assert walk(offsets[3]) == (offsets[3:], len(raw))  # resumed where it stopped
    assert walk() == (offsets, len(raw))
    sizes[KERNEL_KIND] = len(raw) + 8  # a record that would not fit: not taken
    assert walk() == ([], 0)


def test_the_python_hook_takes_a_driver_call_inside_a_runtime_call_as_part_of_it() -> None:
    """cudaLaunchKernel makes cuLaunchKernel: one operation, the runtime call's (the id its
    kernel's activity carries), under hook=python as under the C hook."""
    from types import SimpleNamespace

    backend = CuptiBackend(hook="python").callbacks
    driver, runtime = 1, 2  # CUpti_CallbackDomain (cupti_callbacks.h)
    backend.api_kinds = {(runtime, 211): act.KERNEL, (driver, 307): act.KERNEL}
    backend._domain_resource, backend._domain_driver, backend._enter = 3, driver, 0
    made: list[int] = []
    backend._operation = lambda kind, correlation, multi: made.append(correlation)

    def call(domain: int, cbid: int, site: int, correlation: int) -> None:
        data = SimpleNamespace(callback_site=site, correlation_id=correlation)
        backend._callback(None, domain, cbid, data)

    for correlation in (1, 3):
        call(runtime, 211, 0, correlation)
        call(driver, 307, 0, correlation + 1)
        call(driver, 307, 1, correlation + 1)
        call(runtime, 211, 1, correlation)
    call(driver, 307, 0, 9)
    call(driver, 307, 1, 9)
    assert made == [1, 3, 9]
