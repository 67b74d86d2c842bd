"""The GPU metric kind: hpcrun's 63 GPU activity metrics, names, flags and formulas exactly.

The table below is hpcrun's (``gpu-metrics.c``) as the reference measurement
``meas/loops-cuda-nvidia-t.m`` records it: order, names, descriptions, value formats,
``move2proc``, ``show`` and formulas (formats.md §1.6). Static kernel properties (registers,
shared memory, block and grid sizes, occupancy) are *accumulators* summed over launches together
with ``GKER:COUNT``, and the visible per-kernel metrics are formulas ``#ACUMU/#COUNT``, so averages
survive aggregation (Zhou et al. 2021, §4).

Index constants (``GPUOP``, ``GKER``...) are 0-based positions within the kind; the session adds
the kind's base when it writes the metric table. Standard library only: measured processes import
this module.
"""

from __future__ import annotations

from pyhpctk.measure.cct import MetricKind, MetricSpec

#: formats.md §1.6, byte 6 of the flags: show values.
SHOW, HIDE, SHOW_INCLUSIVE, SHOW_EXCLUSIVE, INVISIBLE = 1, 0, 2, 3, 4

GPU_KIND_NAME = "gpu-activity"


class GpuMetricSpec(MetricSpec):
    """A :class:`MetricSpec` with hpcrun's display formula and format (formats.md §1.6)."""

    __slots__ = ("format", "formula")

    def __init__(
        self,
        name: str,
        description: str,
        is_real: bool,
        show: int = SHOW,
        show_percent: bool = True,
        move_to_proc: bool = False,
        formula: str = "",
        format: str = "",  # the field's name in the format
    ) -> None:
        super().__init__(name, description, is_real, show, show_percent, move_to_proc, 1)
        self.formula = formula
        self.format = format


_MEMORY_KINDS = (
    ("UNK", "unknown memory kind"),
    ("PAG", "pageable memory"),
    ("PIN", "pinned memory"),
    ("DEV", "device memory"),
    ("ARY", "array memory"),
    ("MAN", "managed memory"),
    ("DST", "device static memory"),
    ("MST", "managed static memory"),
)
#: GXCOPY direction suffixes in hpcrun's order (CUPTI's CUpti_ActivityMemcpyKind numbering).
COPY_KINDS = (
    ("UNK", "unknown kind"),
    ("H2D", "host to device"),
    ("D2H", "device to host"),
    ("H2A", "host to array"),
    ("A2H", "array to host"),
    ("A2A", "array to array"),
    ("A2D", "array to device"),
    ("D2A", "device to array"),
    ("D2D", "device to device"),
    ("H2H", "host to host"),
    ("P2P", "peer to peer"),
)
#: GSYNC kinds in hpcrun's order (CUPTI's CUpti_ActivitySynchronizationType numbering).
SYNC_KINDS = (
    ("UNK", "unknown kind"),
    ("EVT", "event"),
    ("STRE", "stream event wait"),
    ("STR", "stream"),
    ("CTX", "context"),
)
_KERNEL_ACCUMULATORS = (
    ("STMEM", " (B)", "static memory", " (bytes)"),
    ("DYMEM", " (B)", "dynamic memory", " (bytes)"),
    ("LMEM", " (B)", "local memory", " (bytes)"),
    ("FGP_ACT", "", "fine-grain parallelism", ", actual"),
    ("FGP_MAX", "", "fine-grain parallelism", ", maximum"),
    ("THR_REG", "", "thread register count", ""),
    ("BLK_THR", "", "thread count", ""),
    ("BLK_SM", " (B)", "block local memory", " (bytes)"),
    ("BLKS", "", "block count", ""),
)


