"""Exact GPU instruction counts (issue #7): CUPTI's ``cuptiSassMetrics*`` API via ctypes.

The GT-Pin-like path of Zhou et al. (2021): CUPTI patches every SASS instruction of a kernel
with a counter (``cupti_sass_metrics.h``, CUDA >= 12.5), so each instruction's execution count
is exact, and so is the weight of every device call edge (the count of its call instruction).
This module never decides *when* to count; the CUPTI backend does (see :class:`SassCounter`).

Two halves, as in :mod:`pyhpctk.measure.gpu.cupti.pcsampling`:

- :class:`SassCounter` drives the API on one CUDA context. Layouts are declared once below:
  numpy dtypes for what CUPTI fills in bulk (``CUpti_SassMetrics_Data`` records and their
  ``CUpti_SassMetrics_InstanceValue`` arrays), ctypes structures for the call parameters, whose
  ``structSize`` is ``CUPTI_PROFILER_STRUCT_SIZE(type, last field)`` exactly as the header
  defines it (``tests/test_gpu_inst.py`` compiles the header and compares every offset).
  :meth:`SassCounter.collect` returns one :data:`INST_DTYPE` row per executed instruction.
- :func:`attribute_counts` turns rows into hpcrun's GPU instrumentation metrics — the names
  hpcrun's GT-Pin path writes (``gpu-metrics.h``, ``FORALL_GPU_INST``): ``GINS`` = warp-level
  executions (``smsp__sass_inst_executed``), ``GINS:SIMD_ACT`` = thread-level executions
  (active lanes, ``smsp__sass_thread_inst_executed``), ``GINS:SIMD_TOT`` = ``GINS`` x warp
  size, ``GINS:SIMD_WST`` = TOT - ACT. ``GINS:BLK_EXEC_CNT`` needs basic blocks, which only
  pystruct knows: not written. Pure numpy: CI runs it on recorded rows.

What CUPTI counts, as measured on the H200 (CUPTI 13.0, driver 580; ``tests/data/gpu/``
``sass_probe.cu``, ``probe_from_python.py`` and ``diagnose_inst.py``, 2026-12-01) — far
narrower than its header says, with every call returning success throughout:

- Only the first kernel run after ``cuptiSassMetricsSetConfig`` is counted, if Enable came
  before it; its later launches add to the same counters (three launches, three times the
  counts); no other kernel is counted. Any other device work first — a ``cuMemsetD8``,
  ``cupy.zeros``, even before Enable, or a launch before Enable — leaves nothing counted.
  (Why every earlier attempt read 0 records: the recorder zeroed its output after Enable.)
- ``cuptiSassMetricsFlushData`` ends the window: nothing later is counted, not after Disable
  + Enable, and a SetConfig after UnsetConfig returns ``CUPTI_ERROR_OUT_OF_MEMORY``.
- With ``CONCURRENT_KERNEL`` activity tracing on the counts are all 0, with ``MEMCPY`` or
  ``MEMSET`` activity on nothing is counted; ``KERNEL``, ``SYNCHRONIZATION`` and ``MEMORY2``
  activity are harmless. Enabling inside the launch's own API-entry callback gives zeros.

So counting is one window: :meth:`SassCounter.enable` right before the kernel's first launch
(synchronized, nothing else in between), one :meth:`SassCounter.collect` when counting ends.
The counts are totals over every launch of that kernel in the window; CUPTI's records carry no
correlation id, and the caller says which launch they are attributed to.

Never combine with PC sampling: ``cuptiProfilerInitialize`` (required here) blocks CUPTI's
PC sampling API, and ``GINS`` would mix counts with samples; ``gpu=...,pc,inst`` is refused.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.measure.gpu.cupti.pcsampling import InstructionValues

# -- cupti_sass_metrics.h layouts (natural alignment, x86-64 / aarch64) ----------------------

#: CUpti_SassMetrics_InstanceValue {uint64_t metricId; uint64_t value;}.
INSTANCE_VALUE = np.dtype([("metric_id", "<u8"), ("value", "<u8")])
#: CUpti_SassMetrics_Data: {size_t structSize; void *pPriv; uint32_t cubinCrc;
#: uint32_t functionIndex; const char *functionName; uint32_t pcOffset; (4 bytes padding)
#: CUpti_SassMetrics_InstanceValue *pInstanceValues;} — 48 bytes.
SASS_DATA = np.dtype(
    {
        "names": [
            "size",
            "priv",
            "cubin_crc",
            "function_index",
            "function_name",
            "pc_offset",
            "instance_values",
        ],
        "formats": ["<u8", "<u8", "<u4", "<u4", "<u8", "<u4", "<u8"],
        "offsets": [0, 8, 16, 20, 24, 32, 40],
        "itemsize": 48,
    }
)
assert INSTANCE_VALUE.itemsize == 16 and SASS_DATA.itemsize == 48

OUTPUT_GRANULARITY_GPU = 0  # CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU: one instance per value
CUPTI_ERROR_INVALID_OPERATION = 7  # cupti_result.h: SetConfig already done for the device
WARP_SIZE = 32

#: The metrics counted, and the INST_DTYPE column each one fills.
METRICS: tuple[tuple[str, str], ...] = (
    ("smsp__sass_inst_executed", "inst"),  # warp-level: once per warp that executes it
    ("smsp__sass_thread_inst_executed", "threads"),  # thread-level: once per active thread
)

#: One row per (instruction, launch) — what the backend records and the monitor attributes.
INST_DTYPE = np.dtype(
    [
        ("cubin_crc", "<u8"),
        ("function", "<i4"),  # index into the batch's function names
        ("function_index", "<u4"),  # CUPTI's symbol index of the function in its module
        ("pc_offset", "<u8"),  # offset of the instruction within its function
        ("inst", "<u8"),  # warp-level executions
        ("threads", "<u8"),  # thread-level executions
        ("correlation", "<u8"),  # the launch's correlation id (given by the caller)
    ]
)


def _struct_size(kind: type[ctypes.Structure], last: str) -> int:
    """``CUPTI_PROFILER_STRUCT_SIZE(type, last)``: offsetof(last) + sizeof(last)."""
    descriptor = getattr(kind, last)
    return int(descriptor.offset + descriptor.size)


class _Initialize(ctypes.Structure):
    """CUpti_Profiler_Initialize_Params (cupti_profiler_target.h)."""

    _fields_ = [("structSize", ctypes.c_size_t), ("pPriv", ctypes.c_void_p)]


class _ChipName(ctypes.Structure):
    """CUpti_Device_GetChipName_Params (cupti_target.h)."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("deviceIndex", ctypes.c_size_t),
        ("pChipName", ctypes.c_char_p),
    ]


