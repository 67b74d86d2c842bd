"""GPU PC sampling (issue #7): CUPTI's ``cuptiPCSampling*`` API via ctypes; hpcrun's metrics.

Two halves:

- :class:`PcSampler` drives libcupti's PC sampling API (``cupti_pcsampling.h``, CUDA >= 11.3;
  the legacy activity-based PC sampling is not supported on Hopper). It is reached with ctypes
  because cupti-python binds no part of it. Layouts are declared once below, as numpy
  structured dtypes for what is read in bulk (``CUpti_PCSamplingData`` and its
  ``CUpti_PCSamplingPCData`` / ``CUpti_PCSamplingStallReason`` arrays) and as ctypes structures
  for the call parameters. Collection is kernel-serialized with start/stop control, so each
  :meth:`PcSampler.stop` returns the samples of the kernels launched since :meth:`start`:
  one :data:`SAMPLE_DTYPE` row per (PC, stall reason) with its sample count.
- :func:`attribute_samples` turns those rows into hpcrun's GPU instruction metrics, exactly as
  ``meas/loops-cuda-nvidiapc-t.m`` has them: under the kernel's ``GPUKernl`` placeholder, one
  node per sampled instruction (load module = the captured gpubin, offset = the instruction's
  file offset = ``.text.<function>`` offset + ``pcOffset``, CCT flag "unwound" = 0; an
  instruction at the kernel's entry shares the kernel's own node, as in the reference);
  ``GINS`` = samples x period, ``GINS:STL_ANY`` and ``GINS:STL_<reason>`` = stalled samples x
  period (the "selected" reason is an issued warp: ``GINS`` only); on the kernel's node
  ``GSAMP:TOT`` (samples), ``GSAMP:DRP`` (dropped), ``GSAMP:PER (cyc)`` (period) and
  ``GSAMP:EXP`` (duration x SM clock x SMs / period). Pure numpy: CI runs it on recorded rows.

CUPTI identifies a module by a CRC (``cuptiGetCubinCrc``), not by hpcrun's md5; the backend
computes the CRC of every cubin it saves, so samples map back to ``gpubins/<md5>.gpubin``.
"""

from __future__ import annotations

import ctypes
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# -- cupti_pcsampling.h layouts (PACKED_ALIGNMENT: packed, then aligned to 8) ------------------

#: CUpti_PCSamplingStallReason {u32 pcSamplingStallReasonIndex; u32 samples}.
STALL_REASON = np.dtype([("index", "<u4"), ("samples", "<u4")])
#: CUpti_PCSamplingPCData; ``correlationId`` exists from CUDA 12.4 (the H200's CUDA 13 has it).
PC_DATA = np.dtype(
    {
        "names": [
            "size",
            "cubin_crc",
            "pc_offset",
            "function_index",
            "function_name",
            "stall_reason_count",
            "stall_reason",
            "correlation",
        ],
        "formats": ["<u8", "<u8", "<u8", "<u4", "<u8", "<u8", "<u8", "<u4"],
        "offsets": [0, 8, 16, 24, 32, 40, 48, 56],
        "itemsize": 64,
    }
)
PC_DATA_SIZE_LEGACY = 56  # offsetof(stallReason) + 8: the layout before CUDA 12.4
PC_DATA_SIZE = 64  # sizeof(CUpti_PCSamplingPCData) with correlationId, as CUPTI's samples set it
#: CUpti_PCSamplingData.
SAMPLING_DATA = np.dtype(
    {
        "names": [
            "size",
            "collect_num_pcs",
            "total_samples",
            "dropped_samples",
            "total_num_pcs",
            "remaining_num_pcs",
            "range_id",
            "pc_data",
            "non_user_kernels_total_samples",
            "hardware_buffer_full",
        ],
        "formats": ["<u8"] * 9 + ["u1"],
        "offsets": [0, 8, 16, 24, 32, 40, 48, 56, 64, 72],
        "itemsize": 80,
    }
)
SAMPLING_DATA_SIZE = 80  # sizeof(CUpti_PCSamplingData), as CUPTI's samples set it
STALL_REASON_STRING_SIZE = 128  # CUPTI_STALL_REASON_STRING_SIZE

