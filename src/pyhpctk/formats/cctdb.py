"""``cct.db`` v4.0: context-major sparse metric values (formats.md §3.4, §3.6, §3.9).

The same values as ``profile.db``'s thread profiles, transposed: for every context (indexed by
ctxId; entry 0 is the global context) the metrics it has values for, and per metric the
``(profile index, value)`` pairs. A viewer reads one context's block to show it across all threads.

Reading is lazy: :func:`read` memory-maps a path and parses the header and the context infos
(32 bytes per context); a context's block becomes numpy views of the file only when used
(``db.values[ctx_id]``), and is checked then. ``read(..., lazy=False)`` instead copies every block
into two packed arrays (:class:`PackedContexts`) with one slice per context and checks them all
in one vectorised pass (:func:`packed_problems`).

Writing reproduces hpcprof's layout byte for byte (formats.md §3.6): blocks in ctxId order, each
4-aligned, empty ones pointing where the next starts. One difference is deliberate: bytes
0x20-0x2f of the header, which hpcprof leaves uninitialised (formats.md §3.9.2; every sample holds
``00*8 01 00*7`` there), are written as zeros, and the reader ignores them. :func:`normalise`
zeroes them in a file image so that hpcprof's files and ours can be compared byte for byte.

Parallel writers use :func:`layout` (an exclusive scan over per-context sizes) with
:func:`write_head`, :func:`write_block` and :func:`write_footer`. :func:`transpose` turns
profile-major values into this file's context-major form with one stable numpy sort.

This module never loops over values in Python (only over contexts).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, TextIO, overload

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats import _blocks, _db, _window
from pyhpctk.formats._db import pwrite_all, struct_dtype
from pyhpctk.formats.profiledb import ProfileDB, ProfileValues

FORMAT_ID = _db.FORMAT_IDS["cct"]
FOOTER = _db.FOOTERS[FORMAT_ID]

# formats.md §3.4 / §3.9.2: one section, but the header is 0x30 bytes; 0x20-0x2f are junk.
HEADER_END = 0x30
UNINITIALISED = slice(0x20, 0x30)

# formats.md §3.4, CtxInfos section header: { {CI}[n]* pCtxs; u32 nCtxs; u8 szCtx }.
CTX_SECTION_DTYPE = struct_dtype(
    [("p_ctxs", "<u8", 0x00), ("n_ctxs", "<u4", 0x08), ("sz_ctx", "u1", 0x0C)], 0x10
)
assert CTX_SECTION_DTYPE.itemsize == 16

# formats.md §3.4, {CI} context info (32 bytes):
#   0x00 u64 nValues | 0x08 ptr pValues | 0x10 u16 nMetrics | 0x18 ptr pMetricIndices
_CTX_INFO_FIELDS = [
    ("n_values", "<u8", 0x00),
    ("p_values", "<u8", 0x08),
    ("n_metrics", "<u2", 0x10),
    ("p_metric_indices", "<u8", 0x18),
]
CTX_INFO_SIZE = 0x20
CTX_INFO_DTYPE = struct_dtype(_CTX_INFO_FIELDS, CTX_INFO_SIZE)
assert CTX_INFO_DTYPE.itemsize == 32
_CTX_INFOS = _db.RecordTable(
    "CtxInfos",
    CTX_SECTION_DTYPE,
    "p_ctxs",
    "n_ctxs",
    "sz_ctx",
    "szCtx",
    "{CI}",
    _CTX_INFO_FIELDS,
    CTX_INFO_SIZE,
)

# formats.md §3.4, the context-major block: packed, 2- or 4-aligned (§3.9.7).
CCT_VALUE_DTYPE = np.dtype([("prof_index", "<u4"), ("value", "<f8")])  # '<Id'
assert CCT_VALUE_DTYPE.itemsize == 12
CCT_METRIC_INDEX_DTYPE = np.dtype([("metric_id", "<u2"), ("start", "<u8")])  # '<HQ'
assert CCT_METRIC_INDEX_DTYPE.itemsize == 10

BLOCK_ALIGN = 4


# --------------------------------------------------------------------------------------------
# Model


@dataclass(frozen=True, slots=True, eq=False)
class ContextValues:
    """One context's block (formats.md §3.4).

    ``metric_indices`` (:data:`CCT_METRIC_INDEX_DTYPE`) lists the metrics with values, ascending,
    each with the index of its first pair in ``values`` (:data:`CCT_VALUE_DTYPE`), where profile
    indices ascend within a metric. Both may be read-only views of a memory-mapped file.
    """

    metric_indices: npt.NDArray[np.void]
    values: npt.NDArray[np.void]

    def __post_init__(self) -> None:
        if self.metric_indices.dtype != CCT_METRIC_INDEX_DTYPE:
            raise TypeError("metric_indices must have dtype CCT_METRIC_INDEX_DTYPE")
        if self.values.dtype != CCT_VALUE_DTYPE:
            raise TypeError("values must have dtype CCT_VALUE_DTYPE")

    @classmethod
    def empty(cls) -> ContextValues:
        return cls(np.zeros(0, CCT_METRIC_INDEX_DTYPE), np.zeros(0, CCT_VALUE_DTYPE))

    @classmethod
    def from_triples(
        cls, metric_ids: npt.ArrayLike, prof_indices: npt.ArrayLike, values: npt.ArrayLike
    ) -> ContextValues:
        """Build a block from parallel (metric, profile, value) arrays in any order; drops zeros."""
        met = np.asarray(metric_ids, dtype=np.uint16).ravel()
        prof = np.asarray(prof_indices, dtype=np.uint32).ravel()
        val = np.asarray(values, dtype=np.float64).ravel()
        if not met.shape == prof.shape == val.shape:
            raise ValueError("metric_ids, prof_indices and values must have the same length")
        return cls(
            *_db.block_from_triples(
                met, prof, val, CCT_METRIC_INDEX_DTYPE, CCT_VALUE_DTYPE, "(metric, profile)"
            )
        )

    @property
    def n_values(self) -> int:
        return len(self.values)

    @property
    def n_metrics(self) -> int:
        return len(self.metric_indices)

    def metric_ids(self) -> npt.NDArray[np.uint16]:
        return np.asarray(self.metric_indices["metric_id"], dtype=np.uint16)

    def bounds(self) -> npt.NDArray[np.uint64]:
        """``n_metrics + 1`` indices: metric ``i`` owns ``values[b[i]:b[i+1]]``."""
        return _db.block_bounds(self.metric_indices, self.n_values)

    def metric(self, metric_id: int) -> npt.NDArray[np.void]:
        """The ``(prof_index, value)`` pairs of one metric (empty when it has none): a view."""
        return _db.block_entry(self.metric_indices, "metric_id", self.values, metric_id)

    def value_metric_ids(self) -> npt.NDArray[np.uint16]:
        """The metric id of every value (the block expanded to coordinate form)."""
        return np.asarray(
            _db.block_keys(self.metric_indices, "metric_id", self.n_values), np.uint16
        )

    def problems(self) -> list[str]:
        """Consistency problems of this block (formats.md §3.4), empty when clean."""
        # The one-block case of packed_problems, kept lean: pyview reads contexts one at a time.
        return _db.block_problems(
            self.metric_indices, "metric_id", self.values, "prof_index", "metric", "profile indices"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ContextValues):
            return NotImplemented
        return _db.same_bits(self.metric_indices, other.metric_indices) and _db.same_bits(
            self.values, other.values
        )

    __hash__ = None  # type: ignore[assignment]


def packed_problems(
    metric_indices: npt.NDArray[np.void],
    values: npt.NDArray[np.void],
    metric_bounds: npt.NDArray[np.int64],
    value_bounds: npt.NDArray[np.int64],
) -> list[tuple[int, str]]:
    """``(ctx, problem)`` for the first context breaking each rule of formats.md §3.4.

    Context ``c`` owns ``metric_indices[metric_bounds[c]:metric_bounds[c+1]]`` and
    ``values[value_bounds[c]:value_bounds[c+1]]``. One vectorised pass over all contexts.
    """
    found: list[tuple[int, str]] = []
    mb = np.asarray(metric_bounds, dtype=np.int64)
    vb = np.asarray(value_bounds, dtype=np.int64)
    nm, nv = np.diff(mb), np.diff(vb)
    n_ctx = len(nm)
    owner = np.repeat(np.arange(n_ctx), nm)  # the context of every metric index
    ids = metric_indices["metric_id"]
    starts = metric_indices["start"]
    first = np.zeros(len(ids), dtype=bool)
    first[mb[:-1][nm > 0]] = True

    def report(bad: npt.NDArray[np.bool_], ctx_of: npt.NDArray[np.int64], problem: str) -> None:
        hits = np.flatnonzero(bad)
        if len(hits):
            found.append((int(ctx_of[hits[0]]), problem))

    report((ids[1:] <= ids[:-1]) & ~first[1:], owner[1:], "metric ids are not strictly ascending")
    report(first & (starts != 0), owner, "the first metric does not start at value 0")
    broken = (starts[1:] < starts[:-1]) & ~first[1:]
    report(broken, owner[1:], "metric start indices are not ascending within the values")
    over = starts > nv[owner].astype(np.uint64)
    report(over, owner, "metric start indices are not ascending within the values")
    report((nv > 0) & (nm == 0), np.arange(n_ctx), "values but no metric owns them")
    # A context whose starts are broken has no runs to check; leave its values out.
    skip = np.zeros(n_ctx, dtype=bool)
    skip[owner[1:][broken]] = True
    skip[owner[over]] = True
    skipped = np.repeat(skip, nv) if np.any(skip) else None
    # Where each metric's run of values starts, as an index into ``values``.
    run_at = vb[owner] + starts.astype(np.int64)
    run_start = np.zeros(len(values), dtype=bool)
    run_start[run_at[(run_at < vb[owner + 1]) & ~skip[owner]]] = True
    run_start[vb[:-1][nv > 0]] = True
    prof = values["prof_index"]

    def report_value(bad: npt.NDArray[np.bool_], shift: int, problem: str) -> None:
        if skipped is not None:
            bad &= ~skipped[shift:]
        hits = np.flatnonzero(bad)
        if len(hits):  # the owner of value j is the last context starting at or before j
            found.append((int(np.searchsorted(vb, hits[0] + shift, side="right")) - 1, problem))

    unsorted = prof[1:] <= prof[:-1]
    unsorted &= ~run_start[1:]
    report_value(unsorted, 1, "profile indices are not strictly ascending within a metric")
    report_value(values["value"] == 0.0, 0, "a zero value is stored (zeros are never stored)")
    return found


def _range_index(
    starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The concatenation of ``arange(s, s + n)`` for every ``(s, n)``, without a Python loop."""
    total = int(lengths.sum())
    index = np.arange(total, dtype=np.int64)
    if total:
        index += np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return index


