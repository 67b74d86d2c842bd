"""Read and write ``.hpctrace`` measurement traces (format "01.01").

formats.md §2: a 32-byte header (``HPCRUN-trace______``, version ``01.01``, ``b``, u64 flags),
then 12-byte records ``{ u64 time_ns; u32 cct_node_id }`` (big-endian) to the end of the file.
The model is :class:`~pyhpctk.formats.hpcrun_model.HpctraceFile`; records are read with one
``np.frombuffer`` (a zero-copy, read-only view) and written with one ``tobytes``.

Version 01.00 files have no flags word (a 24-byte header); they are read with flags 0 and written
back the same way, so ``write(read(f)) == f`` byte for byte for every trace. A newer minor version
is read as 01.01 with a :class:`~pyhpctk.errors.FormatWarning`; a newer major version, a wrong
magic or endianness marker, a data-centric trace (flag bit 0: hpcprof refuses those, and their
16-byte records) and a record area that is not a whole number of 12-byte records are
:class:`~pyhpctk.errors.FormatError`. :func:`verify_trace` checks a trace against its sibling
``.hpcrun`` profile. A trace has no footer, so one cut between two records cannot be told
from a shorter trace; any other truncation is an error. This module never raises anything but
FormatError on bad input.
"""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np

from pyhpctk.errors import FormatError
from pyhpctk.formats.hpcrun import parse_version
from pyhpctk.formats.hpcrun_check import trace_span
from pyhpctk.formats.hpcrun_constants import ENDIAN_BIG, TRACE_MAGIC, TRACE_VERSION
from pyhpctk.formats.hpcrun_model import (
    CCT_ID_RETAINED,
    TRACE_FLAG_CALL_TRACE,
    TRACE_FLAG_DATA_CENTRIC,
    TRACE_FLAG_LCA,
    TRACE_RECORD_DTYPE,
    HpcrunProfile,
    HpctraceFile,
    traces_equal,
)
from pyhpctk.formats.whole import Source, read_whole

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "VERSION",
    "HpctraceFile",
    "dump",
    "dumps",
    "read",
    "sniff",
    "to_bytes",
    "traces_equal",
    "verify",
    "verify_trace",
    "write",
]

MAGIC = TRACE_MAGIC  # formats.md §2 (.hpcrun_constants)
VERSION = TRACE_VERSION
MAJOR, MINOR = 1, 1
HEADER_SIZE = 32  # 24 bytes of text + u64 flags (formats.md §2)
HEADER_SIZE_1_00 = 24  # version 01.00 has no flags word
KNOWN_FLAGS = TRACE_FLAG_DATA_CENTRIC | TRACE_FLAG_LCA | TRACE_FLAG_CALL_TRACE
FLAG_NAMES = {
    TRACE_FLAG_DATA_CENTRIC: "data-centric",
    TRACE_FLAG_LCA: "lca-recorded",
    TRACE_FLAG_CALL_TRACE: "call-trace",
}


def sniff(head: bytes) -> bool:
    """Is this the start of an ``.hpctrace`` file?"""
    return head.startswith(MAGIC)


def read(source: Source) -> HpctraceFile:
    """Read a whole trace from a path, a buffer or a binary stream."""
    buf, path = read_whole(source)
    size = len(buf)
    if size < HEADER_SIZE_1_00:
        raise FormatError(path, "header", f"truncated: {size} bytes, need at least 24")
    if bytes(buf[:18]) != MAGIC:
        raise FormatError(path, "header", f"bad magic {bytes(buf[:18])!r}, not an .hpctrace file")
    version = parse_version(bytes(buf[18:23]), path, "header", (MAJOR, MINOR))
    if bytes(buf[23:24]) != ENDIAN_BIG:
        raise FormatError(
            path, "header", f"endianness marker {bytes(buf[23:24])!r} is not 'b' (big-endian)"
        )
    if version == "01.00":
        flags, start = 0, HEADER_SIZE_1_00
    else:
        if size < HEADER_SIZE:
            raise FormatError(path, "header", f"truncated: {size} bytes, need 32")
        (flags,) = struct.unpack_from(">Q", buf, 24)
        start = HEADER_SIZE
    if flags & TRACE_FLAG_DATA_CENTRIC:
        raise FormatError(
            path, "header", "data-centric traces (flag bit 0) are not supported, as in hpcprof"
        )
    trailing = (size - start) % TRACE_RECORD_DTYPE.itemsize
    if trailing:
        raise FormatError(
            path,
            "records",
            f"{size - start} bytes of records is not a multiple of 12 ({trailing} trailing bytes)",
        )
    count = (size - start) // TRACE_RECORD_DTYPE.itemsize
    records = np.frombuffer(buf, dtype=TRACE_RECORD_DTYPE, count=count, offset=start)
    return HpctraceFile(flags=flags, records=records, version=version)


