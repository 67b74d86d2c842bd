"""``trace.db`` v4.0: per-thread / per-stream traces of a database (formats.md §3.5, §3.6).

One trace line per non-summary profile: time-sorted ``(timestamp ns, ctxId)`` elements saying
which context a thread or GPU stream was in from that instant on (ctxId 0: idle). The section
header also holds the smallest and largest timestamp of the whole database.

Reading is lazy: :func:`read` memory-maps a path and parses the header and the trace headers; a
line's elements become a numpy view of the file only when used (``db.lines[i]``), and are checked
then (time order, no two consecutive idle elements). Whether every ctxId exists is a question for
meta.db: :func:`verify` with ``known_ctx_ids`` (or :func:`verify_contexts`) answers it.

Writing reproduces hpcprof's layout byte for byte (formats.md §3.6): each line starts 8-aligned
with room for ``capacity`` elements (hpcprof reserves the thread's maximum, and may fill less);
lines are placed in *line order* (hpcprof's samples have them in reverse, which is the default
here). Parallel writers use :func:`layout`, :func:`write_head`, :func:`write_line` and
:func:`write_footer`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, TextIO, cast, overload

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats import _blocks, _db, _window
from pyhpctk.formats._db import pwrite_all, struct_dtype

FORMAT_ID = _db.FORMAT_IDS["trace"]
FOOTER = _db.FOOTERS[FORMAT_ID]

HEADER_END = 0x20  # formats.md §3.5: one section, the section header starts at 0x20

# formats.md §3.5, CtxTraces section header (32 bytes):
#   0x00 ptr pTraces | 0x08 u32 nTraces | 0x0c u8 szTrace | 0x10 u64 minTimestamp | 0x18 u64 max
TRACE_SECTION_DTYPE = struct_dtype(
    [
        ("p_traces", "<u8", 0x00),
        ("n_traces", "<u4", 0x08),
        ("sz_trace", "u1", 0x0C),
        ("min_timestamp", "<u8", 0x10),
        ("max_timestamp", "<u8", 0x18),
    ],
    0x20,
)
assert TRACE_SECTION_DTYPE.itemsize == 32

# formats.md §3.5, {CTH} trace header (24 bytes): u32 profIndex | ptr pStart | ptr pEnd.
_TRACE_HEADER_FIELDS = [
    ("prof_index", "<u4", 0x00),
    ("p_start", "<u8", 0x08),
    ("p_end", "<u8", 0x10),
]
TRACE_HEADER_SIZE = 0x18
TRACE_HEADER_DTYPE = struct_dtype(_TRACE_HEADER_FIELDS, TRACE_HEADER_SIZE)
assert TRACE_HEADER_DTYPE.itemsize == 24
_CTX_TRACES = _db.RecordTable(
    "CtxTraces",
    TRACE_SECTION_DTYPE,
    "p_traces",
    "n_traces",
    "sz_trace",
    "szTrace",
    "{CTH}",
    _TRACE_HEADER_FIELDS,
    TRACE_HEADER_SIZE,
)

# formats.md §3.5, elements: { u64 timestamp; u32 ctxId }, packed ('<QI').
TRACE_ELEMENT_DTYPE = np.dtype([("timestamp", "<u8"), ("ctx_id", "<u4")])
assert TRACE_ELEMENT_DTYPE.itemsize == 12

LINE_ALIGN = 8
IDLE_CTX = 0


# --------------------------------------------------------------------------------------------
# Model


def element_problems(elements: npt.NDArray[np.void]) -> list[str]:
    """What is wrong with one line's elements (formats.md §3.5), empty when clean."""
    found: list[str] = []
    times = elements["timestamp"]
    if len(times) > 1:
        back = np.flatnonzero(times[1:] < times[:-1])
        if len(back):
            found.append(f"element {int(back[0]) + 1} goes back in time (not time-sorted)")
        idle = elements["ctx_id"] == IDLE_CTX
        twice = np.flatnonzero(idle[1:] & idle[:-1])
        if len(twice):
            found.append(f"elements {int(twice[0])} and {int(twice[0]) + 1} are both idle (ctx 0)")
    return found