def _table() -> tuple[GpuMetricSpec, ...]:
    specs: list[GpuMetricSpec] = []
    times = (
        ("GPUOP", "all operations"),
        ("GKER", "kernel execution"),
        ("GMEM", "memory allocation/deallocation"),
        ("GMSET", "memory set"),
        ("GXCOPY", "explicit data copy"),
        ("GICOPY", "implicit data copy"),
        ("GSYNC", "synchronization"),
    )
    for name, what in times:
        specs.append(
            GpuMetricSpec(f"{name} (sec)", f"GPU time: {what} (seconds)", True, move_to_proc=True)
        )
    for prefix, what in (("GMEM", "GPU memory alloc/free"), ("GMSET", "GPU memory set")):
        for suffix, kind in _MEMORY_KINDS:
            specs.append(GpuMetricSpec(f"{prefix}:{suffix} (B)", f"{what}: {kind} (bytes)", False))
        specs.append(GpuMetricSpec(f"{prefix}:COUNT", f"{what}: count", False))
    for suffix, kind in COPY_KINDS:
        specs.append(
            GpuMetricSpec(
                f"GXCOPY:{suffix} (B)", f"GPU explicit memory copy: {kind} (bytes)", False
            )
        )
    specs.append(GpuMetricSpec("GXCOPY:COUNT", "GPU explicit memory copy: count", False))
    for suffix, kind in SYNC_KINDS:
        specs.append(
            GpuMetricSpec(f"GSYNC:{suffix} (sec)", f"GPU synchronizations: {kind}", True, HIDE)
        )
    specs.append(GpuMetricSpec("GSYNC:COUNT", "GPU synchronizations: count", True, HIDE))
    for short, unit, what, _ in _KERNEL_ACCUMULATORS:
        # hpcrun spells the block-shared-memory accumulator without its unit.
        acumu_unit = "" if short == "BLK_SM" else unit
        specs.append(
            GpuMetricSpec(
                f"GKER:{short}_ACUMU{acumu_unit}",
                f"GPU kernel: {what} accumulator [internal use only]",
                False,
                INVISIBLE,
                move_to_proc=True,
            )
        )
    first_accumulator = len(specs) - len(_KERNEL_ACCUMULATORS)
    count_index = len(specs) + len(_KERNEL_ACCUMULATORS)
    for offset, (short, unit, what, detail) in enumerate(_KERNEL_ACCUMULATORS):
        specs.append(
            GpuMetricSpec(
                f"GKER:{short}{unit}",
                f"GPU kernel: {what}{detail}",
                False,
                SHOW_EXCLUSIVE,
                show_percent=False,
                move_to_proc=True,
                formula=f"#{first_accumulator + offset}/#{count_index}",
                format="%6.0f",
            )
        )
    specs.append(GpuMetricSpec("GKER:COUNT", "GPU kernel: launch count", False, move_to_proc=True))
    fgp_act = first_accumulator + 3
    specs.append(
        GpuMetricSpec(
            "GKER:OCC_THR",
            "GPU kernel: theoretical occupancy (FGP_ACT / FGP_MAX)",
            False,
            SHOW_EXCLUSIVE,
            show_percent=False,
            move_to_proc=True,
            formula=f"100*(#{fgp_act}/#{fgp_act + 1})",
            format="%6.2f %%",
        )
    )
    return tuple(specs)


GPU_METRICS: tuple[GpuMetricSpec, ...] = _table()
_INDEX = {spec.name: index for index, spec in enumerate(GPU_METRICS)}
assert len(GPU_METRICS) == 63, "hpcrun writes 63 GPU activity metrics (meas/loops-cuda-nvidia-t.m)"


def metric_index(name: str) -> int:
    """The 0-based index of metric ``name`` within the GPU kind."""
    return _INDEX[name]


