"""``profile.db`` v4.0: profile-major sparse metric values (formats.md §3.3, §3.6, §3.9).

One file per database. For every profile (index 0: the summary; then one per thread or GPU stream)
it lists the profile's identity (an id tuple) and a *profile-major sparse value block* (PSVB):
the contexts with non-zero values, and per context the ``(metric id, value)`` pairs.

Reading is lazy: :func:`read` memory-maps a path, parses the header, the profile infos and the id
tuples, and checks every pointer; a profile's value block becomes numpy views of the file only
when :meth:`ProfileDB.block` (or ``db.values[i]``) asks for it, and it is checked then. So a tool
can show one profile of a multi-GB database without reading the rest.

Writing reproduces hpcprof's layout byte for byte (formats.md §3.6): header, the ProfileInfos
section at 0x30, IdTuples, then the value blocks 4-aligned in *block order* (hpcprof writes the
summary block last and the threads in whatever order they finish; :attr:`ProfileDB.block_order`
keeps it), then the footer. Parallel writers use :func:`layout` (an exclusive scan giving every
block's offset), then :func:`write_head`, :func:`write_block` per profile (``os.pwrite`` into a
shared file, so ranks write disjoint slices without talking) and :func:`write_footer`.

Only :func:`to_bytes` holds a whole file in memory; nothing here loops over values in Python.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TextIO, overload

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats import _blocks, _db, _window
from pyhpctk.formats._db import pwrite_all, struct_dtype
from pyhpctk.formats.hpcrun_model import DEFAULT_ID_NAMES

FORMAT_ID = _db.FORMAT_IDS["profile"]
FOOTER = _db.FOOTERS[FORMAT_ID]


# formats.md §3.3, file header: two sections, and the header is 0x30 bytes long.
HEADER_END = 0x30

# formats.md §3.3, ProfileInfos section header: { {PI}[n]* pProfiles; u32 nProfiles; u8 szProfile }.
PROFILE_SECTION_DTYPE = struct_dtype(
    [("p_profiles", "<u8", 0x00), ("n_profiles", "<u4", 0x08), ("sz_profile", "u1", 0x0C)], 0x10
)
assert PROFILE_SECTION_DTYPE.itemsize == 16

# formats.md §3.3 and §3.9.1, {PI} profile info: 48 bytes (the prose's "40" is wrong).
#   0x00 u64 nValues | 0x08 ptr pValues | 0x10 u32 nCtxs | 0x18 ptr pCtxIndices
#   0x20 ptr pIdTuple (0: summary) | 0x28 u32 flags (bit 0 isSummary)
_PROFILE_INFO_FIELDS = [
    ("n_values", "<u8", 0x00),
    ("p_values", "<u8", 0x08),
    ("n_ctxs", "<u4", 0x10),
    ("p_ctx_indices", "<u8", 0x18),
    ("p_id_tuple", "<u8", 0x20),
    ("flags", "<u4", 0x28),
]
PROFILE_INFO_SIZE = 0x30
PROFILE_INFO_DTYPE = struct_dtype(_PROFILE_INFO_FIELDS, PROFILE_INFO_SIZE)
assert PROFILE_INFO_DTYPE.itemsize == 48
PROFILE_FLAG_SUMMARY = 0x1

_PROFILE_INFOS = _db.RecordTable(
    "ProfileInfos",
    PROFILE_SECTION_DTYPE,
    "p_profiles",
    "n_profiles",
    "sz_profile",
    "szProfile",
    "{PI}",
    _PROFILE_INFO_FIELDS,
    PROFILE_INFO_SIZE,
)

# formats.md §3.3, IdTuples: { u16 nIds; 6 bytes padding } then nIds 16-byte elements
#   0x00 u8 kind | 0x02 u16 flags (bit 0 isPhysical) | 0x04 u32 logicalId | 0x08 u64 physicalId
ID_TUPLE_HEADER_DTYPE = struct_dtype([("n_ids", "<u2", 0x00)], 8)
assert ID_TUPLE_HEADER_DTYPE.itemsize == 8
ID_ELEMENT_DTYPE = struct_dtype(
    [
        ("kind", "u1", 0x00),
        ("flags", "<u2", 0x02),
        ("logical_id", "<u4", 0x04),
        ("physical_id", "<u8", 0x08),
    ],
    16,
)
assert ID_ELEMENT_DTYPE.itemsize == 16
ID_FLAG_PHYSICAL = 0x1

# formats.md §3.3, PSVB: packed, only 2- or 4-aligned in the file (§3.9.7).
PROFILE_VALUE_DTYPE = np.dtype([("metric_id", "<u2"), ("value", "<f8")])  # '<Hd'
assert PROFILE_VALUE_DTYPE.itemsize == 10
PROFILE_CTX_INDEX_DTYPE = np.dtype([("ctx_id", "<u4"), ("start", "<u8")])  # '<IQ'
assert PROFILE_CTX_INDEX_DTYPE.itemsize == 12

BLOCK_ALIGN = 4  # formats.md §3.3 / §3.9.7: value blocks are 4-aligned
KIND_NAMES: dict[int, str] = dict(DEFAULT_ID_NAMES)


# --------------------------------------------------------------------------------------------
# Model


@dataclass(frozen=True, slots=True)
class IdTupleElement:
    """One level of a profile's identity (formats.md §3.3): ``NODE``, ``THREAD 3``, ..."""

    kind: int
    is_physical: bool
    logical_id: int
    physical_id: int

    def __str__(self) -> str:
        name = KIND_NAMES.get(self.kind, f"kind{self.kind}")
        if self.is_physical:
            return f"{name} {self.logical_id} (physical 0x{self.physical_id:x})"
        if self.physical_id != self.logical_id:
            return f"{name} {self.logical_id} (physical {self.physical_id})"
        return f"{name} {self.logical_id}"


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """What a profile is: the summary flag and its id tuple (``None``: no tuple, pIdTuple 0)."""

    is_summary: bool = False
    id_tuple: tuple[IdTupleElement, ...] | None = ()

    def describe(self) -> str:
        """A one-line label: ``summary`` or the id tuple's elements."""
        parts = ["summary"] if self.is_summary else []
        if self.id_tuple is not None:
            parts.append(" / ".join(str(e) for e in self.id_tuple) or "(empty id tuple)")
        return ", ".join(parts) or "(no id tuple)"


