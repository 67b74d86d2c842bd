"""In-memory model of an ``.hpcrun`` v4.0 profile and an ``.hpctrace`` v1.01 trace.

This module only declares the data (formats.md §1 and §2); :mod:`pyhpctk.formats.hpcrun` and
:mod:`pyhpctk.formats.hpctrace` read and write it. It is shared by pyrun (which builds profiles),
pyprof (which reads them) and the tests, so it must stay free of I/O and of anything but numpy.

Bulk parts are numpy structured arrays in the file's own big-endian layout, so a writer can dump
them with ``tobytes()`` and a reader can take them with ``np.frombuffer`` without a per-record loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# The constants of the format are declared in .hpcrun_constants (stdlib only, so that pyrun's
# encoder shares them); they are re-exported here for the model's users.
from pyhpctk.formats.hpcrun_constants import (
    CCT_FLAG_UNWOUND,
    CCT_ID_RETAINED,
    DEFAULT_ID_NAMES,
    GPU_CONTEXT_LM_ID,
    GPU_RANGE_LM_ID,
    GPU_ROOT_LM_ID,
    ID_INTERPRETATION_NAMES,
    ID_KIND_NAMES,
    INTERP_BOTH_VALID,
    INTERP_LOGIC_GLOBAL,
    INTERP_LOGIC_LOCAL,
    INTERP_LOGIC_ONLY,
    KIND_CORE,
    KIND_GPUCONTEXT,
    KIND_GPUDEVICE,
    KIND_GPUSTREAM,
    KIND_NODE,
    KIND_RANK,
    KIND_SUMMARY,
    KIND_THREAD,
    LM_FLAG_ANALYZE,
    METRIC_SHOW_NAMES,
    METRIC_TYPE_NAMES,
    METRIC_VALFMT_NAMES,
    METRIC_VALTY_NAMES,
    PLACEHOLDER_LM_ID,
    PLACEHOLDER_NAMES,
    TIME_UNITS,
    TRACE_FLAG_CALL_TRACE,
    TRACE_FLAG_DATA_CENTRIC,
    TRACE_FLAG_LCA,
    VALFMT_INT,
    VALFMT_REAL,
    id_interpretation,
    id_kind,
    is_time_metric,
    metric_flags,
    placeholder_ip,
    placeholder_text,
)

# formats.md §1.5: { u32 id; u32 parent_id; u16 lm_id; u64 lm_ip; u8 flags }, packed, big-endian.
CCT_NODE_DTYPE = np.dtype(
    [("id", ">u4"), ("parent_id", ">u4"), ("lm_id", ">u2"), ("lm_ip", ">u8"), ("flags", "u1")]
)
assert CCT_NODE_DTYPE.itemsize == 19

# formats.md §1.8: (value bits, metric index) pairs and (node id, start index) run starts.
METRIC_VALUE_DTYPE = np.dtype([("value_bits", ">u8"), ("metric", ">u2")])
assert METRIC_VALUE_DTYPE.itemsize == 10
NODE_START_DTYPE = np.dtype([("node_id", ">u4"), ("start", ">u8")])
assert NODE_START_DTYPE.itemsize == 12
ID_TUPLE_ELEMENT_DTYPE = np.dtype([("kind", ">u2"), ("physical", ">u8"), ("logical", ">u8")])
assert ID_TUPLE_ELEMENT_DTYPE.itemsize == 18

# formats.md §2: { u64 time_ns; u32 cct_node_id }, big-endian.
TRACE_RECORD_DTYPE = np.dtype([("time", ">u8"), ("node_id", ">u4")])
assert TRACE_RECORD_DTYPE.itemsize == 12


@dataclass(slots=True)
class LoadModule:
    """One load-map entry (formats.md §1.4). ``id`` is 1..N; 0 is reserved for placeholders."""

    id: int
    path: str
    flags: int = LM_FLAG_ANALYZE


@dataclass(slots=True)
class MetricDescriptor:
    """One metric-table entry (formats.md §1.6). Its index in the table is its metric id.

    ``flags`` holds the 16 raw bytes of the little-endian flags struct; the named properties
    decode the fields hpcprof uses.
    """

    name: str
    description: str = ""
    flags: bytes = bytes([1, 0, 2, 0, 0, 0, 1, 1]) + bytes(8)  # raw, real, shown, percent
    period: int = 1
    formula: str = ""
    format: str = ""
    is_frequency: int = 0
    is_multiplexed: int = 0
    threshold_mean: float = 0.0
    num_samples: int = 0

    def __post_init__(self) -> None:
        if len(self.flags) != 16:
            raise ValueError("metric flags are exactly 16 bytes")

    @property
    def type(self) -> int:
        return self.flags[0]

    @property
    def value_type(self) -> int:
        return self.flags[1]

    @property
    def is_real(self) -> bool:
        """True when values are IEEE doubles (valFmt 2), False for u64 integers (valFmt 1)."""
        return self.flags[2] == 2

    @property
    def value_format(self) -> int:
        """valFmt: 1 (:data:`VALFMT_INT`) integer, 2 (:data:`VALFMT_REAL`) real, 0 null."""
        return self.flags[2]

    @property
    def partner(self) -> int:
        return int.from_bytes(self.flags[4:6], "little")

    @property
    def move_to_proc(self) -> bool:
        """A relation metric: hpcprof attributes it to the call site rather than the leaf."""
        return self.flags[3] != 0

    @property
    def show(self) -> int:
        return self.flags[6]

    @property
    def show_percent(self) -> bool:
        return self.flags[7] != 0


def empty_cct() -> npt.NDArray[np.void]:
    return np.zeros(0, dtype=CCT_NODE_DTYPE)


@dataclass(slots=True)
class HpcrunProfile:
    """A whole ``.hpcrun`` file.

    ``cct`` lists nodes in file order (parents before children). ``values`` holds the sparse
    (value bits, metric) pairs; ``node_starts`` gives, per node with values and in file order, the
    node id and the index of its first pair (the ``end!`` sentinel is not stored: the writer adds
    it). Values of a metric are decoded with :meth:`decoded_values`.
    """

    nvpairs: list[tuple[str, str]] = field(default_factory=list)
    load_modules: list[LoadModule] = field(default_factory=list)
    cct: npt.NDArray[np.void] = field(default_factory=empty_cct)
    metrics: list[MetricDescriptor] = field(default_factory=list)
    id_names: list[tuple[int, str]] = field(default_factory=lambda: list(DEFAULT_ID_NAMES))
    id_tuple: npt.NDArray[np.void] = field(
        default_factory=lambda: np.zeros(0, dtype=ID_TUPLE_ELEMENT_DTYPE)
    )
    values: npt.NDArray[np.void] = field(
        default_factory=lambda: np.zeros(0, dtype=METRIC_VALUE_DTYPE)
    )
    node_starts: npt.NDArray[np.void] = field(
        default_factory=lambda: np.zeros(0, dtype=NODE_START_DTYPE)
    )
    version: str = "04.00"

    def header(self, name: str, default: str = "") -> str:
        """The value of header nv-pair ``name`` (``program-name``, ``thread-id``, ...)."""
        for key, value in self.nvpairs:
            if key == name:
                return value
        return default

    def node_ids_of_values(self) -> npt.NDArray[np.uint32]:
        """The CCT node id of each entry of :attr:`values` (native ``uint32``, vectorised)."""
        n = len(self.values)
        starts = np.asarray(self.node_starts["start"], dtype=np.int64)
        if len(starts) == 0:
            return np.zeros(n, dtype=np.uint32)
        counts = np.diff(np.append(starts, n))
        if (counts < 0).any() or starts[0] != 0:
            raise ValueError("node_starts must be ascending from 0 and within values")
        return np.repeat(np.asarray(self.node_starts["node_id"], dtype=np.uint32), counts)

    def decoded_values(
        self, scaled: bool = False
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint16], npt.NDArray[np.float64]]:
        """``(node_ids, metric, values)``: every stored value decoded by its metric's valFmt.

        Integer metrics (valFmt 1) store a u64, real ones (valFmt 2) the bits of a double
        (formats.md §1.8). With ``scaled``, each value is multiplied by its metric's period, as
        hpcprof does. All three arrays are native-endian and as long as :attr:`values`.
        """
        metric = np.asarray(self.values["metric"], dtype=np.uint16)
        bits = np.asarray(self.values["value_bits"], dtype=np.uint64)
        if len(metric) and int(metric.max()) >= len(self.metrics):
            raise ValueError("a value names a metric index past the metric table")
        is_real = np.array([m.value_format == VALFMT_REAL for m in self.metrics], dtype=bool)
        real = is_real[metric] if len(self.metrics) else np.zeros(len(metric), dtype=bool)
        decoded = np.where(real, bits.view(np.float64), bits.astype(np.float64))
        if scaled and len(self.metrics):
            periods = np.array([float(m.period) for m in self.metrics], dtype=np.float64)
            decoded = decoded * periods[metric]
        return self.node_ids_of_values(), metric, decoded

    def __eq__(self, other: object) -> bool:
        # Arrays compare by content (dataclass == on numpy arrays would be ambiguous).
        if not isinstance(other, HpcrunProfile):
            return NotImplemented
        return profiles_equal(self, other)


@dataclass(slots=True)
class HpctraceFile:
    """A whole ``.hpctrace`` file: flags and (time ns, cct node id) records in file order."""

    flags: int = 0
    records: npt.NDArray[np.void] = field(
        default_factory=lambda: np.zeros(0, dtype=TRACE_RECORD_DTYPE)
    )
    version: str = "01.01"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HpctraceFile):
            return NotImplemented
        return traces_equal(self, other)


def _same_array(a: npt.NDArray[np.void], b: npt.NDArray[np.void], dtype: np.dtype[np.void]) -> bool:
    """Equal length and identical bytes once both are in the file layout ``dtype``."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    return bool(a.astype(dtype, copy=False).tobytes() == b.astype(dtype, copy=False).tobytes())