GPUOP = _INDEX["GPUOP (sec)"]
GKER = _INDEX["GKER (sec)"]
GMEM = _INDEX["GMEM (sec)"]
GMSET = _INDEX["GMSET (sec)"]
GXCOPY = _INDEX["GXCOPY (sec)"]
GSYNC = _INDEX["GSYNC (sec)"]
GMEM_BYTES = _INDEX["GMEM:UNK (B)"]  # + CUPTI memory kind (0..7)
GMEM_COUNT = _INDEX["GMEM:COUNT"]
GMSET_BYTES = _INDEX["GMSET:UNK (B)"]  # + memory kind
GMSET_COUNT = _INDEX["GMSET:COUNT"]
GXCOPY_BYTES = _INDEX["GXCOPY:UNK (B)"]  # + copy kind (0..10)
GXCOPY_COUNT = _INDEX["GXCOPY:COUNT"]
GSYNC_TIME = _INDEX["GSYNC:UNK (sec)"]  # + sync kind (0..4)
GSYNC_COUNT = _INDEX["GSYNC:COUNT"]
GKER_STMEM_ACUMU = _INDEX["GKER:STMEM_ACUMU (B)"]
GKER_DYMEM_ACUMU = _INDEX["GKER:DYMEM_ACUMU (B)"]
GKER_LMEM_ACUMU = _INDEX["GKER:LMEM_ACUMU (B)"]
GKER_FGP_ACT_ACUMU = _INDEX["GKER:FGP_ACT_ACUMU"]
GKER_FGP_MAX_ACUMU = _INDEX["GKER:FGP_MAX_ACUMU"]
GKER_THR_REG_ACUMU = _INDEX["GKER:THR_REG_ACUMU"]
GKER_BLK_THR_ACUMU = _INDEX["GKER:BLK_THR_ACUMU"]
GKER_BLK_SM_ACUMU = _INDEX["GKER:BLK_SM_ACUMU"]
GKER_BLKS_ACUMU = _INDEX["GKER:BLKS_ACUMU"]
GKER_COUNT = _INDEX["GKER:COUNT"]


def gpu_metric_kind() -> MetricKind:
    """A fresh GPU metric kind (each session adds its own; a kind's base is per session)."""
    return MetricKind(GPU_KIND_NAME, GPU_METRICS)


# -- issue #7: hpcrun's 30 GPU instruction metrics (PC sampling), before the activity metrics --

#: (name, description, show, real, move_to_proc), as ``meas/loops-cuda-nvidiapc-t.m`` has them
#: (metric table #0..#29, formats.md §1.6); GINS:LAT_THR carries a formula within this kind.
_PC_TABLE = (
    ("GINS:BLK_EXEC_CNT", "GPU basic block execution count", INVISIBLE, False, False),
    ("GINS:BLK_LAT", "GPU basic block latency", INVISIBLE, False, False),
    ("GINS:BLK_SIMD_ACT", "GPU basic block active SIMD lanes", INVISIBLE, False, False),
    ("GINS", "GPU instruction execution count", SHOW, False, False),
    ("GINS:LAT", "GPU instruction latency", SHOW, False, False),
    ("GINS:LAT_COV", "GPU instruction covered latency", SHOW, False, False),
    ("GINS:LAT_UCV", "GPU instruction uncovered latency", SHOW, False, False),
    ("GINS:LAT_THR", "GPU threads needed to cover latency (1 + UCV/COV)", SHOW, False, False),
    ("GINS:SIMD_TOT", "GPU instruction total SIMD lanes", SHOW, False, False),
    ("GINS:SIMD_ACT", "GPU instruction active SIMD lanes", SHOW, False, False),
    ("GINS:SIMD_WST", "GPU instruction wasted SIMD lanes", SHOW, False, False),
    (
        "GINS:SIMD_SLS",
        "GPU instruction SIMD lanes lost due to scalar instructions",
        SHOW,
        False,
        False,
    ),
    ("GINS:STL_ANY", "GPU instruction stalls: any", SHOW, False, False),
    ("GINS:STL_NONE", "GPU instruction stalls: no stall", HIDE, False, False),
    (
        "GINS:STL_IFET",
        "GPU instruction stalls: await availability of next instruction (fetch or branch delay)",
        HIDE,
        False,
        False,
    ),
    (
        "GINS:STL_IDEP",
        "GPU instruction stalls: await satisfaction of instruction input dependence",
        HIDE,
        False,
        False,
    ),
    (
        "GINS:STL_GMEM",
        "GPU instruction stalls: await completion of global memory access",
        HIDE,
        False,
        False,
    ),
    (
        "GINS:STL_TMEM",
        "GPU instruction stalls: texture memory request queue full",
        HIDE,
        False,
        False,
    ),
    (
        "GINS:STL_SYNC",
        "GPU instruction stalls: await completion of thread or memory synchronization",
        HIDE,
        False,
        False,
    ),
    (
        "GINS:STL_CMEM",
        "GPU instruction stalls: await completion of constant or immediate memory access",
        HIDE,
        False,
        False,
    ),
    (
        "GINS:STL_PIPE",
        "GPU instruction stalls: await completion of required compute resources",
        HIDE,
        False,
        False,
    ),
    (
        "GINS:STL_MTHR",
        "GPU instruction stalls: global memory request queue full",
        HIDE,
        False,
        False,
    ),
    (
        "GINS:STL_NSEL",
        "GPU instruction stalls: not selected for issue but ready",
        HIDE,
        False,
        False,
    ),
    ("GINS:STL_OTHR", "GPU instruction stalls: other", HIDE, False, False),
    ("GINS:STL_SLP", "GPU instruction stalls: sleep", HIDE, False, False),
    ("GSAMP:DRP", "GPU PC samples: dropped", HIDE, False, True),
    ("GSAMP:EXP", "GPU PC samples: expected", HIDE, False, True),
    ("GSAMP:TOT", "GPU PC samples: measured", HIDE, False, True),
    ("GSAMP:PER (cyc)", "GPU PC samples: period (GPU cycles)", HIDE, False, True),
    ("GSAMP:UTIL", "GPU utilization computed using PC sampling", SHOW, True, True),
)
PC_KIND_NAME = "gpu-instruction"
#: Formulas (#N within this kind) and formats of the reference's metric table.
_PC_FORMULAS = {
    "GINS:LAT_THR": ("(#5/#5) + (#6/#5)", "%6.0f"),
    "GSAMP:UTIL": ("min(100, max(0, 100*#27/#26))", "%6.2f %%"),
}


