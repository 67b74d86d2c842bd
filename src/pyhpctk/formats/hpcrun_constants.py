"""The measurement files' constants, declared once: magics, flags, identifier kinds, placeholders.

What ``.hpcrun`` (formats.md §1), ``.hpctrace`` (§2) and ``logical/python.*`` (§1.10) files hold
besides their records' layouts: the magic strings, section alignment and sentinels, the flag bits
of nodes, load modules, metrics and traces, the identifier-tuple kinds and interpretations, the
lm ids hpcrun reserves, and the 8-character placeholder codes. :mod:`.hpcrun_model` (the numpy
model the readers and writers share) and pyrun's encoder (:mod:`pyhpctk.measure.encode`, which
runs inside measured processes) both take them from here.

Standard library only and cheap to import: the measured process imports it (style.md item 16).
"""

from __future__ import annotations

import struct

# formats.md §1.3, §2, §1.10: the magic strings and versions.
PROFILE_MAGIC = b"HPCRUN-profile____"
PROFILE_VERSION = "04.00"
TRACE_MAGIC = b"HPCRUN-trace______"
TRACE_VERSION = "01.01"
LOGICAL_MAGIC = b"HPCLOGICAL"
# pyhpctk's own side file (docs/formats.md, "Thread names"): the first line of a ``threads/``
# file of a measurement directory (keys: profile file stems) or of a database's threads.txt
# (keys: profile.db indices). Neither hpcprof nor hpcviewer reads it.
THREADS_MAGIC = b"pyhpctk-threads 1 "
THREADS_BY_FILE, THREADS_BY_PROFILE = "by-file", "by-profile"
#: pyhpctk's loaded-sources side file (docs/formats.md, "Loaded sources"): its first line.
SOURCES_MAGIC = b"pyhpctk-sources 1\n"
#: pyhpctk's loaded-modules side file (docs/formats.md, "Loaded modules"): its first line.
MODULES_MAGIC = b"pyhpctk-modules 1\n"
ENDIAN_BIG = b"b"
# formats.md §1.1, §1.10: hpcrun's strings are C strings (and meta.db's, §3), so a NUL cannot be
# in one. Python names can hold it (``code.replace(co_name="a\0b")``): pyrun writes each NUL of
# a name as these four characters, as Python's repr shows it, so that every reader takes it.
NUL_IN_NAME = "\\x00"
FOOTER_MAGIC = 0x48504352554E736D  # formats.md §1.9: the last 8 bytes read "HPCRUNsm"
SECTION_ALIGNMENT = 1024  # formats.md §1.2; hpcrun's write_data.c MULTIPLE_1024
SPARSE_END_NODE = 0x656E6421  # formats.md §1.8: "end!", the node-start sentinel

# formats.md §1.4, §1.5, §2: flag bits.
CCT_FLAG_UNWOUND = 0x1
CCT_ID_RETAINED = 0x1  # bit 0 of a node id marks the leaf of a trace sample
LM_FLAG_ANALYZE = 0x1
TRACE_FLAG_DATA_CENTRIC = 0x1
TRACE_FLAG_LCA = 0x2
TRACE_FLAG_CALL_TRACE = 0x4  # GPU stream traces: records name the call context

# formats.md §1.5: lm ids hpcrun reserves. 0 marks a placeholder node; the three highest name
# hpcrun's "outlined range trees" (GPU_ROOT is a second root).
PLACEHOLDER_LM_ID = 0
GPU_ROOT_LM_ID, GPU_RANGE_LM_ID, GPU_CONTEXT_LM_ID = 65533, 65532, 65531

# formats.md §1.10: a Python logical frame's lm_ip is fid << 32 | line; fid 0 is "unknown".
LOGICAL_FID_SHIFT = 32
LOGICAL_LINE_MASK = 0xFFFFFFFF
UNKNOWN_FID = 0

# formats.md §1.7: the identifier dictionary hpcrun always writes.
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
ID_KIND_NAMES = dict(DEFAULT_ID_NAMES)

# formats.md §1.8: id-tuple kinds (bits 0-13 of an element's kind word) and interpretations
# (bits 14-15).
KIND_SUMMARY, KIND_NODE, KIND_RANK, KIND_THREAD = 0, 1, 2, 3
KIND_GPUDEVICE, KIND_GPUCONTEXT, KIND_GPUSTREAM, KIND_CORE = 4, 5, 6, 7
INTERP_BOTH_VALID, INTERP_LOGIC_LOCAL, INTERP_LOGIC_GLOBAL, INTERP_LOGIC_ONLY = 0, 1, 2, 3
ID_INTERPRETATION_NAMES = {0: "BOTH_VALID", 1: "LOGIC_LOCAL", 2: "LOGIC_GLOBAL", 3: "LOGIC_ONLY"}
INTERP_SHIFT = 14


def id_kind_word(kind: int, interpretation: int) -> int:
    """An id-tuple element's kind word: the kind in bits 0-13, its interpretation above."""
    return (interpretation << INTERP_SHIFT) | kind


def id_kind(kind: int) -> int:
    """The kind (bits 0-13) of an id-tuple element's ``kind`` field (formats.md §1.8)."""
    return kind & 0x3FFF


def id_interpretation(kind: int) -> int:
    """The interpretation (bits 14-15) of an id-tuple element's ``kind`` field."""
    return (kind >> INTERP_SHIFT) & 0x3