class _MetricDetails(ctypes.Structure):
    """CUpti_SassMetrics_MetricDetails."""

    _fields_ = [
        ("metricId", ctypes.c_uint64),
        ("pMetricName", ctypes.c_char_p),
        ("pMetricDescription", ctypes.c_char_p),
    ]


class _NumMetrics(ctypes.Structure):
    """CUpti_SassMetrics_GetNumOfMetrics_Params."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("pChipName", ctypes.c_char_p),
        ("numOfMetrics", ctypes.c_size_t),
    ]


class _Metrics(ctypes.Structure):
    """CUpti_SassMetrics_GetMetrics_Params."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("pChipName", ctypes.c_char_p),
        ("numOfMetrics", ctypes.c_size_t),
        ("pMetricsList", ctypes.POINTER(_MetricDetails)),
    ]


class _Properties(ctypes.Structure):
    """CUpti_SassMetrics_GetProperties_Params."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("pChipName", ctypes.c_char_p),
        ("pMetricName", ctypes.c_char_p),
        ("metric", _MetricDetails),
    ]


class _Config(ctypes.Structure):
    """CUpti_SassMetrics_Config {uint64_t metricId; uint8_t outputGranularity;}."""

    _fields_ = [("metricId", ctypes.c_uint64), ("outputGranularity", ctypes.c_uint8)]


class _SetConfig(ctypes.Structure):
    """CUpti_SassMetricsSetConfig_Params."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("numOfMetricConfig", ctypes.c_size_t),
        ("pConfigs", ctypes.POINTER(_Config)),
        ("deviceIndex", ctypes.c_uint32),
    ]


class _UnsetConfig(ctypes.Structure):
    """CUpti_SassMetricsUnsetConfig_Params."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("deviceIndex", ctypes.c_uint32),
    ]


class _Enable(ctypes.Structure):
    """CUpti_SassMetricsEnable_Params."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
        ("enableLazyPatching", ctypes.c_uint8),
    ]


