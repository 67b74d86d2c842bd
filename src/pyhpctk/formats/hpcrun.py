"""Read and write ``.hpcrun`` measurement profiles (hpcrun-fmt "04.00", sparse layout).

formats.md §1 describes the file; the model is :class:`~pyhpctk.formats.hpcrun_model.HpcrunProfile`.
pyrun writes these files, pyprof reads them (hundreds of MB/s), ``pyhpctk dump`` prints them.

Reading starts from the 112-byte footer (formats.md §1.9, §1.11): the header's magic, version and
endianness marker are checked, the footer's section offsets must lie in the file in hpcrun's
order, and each section is parsed from its start and must end exactly at its ``*_end``. The CCT,
the sparse values, the node starts and the id tuple are taken with one ``np.frombuffer`` each
(zero-copy, read-only views of the file's bytes); only the small sections (header nv-pairs, load
map, metric table, id-tuple dictionary) are parsed with :mod:`struct`. A CCT or sparse section
that hpcprof could not use (duplicate ids, a parent after its child, no root or two roots, a value
on a node missing from the CCT, a metric index past the table, a broken ``end!`` sentinel) is a
:class:`~pyhpctk.errors.FormatError`; softer inconsistencies are reported by :func:`verify`.

Writing reproduces hpcrun's ``write_data.c`` layout: the header at 0, then load map, CCT, metric
table, id-tuple dictionary and sparse metrics, each starting at the next multiple of 1024 (zero
fill; an offset already on a boundary is kept), and the footer at the next multiple of 1024.
``write(read(f))`` gives back ``f`` byte for byte for every file laid out that way, which is every
file hpcrun writes. Normalisation: a file whose sections are placed differently (other holes,
non-zero bytes in holes) is read fine and written back in hpcrun's layout. Strings are decoded as
UTF-8 with ``surrogateescape``, so any bytes round-trip exactly, except NUL: hpcrun writes C
strings, so a NUL inside one is damage (refused; the writer refuses to write one).

This module must never guess: bad input raises ``FormatError(path, section, problem)``, never a
bare ``struct.error``/``IndexError``/``ValueError``/``UnicodeDecodeError``. The checks live in
:mod:`.hpcrun_check`, the text form in :mod:`.hpcrun_dump` (re-exported here: ``verify``,
``decoded_values``, ``dump``, ``dumps``), the constants in :mod:`.hpcrun_constants` and the model
in :mod:`.hpcrun_model`.
"""

from __future__ import annotations

import os
import struct
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats.hpcrun_check import decoded_values, fatal_problems, verify
from pyhpctk.formats.hpcrun_constants import (
    ENDIAN_BIG,
    FOOTER_MAGIC,
    PRIMARY_ROOT,
    PROFILE_MAGIC,
    PROFILE_VERSION,
    SECTION_ALIGNMENT,
    SPARSE_END_NODE,
)
from pyhpctk.formats.hpcrun_dump import dump, dumps, logical_modules
from pyhpctk.formats.hpcrun_model import (
    CCT_NODE_DTYPE,
    ID_TUPLE_ELEMENT_DTYPE,
    METRIC_VALUE_DTYPE,
    NODE_START_DTYPE,
    HpcrunProfile,
    LoadModule,
    MetricDescriptor,
    id_kind,
    placeholder_ip,
    profiles_equal,
)
from pyhpctk.formats.whole import Buffer, Source, read_whole

__all__ = [
    "FOOTER_DTYPE",
    "FOOTER_MAGIC",
    "MAGIC",
    "SECTION_ALIGNMENT",
    "SPARSE_END_NODE",
    "VERSION",
    "HpcrunProfile",
    "decoded_values",
    "dump",
    "dumps",
    "id_kind",
    "logical_modules",
    "parse_version",
    "profiles_equal",
    "read",
    "sniff",
    "to_bytes",
    "verify",
    "write",
]


# formats.md §1.3: 18-byte magic, 5-byte version, 1-byte endianness marker (.hpcrun_constants).
MAGIC = PROFILE_MAGIC
VERSION = PROFILE_VERSION
MAJOR, MINOR = 4, 0
HEADER_PREFIX_SIZE = 24