def _metric_key(m: MetricDescriptor) -> tuple[object, ...]:
    # threshold_mean by its bits, so NaN equals NaN and 0.0 differs from -0.0, as in the file.
    return (
        m.name,
        m.description,
        bytes(m.flags),
        m.period,
        m.formula,
        m.format,
        m.is_frequency,
        m.is_multiplexed,
        np.float64(m.threshold_mean).tobytes(),
        m.num_samples,
    )


def profiles_equal(a: HpcrunProfile, b: HpcrunProfile) -> bool:
    """True when ``a`` and ``b`` would be written as the same file (arrays by content)."""
    return (
        a.version == b.version
        and list(a.nvpairs) == list(b.nvpairs)
        and [(m.id, m.path, m.flags) for m in a.load_modules]
        == [(m.id, m.path, m.flags) for m in b.load_modules]
        and [_metric_key(m) for m in a.metrics] == [_metric_key(m) for m in b.metrics]
        and list(a.id_names) == list(b.id_names)
        and _same_array(a.cct, b.cct, CCT_NODE_DTYPE)
        and _same_array(a.id_tuple, b.id_tuple, ID_TUPLE_ELEMENT_DTYPE)
        and _same_array(a.values, b.values, METRIC_VALUE_DTYPE)
        and _same_array(a.node_starts, b.node_starts, NODE_START_DTYPE)
    )