def _gather(
    buf: _db.Buffer,
    values_at: npt.NDArray[np.int64],
    n_values: npt.NDArray[np.int64],
    metrics_at: npt.NDArray[np.int64],
    n_metrics: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.void], npt.NDArray[np.void]]:
    """Every context's values and metric indices, copied out of ``buf`` into two packed arrays.

    Each context's values are one contiguous run of bytes, copied with one slice per context (a
    loop over contexts, never over values); the small metric indices move by one fancy index.
    The blocks are read from one span of the file (they fill it: this read holds them all).
    """
    values = np.empty(int(n_values.sum()), CCT_VALUE_DTYPE)
    metrics = np.empty(int(n_metrics.sum()), CCT_METRIC_INDEX_DTYPE)
    v_size = n_values * CCT_VALUE_DTYPE.itemsize
    m_size = n_metrics * CCT_METRIC_INDEX_DTYPE.itemsize
    busy, busy_m = n_values > 0, n_metrics > 0
    starts = np.concatenate([values_at[busy], metrics_at[busy_m]])
    if not len(starts):
        return metrics, values
    ends = np.concatenate([(values_at + v_size)[busy], (metrics_at + m_size)[busy_m]])
    lo = int(starts.min())
    raw = _window.bytes_at(buf, lo, int(ends.max()))
    out = values.view(np.uint8)
    done = 0
    for at, size in zip((values_at[busy] - lo).tolist(), v_size[busy].tolist(), strict=True):
        out[done : done + size] = raw[at : at + size]
        done += size
    metrics.view(np.uint8)[:] = raw[_range_index(metrics_at - lo, m_size)]
    return metrics, values