class _Disable(ctypes.Structure):
    """CUpti_SassMetricsDisable_Params."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
        ("numOfDroppedRecords", ctypes.c_size_t),
    ]


class _DataProperties(ctypes.Structure):
    """CUpti_SassMetricsGetDataProperties_Params."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
        ("numOfPatchedInstructionRecords", ctypes.c_size_t),
        ("numOfInstances", ctypes.c_size_t),
    ]


class _FlushData(ctypes.Structure):
    """CUpti_SassMetricsFlushData_Params (its STRUCT_SIZE ends at numOfInstances)."""

    _fields_ = [
        ("structSize", ctypes.c_size_t),
        ("pPriv", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
        ("numOfPatchedInstructionRecords", ctypes.c_size_t),
        ("numOfInstances", ctypes.c_size_t),
        ("pMetricsData", ctypes.c_void_p),
    ]


#: ``<type>_STRUCT_SIZE`` of every parameter block, as the headers define them.
STRUCT_SIZES: dict[str, int] = {
    "CUpti_Profiler_Initialize_Params": _struct_size(_Initialize, "pPriv"),
    "CUpti_Device_GetChipName_Params": _struct_size(_ChipName, "pChipName"),
    "CUpti_SassMetrics_GetNumOfMetrics_Params": _struct_size(_NumMetrics, "numOfMetrics"),
    "CUpti_SassMetrics_GetMetrics_Params": _struct_size(_Metrics, "pMetricsList"),
    "CUpti_SassMetrics_GetProperties_Params": _struct_size(_Properties, "metric"),
    "CUpti_SassMetricsSetConfig_Params": _struct_size(_SetConfig, "deviceIndex"),
    "CUpti_SassMetricsUnsetConfig_Params": _struct_size(_UnsetConfig, "deviceIndex"),
    "CUpti_SassMetricsEnable_Params": _struct_size(_Enable, "enableLazyPatching"),
    "CUpti_SassMetricsDisable_Params": _struct_size(_Disable, "numOfDroppedRecords"),
    "CUpti_SassMetricsGetDataProperties_Params": _struct_size(_DataProperties, "numOfInstances"),
    "CUpti_SassMetricsFlushData_Params": _struct_size(_FlushData, "numOfInstances"),
}
#: Offsets of the ctypes structures' fields, for the header comparison test.
PARAM_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "CUpti_Profiler_Initialize_Params": _Initialize,
    "CUpti_Device_GetChipName_Params": _ChipName,
    "CUpti_SassMetrics_MetricDetails": _MetricDetails,
    "CUpti_SassMetrics_GetNumOfMetrics_Params": _NumMetrics,
    "CUpti_SassMetrics_GetMetrics_Params": _Metrics,
    "CUpti_SassMetrics_GetProperties_Params": _Properties,
    "CUpti_SassMetrics_Config": _Config,
    "CUpti_SassMetricsSetConfig_Params": _SetConfig,
    "CUpti_SassMetricsUnsetConfig_Params": _UnsetConfig,
    "CUpti_SassMetricsEnable_Params": _Enable,
    "CUpti_SassMetricsDisable_Params": _Disable,
    "CUpti_SassMetricsGetDataProperties_Params": _DataProperties,
    "CUpti_SassMetricsFlushData_Params": _FlushData,
}


class SassMetricsError(OSError):
    """A cuptiSassMetrics* (or profiler) call failed (status from cupti_result.h)."""


def _check(name: str, status: int, statuses: dict[str, int] | None = None) -> None:
    if statuses is not None:
        statuses[name.split("(")[0]] = int(status)
    if status != 0:
        raise SassMetricsError(f"{name} failed with CUPTI status {status}")


def _sized(kind: type[ctypes.Structure], name: str) -> ctypes.Structure:
    params = kind()
    params.structSize = STRUCT_SIZES[name]
    return params


@dataclass(slots=True)
class InstBatch:
    """The counts of one :meth:`SassCounter.collect`."""

    rows: np.ndarray  # INST_DTYPE
    functions: list[str]


