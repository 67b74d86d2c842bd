"""Shared plumbing of the v4.0 database files: meta.db, profile.db, cct.db and trace.db.

formats.md §3.1 gives the four files one frame: a 16-byte header (``HPCTOOLKIT``, a 4-byte format
id, major and minor version bytes), a table of ``(u64 size, u64 offset)`` section pointers right
after it, little-endian absolute-offset pointers everywhere, NUL-terminated UTF-8 strings, and an
8-byte footer that marks the file complete. This module implements that frame once, so each format
module only declares its own sections. It must never know about any one format's sections, and it
imports nothing but numpy, :mod:`pyhpctk.errors` and the other ``formats`` plumbing modules.

Every reading helper takes the whole file as a buffer (``bytes``, ``memoryview`` or a
``_window.MappedFile``, read through bounded windows) plus the ``path`` used in error messages
(``None`` means an in-memory buffer), checks bounds *before* touching bytes, and raises
:class:`~pyhpctk.errors.FormatError` (``PATH: SECTION: PROBLEM``) instead of letting
``struct.error``, ``IndexError``, ``ValueError`` or ``UnicodeDecodeError`` escape.

Stable API (other format modules depend on it; only add to it):

Constants
    ``MAGIC`` (``b"HPCTOOLKIT"``), ``HEADER_SIZE`` (16), ``SECTION_ENTRY_SIZE`` (16),
    ``MAJOR`` (4), ``MINOR`` (0, the newest minor this package knows), ``FOOTER_SIZE`` (8),
    ``FORMAT_IDS`` (short name -> 4-byte id) and ``FOOTERS`` (4-byte id -> 8-byte footer):
    ``b"meta"``/``b"_meta.db"``, ``b"prof"``/``b"_prof.db"``, ``b"ctxt"``/``b"__ctx.db"``,
    ``b"trce"``/``b"trace.db"``. ``SECTION_DTYPE``: the ``(size, offset)`` table entry.

Types
    ``Buffer`` (bytes, bytearray, memoryview or MappedFile: a whole file), ``Source`` (what a
    format's ``read`` accepts: a path, a buffer or a binary file object), ``Dest`` (a path or a
    binary file object).

Input and output
    ``open_source(source) -> (buf, path)``: a path is a ``MappedFile``, memory-mapped a window at
    a time (so multi-GB files take neither their size in memory nor in address space);
    ``bytes``/``bytearray``/``memoryview`` are used as they are; a binary file object is read
    to its end. ``path`` is the file name for messages, or ``None``.
    ``write_dest(data, dest)``: write bytes to a path or a binary file object.

Header and footer
    ``sniff(head, fmt) -> bool``: do these first bytes start a v4 database file of format ``fmt``?
    ``read_header(buf, path, fmt, n_sections) -> (minor, [(size, offset), ...])``: check the
    magic, the format id, the major version (other than 4 -> FormatError) and the minor version
    (newer than ``MINOR`` -> ``FormatWarning``), then return the section table. Each section is
    bounds-checked against the buffer with :func:`check_range`.
    ``check_footer(buf, path, footer)``: the last 8 bytes must equal ``footer``.
    ``write_header(fmt, sections, minor=MINOR) -> bytes``: the header plus section table
    (``16 + 16 * len(sections)`` bytes).

Bounds-checked access (unchecked: ``_window.span``, ``frombuffer``, ``bytes_at``)
    ``check_range(buf_len, offset, size, path, section, what)``: ``[offset, offset+size)`` must
    lie inside the buffer.
    ``read_array(buf, offset, dtype, count, path, section, what="array") -> np.ndarray``: a
    zero-copy ``np.frombuffer`` view of ``count`` records, bounds-checked.
    ``read_record(buf, offset, dtype, path, section, what="record") -> np.void``: one record.
    ``u8_at``/``u16_at``/``u32_at``/``u64_at(buf, offset, path, section)``: one scalar.
    ``cstring_at(buf, offset, path, section, end=None) -> str``: the NUL-terminated UTF-8 string
    at ``offset`` (other bytes as surrogate escapes); the NUL must come before ``end`` (default:
    the end of the buffer).

Writing helpers
    ``align(n, k) -> int``: ``n`` rounded up to a multiple of ``k``.
    ``pad_to(out, k)``: append NULs to a ``bytearray`` until its length is a multiple of ``k``.
    ``StringTable``: a deduplicating NUL-terminated string pool with first-use order (``add``
    returns the offset of a string relative to the pool start; ``data`` is the pool bytes).
    ``struct_dtype(fields, itemsize)``, ``as_records(array)``, ``pwrite_all(fd, data, offset)``.

profile.db, cct.db and trace.db (what their readers and writers share)
    ``open_db(source, fmt, n_sections) -> (buf, path, sections, limit)``: open, check header and
    footer; ``limit`` is where the footer starts.
    ``RecordTable(...).read(buf, path, limit, (size, offset)) -> (header, records)``: a section
    header pointing at ``n`` records of a stored stride ({PI}, {CI}, {CTH}).
    ``arrays_past(limit, (counts, pointers, itemsize), ...)``: which records' non-empty arrays
    run past ``limit`` (u64-safe; a count of 0 never looks at its pointer).
    ``FileBlocks(buf, path, label, make, index, values)``: a lazy sequence of sparse value blocks
    (profile.db's PSVBs, cct.db's context blocks) checked on access; ``counts()``,
    ``pointers()``, ``raw(i)``; a block is a view of its file's window (a ``MappedFile`` keeps
    a bounded number of windows mapped).
    ``block_bounds``/``block_entry``/``block_keys``/``block_problems``/``block_from_triples``:
    one sparse value block; ``same_bits(a, b)``: arrays equal bit for bit.
    ``exclusive_scan(first, sizes, order=None) -> (offsets, end)``: place blocks end to end.
    ``Layout``: mixin of the layout dataclasses (``head``, ``footer_at``, class ``footer``,
    ``size``); ``write_head(fd, plan)``, ``write_footer(fd, plan)``; ``Piece`` (``(offset,
    array)``), ``put(out, at, array)``, ``blank_image(plan)``, ``image(plan, pieces) -> bytes``,
    ``write_file(dest, plan, pieces)`` (pieces by ``os.pwrite`` to a path, or one image to a
    binary file object).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, ClassVar, Generic, Protocol, TypeAlias, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import _window
from pyhpctk.formats._window import MappedFile, frombuffer, span
from pyhpctk.formats.whole import open_regular

Buffer: TypeAlias = _window.Buffer
"""Anything the readers accept as the bytes of a whole file."""

Source: TypeAlias = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO
"""What a format module's ``read`` accepts."""