class PackedContexts(Sequence[ContextValues]):
    """Every context's block held in two big arrays (what :func:`transpose` builds).

    Context ``c`` owns ``values[value_bounds[c]:value_bounds[c+1]]`` and
    ``metric_indices[metric_bounds[c]:metric_bounds[c+1]]`` (starts relative to the context).
    """

    __slots__ = ("metric_bounds", "metric_indices", "value_bounds", "values")

    def __init__(
        self,
        metric_indices: npt.NDArray[np.void],
        values: npt.NDArray[np.void],
        metric_bounds: npt.NDArray[np.int64],
        value_bounds: npt.NDArray[np.int64],
    ) -> None:
        if metric_indices.dtype != CCT_METRIC_INDEX_DTYPE or values.dtype != CCT_VALUE_DTYPE:
            raise TypeError("packed arrays must have the cct.db dtypes")
        self.metric_indices = metric_indices
        self.values = values
        self.metric_bounds = np.asarray(metric_bounds, dtype=np.int64)
        self.value_bounds = np.asarray(value_bounds, dtype=np.int64)
        if len(self.metric_bounds) != len(self.value_bounds) or len(self.value_bounds) < 1:
            raise ValueError("metric_bounds and value_bounds need n_contexts + 1 entries each")

    def counts(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        return np.diff(self.value_bounds), np.diff(self.metric_bounds)

    def __len__(self) -> int:
        return len(self.value_bounds) - 1

    @overload
    def __getitem__(self, index: int) -> ContextValues: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[ContextValues]: ...
    def __getitem__(self, index: int | slice) -> ContextValues | Sequence[ContextValues]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        c = range(len(self))[index]
        return ContextValues(
            self.metric_indices[self.metric_bounds[c] : self.metric_bounds[c + 1]],
            self.values[self.value_bounds[c] : self.value_bounds[c + 1]],
        )


class CctDB:
    """A whole ``cct.db``: one block per context id (``values[ctx_id]``), maybe lazy.

    ``values`` is any sequence of :class:`ContextValues`: a list, a :class:`PackedContexts`, or
    the lazy view :func:`read` builds over a memory map. Its length is ``nCtxs`` (max ctxId + 1).
    """

    __slots__ = ("values",)

    def __init__(self, values: Sequence[ContextValues]) -> None:
        self.values: Sequence[ContextValues] = values

    @property
    def n_contexts(self) -> int:
        return len(self.values)

    def context(self, ctx_id: int) -> ContextValues:
        """Context ``ctx_id``'s block (read and checked on demand for a file)."""
        return self.values[ctx_id]

    def value_counts(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(n_values, n_metrics)`` per context, without loading any block."""
        counts = getattr(self.values, "counts", None)
        if callable(counts):
            nv, nm = counts()
            return np.asarray(nv, np.int64), np.asarray(nm, np.int64)
        nv = np.array([v.n_values for v in self.values], dtype=np.int64)
        nm = np.array([v.n_metrics for v in self.values], dtype=np.int64)
        return nv, nm

    def __len__(self) -> int:
        return len(self.values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CctDB):
            return NotImplemented
        if len(self.values) != len(other.values):
            return False
        nv, nm = self.value_counts()
        onv, onm = other.value_counts()
        if not (np.array_equal(nv, onv) and np.array_equal(nm, onm)):
            return False
        return all(self.values[c] == other.values[c] for c in np.flatnonzero(nv | nm).tolist())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        nv, _ = self.value_counts()
        return f"CctDB({self.n_contexts} contexts, {int(nv.sum())} values)"


# --------------------------------------------------------------------------------------------
# Reading


def sniff(head: bytes) -> bool:
    """Is ``head`` (a file's first bytes) the start of a cct.db?"""
    return _db.sniff(head, FORMAT_ID)


def read(source: _db.Source, *, lazy: bool = True) -> CctDB:
    """Read a cct.db from a path (memory-mapped), a buffer or a binary file object.

    With ``lazy`` (the default) context blocks are checked when first used; ``lazy=False`` checks
    every block now, so any damage is reported by this call.
    """
    buf, path, (where,), limit = _db.open_db(source, FORMAT_ID, 1)
    _, infos = _CTX_INFOS.read(buf, path, limit, where)
    n = len(infos)
    # Never dereference a pointer whose count is 0 (formats.md §3.4): empty blocks may alias.
    nv, nm = infos["n_values"], infos["n_metrics"].astype(np.uint64)
    if np.any(nv > np.uint64(limit)):
        c = int(np.flatnonzero(nv > np.uint64(limit))[0])
        raise FormatError(path, "CtxInfos", f"context {c}: nValues {int(nv[c])} is impossible")
    bad = _db.arrays_past(
        limit,
        (nv, infos["p_values"], CCT_VALUE_DTYPE.itemsize),
        (nm, infos["p_metric_indices"], CCT_METRIC_INDEX_DTYPE.itemsize),
    )
    if np.any(bad):
        c = int(np.flatnonzero(bad)[0])
        raise FormatError(path, "CtxInfos", f"context {c}: block points past the end of the data")
    pv, pm = infos["p_values"], infos["p_metric_indices"]
    _blocks.refuse_overlaps(  # formats.md §3.6: aliases would multiply the values a file holds
        path,
        "CtxInfos",
        [
            ("context {} values", pv, pv + nv * np.uint64(CCT_VALUE_DTYPE.itemsize)),
            ("context {} metric indices", pm, pm + nm * np.uint64(CCT_METRIC_INDEX_DTYPE.itemsize)),
        ],
    )
    contexts = _db.FileBlocks(
        buf,
        path,
        "context",
        ContextValues,
        (nm, infos["p_metric_indices"], CCT_METRIC_INDEX_DTYPE),
        (nv, infos["p_values"], CCT_VALUE_DTYPE),
    )
    if lazy:
        return CctDB(contexts)
    nv64, nm64 = contexts.counts()
    pv64, pm64 = contexts.pointers()
    # One bulk copy into packed arrays, checked in one vectorised pass.
    metrics, values = _gather(buf, pv64, nv64, pm64, nm64)
    mb = np.zeros(n + 1, np.int64)
    vb = np.zeros(n + 1, np.int64)
    np.cumsum(nm64, out=mb[1:])
    np.cumsum(nv64, out=vb[1:])
    found = packed_problems(metrics, values, mb, vb)
    if found:
        c, problem = found[0]
        raise FormatError(path, f"context {c} values", problem)
    return CctDB(PackedContexts(metrics, values, mb, vb))


# --------------------------------------------------------------------------------------------
# Layout and writing


@dataclass(frozen=True, slots=True)
class CctLayout(_db.Layout):
    """Where everything of a cct.db goes (formats.md §3.6), from per-context counts alone."""

    head: bytes
    values_at: npt.NDArray[np.int64]
    metric_indices_at: npt.NDArray[np.int64]
    n_values: npt.NDArray[np.int64]
    n_metrics: npt.NDArray[np.int64]
    footer_at: int
    footer: ClassVar[bytes] = FOOTER


def block_size(n_values: int, n_metrics: int) -> int:
    """Bytes of one context's block in hpcprof's layout: values, metric indices, padding to 4."""
    return n_values * CCT_VALUE_DTYPE.itemsize + _db.align(
        n_metrics * CCT_METRIC_INDEX_DTYPE.itemsize, BLOCK_ALIGN
    )


def layout(n_values: npt.ArrayLike, n_metrics: npt.ArrayLike) -> CctLayout:
    """Place every context's block (ctxId order, 4-aligned) by an exclusive scan of the sizes."""
    nv = np.asarray(n_values, dtype=np.int64).reshape(-1)
    nm = np.asarray(n_metrics, dtype=np.int64).reshape(-1)
    if len(nv) != len(nm):
        raise ValueError("one value count and one metric count per context are needed")
    n = len(nv)
    infos_at = HEADER_END + CTX_SECTION_DTYPE.itemsize
    first = _db.align(infos_at + n * CTX_INFO_SIZE, BLOCK_ALIGN)
    values_bytes = nv * CCT_VALUE_DTYPE.itemsize  # a multiple of 4: no padding before indices
    sizes = values_bytes + (nm * CCT_METRIC_INDEX_DTYPE.itemsize + 3) // 4 * 4
    values_at, footer_at = _db.exclusive_scan(first, sizes)
    metrics_at = values_at + values_bytes
    infos = np.zeros(n, CTX_INFO_DTYPE)
    infos["n_values"] = nv
    infos["p_values"] = values_at
    infos["n_metrics"] = nm
    infos["p_metric_indices"] = metrics_at
    section = np.zeros(1, CTX_SECTION_DTYPE)
    section[0] = (infos_at, n, CTX_INFO_SIZE)
    head = bytearray(
        _db.write_header(FORMAT_ID, [(CTX_SECTION_DTYPE.itemsize + n * CTX_INFO_SIZE, HEADER_END)])
    )
    _db.pad_to(head, HEADER_END)  # 0x20-0x2f: hpcprof leaves junk, we write zeros
    head += section.tobytes() + infos.tobytes()
    _db.pad_to(head, BLOCK_ALIGN)
    return CctLayout(bytes(head), values_at, metrics_at, nv, nm, footer_at)


def layout_of(db: CctDB) -> CctLayout:
    nv, nm = db.value_counts()
    return layout(nv, nm)


write_head = _db.write_head  # size the file, write the header and context infos
write_footer = _db.write_footer  # last: the footer marks the file complete


def write_block(fd: int, plan: CctLayout, ctx_id: int, block: ContextValues) -> None:
    """Write context ``ctx_id``'s block at its place (any process, any order)."""
    if block.n_values != plan.n_values[ctx_id] or block.n_metrics != plan.n_metrics[ctx_id]:
        raise ValueError(f"context {ctx_id}: block counts differ from the layout's")
    if block.n_values:
        pwrite_all(fd, block.values, int(plan.values_at[ctx_id]))
    if block.n_metrics:
        pwrite_all(fd, block.metric_indices, int(plan.metric_indices_at[ctx_id]))


def _fill(
    out: npt.NDArray[np.uint8], base: int, plan: CctLayout, db: CctDB, lo: int, hi: int
) -> None:
    """Copy the blocks of contexts ``lo..hi-1`` into ``out``, which holds the file from ``base``."""
    packed = db.values
    if isinstance(packed, PackedContexts):
        # One slice per context for the values, one fancy index for all metric indices.
        vb, mb = packed.value_bounds, packed.metric_bounds
        values = np.ascontiguousarray(packed.values[vb[lo] : vb[hi]]).view(np.uint8)
        sizes = plan.n_values[lo:hi] * CCT_VALUE_DTYPE.itemsize
        busy = sizes > 0
        done = 0
        for at, size in zip(
            (plan.values_at[lo:hi][busy] - base).tolist(), sizes[busy].tolist(), strict=True
        ):
            out[at : at + size] = values[done : done + size]
            done += size
        metrics = np.ascontiguousarray(packed.metric_indices[mb[lo] : mb[hi]]).view(np.uint8)
        size = CCT_METRIC_INDEX_DTYPE.itemsize
        out[_range_index(plan.metric_indices_at[lo:hi] - base, size * plan.n_metrics[lo:hi])] = (
            metrics
        )
        return
    for c in np.flatnonzero(plan.n_values[lo:hi] | plan.n_metrics[lo:hi]).tolist():
        block = db.values[lo + c]
        _db.put(out, int(plan.values_at[lo + c]) - base, block.values)
        _db.put(out, int(plan.metric_indices_at[lo + c]) - base, block.metric_indices)


def to_bytes(obj: CctDB) -> bytes:
    """The whole file as bytes (header bytes 0x20-0x2f zero)."""
    plan = layout_of(obj)
    out = _db.blank_image(plan)
    _fill(out, 0, plan, obj, 0, obj.n_contexts)
    return out.tobytes()


_CHUNK_BYTES = 64 << 20


def _chunks(obj: CctDB, plan: CctLayout) -> Iterator[_db.Piece]:
    """The blocks in runs of consecutive contexts of about :data:`_CHUNK_BYTES` each."""
    n = obj.n_contexts
    # Blocks are contiguous in ctxId order, so gather runs of contexts into one buffer.
    ends = np.append(plan.values_at[1:], plan.footer_at) if n else np.zeros(0, np.int64)
    lo = 0
    while lo < n:
        base = int(plan.values_at[lo])
        hi = int(np.searchsorted(ends, base + _CHUNK_BYTES, side="right"))
        hi = max(hi, lo + 1)
        out = np.zeros(int(ends[hi - 1]) - base, dtype=np.uint8)
        _fill(out, base, plan, obj, lo, hi)
        yield base, out
        lo = hi


def write(obj: CctDB, dest: _db.Dest) -> None:
    """Write ``obj`` to a path (in chunks of consecutive contexts) or to a binary file object."""
    if not isinstance(dest, str | os.PathLike):
        dest.write(to_bytes(obj))
        return
    plan = layout_of(obj)
    _db.write_file(dest, plan, _chunks(obj, plan))


def normalise(image: bytes) -> bytes:
    """``image`` with header bytes 0x20-0x2f zeroed: hpcprof leaves them uninitialised."""
    return image[: UNINITIALISED.start] + bytes(0x10) + image[UNINITIALISED.stop :]


# --------------------------------------------------------------------------------------------
# Transposition


def transpose(profiles: ProfileDB, n_contexts: int | None = None) -> CctDB:
    """The cct.db of a profile.db: its non-summary profiles' values, context-major.

    formats.md §3.4: cct.db is exactly this transpose. ``n_contexts`` defaults to the largest
    context id with values, plus one. One stable sort on a (ctx, metric) key does it: the profiles
    are concatenated in index order, so profile indices stay ascending within each metric.
    """
    key_parts: list[npt.NDArray[np.uint64]] = []
    prof_parts: list[npt.NDArray[np.uint32]] = []
    val_parts: list[npt.NDArray[np.float64]] = []
    for i, info in enumerate(profiles.profiles):
        if info.is_summary:
            continue
        block = profiles.values[i]
        if not block.n_values:
            continue
        ctx = block.value_ctx_ids()
        key_parts.append((ctx.astype(np.uint64) << np.uint64(16)) | block.values["metric_id"])
        prof_parts.append(np.full(block.n_values, i, dtype=np.uint32))
        val_parts.append(np.asarray(block.values["value"]))
    top = max((int(k.max()) >> 16 for k in key_parts), default=-1) + 1
    n = top if n_contexts is None else n_contexts
    if n < top:
        raise ValueError(f"n_contexts {n} is smaller than the largest context id + 1 ({top})")
    return CctDB(pack(key_parts, prof_parts, val_parts, n))


def pack(
    key_parts: Sequence[npt.NDArray[np.uint64]],
    prof_parts: Sequence[npt.NDArray[np.uint32]],
    val_parts: Sequence[npt.NDArray[np.float64]],
    n_contexts: int,
) -> PackedContexts:
    """Contexts ``0..n_contexts-1`` from values given profile by profile, in profile order:
    per value its key ``ctx << 16 | metric id``, profile index and value (:func:`transpose`).

    One stable sort on the key, so profile indices stay ascending within each metric. Every
    context id must be below ``n_contexts``.
    """
    if key_parts:
        key = np.concatenate(key_parts)
        order = np.argsort(key, kind="stable")
        key = key[order]
        values = np.empty(len(key), CCT_VALUE_DTYPE)
        values["prof_index"] = np.concatenate(prof_parts)[order]
        values["value"] = np.concatenate(val_parts)[order]
        del order
    else:
        key = np.zeros(0, np.uint64)
        values = np.zeros(0, CCT_VALUE_DTYPE)
    ctx = (key >> np.uint64(16)).astype(np.int64)
    new_metric = np.ones(len(key), dtype=bool)
    new_metric[1:] = key[1:] != key[:-1]
    first = np.flatnonzero(new_metric)
    value_bounds = np.searchsorted(ctx, np.arange(n_contexts + 1), side="left")
    metric_bounds = np.searchsorted(ctx[first], np.arange(n_contexts + 1), side="left")
    index = np.empty(len(first), CCT_METRIC_INDEX_DTYPE)
    index["metric_id"] = (key[first] & np.uint64(0xFFFF)).astype(np.uint16)
    index["start"] = first - value_bounds[ctx[first]]
    return PackedContexts(index, values, metric_bounds, value_bounds)


def windows(counts: npt.NDArray[np.int64], budget: int) -> list[tuple[int, int]]:
    """Consecutive ranges ``(start, stop)`` of contexts covering all of them, each holding at
    most ``budget`` values (``counts``: per context) unless one context alone holds more."""
    n = len(counts)
    cumulative = np.cumsum(counts, dtype=np.int64)
    out = []
    start = 0
    while start < n:
        before = int(cumulative[start - 1]) if start else 0
        end = int(np.searchsorted(cumulative, before + budget, side="right"))
        end = min(max(end, start + 1), n)
        out.append((start, end))
        start = end
    return out


def transpose_back(contexts: CctDB, n_profiles: int) -> list[ProfileValues]:
    """The profile-major blocks of profiles ``0..n_profiles-1`` from a cct.db (the inverse).

    The summary profile is not in a cct.db, so its block comes back empty.
    """
    ctx_parts: list[npt.NDArray[np.uint32]] = []
    met_parts: list[npt.NDArray[np.uint16]] = []
    prof_parts: list[npt.NDArray[np.uint32]] = []
    val_parts: list[npt.NDArray[np.float64]] = []
    nv, _ = contexts.value_counts()
    for c in np.flatnonzero(nv).tolist():
        block = contexts.values[c]
        ctx_parts.append(np.full(block.n_values, c, dtype=np.uint32))
        met_parts.append(block.value_metric_ids())
        prof_parts.append(np.asarray(block.values["prof_index"], dtype=np.uint32))
        val_parts.append(np.asarray(block.values["value"]))
    if not ctx_parts:
        return [ProfileValues.empty() for _ in range(n_profiles)]
    ctx, met = np.concatenate(ctx_parts), np.concatenate(met_parts)
    prof, val = np.concatenate(prof_parts), np.concatenate(val_parts)
    if int(prof.max()) >= n_profiles:
        raise ValueError(f"a value names profile {int(prof.max())} of {n_profiles}")
    order = np.lexsort((met, ctx, prof))
    ctx, met, prof, val = ctx[order], met[order], prof[order], val[order]
    bounds = np.searchsorted(prof, np.arange(n_profiles + 1))
    return [
        ProfileValues.from_triples(ctx[a:b], met[a:b], val[a:b])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    ]


# --------------------------------------------------------------------------------------------
# Text and checks


def dump(obj: CctDB, out: TextIO) -> None:
    """Readable text: every context with values, per metric its (profile, value) pairs."""
    nv, nm = obj.value_counts()
    out.write(f"cct.db: {obj.n_contexts} contexts, {int(nv.sum())} values\n")
    for c in np.flatnonzero(nv | nm).tolist():
        block, problem = _blocks.block_for_dump(obj.values, c)
        out.write(f"ctx {c}: {block.n_values} values in {block.n_metrics} metrics\n")
        if problem is not None:
            out.write(f"  # problem: {problem}\n")
        bounds = _blocks.dump_bounds(block.metric_indices, block.n_values)
        prof = block.values["prof_index"].tolist()
        values = block.values["value"].tolist()
        for j, metric in enumerate(block.metric_ids().tolist()):
            pairs = " ".join(f"p{prof[k]}={values[k]!r}" for k in range(bounds[j], bounds[j + 1]))
            out.write(f"  m{metric}: {pairs}\n")


def verify(obj: CctDB) -> list[str]:
    """Consistency problems (formats.md §3.4), empty when clean."""
    packed = obj.values
    if isinstance(packed, PackedContexts):
        found = [
            f"context {c}: {p}"
            for c, p in packed_problems(
                packed.metric_indices, packed.values, packed.metric_bounds, packed.value_bounds
            )
        ]
        bad = ~np.isfinite(np.asarray(packed.values["value"], dtype=np.float64))
        if bad.any():
            c = int(np.searchsorted(packed.value_bounds, int(np.argmax(bad)), side="right")) - 1
            found.append(f"context {c}: {_blocks.non_finite_problem(packed.values)[0]}")
        return found
    found = []
    nv, nm = obj.value_counts()
    for c in np.flatnonzero(nv | nm).tolist():
        try:
            block = obj.values[c]
        except FormatError as error:
            found.append(f"context {c}: {error.problem}")
            continue
        found.extend(f"context {c}: {p}" for p in block.problems())
        found.extend(f"context {c}: {p}" for p in _blocks.non_finite_problem(block.values))
    return found