def _pc_table() -> tuple[GpuMetricSpec, ...]:
    specs = []
    for name, description, show, real, move in _PC_TABLE:
        formula, shape = _PC_FORMULAS.get(name, ("", ""))
        specs.append(
            GpuMetricSpec(
                name, description, real, show, move_to_proc=move, formula=formula, format=shape
            )
        )
    return tuple(specs)


PC_METRICS: tuple[GpuMetricSpec, ...] = _pc_table()
PC_INDEX = {spec.name: index for index, spec in enumerate(PC_METRICS)}
assert len(PC_METRICS) == 30, "hpcrun writes 30 GPU instruction metrics (meas/...nvidiapc-t.m)"


def pc_metric_kind() -> MetricKind:
    """A fresh GPU instruction (PC sampling) kind; added before :func:`gpu_metric_kind`."""
    return MetricKind(PC_KIND_NAME, PC_METRICS)


# -- issue #22: communication kernels (NCCL collectives), a kind of pyrun's own ----------------

COMM_KIND_NAME = "gpu-communication"
#: hpcrun has no communication metric; these two follow its naming (``GKER``, ``GKER:COUNT``).
#: Communication kernels are kernels too: their time is also in ``GKER (sec)``, so compute is
#: ``GKER - GCOMM``. Bytes are not among them: no record says them (docs/gpu.md).
COMM_METRICS: tuple[GpuMetricSpec, ...] = (
    GpuMetricSpec(
        "GCOMM (sec)",
        "GPU time: communication kernels (NCCL collectives, also in GKER) (seconds)",
        True,
        move_to_proc=True,
    ),
    GpuMetricSpec(
        "GCOMM:COUNT", "GPU communication kernels: launch count", False, move_to_proc=True
    ),
)
GCOMM, GCOMM_COUNT = 0, 1


def comm_metric_kind() -> MetricKind:
    """A fresh communication kind (added to a session at its first communication kernel)."""
    return MetricKind(COMM_KIND_NAME, COMM_METRICS)