# formats.md §1.9: 14 big-endian u64, the last one the magic "HPCRUNsm".
FOOTER_FIELDS = (
    "hdr_start",
    "hdr_end",
    "loadmap_start",
    "loadmap_end",
    "cct_start",
    "cct_end",
    "met_tbl_start",
    "met_tbl_end",
    "idtpl_dxnry_start",
    "idtpl_dxnry_end",
    "sm_start",
    "sm_end",
    "footer_start",
    "magic",
)
FOOTER_DTYPE = np.dtype([(name, ">u8") for name in FOOTER_FIELDS])
assert FOOTER_DTYPE.itemsize == 112

_U16, _U32, _U64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_METRIC_TAIL = struct.Struct(">HHdQ")  # is_frequency, is_multiplexed, threshold_mean, num_samples

# Section names used in error messages, in file order (formats.md §1.2).
SECTIONS = ("header", "load map", "cct", "metric table", "id-tuple dictionary", "sparse metrics")
_PRIMARY_ROOT_IP = placeholder_ip(PRIMARY_ROOT)


# --------------------------------------------------------------------------------------------
# Input helpers


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class _Cursor:
    """Bounds-checked reading of one section ``[pos, end)`` of ``buf`` (big-endian primitives)."""

    __slots__ = ("buf", "end", "path", "pos", "section")

    def __init__(self, buf: Buffer, pos: int, end: int, path: str | None, section: str) -> None:
        self.buf, self.pos, self.end, self.path, self.section = buf, pos, end, path, section

    def error(self, problem: str) -> FormatError:
        return FormatError(self.path, self.section, problem)

    def truncated(self, size: int, what: str) -> FormatError:
        return self.error(
            f"truncated: {what} needs {size} bytes at offset {self.pos:#x}, "
            f"but the section ends at {self.end:#x}"
        )

    def take(self, size: int, what: str) -> int:
        start = self.pos
        if start + size > self.end:
            raise self.truncated(size, what)
        self.pos = start + size
        return start

    def unpack(self, layout: struct.Struct, what: str) -> tuple[int, ...]:
        return layout.unpack_from(self.buf, self.take(layout.size, what))

    def u16(self, what: str) -> int:
        return self.unpack(_U16, what)[0]

    def u32(self, what: str) -> int:
        return self.unpack(_U32, what)[0]

    def u64(self, what: str) -> int:
        return self.unpack(_U64, what)[0]

    def raw(self, size: int, what: str) -> bytes:
        start = self.take(size, what)
        return bytes(self.buf[start : start + size])

    def string(self, what: str) -> str:
        # formats.md §1.1: u32 length, then the bytes, no NUL. (Hot in metric tables: inlined.)
        pos = self.pos
        if pos + 4 > self.end:
            raise self.truncated(4, f"length of {what}")
        start = pos + 4
        stop = start + _U32.unpack_from(self.buf, pos)[0]
        if stop > self.end:
            self.pos = start
            raise self.truncated(stop - start, what)
        self.pos = stop
        raw = bytes(self.buf[start:stop])
        if b"\0" in raw:  # hpcrun writes C strings (strlen bytes): a NUL is damage
            raise self.error(f"{what} at offset {start:#x} holds a NUL byte")
        return raw.decode("utf-8", "surrogateescape")

    def nvpairs(self, what: str) -> list[tuple[str, str]]:
        count = self.u32(f"{what} count")
        return [(self.string(f"{what} name"), self.string(f"{what} value")) for _ in range(count)]

    def array(self, dtype: np.dtype[np.void], count: int, what: str) -> npt.NDArray[np.void]:
        if count > (self.end - self.pos) // dtype.itemsize:
            raise self.error(
                f"truncated: {count} {what} of {dtype.itemsize} bytes do not fit between "
                f"{self.pos:#x} and the section end {self.end:#x}"
            )
        start = self.take(count * dtype.itemsize, what)
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start)

    def finish(self) -> None:
        if self.pos != self.end:
            raise self.error(
                f"section parsed to {self.pos:#x} but the footer says it ends at {self.end:#x}"
            )