@dataclass(slots=True)
class SassCounter:
    """Exact per-instruction execution counts on one CUDA context.

    How the CUPTI backend uses it (it owns the callbacks, this class owns the API), shaped by
    what CUPTI counts (module docstring):

    - at the API *exit* of the program's first ``cu/cudaProfilerStart``, on that thread:
      ``counter.synchronize()`` (nothing in flight), then ``counter.enable()``: SetConfig for
      the device (once; a later counter finds it set), Enable with lazy patching; CUPTI
      patches the kernel the program launches next.
    - each later launch is only counted by the backend (CUPTI adds it to the same counters
      when it is the same kernel).
    - at shutdown: ``counter.synchronize()``, ``counter.disable(correlation)`` — one flush (the
      totals, as the first launch's rows), then ``cuptiSassMetricsDisable`` — and once per
      device ``counter.release()`` (``cuptiSassMetricsUnsetConfig``). Its CUDA calls run with
      the backend's busy flag set, so their own callbacks are not taken for the program's.
    """

    lib: ctypes.CDLL
    context: int
    device: int = 0
    metrics: tuple[tuple[str, str], ...] = METRICS
    lazy: bool = True
    chip: str = ""
    metric_ids: dict[int, str] = field(default_factory=dict)  # CUPTI metric id → column
    enabled: bool = False
    dropped_records: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # last CUPTI status of each call
    _names: dict[int, int] = field(default_factory=dict)
    _functions: list[str] = field(default_factory=list)
    _cuda: ctypes.CDLL | None = None

    def chip_name(self) -> str:
        """Initialize CUPTI's profiler and return the device's chip name (e.g. ``GH100``)."""
        if self.chip:
            return self.chip
        init = _sized(_Initialize, "CUpti_Profiler_Initialize_Params")
        _check(
            "cuptiProfilerInitialize",
            self.lib.cuptiProfilerInitialize(ctypes.byref(init)),
            self.statuses,
        )
        params = _sized(_ChipName, "CUpti_Device_GetChipName_Params")
        params.deviceIndex = self.device
        _check(
            "cuptiDeviceGetChipName",
            self.lib.cuptiDeviceGetChipName(ctypes.byref(params)),
            self.statuses,
        )
        self.chip = (params.pChipName or b"").decode()
        return self.chip

    def available(self) -> list[tuple[str, str]]:
        """Every SASS metric of the chip: (name, description)."""
        chip = self.chip_name().encode()
        count = _sized(_NumMetrics, "CUpti_SassMetrics_GetNumOfMetrics_Params")
        count.pChipName = chip
        _check(
            "cuptiSassMetricsGetNumOfMetrics",
            self.lib.cuptiSassMetricsGetNumOfMetrics(ctypes.byref(count)),
            self.statuses,
        )
        n = int(count.numOfMetrics)
        details = (_MetricDetails * n)()
        params = _sized(_Metrics, "CUpti_SassMetrics_GetMetrics_Params")
        params.pChipName = chip
        params.numOfMetrics = n
        params.pMetricsList = details
        _check(
            "cuptiSassMetricsGetMetrics",
            self.lib.cuptiSassMetricsGetMetrics(ctypes.byref(params)),
            self.statuses,
        )
        return [
            ((d.pMetricName or b"").decode(), (d.pMetricDescription or b"").decode())
            for d in details
        ]

    def enable(self) -> None:
        """Configure the device's metrics (once per device) and enable counting here."""
        chip = self.chip_name().encode()
        configs = (_Config * len(self.metrics))()
        for slot, (name, column) in zip(configs, self.metrics, strict=True):
            props = _sized(_Properties, "CUpti_SassMetrics_GetProperties_Params")
            props.pChipName = chip
            props.pMetricName = name.encode()
            _check(
                f"cuptiSassMetricsGetProperties({name})",
                self.lib.cuptiSassMetricsGetProperties(ctypes.byref(props)),
                self.statuses,
            )
            metric_id = int(props.metric.metricId)
            self.metric_ids[metric_id] = column
            slot.metricId = metric_id
            slot.outputGranularity = OUTPUT_GRANULARITY_GPU
        config = _sized(_SetConfig, "CUpti_SassMetricsSetConfig_Params")
        config.numOfMetricConfig = len(self.metrics)
        config.pConfigs = configs
        config.deviceIndex = self.device
        status = self.lib.cuptiSassMetricsSetConfig(ctypes.byref(config))
        self.statuses["cuptiSassMetricsSetConfig"] = int(status)
        if status not in (0, CUPTI_ERROR_INVALID_OPERATION):  # 7: the device is configured
            _check("cuptiSassMetricsSetConfig", status)
        params = _sized(_Enable, "CUpti_SassMetricsEnable_Params")
        params.ctx = self.context
        params.enableLazyPatching = int(self.lazy)
        _check(
            "cuptiSassMetricsEnable",
            self.lib.cuptiSassMetricsEnable(ctypes.byref(params)),
            self.statuses,
        )
        self.enabled = True

    def synchronize(self) -> None:
        """``cuCtxSynchronize`` of this counter's context (pushed current for the call)."""
        if self._cuda is None:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        cuda = self._cuda
        pushed = (
            bool(self.context) and int(cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(self.context))) == 0
        )
        try:
            status = int(cuda.cuCtxSynchronize())
        finally:
            if pushed:
                cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p(0)))
        if status != 0:
            raise SassMetricsError(f"cuCtxSynchronize failed with CUDA status {status}")

    def collect(self, correlation: int = 0) -> InstBatch:
        """Flush CUPTI's counts since the last collect into rows (call when kernels are done)."""
        batch = InstBatch(np.zeros(0, INST_DTYPE), self._functions)
        if not self.enabled:
            return batch
        props = _sized(_DataProperties, "CUpti_SassMetricsGetDataProperties_Params")
        props.ctx = self.context
        _check(
            "cuptiSassMetricsGetDataProperties",
            self.lib.cuptiSassMetricsGetDataProperties(ctypes.byref(props)),
            self.statuses,
        )
        records = int(props.numOfPatchedInstructionRecords)
        instances = int(props.numOfInstances)
        if not records or not instances:
            return batch
        data = np.zeros(records, SASS_DATA)
        values = np.zeros((records, instances), INSTANCE_VALUE)
        data["size"] = SASS_DATA.itemsize
        data["instance_values"] = values.ctypes.data + np.arange(
            records, dtype=np.uint64
        ) * np.uint64(values.strides[0])
        flush = _sized(_FlushData, "CUpti_SassMetricsFlushData_Params")
        flush.ctx = self.context
        flush.numOfPatchedInstructionRecords = records
        flush.numOfInstances = instances
        flush.pMetricsData = data.ctypes.data
        _check(
            "cuptiSassMetricsFlushData",
            self.lib.cuptiSassMetricsFlushData(ctypes.byref(flush)),
            self.statuses,
        )
        names = [self._function(p) for p in data["function_name"].tolist()]
        batch.rows = rows_of_records(data, values, np.array(names, np.int32), self.metric_ids)
        batch.rows["correlation"] = correlation
        return batch

    def _function(self, pointer: int) -> int:
        from pyhpctk.measure.gpu.cupti.pcsampling import function_index

        return function_index(pointer, self._names, self._functions)

    def disable(self, correlation: int = 0) -> InstBatch:
        """Flush what is left (as ``correlation``'s), then ``cuptiSassMetricsDisable``."""
        batch = self.collect(correlation)
        if not self.enabled:
            return batch
        self.enabled = False
        params = _sized(_Disable, "CUpti_SassMetricsDisable_Params")
        params.ctx = self.context
        _check(
            "cuptiSassMetricsDisable",
            self.lib.cuptiSassMetricsDisable(ctypes.byref(params)),
            self.statuses,
        )
        self.dropped_records += int(params.numOfDroppedRecords)
        return batch

    def release(self) -> None:
        """``cuptiSassMetricsUnsetConfig`` for the device (once, after every disable)."""
        params = _sized(_UnsetConfig, "CUpti_SassMetricsUnsetConfig_Params")
        params.deviceIndex = self.device
        _check(
            "cuptiSassMetricsUnsetConfig",
            self.lib.cuptiSassMetricsUnsetConfig(ctypes.byref(params)),
            self.statuses,
        )


