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
bare ``struct.error``/``IndexError``/``ValueError``/``UnicodeDecodeError``.
"""

from __future__ import annotations

import io
import os
import struct
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError, FormatWarning
from pyhpctk.formats import hpcrun_check
from pyhpctk.formats._whole import Buffer, Source, read_whole
from pyhpctk.formats.hpcrun_constants import (
    ENDIAN_BIG,
    FOOTER_MAGIC,
    PRIMARY_ROOT,
    PROFILE_MAGIC,
    PROFILE_VERSION,
    SECTION_ALIGNMENT,
    SPARSE_END_NODE,
)
from pyhpctk.formats.hpcrun_model import (
    CCT_FLAG_UNWOUND,
    CCT_ID_RETAINED,
    CCT_NODE_DTYPE,
    GPU_CONTEXT_LM_ID,
    GPU_RANGE_LM_ID,
    GPU_ROOT_LM_ID,
    ID_INTERPRETATION_NAMES,
    ID_TUPLE_ELEMENT_DTYPE,
    KIND_NODE,
    LM_FLAG_ANALYZE,
    METRIC_SHOW_NAMES,
    METRIC_TYPE_NAMES,
    METRIC_VALFMT_NAMES,
    METRIC_VALTY_NAMES,
    METRIC_VALUE_DTYPE,
    NODE_START_DTYPE,
    PLACEHOLDER_LM_ID,
    PLACEHOLDER_NAMES,
    VALFMT_INT,
    VALFMT_REAL,
    HpcrunProfile,
    LoadModule,
    MetricDescriptor,
    id_interpretation,
    id_kind,
    placeholder_ip,
    placeholder_text,
    profiles_equal,
)
from pyhpctk.formats.logical import LogicalMetadata, LogicalStanza
from pyhpctk.formats.logical import read as read_logical

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
    fatal = _fatal_problems(profile) if strict else []
    if fatal:
        raise FormatError(path, *fatal[0])
    return profile


# --------------------------------------------------------------------------------------------
# Consistency checks (vectorised: profiles may hold millions of nodes and values)


class _Index:
    """CCT node ids sorted once, to find the file positions of many ids at a time.

    Ids and queries are sorted as ``id << 32 | position`` keys (numpy sorts u64 far faster than
    it argsorts), so lookups are a merge of two sorted arrays rather than random binary searches.
    """

    def __init__(self, cct: npt.NDArray[np.void]) -> None:
        self.ids = np.asarray(cct["id"], dtype=np.uint32)
        keys = np.sort(_keyed(self.ids))
        self.sorted = (keys >> np.uint64(32)).astype(np.uint32)
        self.order = (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)

    def duplicate(self) -> int | None:
        """An id that appears more than once, if any."""
        same = self.sorted[1:] == self.sorted[:-1]
        return int(self.sorted[1:][same][0]) if same.any() else None

    def positions(self, ids: npt.NDArray[np.uint32]) -> npt.NDArray[np.int64]:
        """The file position of each id, or -1 where the CCT has no such node."""
        found_at = np.full(len(ids), -1, dtype=np.int64)
        if len(self.sorted) == 0 or len(ids) == 0:
            return found_at
        keys = np.sort(_keyed(np.asarray(ids, dtype=np.uint32)))
        query = (keys >> np.uint64(32)).astype(np.uint32)
        where = np.minimum(np.searchsorted(self.sorted, query), len(self.sorted) - 1)
        hit = self.sorted[where] == query
        found_at[(keys & np.uint64(0xFFFFFFFF)).astype(np.int64)] = np.where(
            hit, self.order[where], -1
        )
        return found_at


def _keyed(ids: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint64]:
    """``id << 32 | index`` for each id: sorting these sorts ids and keeps where each came from."""
    return (ids.astype(np.uint64) << np.uint64(32)) | np.arange(len(ids), dtype=np.uint64)


def _fatal_problems(profile: HpcrunProfile, index: _Index | None = None) -> list[tuple[str, str]]:
    """(section, problem) pairs that make the profile unusable; empty when it can be used."""
    problems: list[tuple[str, str]] = []
    cct = profile.cct
    index = index if index is not None else _Index(cct)
    n = len(cct)
    if n:
        if int(index.sorted[0]) == 0:
            problems.append(("cct", "node id 0 is reserved and may not be used"))
        duplicate = index.duplicate()
        if duplicate is not None:
            problems.append(("cct", f"node id {duplicate} appears more than once"))
        parents = np.asarray(cct["parent_id"], dtype=np.uint32)
        lm_ids = np.asarray(cct["lm_id"], dtype=np.uint16)
        roots = parents == 0
        main_roots = roots & (lm_ids != GPU_ROOT_LM_ID)
        if not roots.any():
            problems.append(("cct", "the CCT has no root (no node with parent 0)"))
        elif main_roots.sum() > 1:
            ids = index.ids[main_roots][:2]
            problems.append(
                (
                    "cct",
                    f"the CCT has {int(main_roots.sum())} roots (nodes {int(ids[0])} and "
                    f"{int(ids[1])}...); only a GPU_ROOT (lm 65533) may be a second root",
                )
            )
        child_pos = np.flatnonzero(~roots)
        parent_pos = index.positions(parents[child_pos])
        missing = parent_pos < 0
        if missing.any():
            i = child_pos[np.argmax(missing)]
            problems.append(
                ("cct", f"node {int(index.ids[i])} has parent {int(parents[i])}, not in the CCT")
            )
        late = parent_pos > child_pos
        if late.any():
            i = child_pos[np.argmax(late)]
            problems.append(
                ("cct", f"node {int(index.ids[i])}'s parent {int(parents[i])} follows it")
            )
        elif (parent_pos == child_pos).any():
            i = child_pos[np.argmax(parent_pos == child_pos)]
            problems.append(("cct", f"node {int(index.ids[i])} is its own parent"))

    values, starts = profile.values, profile.node_starts
    metric = np.asarray(values["metric"], dtype=np.uint16)
    if len(metric) and int(metric.max()) >= len(profile.metrics):
        problems.append(
            (
                "sparse metrics",
                f"metric index {int(metric.max())} out of range: the table has "
                f"{len(profile.metrics)} metrics",
            )
        )
    start = np.asarray(starts["start"], dtype=np.uint64)
    if len(start) == 0 and len(values):
        problems.append(("sparse metrics", f"{len(values)} values belong to no node"))
    if len(start):
        if int(start[0]) != 0:
            problems.append(("sparse metrics", f"the first node's values start at {start[0]}"))
        if (np.diff(start.astype(np.int64)) < 0).any() or int(start[-1]) > len(values):
            problems.append(
                ("sparse metrics", "node start indices are not ascending within the values")
            )
        node_ids = np.asarray(starts["node_id"], dtype=np.uint32)
        absent = index.positions(node_ids) < 0
        if absent.any():
            problems.append(
                ("sparse metrics", f"values name node {int(node_ids[absent][0])}, not in the CCT")
            )
    return problems


def verify(profile: HpcrunProfile) -> list[str]:
    """Every consistency problem of ``profile`` as ``SECTION: PROBLEM``; empty when clean.

    Includes everything :func:`read` refuses, plus what hpcprof would stumble on or that hpcrun
    never writes: unknown load modules, bad metric flags, unsorted or zero values, nodes with
    values out of CCT order, an id tuple naming kinds missing from the dictionary, and
    (:mod:`~pyhpctk.formats.hpcrun_check`) header numbers that are no numbers, a trace span
    that ends before it starts, NaN or infinite values, negative times.
    """
    index = _Index(profile.cct)
    problems = [f"{section}: {problem}" for section, problem in _fatal_problems(profile, index)]
    if not profile.version.startswith("04."):
        problems.append(f"header: version {profile.version!r} is not 04.xx")
    problems.extend(hpcrun_check.header_problems(profile))

    lm_ids = [m.id for m in profile.load_modules]
    if len(set(lm_ids)) != len(lm_ids):
        problems.append("load map: load module ids are not unique")
    if PLACEHOLDER_LM_ID in lm_ids:
        problems.append("load map: id 0 is reserved for placeholders")

    cct = profile.cct
    if len(cct) == 0:
        problems.append("cct: the CCT is empty (hpcrun always writes a ^Primary root)")
    else:
        used = np.unique(np.asarray(cct["lm_id"], dtype=np.uint16))
        special = {PLACEHOLDER_LM_ID, GPU_ROOT_LM_ID, GPU_RANGE_LM_ID, GPU_CONTEXT_LM_ID}
        unknown = sorted(set(used.tolist()) - set(lm_ids) - special)
        if unknown:
            problems.append(f"cct: nodes use load module ids {unknown} missing from the load map")
        roots = np.flatnonzero(np.asarray(cct["parent_id"]) == 0)
        for i in roots[:4]:
            lm, ip = int(cct["lm_id"][i]), int(cct["lm_ip"][i])
            if lm != GPU_ROOT_LM_ID and (lm, ip) != (PLACEHOLDER_LM_ID, _PRIMARY_ROOT_IP):
                problems.append(f"cct: root {int(cct['id'][i])} is not the ^Primary placeholder")

    for i, m in enumerate(profile.metrics):
        if m.flags[8:] != bytes(8):
            problems.append(f"metric table: metric {i} ({m.name}): unused flag bytes are not 0")
        if not m.formula and m.value_format not in (VALFMT_INT, VALFMT_REAL):
            problems.append(
                f"metric table: metric {i} ({m.name}): valFmt {m.value_format} is neither "
                "1 (int) nor 2 (real)"
            )
        if m.show not in METRIC_SHOW_NAMES:
            problems.append(f"metric table: metric {i} ({m.name}): unknown show {m.show}")

    dictionary = {kind for kind, _ in profile.id_names}
    for kind in np.asarray(profile.id_tuple["kind"], dtype=np.uint16).tolist():
        if id_kind(kind) not in dictionary:
            problems.append(f"sparse metrics: id tuple kind {id_kind(kind)} not in the dictionary")

    if not any(s.startswith("sparse metrics") for s in problems):
        problems.extend(_sparse_order_problems(profile, index))
        problems.extend(hpcrun_check.value_problems(profile))
    return problems


def _sparse_order_problems(profile: HpcrunProfile, index: _Index) -> list[str]:
    """Problems of a well-formed sparse section that hpcrun would never write (§1.8)."""
    problems = []
    values, starts = profile.values, profile.node_starts
    start = np.asarray(starts["start"], dtype=np.int64)
    node_ids = np.asarray(starts["node_id"], dtype=np.uint32)
    sorted_ids = np.sort(node_ids)
    if (sorted_ids[1:] == sorted_ids[:-1]).any():
        problems.append("sparse metrics: a node appears twice in the node starts")
    counts = np.diff(np.append(start, len(values)))
    if (counts == 0).any():
        problems.append("sparse metrics: a node is listed without any value")
    positions = index.positions(node_ids)
    if (np.diff(positions) < 0).any():
        problems.append("sparse metrics: nodes with values are not in CCT (file) order")
    metric = np.asarray(values["metric"], dtype=np.int64)
    if len(metric) > 1:
        new_node = np.zeros(len(metric), dtype=bool)
        new_node[start[start < len(metric)]] = True
        unsorted = (np.diff(metric) <= 0) & ~new_node[1:]
        if unsorted.any():
            problems.append("sparse metrics: metric indices are not strictly ascending in a node")
    if (np.asarray(values["value_bits"], dtype=np.uint64) == 0).any():
        problems.append("sparse metrics: a zero value is stored (hpcrun stores only non-zeros)")
    return problems


def decoded_values(
    profile: HpcrunProfile, scaled: bool = False
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint16], npt.NDArray[np.float64]]:
    """``(node_ids u32[n], metric u16[n], values f64[n])`` of every stored value (formats.md §1.8).

    Values are decoded by each metric's valFmt (u64 or double bits), vectorised; with ``scaled``
    they are multiplied by the metric's period, as hpcprof does.
    """
    return profile.decoded_values(scaled=scaled)


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


# --------------------------------------------------------------------------------------------
# Text dump


def _show(text: str) -> str:
    return text if text.isprintable() else repr(text)


def _flags_text(m: MetricDescriptor) -> str:
    f = m.flags
    parts = [
        f"type={METRIC_TYPE_NAMES.get(f[0], str(f[0]))}",
        f"valTy={METRIC_VALTY_NAMES.get(f[1], str(f[1]))}",
        f"valFmt={METRIC_VALFMT_NAMES.get(f[2], str(f[2]))}",
        f"move2proc={f[3]}",
        f"partner={m.partner}",
        f"show={METRIC_SHOW_NAMES.get(f[6], str(f[6]))}",
        f"showPercent={f[7]}",
    ]
    if f[8:] != bytes(8):
        parts.append(f"unused={f[8:].hex()}")
    return " ".join(parts)


def _is_logical(module: LoadModule | None) -> bool:
    return module is not None and module.path.startswith("logical/")


def _node_text(
    node: np.void,
    modules: Mapping[int, LoadModule],
    logical: Mapping[int, Mapping[int, LogicalStanza]],
) -> str:
    lm, ip = int(node["lm_id"]), int(node["lm_ip"])
    if lm == PLACEHOLDER_LM_ID:
        code = placeholder_text(ip)
        pretty = PLACEHOLDER_NAMES.get(code, "<unknown placeholder>")
        text = f"placeholder {code!r} {pretty}"
    elif lm in (GPU_ROOT_LM_ID, GPU_RANGE_LM_ID, GPU_CONTEXT_LM_ID):
        kind = {GPU_ROOT_LM_ID: "gpu root", GPU_RANGE_LM_ID: "gpu range"}.get(lm, "gpu context")
        text = f"{kind} {ip}"
    elif lm in logical or _is_logical(modules.get(lm)):
        fid, line = ip >> 32, ip & 0xFFFFFFFF
        stanza = logical[lm].get(fid) if lm in logical else None
        if stanza is None:
            text = f"logical lm {lm} fid {fid} line {line}"
        else:
            where = f" ({_show(stanza.filename)}:{stanza.lineno})" if stanza.filename else ""
            name = _show(stanza.funcname) if stanza.funcname else "<module>"
            text = f"python {name}{where} line {line}"
    else:
        module = modules.get(lm)
        base = os.path.basename(module.path) if module is not None else "?"
        text = f"lm {lm} [{_show(base)}] +{ip:#x}"
    if not int(node["flags"]) & CCT_FLAG_UNWOUND:
        text += " (not unwound)"
    return text


def _dump_cct(
    profile: HpcrunProfile,
    out: TextIO,
    logical: Mapping[int, LogicalMetadata],
) -> None:
    cct = profile.cct
    out.write(f"[cct] {len(cct)} nodes (* = retained for a trace)\n")
    modules = {m.id: m for m in profile.load_modules}
    stanzas = {lm_id: metadata.by_fid() for lm_id, metadata in logical.items()}
    children: dict[int, list[int]] = {}
    position = {int(node_id): i for i, node_id in enumerate(cct["id"])}
    roots = []
    for i, parent in enumerate(cct["parent_id"].tolist()):
        if parent in position and parent != cct["id"][i]:
            children.setdefault(position[parent], []).append(i)
        else:
            roots.append(i)
    stack = [(i, 0) for i in reversed(roots)]
    shown = np.zeros(len(cct), dtype=bool)
    while stack:
        i, depth = stack.pop()
        shown[i] = True
        node = cct[i]
        node_id = int(node["id"])
        mark = "*" if node_id & CCT_ID_RETAINED else " "
        out.write(f"  {'  ' * depth}{node_id}{mark} {_node_text(node, modules, stanzas)}\n")
        stack.extend((child, depth + 1) for child in reversed(children.get(i, [])))
    for i in np.flatnonzero(~shown).tolist():  # only in a CCT with a cycle
        node = cct[i]
        text = _node_text(node, modules, stanzas)
        out.write(f"  (unreachable) {int(node['id'])} parent {int(node['parent_id'])} {text}\n")


def dump(
    profile: HpcrunProfile,
    out: TextIO,
    *,
    logical: Mapping[int, LogicalMetadata] | None = None,
) -> None:
    """Write ``profile`` as readable text, complete enough to diff two files.

    ``logical`` maps load-module ids of logical (Python) modules to their metadata
    (see :func:`logical_modules`), so Python frames are shown by function, file and line.
    """
    logical = logical or {}
    out.write(f"hpcrun profile, format {profile.version}\n")
    out.write(f"[header] {len(profile.nvpairs)} nv-pairs\n")
    for key, value in profile.nvpairs:
        out.write(f"  {_show(key)} = {_show(value)}\n")
    out.write(f"[load map] {len(profile.load_modules)} modules\n")
    for module in profile.load_modules:
        flags = f"{module.flags:#x}" + (" analyze" if module.flags & LM_FLAG_ANALYZE else "")
        out.write(f"  {module.id:5d} flags={flags} {_show(module.path)}\n")
    _dump_cct(profile, out, logical)
    out.write(f"[metric table] {len(profile.metrics)} metrics\n")
    for i, m in enumerate(profile.metrics):
        out.write(f"  #{i} {_show(m.name)}: {_show(m.description)}\n")
        out.write(f"      {_flags_text(m)} period={m.period}\n")
        extra = [
            f"formula={_show(m.formula)}" if m.formula else "",
            f"format={_show(m.format)}" if m.format else "",
            f"is_frequency={m.is_frequency}" if m.is_frequency else "",
            f"is_multiplexed={m.is_multiplexed}" if m.is_multiplexed else "",
            f"threshold_mean={m.threshold_mean!r}" if m.threshold_mean else "",
            f"num_samples={m.num_samples}" if m.num_samples else "",
        ]
        if any(extra):
            out.write(f"      {' '.join(e for e in extra if e)}\n")
    out.write(f"[id-tuple dictionary] {len(profile.id_names)} kinds\n")
    for kind, name in profile.id_names:
        out.write(f"  {kind} {_show(name)}\n")
    kind_names = dict(profile.id_names)
    out.write(f"[id tuple] {len(profile.id_tuple)} elements\n")
    for element in profile.id_tuple:
        kind = int(element["kind"])
        name = kind_names.get(id_kind(kind), f"kind {id_kind(kind)}")
        interpretation = ID_INTERPRETATION_NAMES[id_interpretation(kind)]
        physical = int(element["physical"])
        # formats.md §1.8: a NODE's physical index is the host id, shown in hex as in file names
        shown = f"{physical:#x}" if id_kind(kind) == KIND_NODE else str(physical)
        out.write(
            f"  {name}({interpretation}) physical={shown} logical={int(element['logical'])}\n"
        )
    _dump_values(profile, out)


def _dump_values(profile: HpcrunProfile, out: TextIO) -> None:
    n_nodes = len(profile.node_starts)
    out.write(f"[values] {len(profile.values)} values on {n_nodes} nodes\n")
    fatal = _fatal_problems(profile)
    if fatal:
        # Only a profile read with strict=False gets here: show what hpcprof could not use.
        out.writelines(f"  # problem: {section}: {problem}\n" for section, problem in fatal)
        for raw in profile.values:
            out.write(f"  raw bits={int(raw['value_bits']):#018x} metric={int(raw['metric'])}\n")
        return
    node_ids, metric, decoded = decoded_values(profile)
    previous = -1
    for node_id, m, value in zip(node_ids.tolist(), metric.tolist(), decoded.tolist(), strict=True):
        if node_id != previous:
            out.write(f"  node {node_id}\n")
            previous = node_id
        desc = profile.metrics[m]
        shown = str(int(value)) if desc.value_format == VALFMT_INT else repr(value)
        scaled = f" x{desc.period} = {value * desc.period!r}" if desc.period != 1 else ""
        out.write(f"    #{m} {_show(desc.name)} = {shown}{scaled}\n")


def logical_modules(
    profile: HpcrunProfile, measurement_dir: str | os.PathLike[str]
) -> dict[int, LogicalMetadata]:
    """Read the logical metadata files (``logical/python.XXXXXXXX``) the load map names.

    Paths are relative to the measurement directory (formats.md §1.10); a missing file is
    skipped, an unreadable one raises FormatError.
    """
    found: dict[int, LogicalMetadata] = {}
    for module in profile.load_modules:
        path = Path(module.path)
        if not path.is_absolute():
            path = Path(measurement_dir) / path
        if _is_logical(module) and path.is_file():
            found[module.id] = read_logical(path)
    return found


def dumps(profile: HpcrunProfile) -> str:
    """:func:`dump` into a string."""
    text = io.StringIO()
    dump(profile, text)
    return text.getvalue()