def parse_version(text: bytes, path: str | None, section: str, known: tuple[int, int]) -> str:
    """Check a ``MM.mm`` version: a newer major is an error, a newer minor a FormatWarning."""
    if len(text) != 5 or text[2:3] != b"." or not (text[:2] + text[3:]).isdigit():
        raise FormatError(path, section, f"version {text!r} is not of the form MM.mm")
    version = text.decode("ascii")
    major, minor = int(version[:2]), int(version[3:])
    if major > known[0]:
        raise FormatError(
            path, section, f"version {version} has a newer major version than {known[0]}"
        )
    if major < known[0]:
        raise FormatError(path, section, f"version {version} is older than {known[0]}.x")
    if minor > known[1]:
        where = path if path is not None else "<buffer>"
        warnings.warn(
            f"{where}: {section}: version {version} is newer than {known[0]:02d}.{known[1]:02d}; "
            "reading it as that version",
            FormatWarning,
            stacklevel=3,
        )
    return version


# --------------------------------------------------------------------------------------------
# Reading


def sniff(head: bytes) -> bool:
    """Is this the start of an ``.hpcrun`` profile? (formats.md §1.3)."""
    return head.startswith(MAGIC)


def _read_footer(buf: Buffer, path: str | None) -> dict[str, int]:
    size = len(buf)
    if size < HEADER_PREFIX_SIZE + FOOTER_DTYPE.itemsize:
        raise FormatError(path, "footer", f"truncated: a {size}-byte file has no room for it")
    record = np.frombuffer(buf, dtype=FOOTER_DTYPE, count=1, offset=size - FOOTER_DTYPE.itemsize)
    footer = {name: int(record[name][0]) for name in FOOTER_FIELDS}
    if footer["magic"] != FOOTER_MAGIC:
        raise FormatError(
            path, "footer", "no HPCRUNsm magic at the end: the file is incomplete or truncated"
        )
    if footer["footer_start"] != size - FOOTER_DTYPE.itemsize:
        raise FormatError(
            path,
            "footer",
            f"footer_start is {footer['footer_start']:#x}, but the footer is at "
            f"{size - FOOTER_DTYPE.itemsize:#x}",
        )
    if footer["hdr_start"] != 0:
        raise FormatError(path, "footer", f"hdr_start is {footer['hdr_start']:#x}, not 0")
    previous_end, previous = 0, "start of file"
    for section, key in zip(SECTIONS, FOOTER_FIELDS[0:12:2], strict=True):
        start, end = footer[key], footer[key.replace("_start", "_end")]
        if start < previous_end:
            raise FormatError(
                path,
                "footer",
                f"{section} starts at {start:#x}, before the end of the {previous} at "
                f"{previous_end:#x} (sections out of order or overlapping)",
            )
        if end < start:
            raise FormatError(path, "footer", f"{section} ends at {end:#x} before its start")
        if end > footer["footer_start"]:
            raise FormatError(
                path,
                "footer",
                f"{section} ends at {end:#x}, past the footer at {footer['footer_start']:#x}",
            )
        previous_end, previous = end, section
    return footer


def _check_prefix(buf: Buffer, path: str | None) -> str:
    """Magic, version and endianness marker (formats.md §1.3); returns the version."""
    if len(buf) < HEADER_PREFIX_SIZE:
        raise FormatError(path, "header", f"truncated: {len(buf)} bytes, need at least 24")
    if bytes(buf[:18]) != MAGIC:
        raise FormatError(path, "header", f"bad magic {bytes(buf[:18])!r}, not an .hpcrun file")
    version = parse_version(bytes(buf[18:23]), path, "header", (MAJOR, MINOR))
    if bytes(buf[23:24]) != ENDIAN_BIG:
        raise FormatError(
            path, "header", f"endianness marker {bytes(buf[23:24])!r} is not 'b' (big-endian)"
        )
    return version


def _read_nvpairs(buf: Buffer, path: str | None, end: int) -> list[tuple[str, str]]:
    if end < HEADER_PREFIX_SIZE:
        raise FormatError(path, "footer", f"hdr_end {end:#x} is inside the 24-byte header prefix")
    cursor = _Cursor(buf, HEADER_PREFIX_SIZE, end, path, "header")
    nvpairs = cursor.nvpairs("nv-pair")
    cursor.finish()
    return nvpairs