def rows_of_records(
    data: np.ndarray, values: np.ndarray, functions: np.ndarray, metric_ids: Mapping[int, str]
) -> np.ndarray:
    """:data:`INST_DTYPE` rows from CUPTI's records, in bulk.

    A record is one patched instruction; its instance values carry their metric id (one
    instance per metric at GPU granularity, one per SM or SMSP at finer ones). Values are
    summed per (cubin, function, pc) and metric, so the result does not depend on whether
    CUPTI gives one record per instruction or one per (instruction, metric).
    """
    count, instances = values.shape
    keys = np.zeros(count, [("crc", "<u8"), ("function", "<i4"), ("pc", "<u8")])
    keys["crc"] = data["cubin_crc"]
    keys["function"] = functions
    keys["pc"] = data["pc_offset"]
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    rows = np.zeros(len(unique), INST_DTYPE)
    rows["cubin_crc"] = unique["crc"]
    rows["function"] = unique["function"]
    rows["pc_offset"] = unique["pc"]
    rows["function_index"] = data["function_index"][first]
    owner = np.repeat(inverse, instances)
    ids = values["metric_id"].reshape(-1)
    flat = values["value"].reshape(-1)
    for metric_id, column in metric_ids.items():
        mask = ids == metric_id
        sums = np.zeros(len(unique), np.uint64)  # exact integer sums (no float weights)
        np.add.at(sums, owner[mask], flat[mask])
        rows[column] = sums
    return rows