@dataclass(frozen=True, slots=True, eq=False)
class ProfileValues:
    """A profile-major sparse value block (PSVB, formats.md §3.3).

    ``ctx_indices`` (:data:`PROFILE_CTX_INDEX_DTYPE`) lists the contexts with values, ascending,
    each with the index of its first pair in ``values`` (:data:`PROFILE_VALUE_DTYPE`), where
    metric ids ascend within a context. Both may be read-only views of a memory-mapped file.
    """

    ctx_indices: npt.NDArray[np.void]
    values: npt.NDArray[np.void]

    def __post_init__(self) -> None:
        if self.ctx_indices.dtype != PROFILE_CTX_INDEX_DTYPE:
            raise TypeError("ctx_indices must have dtype PROFILE_CTX_INDEX_DTYPE")
        if self.values.dtype != PROFILE_VALUE_DTYPE:
            raise TypeError("values must have dtype PROFILE_VALUE_DTYPE")

    @classmethod
    def empty(cls) -> ProfileValues:
        return cls(np.zeros(0, PROFILE_CTX_INDEX_DTYPE), np.zeros(0, PROFILE_VALUE_DTYPE))

    @classmethod
    def from_triples(
        cls,
        ctx_ids: npt.ArrayLike,
        metric_ids: npt.ArrayLike,
        values: npt.ArrayLike,
    ) -> ProfileValues:
        """Build a block from parallel (context, metric, value) arrays in any order.

        Zeros are dropped (formats.md §3.3: never stored); a repeated (context, metric) pair is
        an error.
        """
        ctx = np.asarray(ctx_ids, dtype=np.uint32).ravel()
        met = np.asarray(metric_ids, dtype=np.uint16).ravel()
        val = np.asarray(values, dtype=np.float64).ravel()
        if not ctx.shape == met.shape == val.shape:
            raise ValueError("ctx_ids, metric_ids and values must have the same length")
        return cls(
            *_db.block_from_triples(
                ctx, met, val, PROFILE_CTX_INDEX_DTYPE, PROFILE_VALUE_DTYPE, "(context, metric)"
            )
        )

    @property
    def n_values(self) -> int:
        return len(self.values)

    @property
    def n_contexts(self) -> int:
        return len(self.ctx_indices)

    @property
    def nbytes(self) -> int:
        """Bytes this block takes in the file, alignment padding included."""
        return block_size(self.n_values, self.n_contexts)

    def ctx_ids(self) -> npt.NDArray[np.uint32]:
        return np.asarray(self.ctx_indices["ctx_id"], dtype=np.uint32)

    def bounds(self) -> npt.NDArray[np.uint64]:
        """``n_contexts + 1`` indices: context ``i`` owns ``values[b[i]:b[i+1]]``."""
        return _db.block_bounds(self.ctx_indices, self.n_values)

    def context(self, ctx_id: int) -> npt.NDArray[np.void]:
        """The ``(metric_id, value)`` pairs of one context (empty when it has none): a view."""
        return _db.block_entry(self.ctx_indices, "ctx_id", self.values, ctx_id)

    def value_ctx_ids(self) -> npt.NDArray[np.uint32]:
        """The context id of every value (the block expanded to coordinate form)."""
        return np.asarray(_db.block_keys(self.ctx_indices, "ctx_id", self.n_values), np.uint32)

    def problems(self) -> list[str]:
        """Consistency problems of this block (formats.md §3.3), empty when clean."""
        return _db.block_problems(
            self.ctx_indices, "ctx_id", self.values, "metric_id", "context", "metric ids"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProfileValues):
            return NotImplemented
        return _db.same_bits(self.ctx_indices, other.ctx_indices) and _db.same_bits(
            self.values, other.values
        )

    __hash__ = None  # type: ignore[assignment]