Dest: TypeAlias = str | os.PathLike[str] | BinaryIO
"""What a format module's ``write`` accepts."""

# formats.md §3.1, file header.
MAGIC = b"HPCTOOLKIT"
HEADER_SIZE = 16
SECTION_ENTRY_SIZE = 16
MAJOR = 4
MINOR = 0
FOOTER_SIZE = 8

FORMAT_IDS: dict[str, bytes] = {
    "meta": b"meta",
    "profile": b"prof",
    "cct": b"ctxt",
    "trace": b"trce",
}

# formats.md §3.1, footers.
FOOTERS: dict[bytes, bytes] = {
    b"meta": b"_meta.db",
    b"prof": b"_prof.db",
    b"ctxt": b"__ctx.db",
    b"trce": b"trace.db",
}

# formats.md §3.1: { u64 size; u64 offset } per section, right after the 16-byte header.
SECTION_DTYPE = np.dtype([("size", "<u8"), ("offset", "<u8")])
assert SECTION_DTYPE.itemsize == SECTION_ENTRY_SIZE

_U8 = np.dtype("u1")
_U16 = np.dtype("<u2")
_U32 = np.dtype("<u4")
_U64 = np.dtype("<u8")


# --------------------------------------------------------------------------------------------
# Input and output


def open_source(source: Source) -> tuple[Buffer, str | None]:
    """The whole file as a buffer, and its name for error messages (``None`` for buffers).

    A path is a :class:`~pyhpctk.formats._window.MappedFile` (read-only, mapped a window at a
    time: never the whole file); an empty file is ``b""``.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        return source, None
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        handle = open_regular(path)  # a FormatError when it cannot be opened
        try:
            if os.fstat(handle.fileno()).st_size == 0:
                return b"", path
            return MappedFile(os.dup(handle.fileno()), path), path
        except OSError as error:
            raise FormatError(path, "file", f"cannot open: {error.strerror or error}") from error
        finally:
            handle.close()
    name = getattr(source, "name", None)
    data = source.read()
    return data, name if isinstance(name, str) else None


def write_dest(data: bytes | bytearray, dest: Dest) -> None:
    """Write ``data`` to a path (created or truncated) or to a binary file object."""
    if isinstance(dest, str | os.PathLike):
        with open(dest, "wb") as handle:
            handle.write(data)
    else:
        dest.write(data)


# --------------------------------------------------------------------------------------------
# Bounds-checked access


def check_range(
    buf_len: int, offset: int, size: int, path: str | None, section: str, what: str
) -> None:
    """Raise FormatError unless ``[offset, offset + size)`` lies inside a buffer of ``buf_len``."""
    if offset < 0 or size < 0 or offset + size > buf_len:
        raise FormatError(
            path,
            section,
            f"{what} at 0x{offset:x} (+{size} bytes) runs past the end of the file "
            f"(0x{buf_len:x} bytes)",
        )


def read_array(
    buf: Buffer,
    offset: int,
    dtype: np.dtype[np.void] | np.dtype[np.generic],
    count: int,
    path: str | None,
    section: str,
    what: str = "array",
) -> npt.NDArray[np.generic]:
    """A zero-copy view of ``count`` ``dtype`` records at ``offset``, after a bounds check."""
    size = count * dtype.itemsize
    check_range(len(buf), offset, size, path, section, what)
    return frombuffer(buf, dtype, count, offset)


def read_record(
    buf: Buffer,
    offset: int,
    dtype: np.dtype[np.void],
    path: str | None,
    section: str,
    what: str = "record",
) -> np.void:
    """One ``dtype`` record at ``offset``, after a bounds check."""
    rec: np.void = read_array(buf, offset, dtype, 1, path, section, what)[0]
    return rec


def _scalar(
    buf: Buffer, offset: int, dtype: np.dtype[np.generic], path: str | None, section: str
) -> int:
    check_range(len(buf), offset, dtype.itemsize, path, section, f"{dtype.itemsize}-byte field")
    return int(frombuffer(buf, dtype, 1, offset)[0])


def u8_at(buf: Buffer, offset: int, path: str | None, section: str) -> int:
    """The u8 at ``offset`` (bounds-checked)."""
    return _scalar(buf, offset, _U8, path, section)


def u16_at(buf: Buffer, offset: int, path: str | None, section: str) -> int:
    """The little-endian u16 at ``offset`` (bounds-checked)."""
    return _scalar(buf, offset, _U16, path, section)


def u32_at(buf: Buffer, offset: int, path: str | None, section: str) -> int:
    """The little-endian u32 at ``offset`` (bounds-checked)."""
    return _scalar(buf, offset, _U32, path, section)


def u64_at(buf: Buffer, offset: int, path: str | None, section: str) -> int:
    """The little-endian u64 at ``offset`` (bounds-checked)."""
    return _scalar(buf, offset, _U64, path, section)


def cstring_at(
    buf: Buffer, offset: int, path: str | None, section: str, end: int | None = None
) -> str:
    """The NUL-terminated string at ``offset``; its NUL must lie before ``end``.

    Bytes that are not UTF-8 come back as surrogate escapes (``surrogateescape``): hpcprof
    copies names (a source path in a Latin-1 directory) as the bytes it was given, and they
    round-trip exactly through :class:`StringTable`.
    """
    limit = len(buf) if end is None else min(end, len(buf))
    if offset < 0 or offset >= limit:
        raise FormatError(path, section, f"string pointer 0x{offset:x} is outside [0, 0x{limit:x})")
    # bytes.find is C speed; memoryview has no find, so search a bytes copy of a bounded window.
    window = 256
    start = 0
    while True:
        chunk = bytes(span(buf, offset + start, min(window, limit - offset - start)))
        nul = chunk.find(b"\0")
        if nul >= 0:
            raw = bytes(span(buf, offset, start + nul))
            break
        if offset + start + window >= limit:
            raise FormatError(
                path, section, f"string at 0x{offset:x} has no NUL terminator before 0x{limit:x}"
            )
        start += window
        window *= 4
    return raw.decode("utf-8", "surrogateescape")


# --------------------------------------------------------------------------------------------
# Header and footer


def sniff(head: bytes, fmt: bytes) -> bool:
    """Do the first bytes ``head`` (>= 14 of them) start a v4.0-family file of format ``fmt``?"""
    return len(head) >= 14 and head[:10] == MAGIC and head[10:14] == fmt


def read_header(
    buf: Buffer, path: str | None, fmt: bytes, n_sections: int, *, stacklevel: int = 3
) -> tuple[int, list[tuple[int, int]]]:
    """Check the common header (formats.md §3.1) and return ``(minor, [(size, offset), ...])``.

    Raises FormatError for a short file, a wrong magic or format id, a major version other than
    :data:`MAJOR`, or a section that lies outside the file; warns (``FormatWarning``) when the
    minor version is newer than :data:`MINOR` (``stacklevel`` as for :func:`warnings.warn`: the
    default names the caller of the format module's ``read``).
    """
    name = fmt.decode("ascii", errors="replace")
    if len(buf) < HEADER_SIZE:
        raise FormatError(
            path, "header", f"file is {len(buf)} bytes, shorter than the {HEADER_SIZE}-byte header"
        )
    head = bytes(span(buf, 0, HEADER_SIZE))
    if head[:10] != MAGIC:
        raise FormatError(path, "header", f"bad magic {head[:10]!r}, expected {MAGIC!r}")
    if head[10:14] != fmt:
        raise FormatError(
            path, "header", f"format id {head[10:14]!r} is not {fmt!r}: not a {name} database file"
        )
    major, minor = head[14], head[15]
    if major != MAJOR:
        raise FormatError(
            path,
            "header",
            f"unsupported major version {major}.{minor} (this reader knows {MAJOR}.x)",
        )
    if minor > MINOR:
        warnings.warn(
            f"{path or '<buffer>'}: header: minor version {major}.{minor} is newer than "
            f"{MAJOR}.{MINOR}; fields added since are ignored",
            FormatWarning,
            stacklevel=stacklevel,
        )
    table = read_array(buf, HEADER_SIZE, SECTION_DTYPE, n_sections, path, "header", "section table")
    sections = [(int(size), int(offset)) for size, offset in table.tolist()]
    for index, (size, offset) in enumerate(sections):
        check_range(len(buf), offset, size, path, "header", f"section {index}")
    return minor, sections


def check_footer(buf: Buffer, path: str | None, footer: bytes) -> None:
    """Raise FormatError unless the file ends with ``footer`` (formats.md §3.1: else incomplete)."""
    if len(buf) < FOOTER_SIZE or bytes(span(buf, len(buf) - FOOTER_SIZE, FOOTER_SIZE)) != footer:
        tail = bytes(span(buf, max(0, len(buf) - FOOTER_SIZE), min(len(buf), FOOTER_SIZE)))
        raise FormatError(
            path, "footer", f"missing footer {footer!r} (file ends with {tail!r}): incomplete file"
        )


def write_header(fmt: bytes, sections: Sequence[tuple[int, int]], minor: int = MINOR) -> bytes:
    """The 16-byte header plus the ``(size, offset)`` section table, little-endian."""
    if len(fmt) != 4:
        raise ValueError(f"format ids are 4 bytes, got {fmt!r}")
    table = np.array([(size, offset) for size, offset in sections], dtype=SECTION_DTYPE)
    return MAGIC + fmt + bytes((MAJOR, minor)) + table.tobytes()


# --------------------------------------------------------------------------------------------
# Writing helpers


def align(n: int, k: int) -> int:
    """``n`` rounded up to a multiple of ``k`` (``k`` > 0)."""
    return (n + k - 1) // k * k


def pad_to(out: bytearray, k: int) -> None:
    """Append NUL bytes to ``out`` until its length is a multiple of ``k``."""
    out.extend(b"\0" * (align(len(out), k) - len(out)))


class StringTable:
    """A pool of deduplicated NUL-terminated UTF-8 strings, in first-use order.

    ``add(text)`` returns the offset of ``text`` from the start of the pool, adding it when new;
    ``data`` is the pool's bytes. A writer places the pool at some file offset ``base`` and stores
    ``base + add(text)`` as the pointer.
    """

    __slots__ = ("_data", "_offsets")

    def __init__(self) -> None:
        self._offsets: dict[str, int] = {}
        self._data = bytearray()

    def add(self, text: str) -> int:
        """The pool offset of ``text``, adding it on first use."""
        found = self._offsets.get(text)
        if found is not None:
            return found
        raw = text.encode("utf-8", "surrogateescape")  # the bytes a name was read from
        if b"\0" in raw:
            raise ValueError(f"strings in a database cannot contain NUL: {text!r}")
        offset = len(self._data)
        self._offsets[text] = offset
        self._data += raw + b"\0"
        return offset

    def __contains__(self, text: object) -> bool:
        return text in self._offsets

    def __len__(self) -> int:
        return len(self._data)

    @property
    def data(self) -> bytes:
        """The pool's bytes."""
        return bytes(self._data)


# --- record layouts and positioned writes (shared by the database writers) ---
def struct_dtype(fields: Sequence[tuple[str, str, int]], itemsize: int) -> np.dtype[np.void]:
    """A packed little-endian record layout from ``(name, format, offset)`` and its size."""
    return np.dtype(
        {
            "names": [f[0] for f in fields],
            "formats": [f[1] for f in fields],
            "offsets": [f[2] for f in fields],
            "itemsize": itemsize,
        }
    )


def as_records(array: npt.NDArray[np.generic]) -> npt.NDArray[np.void]:
    """Type a structured array read by :mod:`._db` as the records it is."""
    return cast("npt.NDArray[np.void]", array)


def pwrite_all(fd: int, data: bytes | memoryview | npt.NDArray[np.generic], offset: int) -> None:
    """``os.pwrite`` all of ``data`` at ``offset`` (looping over short writes)."""
    if isinstance(data, np.ndarray):
        view = memoryview(np.ascontiguousarray(data).view(np.uint8).data).cast("B")
    else:
        view = memoryview(data).cast("B")
    while len(view):
        done = os.pwrite(fd, view, offset)
        view = view[done:]
        offset += done


# --- sparse value blocks (profile.db PSVB, cct.db context blocks) ---
#
# Both files store a block as an index of (key, start) records, ascending by key, into an array of
# (inner key, value) records (formats.md §3.3, §3.4): profile.db keys contexts and pairs metric
# ids with values; cct.db keys metrics and pairs profile indices with values.


def same_bits(a: npt.NDArray[np.generic], b: npt.NDArray[np.generic]) -> bool:
    """Arrays equal bit for bit (so NaNs and -0.0 compare as the file stores them)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def block_from_triples(
    keys: npt.NDArray[np.generic],
    inner: npt.NDArray[np.generic],
    values: npt.NDArray[np.float64],
    index_dtype: np.dtype[np.void],
    value_dtype: np.dtype[np.void],
    pair: str,
) -> tuple[npt.NDArray[np.void], npt.NDArray[np.void]]:
    """``(index, values)`` of one block from parallel 1-D (key, inner key, value) arrays.

    ``index_dtype`` holds ``(key, "start")`` records and ``value_dtype`` ``(inner key,
    "value")`` records. The triples may come in any order; zeros are dropped (never stored); a
    repeated (key, inner key) pair is a ValueError naming it as ``pair`` (``(context, metric)``).
    """
    key_field, inner_field = index_dtype.names[0], value_dtype.names[0]  # type: ignore[index]
    keep = values != 0.0
    keys, inner, values = keys[keep], inner[keep], values[keep]
    order = np.lexsort((inner, keys))
    keys, inner, values = keys[order], inner[order], values[order]
    new_key = np.ones(len(keys), dtype=bool)
    new_key[1:] = keys[1:] != keys[:-1]
    if np.any(~new_key[1:] & (inner[1:] == inner[:-1])):
        raise ValueError(f"a {pair} pair is given twice")
    out = np.empty(len(values), value_dtype)
    out[inner_field] = inner
    out["value"] = values
    starts = np.flatnonzero(new_key)
    index = np.empty(len(starts), index_dtype)
    index[key_field] = keys[starts]
    index["start"] = starts
    return index, out


def block_bounds(index: npt.NDArray[np.void], n_values: int) -> npt.NDArray[np.uint64]:
    """``len(index) + 1`` positions: entry ``i`` owns ``values[b[i]:b[i+1]]``."""
    out = np.empty(len(index) + 1, dtype=np.uint64)
    out[:-1] = index["start"]
    out[-1] = n_values
    return out


def block_entry(
    index: npt.NDArray[np.void], key_field: str, values: npt.NDArray[np.void], key: int
) -> npt.NDArray[np.void]:
    """The values owned by ``key`` (an empty view when it owns none), by binary search."""
    keys = index[key_field]
    i = int(np.searchsorted(keys, key))
    if i >= len(keys) or int(keys[i]) != key:
        return values[:0]
    start = int(index["start"][i])
    stop = int(index["start"][i + 1]) if i + 1 < len(keys) else len(values)
    return values[start:stop]


def block_keys(
    index: npt.NDArray[np.void], key_field: str, n_values: int
) -> npt.NDArray[np.generic]:
    """The owning key of every value (the block expanded to coordinate form)."""
    counts = np.diff(block_bounds(index, n_values).astype(np.int64)).astype(np.int64)
    return np.repeat(np.asarray(index[key_field]), counts)


def block_problems(
    index: npt.NDArray[np.void],
    key_field: str,
    values: npt.NDArray[np.void],
    inner_field: str,
    outer: str,
    inner: str,
) -> list[str]:
    """Consistency problems of one block, empty when clean: keys strictly ascending, starts in
    order from 0, inner keys strictly ascending within each entry, no stored zeros. ``outer`` and
    ``inner`` name the two kinds of key in messages (``context`` / ``metric ids``)."""
    found: list[str] = []
    n_values = len(values)
    keys = index[key_field]
    starts = index["start"]
    if np.any(keys[1:] <= keys[:-1]):
        found.append(f"{outer} ids are not strictly ascending")
    if len(starts):
        if int(starts[0]) != 0:
            found.append(f"the first {outer} does not start at value 0")
        if np.any(starts[1:] < starts[:-1]) or int(starts[-1]) > n_values:
            found.append(f"{outer} start indices are not ascending within the values")
            return found
    elif n_values:
        found.append(f"values but no {outer} owns them")
    # Compare neighbours in place (no widening copies: blocks can hold ~10^8 values).
    inner_keys = values[inner_field]
    unsorted = inner_keys[1:] <= inner_keys[:-1]
    unsorted[starts[(starts > 0) & (starts < n_values)].astype(np.int64) - 1] = False
    if np.any(unsorted):
        found.append(f"{inner} are not strictly ascending within a {outer}")
    if np.any(values["value"] == 0.0):
        found.append("a zero value is stored (zeros are never stored)")
    return found


# --- opening a database and reading its record tables (shared by the database readers) ---


def open_db(
    source: Source, fmt: bytes, n_sections: int
) -> tuple[Buffer, str | None, list[tuple[int, int]], int]:
    """Open a v4 database file of format ``fmt``: ``(buf, path, sections, limit)``.

    Checks the header (:func:`read_header`, whose warnings name the caller of the format
    module's ``read``) and the footer; ``limit`` is where the footer starts, and formats.md §3.1
    puts nothing but the footer after it.
    """
    buf, path = open_source(source)
    _, sections = read_header(buf, path, fmt, n_sections, stacklevel=4)
    check_footer(buf, path, FOOTERS[fmt])
    return buf, path, sections, len(buf) - FOOTER_SIZE


@dataclass(frozen=True, slots=True)
class RecordTable:
    """A section made of a header that points at ``n`` records of a stored stride.

    profile.db's ProfileInfos ({PI}), cct.db's CtxInfos ({CI}) and trace.db's CtxTraces ({CTH})
    share this shape (formats.md §3.3-§3.5): ``header`` has the fields ``pointer``, ``count`` and
    ``stride``; a record is ``fields`` and at least ``size`` bytes. ``section``, ``stride_name``
    and ``record`` are the spec's names, used in error messages.
    """

    section: str
    header: np.dtype[np.void]
    pointer: str
    count: str
    stride: str
    stride_name: str
    record: str
    fields: Sequence[tuple[str, str, int]]
    size: int

    def read(
        self, buf: Buffer, path: str | None, limit: int, where: tuple[int, int]
    ) -> tuple[np.void, npt.NDArray[np.void]]:
        """The section header and its records, from the section's ``(size, offset)``."""
        size, at = where
        if size < self.header.itemsize:
            raise FormatError(path, self.section, f"section is {size} bytes, too small")
        head = read_record(buf, at, self.header, path, self.section, "header")
        n, stride = int(head[self.count]), int(head[self.stride])
        if stride < self.size:
            raise FormatError(path, self.section, f"{self.stride_name} {stride} < {self.size}")
        # formats.md §3.1: use the stored stride, so a newer minor version's longer records read.
        dtype = struct_dtype(self.fields, stride)
        start = int(head[self.pointer])
        check_range(limit, start, n * stride, path, self.section, f"{self.record}[n]")
        records = read_array(buf, start, dtype, n, path, self.section, self.record)
        return head, as_records(records)


def arrays_past(
    limit: int, *arrays: tuple[npt.NDArray[np.generic], npt.NDArray[np.generic], int]
) -> npt.NDArray[np.bool_]:
    """Per record, does one of its non-empty arrays run past ``limit``?

    Each of ``arrays`` is ``(counts, pointers, itemsize)`` over the records. A pointer whose
    count is 0 is never looked at (formats.md §3.3, §3.4: empty blocks may alias); the u64
    arithmetic cannot wrap around into a false "inside".
    """
    bad = np.zeros(len(arrays[0][0]) if arrays else 0, dtype=bool)
    top = np.uint64(limit)
    for counts, pointers, itemsize in arrays:
        n = counts.astype(np.uint64)
        p = pointers.astype(np.uint64)
        end = p + n * np.uint64(itemsize)
        bad |= (n > 0) & ((n > top // np.uint64(itemsize)) | (end > top) | (end < p))
    return bad


class Checked(Protocol):
    """A block that can list its own consistency problems."""

    def problems(self) -> list[str]: ...


BlockT = TypeVar("BlockT", bound=Checked)


class FileBlocks(Sequence[BlockT], Generic[BlockT]):
    """Sparse value blocks in a buffer, made into views (and checked) on demand.

    profile.db (one PSVB per profile) and cct.db (one block per context) store a block alike
    (formats.md §3.3, §3.4): an index array and a value array, each found by a count and a
    pointer in the block's info record. ``make(index, values)`` builds the module's block type;
    ``label`` names a record in errors (``profile 3 values``). The reader has checked every
    pointer whose count is not 0; a pointer whose count is 0 is never dereferenced.
    """

    __slots__ = (
        "_buf",
        "_idt",
        "_label",
        "_make",
        "_ni",
        "_nv",
        "_path",
        "_pi",
        "_pv",
        "_vdt",
    )

    def __init__(
        self,
        buf: Buffer,
        path: str | None,
        label: str,
        make: Callable[[npt.NDArray[np.void], npt.NDArray[np.void]], BlockT],
        index: tuple[npt.NDArray[np.generic], npt.NDArray[np.generic], np.dtype[np.void]],
        values: tuple[npt.NDArray[np.generic], npt.NDArray[np.generic], np.dtype[np.void]],
    ) -> None:
        """``index`` and ``values`` are ``(counts, pointers, dtype)`` over the blocks."""
        self._buf = buf
        self._path = path
        self._label = label
        self._make = make
        # Kept as they are (views of the file's info records): 100,000 profiles' counts and
        # pointers copied would be memory that grows with the profiles (issue #19).
        self._ni, self._pi = index[0], index[1]
        self._nv, self._pv = values[0], values[1]
        self._idt, self._vdt = index[2], values[2]

    def counts(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(values, index entries)`` per block, without reading any block."""
        return self._nv.astype(np.int64), self._ni.astype(np.int64)

    def pointers(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(pointer to the values, pointer to the index)`` per block."""
        return self._pv.astype(np.int64), self._pi.astype(np.int64)

    def __len__(self) -> int:
        return len(self._nv)

    def raw(self, i: int) -> BlockT:
        """Block ``i`` as views of the buffer, unchecked (a count of 0 reads no pointer)."""
        ni, nv = int(self._ni[i]), int(self._nv[i])
        pi, pv = int(self._pi[i]), int(self._pv[i])
        # The array nearer the start first: a window mapped for it runs on over the other.
        first_values = bool(nv) and (not ni or pv < pi)
        values = frombuffer(self._buf, self._vdt, nv, pv) if first_values else None
        index = frombuffer(self._buf, self._idt, ni, pi) if ni else np.zeros(0, self._idt)
        if values is None:
            values = frombuffer(self._buf, self._vdt, nv, pv) if nv else np.zeros(0, self._vdt)
        return self._make(as_records(index), as_records(values))

    @overload
    def __getitem__(self, index: int) -> BlockT: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[BlockT]: ...
    def __getitem__(self, index: int | slice) -> BlockT | Sequence[BlockT]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]
        block = self.raw(i)
        found = block.problems()
        if found:
            raise FormatError(self._path, f"{self._label} {i} values", "; ".join(found))
        return block


# --- layouts and writing (shared by the database writers) ---


def exclusive_scan(
    first: int, sizes: npt.NDArray[np.int64], order: npt.NDArray[np.int64] | None = None
) -> tuple[npt.NDArray[np.int64], int]:
    """Where blocks of ``sizes`` go when laid end to end from ``first`` in ``order`` (default:
    index order), and where the last one ends (``first`` when there are none).

    formats.md §3.6: every writer finds its slice from the sizes alone, without the others' data.
    """
    if order is None:
        ends = first + np.cumsum(sizes)
        at = ends - sizes
    else:
        ends = first + np.cumsum(sizes[order])
        at = np.empty(len(sizes), np.int64)
        at[order] = ends - sizes[order]
    return at, int(ends[-1]) if len(ends) else first


class Layout:
    """Mixin of the database layout dataclasses: where the head, blocks and footer go.

    A layout has ``head`` (every byte before the first block), ``footer_at`` and, as a class
    attribute, its file's ``footer``.
    """

    __slots__ = ()
    footer: ClassVar[bytes]
    head: bytes
    footer_at: int

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return self.footer_at + FOOTER_SIZE


def write_head(fd: int, plan: Layout) -> None:
    """Write everything before the blocks, and size the file (holes read as zeros)."""
    os.ftruncate(fd, plan.size)
    pwrite_all(fd, plan.head, 0)


def write_footer(fd: int, plan: Layout) -> None:
    """Write the footer last: its presence marks the file complete (formats.md §3.1)."""
    pwrite_all(fd, plan.footer, plan.footer_at)


Piece: TypeAlias = tuple[int, npt.NDArray[np.generic]]
"""An array to be written at a file offset."""


def put(out: npt.NDArray[np.uint8], at: int, array: npt.NDArray[np.generic]) -> None:
    """Copy ``array``'s bytes into ``out`` from index ``at``."""
    raw = np.ascontiguousarray(array).view(np.uint8)
    out[at : at + len(raw)] = raw


def blank_image(plan: Layout) -> npt.NDArray[np.uint8]:
    """A whole file's bytes: the head and footer in place, zeros where the blocks go."""
    out = np.zeros(plan.size, dtype=np.uint8)
    out[: len(plan.head)] = np.frombuffer(plan.head, np.uint8)
    out[plan.footer_at :] = np.frombuffer(plan.footer, np.uint8)
    return out


def image(plan: Layout, pieces: Iterable[Piece]) -> bytes:
    """The whole file as bytes: the head, the ``pieces`` at their offsets, the footer."""
    out = blank_image(plan)
    for at, array in pieces:
        put(out, at, array)
    return out.tobytes()


def write_file(dest: Dest, plan: Layout, pieces: Iterable[Piece]) -> None:
    """Write a database to a path, piece by piece with ``os.pwrite`` (the head first, the
    footer last), or as one :func:`image` to a binary file object."""
    if not isinstance(dest, str | os.PathLike):
        dest.write(image(plan, pieces))
        return
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        write_head(fd, plan)
        for at, array in pieces:
            pwrite_all(fd, array, at)
        write_footer(fd, plan)
    finally:
        os.close(fd)