def summed_rows(rows: np.ndarray) -> np.ndarray:
    """:data:`INST_DTYPE` rows summed per instruction (cubin, function, pc), as CUPTI sums
    the launches of one counting window; the correlation is the first row's."""
    if not len(rows):
        return rows.copy()
    keys = np.zeros(len(rows), [("crc", "<u8"), ("function", "<i4"), ("pc", "<u8")])
    keys["crc"], keys["function"], keys["pc"] = (
        rows["cubin_crc"],
        rows["function"],
        rows["pc_offset"],
    )
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    result = rows[first].copy()
    for column in ("inst", "threads"):
        sums = np.zeros(len(unique), np.uint64)  # exact integer sums
        np.add.at(sums, inverse, rows[column])
        result[column] = sums
    result["correlation"] = rows["correlation"][0]
    return result


def split_counts(rows: np.ndarray, weights: Sequence[int]) -> list[np.ndarray]:
    """Counting-window totals split between calling contexts in proportion to ``weights``.

    CUPTI gives one total per instruction for all the counted launches (the module docstring).
    When those launches came from several calling contexts, each context gets
    ``count x weight / sum(weights)`` of every instruction's warp executions, in whole
    executions. The rounding is by largest remainder (ties to the earlier context), so each
    instruction's parts add up to its total exactly. Thread executions follow each part's
    share of the warp executions, so no part has more active threads than its warps hold.
    Returns one copy of ``rows`` per weight.
    """
    total = sum(int(w) for w in weights)
    if total <= 0 or not weights:
        raise ValueError(f"split_counts: weights must add up to more than 0: {list(weights)}")
    scale = np.array([[int(w) for w in weights]], dtype=object)  # Python ints: no overflow
    warps = np.array([int(v) for v in rows["inst"].tolist()], dtype=object)
    threads = np.array([int(v) for v in rows["threads"].tolist()], dtype=object)
    warp_parts = _apportion(warps, np.repeat(scale, len(rows), axis=0))
    by_warps = np.where(warps[:, None] > 0, warp_parts, scale)  # a row no warp ran: the weights
    thread_parts = _apportion(threads, by_warps)
    parts = [rows.copy() for _ in weights]
    for index, part in enumerate(parts):
        part["inst"] = warp_parts[:, index].astype(np.uint64)
        part["threads"] = thread_parts[:, index].astype(np.uint64)
    return parts