@dataclass(frozen=True, slots=True, eq=False)
class TraceLine:
    """One thread's or stream's trace: its profile index and elements (time-sorted).

    ``capacity`` is the number of elements the file reserves for the line (hpcprof reserves the
    thread's maximum and may fill less); ``None`` means exactly ``len(elements)``.
    """

    prof_index: int
    elements: npt.NDArray[np.void]
    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.elements.dtype != TRACE_ELEMENT_DTYPE:
            raise TypeError("elements must have dtype TRACE_ELEMENT_DTYPE")
        if self.capacity is not None and self.capacity < len(self.elements):
            raise ValueError(f"capacity {self.capacity} < {len(self.elements)} elements")

    @classmethod
    def from_arrays(
        cls, prof_index: int, timestamps: npt.ArrayLike, ctx_ids: npt.ArrayLike
    ) -> TraceLine:
        ts = np.asarray(timestamps, dtype=np.uint64).ravel()
        ctx = np.asarray(ctx_ids, dtype=np.uint32).ravel()
        if ts.shape != ctx.shape:
            raise ValueError("timestamps and ctx_ids must have the same length")
        elements = np.empty(len(ts), TRACE_ELEMENT_DTYPE)
        elements["timestamp"] = ts
        elements["ctx_id"] = ctx
        return cls(prof_index, elements)

    @property
    def room(self) -> int:
        """Elements of room in the file: the capacity, or the element count."""
        return len(self.elements) if self.capacity is None else self.capacity

    def problems(self) -> list[str]:
        return element_problems(self.elements)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TraceLine):
            return NotImplemented
        return (
            self.prof_index == other.prof_index
            and self.room == other.room
            and _db.same_bits(self.elements, other.elements)
        )

    __hash__ = None  # type: ignore[assignment]


def default_line_order(n_lines: int) -> tuple[int, ...]:
    """hpcprof's order of lines in the file as seen in every sample: the last line first."""
    return tuple(range(n_lines - 1, -1, -1))


def time_bounds(lines: Iterable[TraceLine]) -> tuple[int, int]:
    """The smallest and largest timestamp over ``lines`` (``(0, 0)`` when there are none)."""
    lows, highs = [], []
    for line in lines:
        if len(line.elements):
            lows.append(int(line.elements["timestamp"].min()))
            highs.append(int(line.elements["timestamp"].max()))
    return (min(lows), max(highs)) if lows else (0, 0)