def block_size(n_values: int, n_contexts: int) -> int:
    """Bytes of a PSVB in hpcprof's layout: values, padding to 4, context indices."""
    return _db.align(n_values * PROFILE_VALUE_DTYPE.itemsize, BLOCK_ALIGN) + (
        n_contexts * PROFILE_CTX_INDEX_DTYPE.itemsize
    )


class ProfileTable(Sequence[ProfileInfo]):
    """The profile infos of a profile.db read from a file, each made only when asked for.

    It holds views of the file (the ProfileInfos records and the buffer the id tuples are in),
    so a database of 100,000 profiles opens without 100,000 objects; :func:`read` has checked
    every id tuple already. :meth:`is_summary` and :meth:`has_kind` answer for all profiles
    at once, with numpy.
    """

    __slots__ = ("_buf", "_flags", "_pointers")

    def __init__(
        self, buf: _db.Buffer, flags: npt.NDArray[np.uint32], pointers: npt.NDArray[np.uint64]
    ) -> None:
        self._buf = buf
        self._flags = flags
        self._pointers = pointers

    def __len__(self) -> int:
        return len(self._flags)

    @overload
    def __getitem__(self, index: int) -> ProfileInfo: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[ProfileInfo, ...]: ...

    def __getitem__(self, index: int | slice) -> ProfileInfo | tuple[ProfileInfo, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("profile index out of range")
        summary = bool(int(self._flags[index]) & PROFILE_FLAG_SUMMARY)
        at = int(self._pointers[index])
        if not at:
            return ProfileInfo(summary, None)
        n = int(_window.frombuffer(self._buf, ID_TUPLE_HEADER_DTYPE, 1, at)["n_ids"][0])
        elements = _window.frombuffer(self._buf, ID_ELEMENT_DTYPE, n, at + 8).tolist()
        return ProfileInfo(
            summary,
            tuple(
                IdTupleElement(int(k), bool(f & ID_FLAG_PHYSICAL), lg, ph)
                for k, f, lg, ph in elements
            ),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def is_summary(self) -> npt.NDArray[np.bool_]:
        """Per profile: is it a summary profile?"""
        summary: npt.NDArray[np.bool_] = (np.asarray(self._flags) & PROFILE_FLAG_SUMMARY) != 0
        return summary

    def has_kind(self, kinds: Sequence[int]) -> npt.NDArray[np.bool_]:
        """Per profile: does its id tuple have an element of one of ``kinds``?"""
        found = np.zeros(len(self), dtype=bool)
        pointers = np.asarray(self._pointers, dtype=np.int64)
        with_tuple = np.flatnonzero(pointers)
        if not len(with_tuple):
            return found
        at = pointers[with_tuple]
        n = _tuple_lengths(self._buf, at)
        element = np.repeat(at + 8, n) + 16 * (
            np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        )
        if not len(element):
            return found
        lo = int(element.min())
        kind = _window.bytes_at(self._buf, lo, int(element.max()) + 1)[element - lo]
        hit = np.isin(kind, np.asarray(kinds, dtype=np.uint8))
        owner = np.repeat(with_tuple, n)
        found[owner[hit]] = True
        return found


def _tuple_lengths(buf: _db.Buffer, at: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The element count (u16) of the id tuple at each of ``at`` (non-empty, inside ``buf``),
    read from one span of the file: the tuples' own section."""
    lo = int(at.min())
    raw = _window.bytes_at(buf, lo, int(at.max()) + 2)
    return raw[at - lo].astype(np.int64) | (raw[at - lo + 1].astype(np.int64) << 8)


def _id_tuples_fit(buf: _db.Buffer, pointers: npt.NDArray[np.uint64], limit: int) -> bool:
    """Do all id tuples lie inside ``[0, limit)`` without overlapping one another (the checks of
    :func:`_refuse_overlapping_tuples` and :func:`_read_id_tuple`, for every profile at once)?"""
    at = np.unique(np.asarray(pointers, dtype=np.uint64))
    at = at[at != 0]
    if not len(at):
        return True
    if int(at.max()) + 2 > len(buf):
        return False
    start = at.astype(np.int64)
    n = _tuple_lengths(buf, start)
    end = start + ID_TUPLE_HEADER_DTYPE.itemsize + 16 * n
    return bool(np.all(end <= limit)) and not bool(np.any(start[1:] < end[:-1]))


def default_block_order(profiles: Sequence[ProfileInfo]) -> tuple[int, ...]:
    """hpcprof's order when nothing else is known: non-summary profiles by index, summaries last."""
    return tuple(i for i, p in enumerate(profiles) if not p.is_summary) + tuple(
        i for i, p in enumerate(profiles) if p.is_summary
    )


class ProfileDB:
    """A whole ``profile.db``: profile infos, and per profile its value block (maybe lazy).

    ``values`` is any sequence of :class:`ProfileValues` (a list, or the lazy view :func:`read`
    builds over a memory map). ``block_order`` is the order of the value blocks in the file
    (``None``: :func:`default_block_order`). Two databases are equal when they would be written
    as the same bytes (zero-byte blocks take no room, so their order among themselves is moot).
    """

    __slots__ = ("_block_order", "profiles", "values")

    def __init__(
        self,
        profiles: Sequence[ProfileInfo],
        values: Sequence[ProfileValues],
        block_order: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    ) -> None:
        self.profiles: Sequence[ProfileInfo] = (
            profiles if isinstance(profiles, ProfileTable) else tuple(profiles)
        )
        self.values: Sequence[ProfileValues] = values
        if len(values) != len(self.profiles):
            raise ValueError(f"{len(self.profiles)} profiles but {len(values)} value blocks")
        order: npt.NDArray[np.int64] | None = None
        if block_order is not None:  # an array: 100,000 profiles' order is not 100,000 ints
            order = np.asarray(block_order, dtype=np.int64).reshape(-1)
            if not np.array_equal(np.sort(order), np.arange(len(self.profiles))):
                raise ValueError("block_order must be a permutation of the profile indices")
        self._block_order = order

    @property
    def block_order(self) -> tuple[int, ...]:
        """The order of the value blocks in the file."""
        if self._block_order is None:
            return default_block_order(self.profiles)
        return tuple(self._block_order.tolist())

    def block(self, index: int) -> ProfileValues:
        """Profile ``index``'s value block (read and checked on demand for a file)."""
        return self.values[index]

    def is_summary(self) -> npt.NDArray[np.bool_]:
        """Per profile: is it a summary profile? (no ProfileInfo made for a file's profiles)"""
        if isinstance(self.profiles, ProfileTable):
            return self.profiles.is_summary()
        return np.array([p.is_summary for p in self.profiles], dtype=bool)

    def value_counts(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(n_values, n_contexts)`` per profile, without loading any value block."""
        counts = getattr(self.values, "counts", None)
        if callable(counts):
            nv, nc = counts()
            return np.asarray(nv, np.int64), np.asarray(nc, np.int64)
        nv = np.array([v.n_values for v in self.values], dtype=np.int64)
        nc = np.array([v.n_contexts for v in self.values], dtype=np.int64)
        return nv, nc

    def __len__(self) -> int:
        return len(self.profiles)

    def __iter__(self) -> Iterator[tuple[ProfileInfo, ProfileValues]]:
        for i, info in enumerate(self.profiles):
            yield info, self.values[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProfileDB):
            return NotImplemented
        if self.profiles != other.profiles:
            return False
        # The same pointers: zero-byte blocks may be listed in any order among themselves.
        mine, theirs = layout_of(self), layout_of(other)
        if (mine.head, mine.footer_at) != (theirs.head, theirs.footer_at):
            return False
        return all(self.values[i] == other.values[i] for i in range(len(self.profiles)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        nv, _ = self.value_counts()
        return f"ProfileDB({len(self.profiles)} profiles, {int(nv.sum())} values)"


# --------------------------------------------------------------------------------------------
# Reading


def sniff(head: bytes) -> bool:
    """Is ``head`` (a file's first bytes) the start of a profile.db?"""
    return _db.sniff(head, FORMAT_ID)


def _read_id_tuple(
    buf: _db.Buffer, offset: int, path: str | None, limit: int
) -> tuple[IdTupleElement, ...]:
    n = _db.u16_at(buf, offset, path, "IdTuples")
    _db.check_range(limit, offset, 8 + 16 * n, path, "IdTuples", f"id tuple of {n} elements")
    elems = _db.read_array(buf, offset + 8, ID_ELEMENT_DTYPE, n, path, "IdTuples", "id tuple")
    return tuple(
        IdTupleElement(int(k), bool(f & ID_FLAG_PHYSICAL), int(lg), int(ph))
        for k, f, lg, ph in elems.tolist()
    )


def _refuse_overlapping_tuples(
    buf: _db.Buffer, path: str | None, pointers: npt.NDArray[np.uint64]
) -> None:
    """Profiles may share an id tuple, but distinct tuples may not overlap (§3.3, §3.6)."""
    distinct = sorted(set(pointers.tolist()) - {0})
    end = 0
    for previous, at in zip([0, *distinct], distinct, strict=False):
        if at < end:
            raise FormatError(
                path, "IdTuples", f"the id tuples at 0x{previous:x} and 0x{at:x} overlap"
            )
        n = _db.u16_at(buf, at, path, "IdTuples")
        end = at + ID_TUPLE_HEADER_DTYPE.itemsize + 16 * n


def read(source: _db.Source, *, lazy: bool = True) -> ProfileDB:
    """Read a profile.db from a path (memory-mapped), a buffer or a binary file object.

    With ``lazy`` (the default) value blocks are checked when first used; ``lazy=False`` checks
    every block now, so any damage is reported by this call.
    """
    buf, path, sections, limit = _db.open_db(source, FORMAT_ID, 2)
    infos_at, (tuples_size, tuples_at) = sections
    _, infos = _PROFILE_INFOS.read(buf, path, limit, infos_at)
    n = len(infos)
    # Never dereference a pointer whose count is 0 (formats.md §3.3): empty blocks may alias.
    bad = _db.arrays_past(
        limit,
        (infos["n_values"], infos["p_values"], PROFILE_VALUE_DTYPE.itemsize),
        (infos["n_ctxs"], infos["p_ctx_indices"], PROFILE_CTX_INDEX_DTYPE.itemsize),
    )
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise FormatError(
            path, "ProfileInfos", f"profile {i}: value block points past the end of the data"
        )
    # formats.md §3.6: every non-empty array has bytes of its own (aliases would let a small
    # file name the square of its size in values).
    nv, nc = infos["n_values"], infos["n_ctxs"].astype(np.uint64)
    pv, pc = infos["p_values"], infos["p_ctx_indices"]
    _blocks.refuse_overlaps(
        path,
        "ProfileInfos",
        [
            ("profile {} values", pv, pv + nv * np.uint64(PROFILE_VALUE_DTYPE.itemsize)),
            (
                "profile {} context indices",
                pc,
                pc + nc * np.uint64(PROFILE_CTX_INDEX_DTYPE.itemsize),
            ),
        ],
    )
    tuple_limit = min(limit, tuples_at + tuples_size)
    profiles: Sequence[ProfileInfo]
    if _id_tuples_fit(buf, infos["p_id_tuple"], tuple_limit):
        # Every tuple checked at once; each profile's info is made when asked for.
        profiles = ProfileTable(buf, infos["flags"], infos["p_id_tuple"])
    else:  # one of them is wrong: find which, for the message
        _refuse_overlapping_tuples(buf, path, infos["p_id_tuple"])
        cache: dict[int, tuple[IdTupleElement, ...]] = {}
        profiles = []
        for flags, p_tuple in zip(
            infos["flags"].tolist(), infos["p_id_tuple"].tolist(), strict=True
        ):
            id_tuple: tuple[IdTupleElement, ...] | None = None
            if p_tuple:
                if p_tuple not in cache:
                    cache[p_tuple] = _read_id_tuple(buf, p_tuple, path, tuple_limit)
                id_tuple = cache[p_tuple]
            profiles.append(ProfileInfo(bool(flags & PROFILE_FLAG_SUMMARY), id_tuple))
    # Recover the block order: by file offset; a zero-byte block sits before the block it aliases.
    nonempty = (infos["n_values"] > 0) | (infos["n_ctxs"] > 0)
    order = np.lexsort((np.arange(n), nonempty, infos["p_values"]))
    values = _db.FileBlocks(
        buf,
        path,
        "profile",
        ProfileValues,
        (infos["n_ctxs"], infos["p_ctx_indices"], PROFILE_CTX_INDEX_DTYPE),
        (infos["n_values"], infos["p_values"], PROFILE_VALUE_DTYPE),
    )
    if not lazy:
        values_list = [values[i] for i in range(n)]
        return ProfileDB(profiles, values_list, order)
    return ProfileDB(profiles, values, order)


# --------------------------------------------------------------------------------------------
# Layout and writing


@dataclass(frozen=True, slots=True)
class ProfileLayout(_db.Layout):
    """Where everything of a profile.db goes (formats.md §3.6), from counts alone.

    ``head`` is the bytes before the first value block (header, ProfileInfos, IdTuples);
    ``values_at`` / ``ctx_indices_at`` give each profile's pValues / pCtxIndices; the footer goes
    at ``footer_at`` and the file is ``size`` bytes.
    """

    head: bytes
    values_at: npt.NDArray[np.int64]
    ctx_indices_at: npt.NDArray[np.int64]
    n_values: npt.NDArray[np.int64]
    n_contexts: npt.NDArray[np.int64]
    footer_at: int
    footer: ClassVar[bytes] = FOOTER


def _id_tuples_bytes(profiles: Sequence[ProfileInfo], base: int) -> tuple[bytes, list[int]]:
    """The IdTuples section (tuples in profile order, each 8-aligned) and each tuple's pointer.

    Built at once for all profiles (every rank of pyprof-mpi lays profile.db out: no numpy
    call per profile). A header is 8 bytes and an element 16, so every tuple starts 8-aligned.
    """
    head_size, element_size = ID_TUPLE_HEADER_DTYPE.itemsize, ID_ELEMENT_DTYPE.itemsize
    lengths = np.array(
        [-1 if p.id_tuple is None else len(p.id_tuple) for p in profiles], dtype=np.int64
    )
    present = lengths >= 0
    sizes = np.where(present, head_size + np.maximum(lengths, 0) * element_size, 0)
    at = np.cumsum(sizes) - sizes
    pointers = np.where(present, base + at, 0).tolist()
    out = np.zeros(int(sizes.sum()), dtype=np.uint8)
    heads = np.zeros(int(present.sum()), ID_TUPLE_HEADER_DTYPE)
    heads["n_ids"] = lengths[present]
    out[(at[present][:, None] + np.arange(head_size)).reshape(-1)] = heads.view(np.uint8)
    flat = [e for p in profiles if p.id_tuple for e in p.id_tuple]
    elements = np.zeros(len(flat), ID_ELEMENT_DTYPE)
    if flat:
        elements["kind"] = [e.kind for e in flat]
        elements["flags"] = [ID_FLAG_PHYSICAL if e.is_physical else 0 for e in flat]
        elements["logical_id"] = [e.logical_id for e in flat]
        elements["physical_id"] = [e.physical_id for e in flat]
        # element j of a tuple at ``at`` lies at at + head_size + j * element_size
        counts = np.maximum(lengths, 0)
        first = np.repeat(at + head_size, counts)
        rank = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
        starts = first + rank * element_size
        out[(starts[:, None] + np.arange(element_size)).reshape(-1)] = elements.view(np.uint8)
    return out.tobytes(), pointers


def layout(
    profiles: Sequence[ProfileInfo],
    n_values: npt.ArrayLike,
    n_contexts: npt.ArrayLike,
    block_order: Sequence[int] | None = None,
) -> ProfileLayout:
    """Place every block of a profile.db from per-profile value and context counts.

    The blocks follow ``block_order`` (default :func:`default_block_order`), each 4-aligned; a
    block's offset is the exclusive prefix sum of the sizes before it, so every writer can find
    its slice without seeing the others' data. An empty block points where the next one starts.
    """
    nv = np.asarray(n_values, dtype=np.int64).reshape(-1)
    nc = np.asarray(n_contexts, dtype=np.int64).reshape(-1)
    n = len(profiles)
    if len(nv) != n or len(nc) != n:
        raise ValueError("one value count and one context count per profile are needed")
    order = np.asarray(
        default_block_order(profiles) if block_order is None else block_order, dtype=np.int64
    )
    infos_at = HEADER_END + PROFILE_SECTION_DTYPE.itemsize
    tuples_at = _db.align(infos_at + n * PROFILE_INFO_SIZE, 8)
    tuples, tuple_ptrs = _id_tuples_bytes(profiles, tuples_at)
    first_block = _db.align(tuples_at + len(tuples), BLOCK_ALIGN)
    values_bytes = (
        (nv * PROFILE_VALUE_DTYPE.itemsize + BLOCK_ALIGN - 1) // BLOCK_ALIGN * BLOCK_ALIGN
    )
    sizes = values_bytes + nc * PROFILE_CTX_INDEX_DTYPE.itemsize
    values_at, footer_at = _db.exclusive_scan(first_block, sizes, order)
    ctx_at = values_at + values_bytes

    infos = np.zeros(n, PROFILE_INFO_DTYPE)
    infos["n_values"] = nv
    infos["p_values"] = values_at
    infos["n_ctxs"] = nc
    infos["p_ctx_indices"] = ctx_at
    infos["p_id_tuple"] = tuple_ptrs
    infos["flags"] = [PROFILE_FLAG_SUMMARY if p.is_summary else 0 for p in profiles]
    section = np.zeros(1, PROFILE_SECTION_DTYPE)
    section[0] = (infos_at, n, PROFILE_INFO_SIZE)
    head = bytearray(
        _db.write_header(
            FORMAT_ID,
            [
                (PROFILE_SECTION_DTYPE.itemsize + n * PROFILE_INFO_SIZE, HEADER_END),
                (len(tuples), tuples_at),
            ],
        )
    )
    head += section.tobytes() + infos.tobytes()
    _db.pad_to(head, 8)
    head += tuples
    _db.pad_to(head, BLOCK_ALIGN)
    assert len(head) == first_block
    return ProfileLayout(bytes(head), values_at, ctx_at, nv, nc, footer_at)


def layout_of(db: ProfileDB) -> ProfileLayout:
    """The layout of a whole :class:`ProfileDB`."""
    nv, nc = db.value_counts()
    return layout(db.profiles, nv, nc, db.block_order)


write_head = _db.write_head  # size the file, write everything before the value blocks
write_footer = _db.write_footer  # last: the footer marks the file complete


def block_slices(
    plan: ProfileLayout, index: int, block: ProfileValues
) -> tuple[tuple[int, npt.NDArray[np.void]], tuple[int, npt.NDArray[np.void]]]:
    """Where profile ``index``'s value block goes: (offset, values), (offset, context indices)."""
    if block.n_values != plan.n_values[index] or block.n_contexts != plan.n_contexts[index]:
        raise ValueError(f"profile {index}: block counts differ from the layout's")
    return (
        (int(plan.values_at[index]), block.values),
        (int(plan.ctx_indices_at[index]), block.ctx_indices),
    )


def write_block(fd: int, plan: ProfileLayout, index: int, block: ProfileValues) -> None:
    """Write profile ``index``'s value block at its place (any process, any order)."""
    for offset, data in block_slices(plan, index, block):
        pwrite_all(fd, data, offset)


def _pieces(obj: ProfileDB, plan: ProfileLayout) -> Iterator[_db.Piece]:
    for i in range(len(obj.profiles)):
        block = obj.values[i]
        yield int(plan.values_at[i]), block.values
        yield int(plan.ctx_indices_at[i]), block.ctx_indices


def to_bytes(obj: ProfileDB) -> bytes:
    """The whole file as bytes."""
    plan = layout_of(obj)
    return _db.image(plan, _pieces(obj, plan))


def write(obj: ProfileDB, dest: _db.Dest) -> None:
    """Write ``obj`` to a path (block by block with ``os.pwrite``) or to a binary file object."""
    plan = layout_of(obj)
    _db.write_file(dest, plan, _pieces(obj, plan))


# --------------------------------------------------------------------------------------------
# Text and checks


def dump(obj: ProfileDB, out: TextIO) -> None:
    """Readable text: every profile with its id tuple, then its values per context."""
    nv, nc = obj.value_counts()
    out.write(f"profile.db: {len(obj.profiles)} profiles, {int(nv.sum())} values\n")
    out.write(f"block order: {' '.join(str(i) for i in obj.block_order)}\n")
    for i, info in enumerate(obj.profiles):
        out.write(f"profile {i}: {info.describe()}: {int(nv[i])} values in {int(nc[i])} contexts\n")
        block, problem = _blocks.block_for_dump(obj.values, i)
        if problem is not None:
            out.write(f"  # problem: {problem}\n")
        bounds = _blocks.dump_bounds(block.ctx_indices, block.n_values)
        metric_ids = block.values["metric_id"].tolist()
        values = block.values["value"].tolist()
        for j, ctx in enumerate(block.ctx_ids().tolist()):
            pairs = " ".join(
                f"m{metric_ids[k]}={values[k]!r}" for k in range(bounds[j], bounds[j + 1])
            )
            out.write(f"  ctx {ctx}: {pairs}\n")


def verify(obj: ProfileDB) -> list[str]:
    """Consistency problems (formats.md §3.3), empty when clean."""
    found: list[str] = []
    for i, info in enumerate(obj.profiles):
        if info.id_tuple is None and not info.is_summary:
            found.append(f"profile {i}: a thread profile without an id tuple")
        try:
            block = obj.values[i]
        except FormatError as error:
            found.append(f"profile {i}: {error.problem}")
            continue
        found.extend(f"profile {i}: {p}" for p in block.problems())
        found.extend(f"profile {i}: {p}" for p in _blocks.non_finite_problem(block.values))
    return found