def _read_load_map(cursor: _Cursor) -> list[LoadModule]:
    modules = []
    for _ in range(cursor.u32("load module count")):
        lm_id = cursor.u16("load module id")
        lm_path = cursor.string("load module path")
        modules.append(LoadModule(lm_id, lm_path, cursor.u64("load module flags")))
    return modules


def _read_metrics(cursor: _Cursor) -> list[MetricDescriptor]:
    metrics = []
    for _ in range(cursor.u32("metric count")):
        name = cursor.string("metric name")
        description = cursor.string("metric description")
        flags = cursor.raw(16, "metric flags")
        period = cursor.u64("metric period")
        formula = cursor.string("metric formula")
        format_ = cursor.string("metric format")
        is_frequency, is_multiplexed, threshold, samples = cursor.unpack(_METRIC_TAIL, "metric")
        metrics.append(
            MetricDescriptor(
                name,
                description,
                flags,
                period,
                formula,
                format_,
                is_frequency,
                is_multiplexed,
                float(threshold),
                samples,
            )
        )
    return metrics


def _read_id_names(cursor: _Cursor) -> list[tuple[int, str]]:
    names = []
    for _ in range(cursor.u16("dictionary size")):
        kind = cursor.u16("kind")
        names.append((kind, cursor.string("kind name")))
    return names


def _read_sparse(
    cursor: _Cursor,
) -> tuple[npt.NDArray[np.void], npt.NDArray[np.void], npt.NDArray[np.void]]:
    # formats.md §1.8
    id_tuple = cursor.array(ID_TUPLE_ELEMENT_DTYPE, cursor.u16("id tuple length"), "id elements")
    n_values = cursor.u64("value count")
    n_nodes = cursor.u32("node count")
    values = cursor.array(METRIC_VALUE_DTYPE, n_values, "values")
    starts = cursor.array(NODE_START_DTYPE, n_nodes + 1, "node starts")
    cursor.finish()
    sentinel_node, sentinel_start = int(starts["node_id"][-1]), int(starts["start"][-1])
    if sentinel_node != SPARSE_END_NODE or sentinel_start != n_values:
        raise cursor.error(
            f"end sentinel is ({sentinel_node:#x}, {sentinel_start}), "
            f"expected (0x656e6421 'end!', {n_values})"
        )
    return id_tuple, values, starts[:-1]


def read(source: Source, *, strict: bool = True) -> HpcrunProfile:
    """Read a whole ``.hpcrun`` profile from a path, a buffer or a binary stream.

    Bulk arrays of the result are read-only views of the file's bytes. With ``strict`` (the
    default) a CCT or sparse section hpcprof could not use is a FormatError; ``strict=False``
    returns such a profile anyway (for :func:`dump` and :func:`verify`, which show and list
    what is wrong), though every section must still parse.
    """
    buf, path = read_whole(source)
    # The prefix first: a newer major version may have another footer.
    version = _check_prefix(buf, path)
    footer = _read_footer(buf, path)
    nvpairs = _read_nvpairs(buf, path, footer["hdr_end"])

    def section(name: str, key: str) -> _Cursor:
        return _Cursor(buf, footer[f"{key}_start"], footer[f"{key}_end"], path, name)

    cursor = section("load map", "loadmap")
    load_modules = _read_load_map(cursor)
    cursor.finish()
    cursor = section("cct", "cct")
    cct = cursor.array(CCT_NODE_DTYPE, cursor.u64("node count"), "nodes")
    cursor.finish()
    cursor = section("metric table", "met_tbl")
    metrics = _read_metrics(cursor)
    cursor.finish()
    cursor = section("id-tuple dictionary", "idtpl_dxnry")
    id_names = _read_id_names(cursor)
    cursor.finish()
    id_tuple, values, node_starts = _read_sparse(section("sparse metrics", "sm"))

    profile = HpcrunProfile(
        nvpairs=nvpairs,
        load_modules=load_modules,
        cct=cct,
        metrics=metrics,
        id_names=id_names,
        id_tuple=id_tuple,
        values=values,
        node_starts=node_starts,
        version=version,
    )
    fatal = fatal_problems(profile) if strict else []
    if fatal:
        raise FormatError(path, *fatal[0])
    return profile