class TraceDB:
    """A whole ``trace.db``: the time range and one :class:`TraceLine` per profile (maybe lazy).

    ``line_order`` is the order of the lines in the file (``None``: :func:`default_line_order`).
    Two databases are equal when they would be written as the same bytes: a line that holds and
    reserves nothing takes no room, and when lines share a start the room's owner is moot.
    """

    __slots__ = ("_line_order", "lines", "max_timestamp", "min_timestamp")

    def __init__(
        self,
        lines: Sequence[TraceLine],
        min_timestamp: int,
        max_timestamp: int,
        line_order: Sequence[int] | None = None,
    ) -> None:
        self.lines: Sequence[TraceLine] = lines
        self.min_timestamp = int(min_timestamp)
        self.max_timestamp = int(max_timestamp)
        if line_order is not None:
            line_order = tuple(int(i) for i in line_order)
            if sorted(line_order) != list(range(len(lines))):
                raise ValueError("line_order must be a permutation of the line indices")
        self._line_order: tuple[int, ...] | None = line_order

    @classmethod
    def from_lines(cls, lines: Sequence[TraceLine]) -> TraceDB:
        """A database whose time range is that of ``lines``."""
        return cls(lines, *time_bounds(lines))

    @property
    def line_order(self) -> tuple[int, ...]:
        if self._line_order is None:
            return default_line_order(len(self.lines))
        return self._line_order

    def prof_indices(self) -> npt.NDArray[np.int64]:
        """Each line's profile index, without loading any line."""
        if isinstance(self.lines, _FileLines):
            return self.lines.prof_indices()
        return np.array([line.prof_index for line in self.lines], dtype=np.int64)

    def rooms(self) -> npt.NDArray[np.int64]:
        """Each line's room in elements, without loading any line."""
        rooms = getattr(self.lines, "rooms", None)
        if callable(rooms):
            return np.asarray(rooms(), dtype=np.int64)
        return np.array([line.room for line in self.lines], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lines)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TraceDB):
            return NotImplemented
        if len(self.lines) != len(other.lines):
            return False
        # The same headers and pointers (which hold the time range, profile indices, order and
        # room), then the same elements: equal exactly when the files would be equal.
        mine, theirs = layout_of(self), layout_of(other)
        if (mine.head, mine.footer_at) != (theirs.head, theirs.footer_at):
            return False
        return all(
            _db.same_bits(self.lines[i].elements, other.lines[i].elements)
            for i in range(len(self.lines))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TraceDB({len(self.lines)} lines)"


# --------------------------------------------------------------------------------------------
# Reading


def sniff(head: bytes) -> bool:
    """Is ``head`` (a file's first bytes) the start of a trace.db?"""
    return _db.sniff(head, FORMAT_ID)


class _FileLines(Sequence[TraceLine]):
    """The trace lines of a trace.db in a buffer, made into views (and checked) on demand."""

    __slots__ = ("_buf", "_count", "_path", "_prof", "_room", "_start")

    def __init__(
        self,
        buf: _db.Buffer,
        path: str | None,
        headers: npt.NDArray[np.void],
        room: npt.NDArray[np.int64],
    ) -> None:
        self._buf = buf
        self._path = path
        self._prof = headers["prof_index"].astype(np.int64)
        self._start = headers["p_start"].astype(np.int64)
        self._count: npt.NDArray[np.int64] = (
            (headers["p_end"] - headers["p_start"]) // TRACE_ELEMENT_DTYPE.itemsize
        ).astype(np.int64)
        self._room: npt.NDArray[np.int64] = np.maximum(room, self._count)

    def rooms(self) -> npt.NDArray[np.int64]:
        return self._room

    def counts(self) -> npt.NDArray[np.int64]:
        return self._count

    def prof_indices(self) -> npt.NDArray[np.int64]:
        return self._prof

    def __len__(self) -> int:
        return len(self._prof)

    @overload
    def __getitem__(self, index: int) -> TraceLine: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[TraceLine]: ...
    def __getitem__(self, index: int | slice) -> TraceLine | Sequence[TraceLine]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]
        line = self.raw(i)
        found = line.problems()
        if found:
            raise FormatError(self._path, f"trace line {i}", "; ".join(found))
        return line

    def raw(self, i: int) -> TraceLine:
        """Line ``i`` as a view of the buffer, unchecked (its pointers were checked by read)."""
        count = int(self._count[i])
        if count:  # a view of the file's window: a pass over every line maps a few at a time
            elements = _window.frombuffer(
                self._buf, TRACE_ELEMENT_DTYPE, count, int(self._start[i])
            )
        else:
            elements = np.zeros(0, TRACE_ELEMENT_DTYPE)
        room = int(self._room[i])
        return TraceLine(int(self._prof[i]), elements, None if room == count else room)


