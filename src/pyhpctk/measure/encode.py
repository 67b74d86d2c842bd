"""Turn a thread's CCT into ``.hpcrun``, ``.hpctrace`` and ``logical/python.*`` bytes.

Two roads lead to the same bytes:

- :func:`profile_model` / :func:`trace_model` build the shared model objects of
  :mod:`pyhpctk.formats.hpcrun_model`, which :mod:`pyhpctk.formats.hpcrun` and
  :mod:`pyhpctk.formats.hpctrace` write. Tools and tests use this road.
- :func:`encode_profile` / :func:`encode_trace` / :func:`encode_logical` write the same layout with
  :mod:`struct` alone. The measurement runtime uses this road, because it runs *inside the
  measured program*: importing numpy there would add ~80 ms to every measured process, start
  BLAS thread pools the program never asked for, and change what ``sys.modules`` holds. The
  tests pin both roads to identical bytes (``test_pyrun_encode.py``), so the format still has one
  definition: formats.md, as implemented by :mod:`pyhpctk.formats`.

Layouts cite formats.md §1 (profile), §2 (trace) and §1.10 (logical metadata).
"""

from __future__ import annotations

import struct

from pyhpctk.formats.hpcrun_constants import (
    DEFAULT_ID_NAMES,
    ENDIAN_BIG,
    FOOTER_MAGIC,
    INTERP_LOGIC_LOCAL,
    INTERP_LOGIC_ONLY,
    KIND_NODE,
    KIND_RANK,
    KIND_THREAD,
    LOGICAL_MAGIC,
    NUL_IN_NAME,
    PROFILE_MAGIC,
    PROFILE_VERSION,
    SECTION_ALIGNMENT,
    SPARSE_END_NODE,
    THREADS_MAGIC,
    TRACE_MAGIC,
    TRACE_VERSION,
    id_kind_word,
)

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from pyhpctk.formats.hpcrun_model import HpcrunProfile, HpctraceFile
    from pyhpctk.measure.cct import FunctionStanza, MetricKind, ThreadCCT

# formats.md §1.3, §2: the 24 bytes every profile and trace starts with (magic, version, "b").
PROFILE_HEADER_PREFIX = PROFILE_MAGIC + PROFILE_VERSION.encode("ascii") + ENDIAN_BIG
TRACE_HEADER_PREFIX = TRACE_MAGIC + TRACE_VERSION.encode("ascii") + ENDIAN_BIG

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CCT_NODE = struct.Struct(">IIHQB")  # formats.md §1.5, 19 bytes
_LOAD_MODULE_TAIL = struct.Struct(">Q")
_METRIC_TAIL = struct.Struct(">HHdQ")  # is_frequency, is_multiplexed, threshold, num_samples
_ID_ELEMENT = struct.Struct(">HQQ")  # formats.md §1.8, 18 bytes
_VALUE = struct.Struct(">dH")  # a real value's bits are the IEEE double, big-endian
_INT_VALUE = struct.Struct(">QH")  # an integer metric's value is a u64 (formats.md §1.6 valFmt)
_NODE_START = struct.Struct(">IQ")
_TRACE_RECORD = struct.Struct(">QI")  # formats.md §2, 12 bytes


class ProfileIdentity:
    """What the header nv-pairs and the id tuple say about one thread (formats.md §1.3, §1.8)."""

    __slots__ = (
        "env_path",
        "host_id",
        "job_id",
        "mpi_rank",
        "pid",
        "program_name",
        "program_path",
        "thread",
    )

    def __init__(
        self,
        program_name: str,
        program_path: str,
        env_path: str,
        job_id: str,
        mpi_rank: int | None,
        thread: int,
        host_id: int,
        pid: int,
    ) -> None:
        self.program_name = program_name
        self.program_path = program_path
        self.env_path = env_path
        self.job_id = job_id
        self.mpi_rank = mpi_rank
        self.thread = thread
        self.host_id = host_id
        self.pid = pid

    def nvpairs(self, trace_min: int, trace_max: int) -> list[tuple[str, str]]:
        """The header nv-pairs in hpcrun's order (formats.md §1.3)."""
        return [
            ("program-name", self.program_name),
            ("program-path", self.program_path),
            ("env-path", self.env_path),
            ("job-id", self.job_id),
            ("mpi-rank", str(self.mpi_rank or 0)),
            ("thread-id", str(self.thread)),
            ("host-id", f"{self.host_id:x}"),
            ("process-id", str(self.pid)),
            ("trace-min-time", str(trace_min)),
            ("trace-max-time", str(trace_max)),
            ("trace-disorder", "0"),
        ]

    def id_tuple(self) -> list[tuple[int, int, int]]:
        """``(kind word, physical, logical)`` as hpcrun writes a CPU thread (formats.md §1.8)."""
        elements = [(id_kind_word(KIND_NODE, INTERP_LOGIC_LOCAL), self.host_id, 0)]
        if self.mpi_rank is not None:
            rank = id_kind_word(KIND_RANK, INTERP_LOGIC_ONLY)
            elements.append((rank, self.mpi_rank, self.mpi_rank))
        elements.append((id_kind_word(KIND_THREAD, INTERP_LOGIC_ONLY), self.thread, self.thread))
        return elements