# --------------------------------------------------------------------------------------------
# Writing


def _string(text: str) -> bytes:
    raw = _encode(text)
    if len(raw) > 0xFFFFFFFF:
        raise ValueError("a string longer than 4 GiB cannot be written")
    if b"\0" in raw:
        raise ValueError(f"hpcrun strings are C strings and cannot hold NUL: {text!r}")
    return struct.pack(">I", len(raw)) + raw


def _nvpairs(pairs: list[tuple[str, str]]) -> bytes:
    return struct.pack(">I", len(pairs)) + b"".join(_string(k) + _string(v) for k, v in pairs)


def _array(data: npt.NDArray[np.void], dtype: np.dtype[np.void]) -> bytes:
    return np.ascontiguousarray(np.asarray(data).astype(dtype, copy=False)).tobytes()


def _sections(profile: HpcrunProfile) -> list[bytes]:
    version = profile.version.encode("ascii")
    if len(version) != 5:
        raise ValueError(f"version {profile.version!r} is not 5 ASCII characters")
    header = MAGIC + version + ENDIAN_BIG + _nvpairs(profile.nvpairs)
    load_map = struct.pack(">I", len(profile.load_modules)) + b"".join(
        struct.pack(">H", m.id) + _string(m.path) + struct.pack(">Q", m.flags)
        for m in profile.load_modules
    )
    cct = struct.pack(">Q", len(profile.cct)) + _array(profile.cct, CCT_NODE_DTYPE)
    metrics = struct.pack(">I", len(profile.metrics)) + b"".join(
        _string(m.name)
        + _string(m.description)
        + bytes(m.flags)
        + struct.pack(">Q", m.period)
        + _string(m.formula)
        + _string(m.format)
        + struct.pack(">HHdQ", m.is_frequency, m.is_multiplexed, m.threshold_mean, m.num_samples)
        for m in profile.metrics
    )
    dictionary = struct.pack(">H", len(profile.id_names)) + b"".join(
        struct.pack(">H", kind) + _string(name) for kind, name in profile.id_names
    )
    sentinel = np.array([(SPARSE_END_NODE, len(profile.values))], dtype=NODE_START_DTYPE)
    sparse = b"".join(
        [
            struct.pack(">H", len(profile.id_tuple)),
            _array(profile.id_tuple, ID_TUPLE_ELEMENT_DTYPE),
            struct.pack(">QI", len(profile.values), len(profile.node_starts)),
            _array(profile.values, METRIC_VALUE_DTYPE),
            _array(profile.node_starts, NODE_START_DTYPE),
            sentinel.tobytes(),
        ]
    )
    return [header, load_map, cct, metrics, dictionary, sparse]


def _align(offset: int) -> int:
    return (offset + SECTION_ALIGNMENT - 1) & ~(SECTION_ALIGNMENT - 1)


def to_bytes(profile: HpcrunProfile) -> bytes:
    """The file hpcrun would write for ``profile`` (formats.md §1.2 layout)."""
    out = bytearray()
    bounds: list[int] = []
    for data in _sections(profile):
        out.extend(bytes(_align(len(out)) - len(out)))
        bounds.append(len(out))
        out.extend(data)
        bounds.append(len(out))
    out.extend(bytes(_align(len(out)) - len(out)))
    footer = np.zeros(1, dtype=FOOTER_DTYPE)
    for name, offset in zip(FOOTER_FIELDS[:12], bounds, strict=True):
        footer[name] = offset
    footer["footer_start"] = len(out)
    footer["magic"] = FOOTER_MAGIC
    out.extend(footer.tobytes())
    return bytes(out)


def write(profile: HpcrunProfile, dest: str | os.PathLike[str] | BinaryIO) -> None:
    """Write ``profile`` to a path or a binary stream."""
    data = to_bytes(profile)
    if isinstance(dest, str | os.PathLike):
        Path(dest).write_bytes(data)
    else:
        dest.write(data)