def to_bytes(trace: HpctraceFile) -> bytes:
    """The file hpcrun would write for ``trace``."""
    version = trace.version.encode("ascii")
    if len(version) != 5:
        raise ValueError(f"version {trace.version!r} is not 5 ASCII characters")
    header = MAGIC + version + ENDIAN_BIG
    if trace.version != "01.00":
        header += struct.pack(">Q", trace.flags)
    records = np.asarray(trace.records).astype(TRACE_RECORD_DTYPE, copy=False)
    return header + np.ascontiguousarray(records).tobytes()


def write(trace: HpctraceFile, dest: str | os.PathLike[str] | BinaryIO) -> None:
    """Write ``trace`` to a path or a binary stream."""
    data = to_bytes(trace)
    if isinstance(dest, str | os.PathLike):
        Path(dest).write_bytes(data)
    else:
        dest.write(data)


def verify(trace: HpctraceFile) -> list[str]:
    """Problems a trace shows on its own (see :func:`verify_trace` for those needing the profile).

    Checks the flags and that every record names a retained (odd) node id, as hpcrun writes them.
    """
    problems = []
    if trace.flags & ~KNOWN_FLAGS:
        problems.append(f"header: unknown flag bits {trace.flags & ~KNOWN_FLAGS:#x}")
    if trace.flags & TRACE_FLAG_DATA_CENTRIC:
        problems.append("header: data-centric traces are not supported")
    if trace.version == "01.00" and trace.flags:
        problems.append("header: version 01.00 cannot hold flags")
    node_ids = np.asarray(trace.records["node_id"], dtype=np.uint32)
    even = np.flatnonzero((node_ids & CCT_ID_RETAINED) == 0)
    if len(even):
        i = int(even[0])
        problems.append(
            f"records: record {i} names node {int(node_ids[i])}, an even (not retained) id "
            f"({len(even)} such records)"
        )
    return problems


def verify_trace(trace: HpctraceFile, profile: HpcrunProfile) -> list[str]:
    """Problems of ``trace`` read with its sibling ``profile``; empty when clean.

    Beyond :func:`verify`: every node a record names must be in the profile's CCT, every time
    must lie in the profile's ``trace-min-time``..``trace-max-time`` (hpcrun and pyrun write the
    trace's own first and last time there, ``0``..``0`` for no trace), and times may run
    backwards only within the profile's ``trace-disorder`` window (formats.md §1.3, §2): with
    disorder D, no record may be earlier than any record more than D positions before it.
    """
    problems = verify(trace)
    node_ids = np.asarray(trace.records["node_id"], dtype=np.uint32)
    known = np.unique(np.asarray(profile.cct["id"], dtype=np.uint32))
    unknown = ~np.isin(node_ids, known)
    if unknown.any():
        i = int(np.argmax(unknown))
        problems.append(
            f"records: record {i} names node {int(node_ids[i])}, not in the profile's CCT "
            f"({int(unknown.sum())} such records)"
        )
    disorder_text = profile.header("trace-disorder", "0")
    disorder = int(disorder_text) if disorder_text.isdigit() else 0
    times = np.asarray(trace.records["time"], dtype=np.uint64)
    span = trace_span(profile)
    if span is not None and len(times):
        low, high = span
        outside = (times < np.uint64(low)) | (times > np.uint64(high))
        if outside.any():
            i = int(np.argmax(outside))
            problems.append(
                f"records: record {i} at time {int(times[i])} lies outside the profile's "
                f"trace-min-time..trace-max-time {low}..{high} ({int(outside.sum())} such records)"
            )
    if len(times) > disorder + 1:
        running_max = np.maximum.accumulate(times)
        late = times[disorder + 1 :] < running_max[: len(times) - disorder - 1]
        if late.any():
            i = int(np.argmax(late)) + disorder + 1
            problems.append(
                f"records: record {i} at time {int(times[i])} is earlier than a record more than "
                f"{disorder} positions before it (trace-disorder {disorder})"
            )
    return problems


def _flag_text(flags: int) -> str:
    names = [name for bit, name in FLAG_NAMES.items() if flags & bit]
    if flags & ~KNOWN_FLAGS:
        names.append(f"unknown {flags & ~KNOWN_FLAGS:#x}")
    return f"{flags:#x}" + (f" ({', '.join(names)})" if names else "")


def dump(trace: HpctraceFile, out: TextIO) -> None:
    """Write the header and every record (index, time in ns, delta, node id) as text."""
    out.write(f"hpctrace, format {trace.version}, flags {_flag_text(trace.flags)}\n")
    times = np.asarray(trace.records["time"], dtype=np.uint64).tolist()
    node_ids = np.asarray(trace.records["node_id"], dtype=np.uint32).tolist()
    out.write(f"[records] {len(times)}\n")
    previous = times[0] if times else 0
    for i, (time, node_id) in enumerate(zip(times, node_ids, strict=True)):
        out.write(f"  {i:6d} {time} {time - previous:+d} node {node_id}\n")
        previous = time


def dumps(trace: HpctraceFile) -> str:
    """:func:`dump` into a string."""
    text = io.StringIO()
    dump(trace, text)
    return text.getvalue()