# CUpti_PCSamplingConfigurationAttributeType
ATTR_SAMPLING_PERIOD = 1
ATTR_STALL_REASON = 2
ATTR_SCRATCH_BUFFER_SIZE = 3
ATTR_HARDWARE_BUFFER_SIZE = 4
ATTR_COLLECTION_MODE = 5
ATTR_ENABLE_START_STOP_CONTROL = 6
ATTR_OUTPUT_DATA_FORMAT = 7
ATTR_SAMPLING_DATA_BUFFER = 8
COLLECTION_MODE_CONTINUOUS = 1
COLLECTION_MODE_KERNEL_SERIALIZED = 2
OUTPUT_DATA_FORMAT_PARSED = 1
CUPTI_ERROR_OUT_OF_MEMORY = 13  # cupti_result.h: the hardware buffer is full

#: One row per (sampled PC, stall reason) — what the backend records and the monitor attributes.
SAMPLE_DTYPE = np.dtype(
    [
        ("cubin_crc", "<u8"),
        ("pc_offset", "<u8"),  # offset of the instruction within its function
        ("function", "<i4"),  # index into the batch's function names
        ("reason", "<i4"),  # index into the sampler's stall reason names
        ("samples", "<u4"),
        ("correlation", "<u8"),  # the launch's correlation id (0 when CUPTI gives none)
        ("range", "<u4"),
    ]
)