def read(source: _db.Source, *, lazy: bool = True) -> TraceDB:
    """Read a trace.db from a path (memory-mapped), a buffer or a binary file object.

    With ``lazy`` (the default) lines are checked when first used; ``lazy=False`` checks every
    line now, so any damage is reported by this call.
    """
    buf, path, (where,), limit = _db.open_db(source, FORMAT_ID, 1)
    section_size, section_at = where
    head, headers = _CTX_TRACES.read(buf, path, limit, where)
    n = len(headers)
    start, end = headers["p_start"], headers["p_end"]
    bad = (end < start) | (end > np.uint64(limit)) | ((end - start) % np.uint64(12) != 0)
    bad |= (end > start) & (start < np.uint64(section_at + section_size))
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise FormatError(
            path,
            "CtxTraces",
            f"trace line {i}: elements [0x{int(start[i]):x}, 0x{int(end[i]):x}) are not a whole "
            f"number of elements inside the data",
        )
    # formats.md §3.6: lines are disjoint (aliases would multiply the elements a file holds).
    _blocks.refuse_overlaps(path, "CtxTraces", [("trace line {} elements", start, end)])
    # Recover the line order and each line's room: by start, a zero-room line before its alias.
    count = ((end - start) // np.uint64(12)).astype(np.int64)
    start64 = start.astype(np.int64)
    order = np.lexsort((np.arange(n), count > 0, start64))
    next_start = np.append(start64[order][1:], limit)
    room = np.empty(n, np.int64)
    room[order] = np.maximum(next_start - start64[order], 0) // TRACE_ELEMENT_DTYPE.itemsize
    # A line that fills nothing but shares its start with the next one has no room of its own.
    lines = _FileLines(buf, path, headers, room)
    min_ts, max_ts = int(head["min_timestamp"]), int(head["max_timestamp"])
    if not lazy:
        return TraceDB([lines[i] for i in range(n)], min_ts, max_ts, order.tolist())
    return TraceDB(lines, min_ts, max_ts, order.tolist())


# --------------------------------------------------------------------------------------------
# Layout and writing


@dataclass(frozen=True, slots=True)
class TraceLayout(_db.Layout):
    """Where everything of a trace.db goes (formats.md §3.6), from per-line rooms alone."""

    head: bytes
    lines_at: npt.NDArray[np.int64]
    rooms: npt.NDArray[np.int64]
    footer_at: int
    footer: ClassVar[bytes] = FOOTER


def layout(
    prof_indices: Sequence[int],
    counts: npt.ArrayLike,
    rooms: npt.ArrayLike,
    min_timestamp: int,
    max_timestamp: int,
    line_order: Sequence[int] | None = None,
) -> TraceLayout:
    """Place every line (8-aligned, ``rooms[i]`` elements each) by an exclusive scan.

    ``counts`` are the element counts actually written (``pEnd``); ``rooms`` the reservations.
    """
    n = len(prof_indices)
    cnt = np.asarray(counts, dtype=np.int64).reshape(-1)
    room = np.asarray(rooms, dtype=np.int64).reshape(-1)
    if len(cnt) != n or len(room) != n or np.any(cnt > room):
        raise ValueError("one count <= room per line is needed")
    order = np.asarray(default_line_order(n) if line_order is None else line_order, np.int64)
    headers_at = HEADER_END + TRACE_SECTION_DTYPE.itemsize
    first = _db.align(headers_at + n * TRACE_HEADER_SIZE, LINE_ALIGN)
    sizes = (room * TRACE_ELEMENT_DTYPE.itemsize + LINE_ALIGN - 1) // LINE_ALIGN * LINE_ALIGN
    lines_at, footer_at = _db.exclusive_scan(first, sizes, order)
    headers = np.zeros(n, TRACE_HEADER_DTYPE)
    headers["prof_index"] = prof_indices
    headers["p_start"] = lines_at
    headers["p_end"] = lines_at + cnt * TRACE_ELEMENT_DTYPE.itemsize
    section = np.zeros(1, TRACE_SECTION_DTYPE)
    section[0] = (headers_at, n, TRACE_HEADER_SIZE, min_timestamp, max_timestamp)
    head = bytearray(
        _db.write_header(
            FORMAT_ID, [(TRACE_SECTION_DTYPE.itemsize + n * TRACE_HEADER_SIZE, HEADER_END)]
        )
    )
    head += section.tobytes() + headers.tobytes()
    _db.pad_to(head, LINE_ALIGN)
    return TraceLayout(bytes(head), lines_at, room, footer_at)


def layout_of(db: TraceDB) -> TraceLayout:
    """The layout of a whole :class:`TraceDB` (without loading the lines of a file)."""
    if isinstance(db.lines, _FileLines):
        counts, prof = db.lines.counts(), db.lines.prof_indices().tolist()
    else:
        counts = np.array([len(line.elements) for line in db.lines], dtype=np.int64)
        prof = [line.prof_index for line in db.lines]
    return layout(prof, counts, db.rooms(), db.min_timestamp, db.max_timestamp, db.line_order)


write_head = _db.write_head  # size the file, write the header and trace headers
write_footer = _db.write_footer  # last: the footer marks the file complete


def write_line(fd: int, plan: TraceLayout, index: int, elements: npt.NDArray[np.void]) -> None:
    """Write line ``index``'s elements at its place (any process, any order)."""
    if len(elements) > plan.rooms[index]:
        raise ValueError(f"line {index}: {len(elements)} elements exceed its room")
    if len(elements):
        pwrite_all(fd, elements, int(plan.lines_at[index]))


def _pieces(obj: TraceDB, plan: TraceLayout) -> Iterator[_db.Piece]:
    for i in range(len(obj.lines)):
        yield int(plan.lines_at[i]), obj.lines[i].elements


def to_bytes(obj: TraceDB) -> bytes:
    """The whole file as bytes."""
    plan = layout_of(obj)
    return _db.image(plan, _pieces(obj, plan))


def write(obj: TraceDB, dest: _db.Dest) -> None:
    """Write ``obj`` to a path (line by line with ``os.pwrite``) or to a binary file object."""
    plan = layout_of(obj)
    _db.write_file(dest, plan, _pieces(obj, plan))


# --------------------------------------------------------------------------------------------
# Text and checks


def dump(obj: TraceDB, out: TextIO) -> None:
    """Readable text: the time range, then every line with its elements."""
    out.write(
        f"trace.db: {len(obj.lines)} lines, timestamps {obj.min_timestamp}..{obj.max_timestamp}\n"
    )
    out.write(f"line order: {' '.join(str(i) for i in obj.line_order)}\n")
    for i in range(len(obj.lines)):
        line, problem = _blocks.block_for_dump(obj.lines, i)
        room = "" if line.capacity is None else f", room for {line.capacity}"
        out.write(f"line {i}: profile {line.prof_index}: {len(line.elements)} elements{room}\n")
        if problem is not None:
            out.write(f"  # problem: {problem}\n")
        times = line.elements["timestamp"].tolist()
        ctx = line.elements["ctx_id"].tolist()
        out.writelines(f"  {t} ctx {c}\n" for t, c in zip(times, ctx, strict=True))


def verify_contexts(
    obj: TraceDB, known_ctx_ids: Iterable[int] | npt.NDArray[np.integer]
) -> list[str]:
    """Elements naming a context that is neither 0 (idle) nor in ``known_ctx_ids`` (meta.db's)."""
    if isinstance(known_ctx_ids, np.ndarray):
        known = np.unique(known_ctx_ids.astype(np.int64))
    else:
        known = np.unique(np.fromiter(cast("Iterable[int]", known_ctx_ids), dtype=np.int64))
    found: list[str] = []
    for i in range(len(obj.lines)):
        try:
            line = obj.lines[i]
        except FormatError:
            continue  # reported by verify()
        ctx = line.elements["ctx_id"].astype(np.int64)
        unknown = np.flatnonzero((ctx != IDLE_CTX) & ~np.isin(ctx, known))
        if len(unknown):
            j = int(unknown[0])
            found.append(
                f"line {i} (profile {line.prof_index}): element {j} names unknown context "
                f"{int(ctx[j])} ({len(unknown)} such elements)"
            )
    return found


def verify(
    obj: TraceDB, known_ctx_ids: Iterable[int] | npt.NDArray[np.integer] | None = None
) -> list[str]:
    """Consistency problems (formats.md §3.5), empty when clean.

    With ``known_ctx_ids`` (meta.db's context ids) also every element's context is checked.
    """
    found: list[str] = []
    for i in range(len(obj.lines)):
        try:
            line = obj.lines[i]
        except FormatError as error:
            found.append(f"line {i}: {error.problem}")
            continue
        found.extend(f"line {i}: {p}" for p in line.problems())
        if len(line.elements):
            low = int(line.elements["timestamp"].min())
            high = int(line.elements["timestamp"].max())
            if low < obj.min_timestamp or high > obj.max_timestamp:
                found.append(
                    f"line {i}: timestamps {low}..{high} fall outside the database's range "
                    f"{obj.min_timestamp}..{obj.max_timestamp}"
                )
    n_elements = (
        obj.lines.counts()
        if isinstance(obj.lines, _FileLines)
        else np.array([len(line.elements) for line in obj.lines], dtype=np.int64)
    )
    if obj.min_timestamp > obj.max_timestamp and n_elements.any():
        found.append(
            f"the database's range {obj.min_timestamp}..{obj.max_timestamp} ends before it starts"
        )
    # formats.md §3.5: one line per thread profile.
    prof, lines_of = np.unique(obj.prof_indices(), return_counts=True)
    if (lines_of > 1).any():
        twice = prof[lines_of > 1][:10].tolist()
        found.append(f"profiles {twice} have more than one trace line")
    if known_ctx_ids is not None:
        found.extend(verify_contexts(obj, known_ctx_ids))
    return found