# formats.md §1.6: fields of the 16-byte metric flags block (little-endian C struct).
METRIC_TYPE_NAMES = {0: "null", 1: "raw", 2: "final", 3: "derived"}
METRIC_VALTY_NAMES = {0: "null", 1: "inclusive", 2: "exclusive"}
VALFMT_INT, VALFMT_REAL = 1, 2
METRIC_VALFMT_NAMES = {0: "null", VALFMT_INT: "int", VALFMT_REAL: "real"}
METRIC_SHOW_NAMES = {
    0: "hide",
    1: "show",
    2: "show-inclusive",
    3: "show-exclusive",
    4: "invisible",
}


def metric_flags(
    type: int = 1,
    value_type: int = 0,
    value_format: int = VALFMT_REAL,
    move_to_proc: bool = False,
    partner: int = 0,
    show: int = 1,
    show_percent: bool = True,
) -> bytes:
    """The 16-byte metric flags block (formats.md §1.6), as hpcrun writes it.

    ::

        byte  0     1      2       3          4-5 (LE)  6     7            8-15
              type  valTy  valFmt  move2proc  partner   show  showPercent  unused (0)
    """
    return struct.pack(
        "<BBBBHBB8x",
        type,
        value_type,
        value_format,
        int(move_to_proc),
        partner,
        show,
        int(show_percent),
    )


# Metric names carry their unit in parentheses (``CPUTIME (sec)``, ``GKER (sec)``, formats.md §1.6
# and §7); a time can be neither negative nor anything but a finite number.
TIME_UNITS = frozenset({"sec", "s", "msec", "ms", "usec", "us", "nsec", "ns"})


def is_time_metric(name: str) -> bool:
    """Does metric ``name`` measure a time (its unit suffix is seconds or a fraction of one)?"""
    head, _, unit = name.rpartition(" (")
    return bool(head) and unit.endswith(")") and unit[:-1] in TIME_UNITS


# formats.md §1.5: the placeholders code refers to by name.
PRIMARY_ROOT = "^Primary"
PARTIAL_ROOT = "^Partial"
NO_ACTIVITY = "NoActvty"
MAIN_FENCE = "| Main  "
THREAD_FENCE = "| Thread"
UNNORMALIZED = "*Unnorm "
WORKERS_OPENMP = "WorkOMP "
WORKERS_OPENBLAS = "WorkBLAS"
WORKERS_PYTORCH = "WorkTrch"

# formats.md §1.5 and HPCToolkit's placeholders.c: the 8-character code of each placeholder and
# the name it is presented under (placeholders.c gives none for the first four and "OMT None";
# those names here are descriptive).
PLACEHOLDER_NAMES: dict[str, str] = {
    UNNORMALIZED: "<unnormalized ip>",
    PRIMARY_ROOT: "<primary root>",
    PARTIAL_ROOT: "<partial root>",
    NO_ACTIVITY: "<no activity>",
    MAIN_FENCE: "<program root>",
    THREAD_FENCE: "<thread root>",
    "OMP Idle": "<omp idle>",
    "OMPOvrHd": "<omp overhead>",
    "OMPBarrW": "<omp barrier wait>",
    "OMPTaskW": "<omp task wait>",
    "OMPMtexW": "<omp mutex wait>",
    "OMPUresv": "<omp region unresolved>",
    "OMTAlloc": "<omp tgt alloc>",
    "OMTDelte": "<omp tgt delete>",
    "OMTCpIn ": "<omp tgt copyin>",
    "OMTCpOut": "<omp tgt copyout>",
    "OMTKernl": "<omp tgt kernel>",
    "OMT None": "<omp tgt none>",
    "GPUCp?2?": "<gpu copy>",
    "GPUCpH2D": "<gpu copyin>",
    "GPUCpD2H": "<gpu copyout>",
    "GPUAlloc": "<gpu alloc>",
    "GPUDelte": "<gpu delete>",
    "GPUKernl": "<gpu kernel>",
    "GPUMemst": "<gpu memset>",
    "GPU Sync": "<gpu sync>",
    "GPUTrace": "<gpu kernel>",
    # pyhpctk's own, never in a measurement: pyprof places a native runtime's worker threads
    # under the Python line that gave them work below one of these (analysis/runtimes.py).
    WORKERS_OPENMP: "<OpenMP worker threads>",
    WORKERS_OPENBLAS: "<OpenBLAS worker threads>",
    WORKERS_PYTORCH: "<PyTorch worker threads>",
}


def placeholder_ip(text: str) -> int:
    """Pack an 8-character placeholder name (``^Primary``, ``GPUKernl``...) as hpcrun does."""
    raw = text.encode("ascii")
    if len(raw) != 8:
        raise ValueError(f"placeholder names are 8 ASCII characters, got {text!r}")
    return int.from_bytes(raw, "big")


def placeholder_text(ip: int) -> str:
    """The 8-character name packed in a placeholder node's ``lm_ip``."""
    return ip.to_bytes(8, "big").decode("ascii", errors="replace")


def frame_name(qualname: str) -> str:
    """The name a Python function's logical stanza carries (formats.md §1.10), from its code
    object's ``co_qualname``: the class path and the function (``Vector.__sub__``), without the
    functions it is defined in (``main.<locals>.worker`` is ``worker``, ``f.<locals>.Inner.g``
    is ``Inner.g``): ``<locals>`` tells a reader nothing, and a nested function is known by
    its own name, as in a traceback (issue #36 item 5)."""
    _, nested, own = qualname.rpartition("<locals>.")
    return own if nested else qualname