def traces_equal(a: HpctraceFile, b: HpctraceFile) -> bool:
    """True when ``a`` and ``b`` would be written as the same file (records by content)."""
    return (
        a.version == b.version
        and a.flags == b.flags
        and _same_array(a.records, b.records, TRACE_RECORD_DTYPE)
    )


__all__ = [
    "CCT_FLAG_UNWOUND",
    "CCT_ID_RETAINED",
    "CCT_NODE_DTYPE",
    "DEFAULT_ID_NAMES",
    "GPU_CONTEXT_LM_ID",
    "GPU_RANGE_LM_ID",
    "GPU_ROOT_LM_ID",
    "ID_INTERPRETATION_NAMES",
    "ID_KIND_NAMES",
    "ID_TUPLE_ELEMENT_DTYPE",
    "INTERP_BOTH_VALID",
    "INTERP_LOGIC_GLOBAL",
    "INTERP_LOGIC_LOCAL",
    "INTERP_LOGIC_ONLY",
    "KIND_CORE",
    "KIND_GPUCONTEXT",
    "KIND_GPUDEVICE",
    "KIND_GPUSTREAM",
    "KIND_NODE",
    "KIND_RANK",
    "KIND_SUMMARY",
    "KIND_THREAD",
    "LM_FLAG_ANALYZE",
    "METRIC_SHOW_NAMES",
    "METRIC_TYPE_NAMES",
    "METRIC_VALFMT_NAMES",
    "METRIC_VALTY_NAMES",
    "METRIC_VALUE_DTYPE",
    "NODE_START_DTYPE",
    "PLACEHOLDER_LM_ID",
    "PLACEHOLDER_NAMES",
    "TIME_UNITS",
    "TRACE_FLAG_CALL_TRACE",
    "TRACE_FLAG_DATA_CENTRIC",
    "TRACE_FLAG_LCA",
    "TRACE_RECORD_DTYPE",
    "VALFMT_INT",
    "VALFMT_REAL",
    "HpcrunProfile",
    "HpctraceFile",
    "LoadModule",
    "MetricDescriptor",
    "empty_cct",
    "id_interpretation",
    "id_kind",
    "is_time_metric",
    "metric_flags",
    "placeholder_ip",
    "placeholder_text",
    "profiles_equal",
    "traces_equal",
]