class _Header(ctypes.Structure):
    """``{size_t size; void *pPriv; CUcontext ctx;}``: Enable/Disable/Start/Stop parameters."""

    _fields_ = [("size", ctypes.c_size_t), ("pPriv", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class _NumStallReasons(ctypes.Structure):
    _fields_ = [*_Header._fields_, ("numStallReasons", ctypes.POINTER(ctypes.c_size_t))]


class _StallReasons(ctypes.Structure):
    _fields_ = [
        *_Header._fields_,
        ("numStallReasons", ctypes.c_size_t),
        ("stallReasonIndex", ctypes.POINTER(ctypes.c_uint32)),
        ("stallReasons", ctypes.POINTER(ctypes.c_char_p)),
    ]


class _ConfigurationInfo(ctypes.Structure):
    """CUpti_PCSamplingConfigurationInfo: type, status, a 24-byte union."""

    _fields_ = [
        ("attributeType", ctypes.c_int),
        ("attributeStatus", ctypes.c_int),
        ("data", ctypes.c_uint64 * 3),
    ]


class _ConfigurationParams(ctypes.Structure):
    _fields_ = [
        *_Header._fields_,
        ("numAttributes", ctypes.c_size_t),
        ("pPCSamplingConfigurationInfo", ctypes.POINTER(_ConfigurationInfo)),
    ]


class _GetDataParams(ctypes.Structure):
    _fields_ = [*_Header._fields_, ("pcSamplingData", ctypes.c_void_p)]


class _CubinCrcParams(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("cubinSize", ctypes.c_size_t),
        ("cubin", ctypes.c_void_p),
        ("cubinCrc", ctypes.c_uint64),
    ]


class PcSamplingError(OSError):
    """A cuptiPCSampling* call failed (status from cupti_result.h)."""


def _check(name: str, status: int) -> None:
    if status != 0:
        raise PcSamplingError(f"{name} failed with CUPTI status {status}")


def function_index(pointer: int, by_pointer: dict[int, int], names: list[str]) -> int:
    """The index in ``names`` of the function name CUPTI hands out at ``pointer`` (added once)."""
    index = by_pointer.get(pointer)
    if index is None:
        name = ctypes.string_at(pointer).decode("utf-8", "replace") if pointer else "?"
        if name in names:
            index = names.index(name)
        else:
            index = len(names)
            names.append(name)
        by_pointer[pointer] = index
    return index


def period_exponent(value: int) -> int:
    """``period=N``: N in 5..31 is CUPTI's exponent (2^N cycles); a power of two is cycles."""
    if 5 <= value <= 31:
        return value
    if value >= 32 and value & (value - 1) == 0 and value.bit_length() - 1 <= 31:
        return value.bit_length() - 1
    raise ValueError(f"PC sampling period {value}: say 5..31 (2^N cycles) or a power of two")


def cubin_crc(lib: ctypes.CDLL, cubin: bytes) -> int:
    """CUPTI's CRC of a cubin (``cuptiGetCubinCrc``): the ``cubinCrc`` of its PC samples."""
    buffer = ctypes.create_string_buffer(cubin, len(cubin))
    params = _CubinCrcParams(ctypes.sizeof(_CubinCrcParams), len(cubin), ctypes.addressof(buffer))
    _check("cuptiGetCubinCrc", lib.cuptiGetCubinCrc(ctypes.byref(params)))
    return int(params.cubinCrc)


@dataclass(slots=True)
class SampleBatch:
    """The samples of one :meth:`PcSampler.stop` (one range) and its totals."""

    rows: np.ndarray  # SAMPLE_DTYPE
    functions: list[str]
    total_samples: int = 0
    dropped_samples: int = 0
    non_user_samples: int = 0
    hardware_buffer_full: bool = False
    range_id: int = 0


class _Buffer:
    """A ``CUpti_PCSamplingData`` with its PC records and stall slots, all owned by numpy."""

    __slots__ = ("data", "pcs", "stalls")

    def __init__(self, collect_pcs: int, reasons: int, pc_data_size: int) -> None:
        self.data = np.zeros(1, SAMPLING_DATA)
        self.pcs = np.zeros(collect_pcs, PC_DATA)
        self.stalls = np.zeros((collect_pcs, max(reasons, 1)), STALL_REASON)
        self.pcs["size"] = pc_data_size
        self.pcs["stall_reason"] = self.stalls.ctypes.data + np.arange(
            collect_pcs, dtype=np.uint64
        ) * np.uint64(self.stalls.strides[0])
        self.data["size"] = SAMPLING_DATA_SIZE
        self.data["collect_num_pcs"] = collect_pcs
        self.data["pc_data"] = self.pcs.ctypes.data

    @property
    def address(self) -> int:
        return int(self.data.ctypes.data)


@dataclass(slots=True)
class PcSampler:
    """CUPTI PC sampling on one CUDA context (``cupti_pcsampling.h``).

    As NVIDIA's ``pc_sampling_start_stop`` sample does, the buffer handed to CUPTI in the
    configuration (filled by ``cuptiPCSamplingDisable``) is not the one ``GetData`` fills.
    ``mode`` is ``serialized`` (kernel-serialized: every record carries its launch's
    correlation id) or ``continuous`` (kernels overlap; correlation ids are 0).
    """

    lib: ctypes.CDLL
    context: int
    period: int = 12  # exponent: 2^12 = 4096 cycles, hpcrun's period in the reference
    collect_pcs: int = 4096
    start_stop: bool = True  # False: sampling runs from enable() to disable()
    pc_data_size: int = PC_DATA_SIZE
    mode: str = "serialized"
    settle_s: float = 0.5  # after stop(): how long to wait for CUPTI's decoder threads
    reasons: list[str] = field(default_factory=list)
    reason_indices: list[int] = field(default_factory=list)
    enabled: bool = False
    _config: _Buffer | None = None
    _get: _Buffer | None = None
    _names: dict[int, int] = field(default_factory=dict)
    _functions: list[str] = field(default_factory=list)
    _keep: list[object] = field(default_factory=list)

    def _header(self, kind: type[ctypes.Structure] = _Header) -> ctypes.Structure:
        params = kind()
        params.size = ctypes.sizeof(kind)
        params.ctx = self.context
        return params

    def enable(self) -> None:
        """Enable PC sampling, learn the stall reasons, configure it (all reasons, period)."""
        lib = self.lib
        _check("cuptiPCSamplingEnable", lib.cuptiPCSamplingEnable(ctypes.byref(self._header())))
        self.enabled = True
        count = ctypes.c_size_t(0)
        params = self._header(_NumStallReasons)
        params.numStallReasons = ctypes.pointer(count)
        _check(
            "cuptiPCSamplingGetNumStallReasons",
            lib.cuptiPCSamplingGetNumStallReasons(ctypes.byref(params)),
        )
        n = int(count.value)
        indices = (ctypes.c_uint32 * n)()
        strings = [ctypes.create_string_buffer(STALL_REASON_STRING_SIZE) for _ in range(n)]
        pointers = (ctypes.c_void_p * n)(*[ctypes.addressof(s) for s in strings])
        reasons = self._header(_StallReasons)
        reasons.numStallReasons = n
        reasons.stallReasonIndex = ctypes.cast(indices, ctypes.POINTER(ctypes.c_uint32))
        reasons.stallReasons = ctypes.cast(pointers, ctypes.POINTER(ctypes.c_char_p))
        _check(
            "cuptiPCSamplingGetStallReasons",
            lib.cuptiPCSamplingGetStallReasons(ctypes.byref(reasons)),
        )
        self.reasons = [s.value.decode("utf-8", "replace") for s in strings]
        self.reason_indices = [int(i) for i in indices]
        self._config = _Buffer(self.collect_pcs, n, self.pc_data_size)
        self._get = _Buffer(self.collect_pcs, n, self.pc_data_size)
        selected = (ctypes.c_uint32 * n)(*self.reason_indices)
        self._keep = [selected]
        mode = (
            COLLECTION_MODE_CONTINUOUS
            if self.mode == "continuous"
            else COLLECTION_MODE_KERNEL_SERIALIZED
        )
        values: list[tuple[int, Sequence[int]]] = [
            (ATTR_SAMPLING_PERIOD, (self.period,)),
            (ATTR_STALL_REASON, (n, ctypes.addressof(selected))),
            (ATTR_COLLECTION_MODE, (mode,)),
            (ATTR_ENABLE_START_STOP_CONTROL, (int(self.start_stop),)),
            (ATTR_OUTPUT_DATA_FORMAT, (OUTPUT_DATA_FORMAT_PARSED,)),
            (ATTR_SAMPLING_DATA_BUFFER, (self._config.address,)),
        ]
        config = (_ConfigurationInfo * len(values))()
        for slot, (kind, words) in zip(config, values, strict=True):
            slot.attributeType = kind
            for position, word in enumerate(words):
                slot.data[position] = word
        params_c = self._header(_ConfigurationParams)
        params_c.numAttributes = len(values)
        params_c.pPCSamplingConfigurationInfo = config
        status = lib.cuptiPCSamplingSetConfigurationAttribute(ctypes.byref(params_c))
        if status != 0:
            bad = [(c.attributeType, c.attributeStatus) for c in config if c.attributeStatus]
            raise PcSamplingError(
                f"cuptiPCSamplingSetConfigurationAttribute failed with CUPTI status {status}"
                f" (attribute, status: {bad})"
            )

    def start(self) -> None:
        _check("cuptiPCSamplingStart", self.lib.cuptiPCSamplingStart(ctypes.byref(self._header())))

    def stop(self) -> SampleBatch:
        """Stop the range and read its PC records (waiting up to ``settle_s`` for them)."""
        _check("cuptiPCSamplingStop", self.lib.cuptiPCSamplingStop(ctypes.byref(self._header())))
        deadline = time.monotonic() + self.settle_s
        batch = self.collect()
        while not batch.total_samples and time.monotonic() < deadline:
            time.sleep(0.01)
            more = self.collect()
            batch = more if more.total_samples else batch
        return batch

    def collect(self) -> SampleBatch:
        """``cuptiPCSamplingGetData`` until no PC remains; the rows in bulk, with numpy."""
        buffer = self._get
        batch = SampleBatch(np.zeros(0, SAMPLE_DTYPE), self._functions)
        if buffer is None:
            return batch
        parts: list[np.ndarray] = []
        params = self._header(_GetDataParams)
        params.pcSamplingData = buffer.address
        for _ in range(1 << 16):
            for name in ("total_num_pcs", "remaining_num_pcs", "total_samples", "dropped_samples"):
                buffer.data[name] = 0
            status = self.lib.cuptiPCSamplingGetData(ctypes.byref(params))
            if status == CUPTI_ERROR_OUT_OF_MEMORY:
                batch.hardware_buffer_full = True
            elif status != 0:
                _check("cuptiPCSamplingGetData", status)
            data = buffer.data[0]
            count = min(int(data["total_num_pcs"]), self.collect_pcs)
            batch.total_samples += int(data["total_samples"])
            batch.dropped_samples += int(data["dropped_samples"])
            batch.non_user_samples += int(data["non_user_kernels_total_samples"])
            batch.hardware_buffer_full |= bool(data["hardware_buffer_full"])
            batch.range_id = int(data["range_id"])
            if count:
                parts.append(self._rows(buffer, count, int(data["range_id"])))
            if not int(data["remaining_num_pcs"]):
                break
        if parts:
            batch.rows = np.concatenate(parts)
        return batch

    def _rows(self, buffer: _Buffer, count: int, range_id: int) -> np.ndarray:
        pcs = buffer.pcs[:count]
        per_pc = pcs["stall_reason_count"].astype(np.int64)
        width = buffer.stalls.shape[1]
        mask = np.arange(width)[None, :] < per_pc[:, None]
        stalls = buffer.stalls[:count][mask]
        which = np.repeat(np.arange(count), np.minimum(per_pc, width))
        rows = np.zeros(len(stalls), SAMPLE_DTYPE)
        rows["cubin_crc"] = pcs["cubin_crc"][which]
        rows["pc_offset"] = pcs["pc_offset"][which]
        names = pcs["function_name"].tolist()
        functions = np.array([self._function(p) for p in names], dtype=np.int32)
        rows["function"] = functions[which]
        position = {index: slot for slot, index in enumerate(self.reason_indices)}
        rows["reason"] = [position.get(int(i), -1) for i in stalls["index"].tolist()]
        rows["samples"] = stalls["samples"]
        if self.pc_data_size > PC_DATA_SIZE_LEGACY:
            rows["correlation"] = pcs["correlation"][which]
        rows["range"] = range_id
        return rows

    def _function(self, pointer: int) -> int:
        return function_index(pointer, self._names, self._functions)

    def disable(self) -> SampleBatch:
        """Disable PC sampling; CUPTI copies the records it still holds to the config buffer."""
        batch = SampleBatch(np.zeros(0, SAMPLE_DTYPE), self._functions)
        buffer = self._config
        if not self.enabled or buffer is None:
            return batch
        self.enabled = False
        _check(
            "cuptiPCSamplingDisable",
            self.lib.cuptiPCSamplingDisable(ctypes.byref(self._header())),
        )
        data = buffer.data[0]
        count = min(int(data["total_num_pcs"]), self.collect_pcs)
        batch.total_samples = int(data["total_samples"])
        batch.dropped_samples = int(data["dropped_samples"])
        batch.non_user_samples = int(data["non_user_kernels_total_samples"])
        batch.hardware_buffer_full = bool(data["hardware_buffer_full"])
        if count:
            batch.rows = self._rows(buffer, count, int(data["range_id"]))
        return batch


# -- hpcrun's metrics ------------------------------------------------------------------------

#: Stall reason name (``smsp__pcsamp_warps_issue_stalled_<X>[_not_issued]``) → GINS:STL_ suffix.
#: hpcrun's categories (gpu-metrics.c) over CUPTI's Hopper reasons; "" = issued (no stall).
STALL_CATEGORY = {
    "selected": "",
    "branch_resolving": "IFET",
    "no_instructions": "IFET",
    "wait": "IDEP",
    "short_scoreboard": "IDEP",
    "long_scoreboard": "GMEM",
    "tex_throttle": "TMEM",
    "barrier": "SYNC",
    "membar": "SYNC",
    "warpgroup_arrive": "SYNC",
    "imc_miss": "CMEM",
    "math_pipe_throttle": "PIPE",
    "mio_throttle": "PIPE",
    "dispatch_stall": "PIPE",
    "tensor": "PIPE",
    "lg_throttle": "MTHR",
    "not_selected": "NSEL",
    "sleeping": "SLP",
}
STALL_SUFFIXES = (
    "NONE",
    "IFET",
    "IDEP",
    "GMEM",
    "TMEM",
    "SYNC",
    "CMEM",
    "PIPE",
    "MTHR",
    "NSEL",
    "OTHR",
    "SLP",
)
_REASON = re.compile(r"^(?:smsp__pcsamp_warps_issue_stalled_|smsp__pcsamp_)?(.*?)(?:_not_issued)?$")


def stall_category(reason: str) -> str:
    """hpcrun's ``GINS:STL_`` suffix for a CUPTI stall reason name ("" for an issued warp)."""
    match = _REASON.match(reason)
    core = match.group(1) if match else reason
    if core in STALL_CATEGORY:
        return STALL_CATEGORY[core]
    if core.startswith("sample") or core.startswith("dropped"):
        return "?"  # a counter, not a reason
    return "OTHR"


def is_not_issued(reason: str) -> bool:
    """Whether a reason is a ``_not_issued`` variant (a subset of its base reason's samples).

    On Hopper CUPTI reports each reason X twice: ``..._stalled_X`` counts every sample whose
    warp was in state X; ``..._stalled_X_not_issued`` counts the samples among those taken on
    a cycle when the warp's scheduler issued no instruction at all (Nsight Compute's "Warp
    Stall Sampling (Not-issued Samples)"): stall cycles no other warp covered. Each sample has
    exactly one base reason, so the base reasons alone sum to the samples; adding the variants
    would count samples twice.
    """
    return reason.endswith("_not_issued")


def counted_reasons(reasons: Sequence[str]) -> np.ndarray:
    """Mask over ``reasons``: the base reasons, whose samples add up to the samples taken."""
    return np.array(
        [stall_category(r) != "?" and not is_not_issued(r) for r in reasons], dtype=bool
    )


def sample_count(rows: np.ndarray, reasons: Sequence[str]) -> int:
    """The samples ``rows`` stand for: the sum over base reasons (no variant, no counter)."""
    if not len(rows):
        return 0
    mask = np.append(counted_reasons(reasons), False)
    reason = np.where(rows["reason"] >= 0, rows["reason"], len(reasons))
    return int(rows["samples"][mask[reason]].astype(np.int64).sum())


@dataclass(frozen=True, slots=True)
class InstructionValues:
    """Metric sums for one instruction node: ``(offset, metric name) → value``."""

    values: dict[tuple[int, str], int]
    kernel_values: dict[str, int]


def attribute_samples(
    rows: np.ndarray,
    reasons: Sequence[str],
    functions: Sequence[str],
    entries: Mapping[str, int],
    period_cycles: int,
    total_samples: int = 0,
    dropped_samples: int = 0,
    expected_samples: int = 0,
) -> InstructionValues:
    """hpcrun's values for one kernel's samples: instruction offset → metric → value.

    ``entries`` maps function names to their ``.text.<name>`` file offsets in the gpubin
    (:func:`pyhpctk.measure.gpu.cubin.kernel_entries`); rows of a function not there are
    skipped. ``kernel_values`` holds the GSAMP metrics that go to the kernel's node.

    Base reasons (:func:`counted_reasons`) give ``GINS`` (every sample) and ``GINS:STL_*``
    (samples of a stalled warp: every reason but ``selected``). The ``_not_issued`` variants
    of stall reasons give the latency split hpcrun's instruction metrics have room for:
    ``GINS:LAT`` = stalled samples (stall cycles of warps at the instruction),
    ``GINS:LAT_UCV`` = their not-issued subset (stall cycles on which the scheduler issued
    nothing: latency not covered by other warps) and ``GINS:LAT_COV`` = LAT - LAT_UCV
    (covered), so hpcrun's ``GINS:LAT_THR`` = 1 + UCV/COV reads "warps needed to cover the
    latency". All x period, as hpcrun scales samples.
    """
    category = np.array([stall_category(r) for r in reasons] + ["?"], dtype=object)
    variant = np.array([is_not_issued(r) for r in reasons] + [False], dtype=bool)
    base = np.array([entries.get(name, -1) for name in functions] + [-1], dtype=np.int64)
    function = np.where(rows["function"] >= 0, rows["function"], len(functions))
    offsets = base[function]
    keep = offsets >= 0
    offsets = offsets[keep] + rows["pc_offset"][keep].astype(np.int64)
    samples = rows["samples"][keep].astype(np.int64) * period_cycles
    reason = np.where(rows["reason"][keep] >= 0, rows["reason"][keep], len(reasons))
    cats = category[reason]
    not_issued = variant[reason]
    values: dict[tuple[int, str], int] = {}

    def add(where: np.ndarray, name: str, sign: int = 1) -> None:
        if not where.any():
            return
        unique, inverse = np.unique(offsets[where], return_inverse=True)
        sums = np.bincount(inverse.reshape(-1), weights=samples[where], minlength=len(unique))
        for offset, value in zip(unique.tolist(), sums.tolist(), strict=True):
            if value:
                key = (offset, name)
                total = values.get(key, 0) + sign * int(value)
                if total:
                    values[key] = total
                else:
                    values.pop(key, None)

    counted = (cats != "?") & ~not_issued
    add(counted, "GINS")
    stalled = counted & (cats != "")
    add(stalled, "GINS:STL_ANY")
    for suffix in STALL_SUFFIXES:
        add(stalled & (cats == suffix), f"GINS:STL_{suffix}")
    uncovered = (cats != "?") & (cats != "") & not_issued
    add(stalled, "GINS:LAT")
    add(stalled, "GINS:LAT_COV")
    add(uncovered, "GINS:LAT_COV", -1)
    add(uncovered, "GINS:LAT_UCV")
    kernel = {
        "GSAMP:TOT": total_samples,
        "GSAMP:DRP": dropped_samples,
        "GSAMP:EXP": expected_samples,
        "GSAMP:PER (cyc)": period_cycles,
    }
    return InstructionValues(values, {k: v for k, v in kernel.items() if v})


def expected_samples(duration_ns: int, clock_khz: int, sm_count: int, period_cycles: int) -> int:
    """Samples a fully busy GPU would give: one per SM every period cycles (GSAMP:EXP)."""
    return int(duration_ns * clock_khz * sm_count // (1_000_000 * period_cycles))


# -- recordings (tests/data/gpu/record_pc.py) replayed by gpu=simulated,pc=PATH ----------------


@dataclass(frozen=True, slots=True)
class PcRecording:
    """PC samples of a kernel recorded on a real GPU, with the cubins it ran from."""

    kernel: str
    rows: np.ndarray  # SAMPLE_DTYPE
    reasons: list[str]
    functions: list[str]
    cubins: list[bytes]
    period_exponent: int
    launches: int
    kernels_ns: int
    sm_count: int
    clock_khz: int
    dropped_samples: int = 0
    calls_per_thread: dict[str, int] = field(default_factory=dict)
    total_samples: int = 0  # CUPTI's totalSamples over the recorded range(s)
    non_user_samples: int = 0  # CUPTI's nonUsrKernelsTotalSamples

    def accounting(self) -> dict[str, int]:
        """Where CUPTI's ``totalSamples`` went (``cupti_pcsampling.h``, CUpti_PCSamplingData).

        ``totalSamples`` "includes samples for user modules, samples for non-user kernels and
        dropped samples", counted once per sample, so ``base + non_user + dropped == total``,
        where ``base`` sums the base reasons of the PC records; ``not_issued`` (the variants'
        sum) is a subset of ``base`` and stays out of that sum.
        """
        variant = np.array([is_not_issued(r) for r in self.reasons] + [False], dtype=bool)
        reason = np.where(self.rows["reason"] >= 0, self.rows["reason"], len(self.reasons))
        counted = self.rows[variant[reason] & (self.rows["reason"] >= 0)]
        return {
            "base": sample_count(self.rows, self.reasons),
            "not_issued": int(counted["samples"].astype(np.int64).sum()),
            "non_user": self.non_user_samples,
            "dropped": self.dropped_samples,
            "total": self.total_samples,
        }

    def launch_groups(self) -> list[np.ndarray]:
        """The rows of each recorded launch (by correlation id), in launch order."""
        correlations = self.rows["correlation"]
        return [self.rows[correlations == c] for c in np.unique(correlations).tolist()]


def load_recording(path: str) -> PcRecording:
    """Read a PC-sample recording (JSON from ``record_pc.py``); FormatError when malformed."""
    import base64
    import json

    from pyhpctk.errors import FormatError

    try:
        with open(path, "rb") as stream:
            data = json.loads(stream.read())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise FormatError(path, "PC recording", f"cannot read JSON: {error}") from None
    try:
        columns = data["rows"]
        count = len(columns["samples"])
        rows = np.zeros(count, SAMPLE_DTYPE)
        for name in SAMPLE_DTYPE.names or ():
            values = columns[name]
            if len(values) != count:
                raise ValueError(f"column {name} has {len(values)} values, not {count}")
            rows[name] = values
        device = data["device"]
        return PcRecording(
            kernel=str(data["kernel"]),
            rows=rows,
            reasons=[str(r) for r in data["reasons"]],
            functions=[str(f) for f in data["functions"]],
            cubins=[base64.b64decode(c["base64"]) for c in data["cubins"]],
            period_exponent=int(data["period_exponent"]),
            launches=int(data["launches"]),
            kernels_ns=int(data["kernels_ns"]),
            sm_count=int(device["sm_count"]),
            clock_khz=int(device["clock_khz"]),
            dropped_samples=int(data.get("dropped_samples", 0)),
            calls_per_thread={str(k): int(v) for k, v in data.get("calls_per_thread", {}).items()},
            total_samples=int(data.get("total_samples", 0)),
            non_user_samples=int(data.get("non_user_samples", 0)),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise FormatError(path, "PC recording", f"bad field: {error!r}") from None