def _str(text: str) -> bytes:
    # A C string cannot hold NUL (formats.md §1.1): a Python name that does is written escaped.
    raw = text.replace("\0", NUL_IN_NAME).encode("utf-8", "surrogateescape")
    return _U32.pack(len(raw)) + raw


def _pad_to(chunks: list[bytes], size: int) -> int:
    """Pad the output to the next section boundary; return the new offset."""
    start = -(-size // SECTION_ALIGNMENT) * SECTION_ALIGNMENT
    if start > size:
        chunks.append(bytes(start - size))
    return start


def _node_values(
    cct: ThreadCCT, kinds: Sequence[MetricKind], clamp: bool = False
) -> list[tuple[int, list[tuple[int, float, bool]]]]:
    """Per node with values, in file (index) order: ``(metric index, value, is_real)``.

    With ``clamp``, integer values are rounded into what the file holds (0..2^64-1; a
    negative count becomes 0, so it is not stored).

    formats.md §1.8: only non-zero values are stored, metric indices ascending within a node.
    """
    per_node: dict[int, list[tuple[int, float, bool]]] = {}
    for kind in kinds:
        store = cct.kinds.get(kind.name)
        if store is None:
            continue
        width = kind.width
        values = store.values
        real = [spec.is_real for spec in kind.metrics]
        for node, slot in store.slot_of.items():
            for metric in range(width):
                value = values[slot * width + metric]
                if clamp and not real[metric]:  # a count the file cannot hold: the nearest
                    value = min(max(round(value), 0), (1 << 64) - 1)
                if value != 0.0:
                    per_node.setdefault(node, []).append((kind.base + metric, value, real[metric]))
    return [(node, sorted(per_node[node])) for node in sorted(per_node)]


def _pack_values(triples: list[tuple[int, float, bool]]) -> list[bytes]:
    """The (value, metric) pairs of one node; integer metrics are u64 in the file.

    An integer value outside 0..2^64-1 is a ValueError naming the metric.
    """
    try:
        return [
            _VALUE.pack(value, index) if real else _INT_VALUE.pack(round(value), index)
            for index, value, real in triples
        ]
    except struct.error:
        index, value = next(
            (i, round(v)) for i, v, real in triples if not real and not 0 <= round(v) < 1 << 64
        )
        raise ValueError(
            f"integer metric {index} has the value {value}, which an .hpcrun file cannot hold"
        ) from None


def _rebase_formula(formula: str, base: int) -> str:
    """Shift every metric reference ``#N`` of ``formula`` by ``base`` (formats.md §1.6).

    A kind numbers its metrics from 0; in the file, metric N of a kind is ``base + N``. A small
    scanner rather than :mod:`re`: this module runs in every measured process.
    """
    if not base or "#" not in formula:
        return formula
    out: list[str] = []
    i = 0
    while i < len(formula):
        char = formula[i]
        out.append(char)
        i += 1
        if char == "#":
            j = i
            while j < len(formula) and formula[j].isdigit():
                j += 1
            if j > i:
                out.append(str(int(formula[i:j]) + base))
                i = j
    return "".join(out)


def metric_table(kinds: Sequence[MetricKind]) -> bytes:
    """The metric-table section (formats.md §1.6) for ``kinds`` in base order."""
    chunks = [_U32.pack(sum(kind.width for kind in kinds))]
    for kind in kinds:
        for spec in kind.metrics:
            chunks += [
                _str(spec.name),
                _str(spec.description or spec.name),
                spec.flags(),
                _U64.pack(spec.period),
                # A GPU layer's specs may carry formulas; their #N count within the kind.
                _str(_rebase_formula(getattr(spec, "formula", ""), kind.base)),
                _str(getattr(spec, "format", "")),
                _METRIC_TAIL.pack(0, 0, 0.0, 0),
            ]
    return b"".join(chunks)


def encode_profile(
    cct: ThreadCCT,
    identity: ProfileIdentity,
    load_modules: Sequence[tuple[int, str, int]],
    kinds: Sequence[MetricKind],
    trace_span: tuple[int, int] = (0, 0),
    clamp_counts: bool = False,
) -> bytes:
    """The bytes of one ``.hpcrun`` file (formats.md §1.2-§1.9).

    An integer metric value the file cannot hold (a negative count) is a ValueError, or with
    ``clamp_counts`` written as the nearest value it can hold.
    """
    chunks: list[bytes] = []
    footer: list[int] = []
    # formats.md §1.3: header.
    nvpairs = identity.nvpairs(*trace_span)
    header = [PROFILE_HEADER_PREFIX, _U32.pack(len(nvpairs))]
    for name, value in nvpairs:
        header += [_str(name), _str(value)]
    size = 0

    def section(body: bytes) -> None:
        nonlocal size
        start = _pad_to(chunks, size) if chunks else 0
        chunks.append(body)
        size = start + len(body)
        footer.extend((start, size))

    section(b"".join(header))
    # formats.md §1.4: load map.
    section(
        _U32.pack(len(load_modules))
        + b"".join(
            _U16.pack(lm_id) + _str(path) + _LOAD_MODULE_TAIL.pack(flags)
            for lm_id, path, flags in load_modules
        )
    )
    # formats.md §1.5: CCT, parents before children (node index order guarantees it).
    written = [cct.written_id(node) for node in range(len(cct))]
    pack_node = _CCT_NODE.pack
    section(
        _U64.pack(len(cct))
        + b"".join(
            pack_node(
                written[node],
                written[parent] if parent >= 0 else 0,
                lm,
                ip,
                unwound,
            )
            for node, (parent, lm, ip, unwound) in enumerate(
                zip(cct.parent, cct.lm, cct.ip, cct.unwound, strict=True)
            )
        )
    )
    # formats.md §1.6: metric table (after the CCT).
    section(metric_table(kinds))
    # formats.md §1.7: id-tuple dictionary.
    section(
        _U16.pack(len(DEFAULT_ID_NAMES))
        + b"".join(_U16.pack(kind) + _str(name) for kind, name in DEFAULT_ID_NAMES)
    )
    # formats.md §1.8: this thread's id tuple and sparse values.
    id_tuple = identity.id_tuple()
    node_values = _node_values(cct, kinds, clamp_counts)
    n_values = sum(len(triples) for _, triples in node_values)
    starts: list[bytes] = []
    pairs: list[bytes] = []
    for node, triples in node_values:
        starts.append(_NODE_START.pack(written[node], len(pairs)))
        pairs += _pack_values(triples)
    starts.append(_NODE_START.pack(SPARSE_END_NODE, n_values))
    section(
        _U16.pack(len(id_tuple))
        + b"".join(_ID_ELEMENT.pack(*element) for element in id_tuple)
        + _U64.pack(n_values)
        + _U32.pack(len(node_values))
        + b"".join(pairs)
        + b"".join(starts)
    )
    # formats.md §1.9: footer, itself on a section boundary.
    footer_start = _pad_to(chunks, size)
    chunks.append(struct.pack(">14Q", *footer, footer_start, FOOTER_MAGIC))
    return b"".join(chunks)


def encode_trace(cct: ThreadCCT, times: Iterable[int], nodes: Iterable[int]) -> bytes:
    """The bytes of one ``.hpctrace`` file: header, flags 0, ``(time ns, node id)`` records."""
    pack = _TRACE_RECORD.pack
    written = cct.written_id
    return (
        TRACE_HEADER_PREFIX
        + _U64.pack(0)
        + b"".join(pack(time, written(node)) for time, node in zip(times, nodes, strict=True))
    )


def encode_logical(stanzas: Iterable[FunctionStanza]) -> bytes:
    """The bytes of ``logical/python.XXXXXXXX`` (formats.md §1.10)."""
    chunks = [LOGICAL_MAGIC]
    for stanza in stanzas:
        chunks += [
            _U32.pack(stanza.fid),
            _str(stanza.funcname),
            b"\x00",  # mangling: none
            _str(stanza.filename),
            _U32.pack(stanza.lineno),
        ]
    return b"".join(chunks)


_THREADS_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def encode_threads(keyed_by: str, entries: Iterable[tuple[str, int, str, str]]) -> bytes:
    """The bytes of a thread-names file (docs/formats.md, "Thread names"): ``entries`` are
    ``(key, pid, program, name)``; :func:`pyhpctk.formats.threads.to_bytes` writes the same."""
    lines = [THREADS_MAGIC.decode("ascii") + keyed_by]
    for key, pid, program, name in entries:
        fields = (key, program, name)
        key, program, name = (text.translate(_THREADS_ESCAPES) for text in fields)
        lines.append(f"{key}\t{pid}\t{program}\t{name}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def profile_model(
    cct: ThreadCCT,
    identity: ProfileIdentity,
    load_modules: Sequence[tuple[int, str, int]],
    kinds: Sequence[MetricKind],
    trace_span: tuple[int, int] = (0, 0),
) -> HpcrunProfile:
    """The same profile as :func:`encode_profile`, as the shared model (imports numpy)."""
    import numpy as np

    from pyhpctk.formats.hpcrun_model import (
        CCT_NODE_DTYPE,
        ID_TUPLE_ELEMENT_DTYPE,
        METRIC_VALUE_DTYPE,
        NODE_START_DTYPE,
        HpcrunProfile,
        LoadModule,
        MetricDescriptor,
    )

    written = [cct.written_id(node) for node in range(len(cct))]
    nodes = np.zeros(len(cct), dtype=CCT_NODE_DTYPE)
    nodes["id"] = written
    nodes["parent_id"] = [written[p] if p >= 0 else 0 for p in cct.parent]
    nodes["lm_id"] = list(cct.lm)
    nodes["lm_ip"] = list(cct.ip)
    nodes["flags"] = list(cct.unwound)
    node_values = _node_values(cct, kinds)
    triples = [triple for _, node_triples in node_values for triple in node_triples]
    values = np.zeros(len(triples), dtype=METRIC_VALUE_DTYPE)
    values["metric"] = [index for index, _, _ in triples]
    real = np.array([is_real for _, _, is_real in triples], dtype=bool)
    as_double = np.array([value for _, value, _ in triples], dtype=np.float64)
    bits = np.where(real, as_double.view(np.uint64), np.rint(as_double).astype(np.uint64))
    values["value_bits"] = bits
    starts = np.zeros(len(node_values), dtype=NODE_START_DTYPE)
    running = 0
    for index, (node, node_triples) in enumerate(node_values):
        starts[index] = (written[node], running)
        running += len(node_triples)
    metrics = [
        MetricDescriptor(
            name=spec.name,
            description=spec.description or spec.name,
            flags=spec.flags(),
            period=spec.period,
            formula=getattr(spec, "formula", ""),
            format=getattr(spec, "format", ""),
        )
        for kind in kinds
        for spec in kind.metrics
    ]
    return HpcrunProfile(
        nvpairs=identity.nvpairs(*trace_span),
        load_modules=[LoadModule(lm_id, path, flags) for lm_id, path, flags in load_modules],
        cct=nodes,
        metrics=metrics,
        id_names=list(DEFAULT_ID_NAMES),
        id_tuple=np.array(identity.id_tuple(), dtype=ID_TUPLE_ELEMENT_DTYPE),
        values=values,
        node_starts=starts,
    )


def trace_model(cct: ThreadCCT, times: Sequence[int], nodes: Sequence[int]) -> HpctraceFile:
    """The same trace as :func:`encode_trace`, as the shared model (imports numpy)."""
    import numpy as np

    from pyhpctk.formats.hpcrun_model import TRACE_RECORD_DTYPE, HpctraceFile

    records = np.zeros(len(times), dtype=TRACE_RECORD_DTYPE)
    records["time"] = list(times)
    records["node_id"] = [cct.written_id(node) for node in nodes]
    return HpctraceFile(flags=0, records=records)