def _apportion(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Each row's value split by its row of weights, in whole units by largest remainder.

    Object arrays of Python ints; a part never exceeds the ceiling of its exact share.
    """
    totals = weights.sum(axis=1)
    scaled = values[:, None] * weights
    shares, rest = scaled // totals[:, None], scaled % totals[:, None]
    left = (values - shares.sum(axis=1)).astype(np.int64)  # 0 <= left < number of parts
    ranks = np.argsort(np.argsort(-rest, axis=1, kind="stable"), axis=1, kind="stable")
    return np.asarray(shares + (ranks < left[:, None]).astype(np.int64), dtype=object)


# -- hpcrun's metrics ------------------------------------------------------------------------


def attribute_counts(
    rows: np.ndarray,
    functions: Sequence[str],
    entries: Mapping[str, int],
    warp_size: int = WARP_SIZE,
) -> InstructionValues:
    """hpcrun's instrumentation values for one kernel's counts: offset → metric → value.

    ``entries`` maps function names to their ``.text.<name>`` file offsets in the gpubin;
    rows of a function not there are skipped. Instructions no thread executed are left out.
    """
    base = np.array([entries.get(name, -1) for name in functions] + [-1], dtype=np.int64)
    function = np.where(rows["function"] >= 0, rows["function"], len(functions))
    offsets = base[function]
    keep = (offsets >= 0) & ((rows["inst"] > 0) | (rows["threads"] > 0))
    offsets = offsets[keep] + rows["pc_offset"][keep].astype(np.int64)
    unique, inverse = np.unique(offsets, return_inverse=True)
    inverse = inverse.reshape(-1)

    def summed(column: str) -> list[int]:
        sums = np.zeros(len(unique), np.int64)  # exact integer sums (no float weights)
        np.add.at(sums, inverse, rows[column][keep].astype(np.int64))
        return [int(v) for v in sums]

    result: dict[tuple[int, str], int] = {}
    warps, threads = summed("inst"), summed("threads")
    for offset, inst, active in zip(unique.tolist(), warps, threads, strict=True):
        total = inst * warp_size
        for name, value in (
            ("GINS", inst),
            ("GINS:SIMD_TOT", total),
            ("GINS:SIMD_ACT", active),
            ("GINS:SIMD_WST", total - active),
        ):
            if value:
                result[(offset, name)] = value
    return InstructionValues(result, {})


# -- recordings (tests/data/gpu/record_pc.py --inst) replayed by gpu=simulated,inst=PATH ------


@dataclass(frozen=True, slots=True)
class InstRecording:
    """Instruction counts of a kernel recorded on a real GPU, with the cubins it ran from."""

    kernel: str
    rows: np.ndarray  # INST_DTYPE, one group per launch (by correlation id)
    functions: list[str]
    cubins: list[bytes]
    launches: int
    kernels_ns: int
    grid: tuple[int, int]  # (blocks, threads per block)
    warp_size: int = WARP_SIZE
    calls_per_thread: dict[str, int] = field(default_factory=dict)

    def launch_groups(self) -> list[np.ndarray]:
        """The rows of each recorded launch (by correlation id), in launch order."""
        correlations = self.rows["correlation"]
        return [self.rows[correlations == c] for c in np.unique(correlations).tolist()]

    @property
    def warps(self) -> int:
        """Warps per launch (every block has ``threads`` threads)."""
        blocks, threads = self.grid
        return blocks * -(-threads // self.warp_size)


def load_inst_recording(path: str) -> InstRecording:
    """Read an instruction-count recording (JSON of ``record_pc.py --inst``); FormatError."""
    import base64
    import json

    from pyhpctk.errors import FormatError

    try:
        with open(path, "rb") as stream:
            data = json.loads(stream.read())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise FormatError(
            path, "instruction count recording", f"cannot read JSON: {error}"
        ) from None
    try:
        if data.get("format") != "inst":
            raise ValueError("not an instruction count recording (format != 'inst')")
        columns = data["rows"]
        count = len(columns["inst"])
        rows = np.zeros(count, INST_DTYPE)
        for name in INST_DTYPE.names or ():
            values = columns[name]
            if len(values) != count:
                raise ValueError(f"column {name} has {len(values)} values, not {count}")
            rows[name] = values
        blocks, threads = (int(v) for v in data["grid"])
        return InstRecording(
            kernel=str(data["kernel"]),
            rows=rows,
            functions=[str(f) for f in data["functions"]],
            cubins=[base64.b64decode(c["base64"]) for c in data["cubins"]],
            launches=int(data["launches"]),
            kernels_ns=int(data["kernels_ns"]),
            grid=(blocks, threads),
            warp_size=int(data.get("device", {}).get("warp_size", WARP_SIZE)),
            calls_per_thread={str(k): int(v) for k, v in data.get("calls_per_thread", {}).items()},
        )
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as error:
        raise FormatError(path, "instruction count recording", f"bad field: {error!r}") from None
