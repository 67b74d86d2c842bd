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

CCT_FLAG_UNWOUND = 0x1
LM_FLAG_ANALYZE = 0x1
PLACEHOLDER_LM_ID = 0  # formats.md §1.5: lm_id 0 marks a placeholder node
TRACE_FLAG_DATA_CENTRIC = 0x1
TRACE_FLAG_LCA = 0x2
TRACE_FLAG_CALL_TRACE = 0x4

# formats.md §1.7: the dictionary hpcrun always writes.
DEFAULT_ID_NAMES: tuple[tuple[int, str], ...] = (
    (0, "SUMMARY"),
    (1, "NODE"),
    (2, "RANK"),
    (3, "THREAD"),
    (4, "GPUDEVICE"),
    (5, "GPUCONTEXT"),
    (6, "GPUSTREAM"),
    (7, "CORE"),
)

# Id-tuple kinds (bits 0-13) and interpretations (bits 14-15), formats.md §1.8.
KIND_SUMMARY, KIND_NODE, KIND_RANK, KIND_THREAD = 0, 1, 2, 3
KIND_GPUDEVICE, KIND_GPUCONTEXT, KIND_GPUSTREAM, KIND_CORE = 4, 5, 6, 7
INTERP_BOTH_VALID, INTERP_LOGIC_LOCAL, INTERP_LOGIC_GLOBAL, INTERP_LOGIC_ONLY = 0, 1, 2, 3


def placeholder_ip(text: str) -> int:
    """Pack an 8-character placeholder name (``^Primary``, ``GPUKernl``...) as hpcrun does."""
    raw = text.encode("ascii")
    if len(raw) != 8:
        raise ValueError(f"placeholder names are 8 ASCII characters, got {text!r}")
    return int.from_bytes(raw, "big")


def placeholder_text(ip: int) -> str:
    """The 8-character name packed in a placeholder node's ``lm_ip``."""
    return ip.to_bytes(8, "big").decode("ascii", errors="replace")


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


@dataclass(slots=True)
class HpctraceFile:
    """A whole ``.hpctrace`` file: flags and (time ns, cct node id) records in file order."""

    flags: int = 0
    records: npt.NDArray[np.void] = field(
        default_factory=lambda: np.zeros(0, dtype=TRACE_RECORD_DTYPE)
    )
    version: str = "01.01"
