"""Reading meta.db: one reader per section, every pointer and size checked (formats.md §3.2).

:func:`read_buffer` checks the header and footer, then asks each section's reader in turn:
:func:`read_general`, :func:`read_id_names`, :func:`read_metrics`, :func:`read_strings`,
:func:`read_tables` (Modules, Files, Functions) and :func:`read_contexts`. Every function, file,
module and scope pointer must hit an entry of its table; child arrays must be tiled exactly by
their records and may not be shared or overlap (so a corrupt file cannot loop); neither may the
metrics' scope-instance and summary arrays, nor the strings named (so a small file cannot name
the square of its size). Bad input raises :class:`~pyhpctk.errors.FormatError`; a newer minor
version warns.

The Context section is read in two passes: a loop that only finds record offsets (depth-first
pre-order, :func:`_context_records`), then bulk numpy gathers of all fields, flags and flex
words (:func:`_context_columns`), from which both the objects and the flat index are made
(:func:`_context_objects`). Deep trees are handled without recursion.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats import _blocks, _db
from pyhpctk.formats.metadb.layout import (
    CONTEXTS_HEADER_DTYPE,
    CTX_HAS_FUNCTION,
    CTX_HAS_POINT,
    CTX_HAS_SRCLOC,
    ENTRY_POINT_DTYPE,
    FILE_DTYPE,
    FOOTER,
    FORMAT_ID,
    FUNCTION_DTYPE,
    GENERAL_DTYPE,
    ID_NAMES_DTYPE,
    METRIC_DTYPE,
    METRICS_HEADER_DTYPE,
    MODULE_DTYPE,
    N_SECTIONS,
    SCOPE_DTYPE,
    SCOPE_INST_DTYPE,
    SEC_CONTEXT,
    SEC_FILES,
    SEC_FUNCTIONS,
    SEC_GENERAL,
    SEC_ID_NAMES,
    SEC_METRICS,
    SEC_MODULES,
    SEC_STRINGS,
    SECTION_NAMES,
    SUMMARY_DTYPE,
    TABLE_HEADER_DTYPE,
)
from pyhpctk.formats.metadb.model import (
    CONTEXT_TABLE_DTYPE,
    NO_ENUM,
    Context,
    ContextIndex,
    Entry,
    Function,
    MetaDB,
    Metric,
    Module,
    Node,
    PropagationScope,
    ScopeInstance,
    SourceFile,
    SummaryStatistic,
    fill_parent_ids,
    no_gc,
)
from pyhpctk.formats.vocabulary import FILE_COPIED
from pyhpctk.formats.whole import Buffer, read_whole


def sniff(head: bytes) -> bool:
    """Is this the start of a ``meta.db``?"""
    return _db.sniff(head, FORMAT_ID)


def read(source: _db.Source) -> MetaDB:
    """Read a ``meta.db`` from a path, a buffer or a binary file object.

    A path is read into memory (the context tree is read from a copy of the whole file), not
    memory-mapped as the other database files are: a ``meta.db`` is the small one.
    """
    buf, path = read_whole(source)
    return read_buffer(buf, path)


def read_buffer(buf: Buffer, path: str | None = None) -> MetaDB:
    """Read a ``meta.db`` held in ``buf``; ``path`` names it in error messages."""
    with no_gc():
        _, sections = _db.read_header(buf, path, FORMAT_ID, N_SECTIONS)
        _db.check_footer(buf, path, FOOTER)
        r = _Reader(buf, path, sections)
        for k, (size, offset) in enumerate(sections):
            if offset + size > r.size - _db.FOOTER_SIZE:
                raise r.fail("header", f"{SECTION_NAMES[k]} section overlaps the footer")
        title, description = read_general(r)
        id_names = read_id_names(r)
        scopes, metrics = read_metrics(r)
        pool = read_strings(r)
        modules, files, functions, tables = read_tables(r, pool)
        entry_points, index = read_contexts(r, pool, tables)
    return MetaDB(
        title=title,
        description=description,
        id_names=id_names,
        scopes=scopes,
        metrics=metrics,
        modules=modules,
        files=files,
        functions=functions,
        entry_points=entry_points,
        string_order=tuple(pool.order),
        read_problems=tuple(pool.stray),
        _index=index,
    )


class _Reader:
    """One read of one buffer: the buffer, the path for messages and the section table."""

    def __init__(self, buf: Buffer, path: str | None, sections: list[tuple[int, int]]) -> None:
        self.buf = buf
        self.path = path
        self.size = len(buf)
        self.sections = sections
        self.strings: dict[int, str] = {}
        # Bytes of distinct strings decoded so far: hpcprof's strings are disjoint, so more than
        # the file holds means pointers into one another's strings (a file naming far more
        # text than it holds, pointer by pointer).
        self.decoded = 0

    def fail(self, section: str, problem: str) -> FormatError:
        return FormatError(self.path, section, problem)

    def need(self, k: int, dtype: np.dtype[np.void]) -> np.void:
        """Section ``k``'s header record (the section must hold it)."""
        size, offset = self.sections[k]
        if size < dtype.itemsize:
            raise self.fail(
                SECTION_NAMES[k],
                f"section is {size} bytes, smaller than its {dtype.itemsize}-byte header",
            )
        return _db.read_record(
            self.buf, offset, dtype, self.path, SECTION_NAMES[k], "section header"
        )

    def array(
        self,
        offset: int,
        dtype: np.dtype[Any],
        count: int,
        stride: int,
        section: str,
        what: str,
    ) -> npt.NDArray[Any]:
        """``count`` records of ``dtype`` every ``stride`` bytes (stored sizes, §3.1)."""
        if count and stride < dtype.itemsize:
            raise self.fail(
                section, f"{what}: element size {stride} is smaller than {dtype.itemsize}"
            )
        if count == 0:
            return np.zeros(0, dtype=dtype)
        _db.check_range(
            self.size, offset, (count - 1) * stride + dtype.itemsize, self.path, section, what
        )
        return np.ndarray(
            shape=(count,), dtype=dtype, buffer=self.buf, offset=offset, strides=(stride,)
        )

    def string(self, pointer: int, section: str) -> str:
        found = self.strings.get(pointer)
        if found is None:
            found = _db.cstring_at(self.buf, pointer, self.path, section)
            self.strings[pointer] = found
            self.decoded += len(found)
            if self.decoded > self.size:
                raise self.fail(
                    section,
                    f"string pointers overlap: the strings named add up to more than the "
                    f"file's {self.size} bytes",
                )
        return found


def _resolve(
    pointers: npt.NDArray[np.uint64],
    base: int,
    stride: int,
    count: int,
    fail: FormatError,
    allow_null: bool,
) -> npt.NDArray[np.int64]:
    """Turn pointers to table entries into indices (-1 for a null pointer when allowed)."""
    # Unsigned arithmetic throughout: pointers and bases are arbitrary u64s in a corrupt file.
    p = pointers.astype(np.uint64)
    step = np.uint64(max(stride, 1))
    above = p >= np.uint64(base)
    rel = np.where(above, p - np.uint64(base), np.uint64(0))
    idx = rel // step
    ok = above & (rel % step == 0) & (idx < np.uint64(count))
    null = p == 0
    if allow_null:
        ok |= null
    if not bool(np.all(ok)):
        bad = int(p[np.flatnonzero(~ok)[0]])
        raise FormatError(fail.path, fail.section, f"{fail.problem} 0x{bad:x}")
    return np.where(null, -1, idx.astype(np.int64))


# --------------------------------------------------------------------------------------------
# General, IdNames, Metrics


def read_general(r: _Reader) -> tuple[str, str]:
    """formats.md §3.2, General: the title and the description."""
    general = r.need(SEC_GENERAL, GENERAL_DTYPE)
    return r.string(int(general["pTitle"]), "General"), r.string(
        int(general["pDescription"]), "General"
    )


def read_id_names(r: _Reader) -> list[str]:
    """formats.md §3.2, IdNames: the identifier kinds' names."""
    idn = r.need(SEC_ID_NAMES, ID_NAMES_DTYPE)
    name_ptrs = r.array(
        int(idn["ppNames"]), np.dtype("<u8"), int(idn["nKinds"]), 8, "IdNames", "name pointers"
    )
    return [r.string(int(p), "IdNames") for p in name_ptrs.tolist()]


def read_metrics(r: _Reader) -> tuple[list[PropagationScope], list[Metric]]:
    """formats.md §3.2, Metrics: the propagation scopes and the metric descriptions."""
    mh = r.need(SEC_METRICS, METRICS_HEADER_DTYPE)
    n_scopes, p_scopes, sz_scope = int(mh["nScopes"]), int(mh["pScopes"]), int(mh["szScope"])
    scope_recs = r.array(p_scopes, SCOPE_DTYPE, n_scopes, sz_scope, "Metrics", "scopes")
    scopes = [
        PropagationScope(
            r.string(int(s["pScopeName"]), "Metrics"), int(s["type"]), int(s["propagationIndex"])
        )
        for s in scope_recs
    ]
    metric_recs = r.array(
        int(mh["pMetrics"]),
        METRIC_DTYPE,
        int(mh["nMetrics"]),
        int(mh["szMetric"]),
        "Metrics",
        "metric descriptions",
    )
    # formats.md §3.6: each metric has arrays of its own; aliases would let a small file name
    # the square of its size in scope instances.
    n_insts = metric_recs["nScopeInsts"].astype(np.uint64)
    n_sums = metric_recs["nSummaries"].astype(np.uint64)
    p_insts, p_sums = metric_recs["pScopeInsts"], metric_recs["pSummaries"]
    sz_insts, sz_sums = np.uint64(mh["szScopeInst"]), np.uint64(mh["szSummary"])
    _blocks.refuse_overlaps(
        r.path,
        "Metrics",
        [
            ("the scope instances of metric {}", p_insts, p_insts + n_insts * sz_insts),
            ("the summaries of metric {}", p_sums, p_sums + n_sums * sz_sums),
        ],
    )
    # Metric tables are small and many (4 records per metric): numpy views per metric, but
    # scope pointers resolved through a dict, since per-call numpy overhead dominates here.
    scope_of = {p_scopes + k * sz_scope: k for k in range(n_scopes)}

    def scope_index(pointer: int) -> int:
        found = scope_of.get(pointer)
        if found is None:
            raise r.fail("Metrics", f"scope pointer 0x{pointer:x} does not point at a scope")
        return found

    metrics: list[Metric] = []
    for name_p, insts_p, sums_p, n_inst, n_sum in metric_recs.tolist():
        insts = r.array(
            insts_p, SCOPE_INST_DTYPE, n_inst, int(mh["szScopeInst"]), "Metrics", "scope instances"
        )
        sums = r.array(sums_p, SUMMARY_DTYPE, n_sum, int(mh["szSummary"]), "Metrics", "summaries")
        metrics.append(
            Metric(
                r.string(name_p, "Metrics"),
                tuple(ScopeInstance(scope_index(sp), i) for sp, i in insts.tolist()),
                tuple(
                    SummaryStatistic(scope_index(sp), r.string(f, "Metrics"), c, i)
                    for sp, f, c, i in sums.tolist()
                ),
            )
        )
    return scopes, metrics


# --------------------------------------------------------------------------------------------
# Strings, Modules, Files, Functions


@dataclass(slots=True)
class Strings:
    """The Strings pool: its strings by pointer, their order (the writer's layout hint) and the
    names found outside it (readable, but not where formats.md §3.6 puts them)."""

    reader: _Reader
    start: int
    size: int
    at: dict[int, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    stray: list[str] = field(default_factory=list)

    def get(self, pointer: int, section: str) -> str:
        found = self.at.get(pointer)
        if found is not None:
            return found
        if len(self.stray) < 10:
            self.stray.append(
                f"{section}: string pointer 0x{pointer:x} is not the start of a string of the "
                f"Strings section [0x{self.start:x}, 0x{self.start + self.size:x})"
            )
        return self.reader.string(pointer, section)


def read_strings(r: _Reader) -> Strings:
    """formats.md §3.2, Strings: the pool, in its order; pointers into it decode via a table."""
    s_size, s_off = r.sections[SEC_STRINGS]
    pool = bytes(r.buf[s_off : s_off + s_size])
    strings = Strings(r, s_off, s_size)
    pos = 0
    for raw in pool.split(b"\0")[: -1 if pool.endswith(b"\0") else None]:
        if pos + len(raw) >= len(pool):
            break  # an unterminated tail: leave it to cstring_at if anything points there
        text = raw.decode("utf-8", "surrogateescape")  # hpcprof writes names as bytes
        strings.at[s_off + pos] = text
        strings.order.append(text)
        pos += len(raw) + 1
    return strings


Table = tuple[int, int, int]
"""(first entry, entry size, entries) of the Functions, Files or Modules table."""


def read_tables(
    r: _Reader, strings: Strings
) -> tuple[list[Module], list[SourceFile], list[Function], tuple[Table, Table, Table]]:
    """formats.md §3.2, Modules, Files and Functions; and where each table lies (for the
    Context section's pointers): functions, files, modules."""

    def table(k: int, dtype: np.dtype[np.void], what: str) -> tuple[npt.NDArray[np.void], int, int]:
        h = r.need(k, TABLE_HEADER_DTYPE)
        base, n, sz = int(h["pEntries"]), int(h["nEntries"]), int(h["szEntry"])
        return r.array(base, dtype, n, sz, SECTION_NAMES[k], what), base, sz

    mod_recs, mod_base, mod_sz = table(SEC_MODULES, MODULE_DTYPE, "modules")
    modules = [
        Module(strings.get(p, "Modules"), f)
        for f, p in zip(mod_recs["flags"].tolist(), mod_recs["pPath"].tolist(), strict=True)
    ]
    file_recs, file_base, file_sz = table(SEC_FILES, FILE_DTYPE, "files")
    files = [
        SourceFile(strings.get(p, "Files"), bool(f & FILE_COPIED), f & ~FILE_COPIED)
        for f, p in zip(file_recs["flags"].tolist(), file_recs["pPath"].tolist(), strict=True)
    ]
    fn_recs, fn_base, fn_sz = table(SEC_FUNCTIONS, FUNCTION_DTYPE, "functions")
    fn_mod = _resolve(
        fn_recs["pModule"],
        mod_base,
        mod_sz,
        len(modules),
        FormatError(r.path, "Functions", "module pointer does not point at a module:"),
        True,
    )
    fn_file = _resolve(
        fn_recs["pFile"],
        file_base,
        file_sz,
        len(files),
        FormatError(r.path, "Functions", "file pointer does not point at a file:"),
        True,
    )
    functions = [
        Function(
            None if p == 0 else strings.get(p, "Functions"),
            None if m < 0 else m,
            off,
            None if f < 0 else f,
            line,
            flags,
        )
        for p, m, off, f, line, flags in zip(
            fn_recs["pName"].tolist(),
            fn_mod.tolist(),
            fn_recs["offset"].tolist(),
            fn_file.tolist(),
            fn_recs["line"].tolist(),
            fn_recs["flags"].tolist(),
            strict=True,
        )
    ]
    tables = ((fn_base, fn_sz, len(functions)), (file_base, file_sz, len(files)))
    return modules, files, functions, (*tables, (mod_base, mod_sz, len(modules)))


# --------------------------------------------------------------------------------------------
# Context


_ARRAY_HEAD = struct.Struct("<QQ")


@dataclass(slots=True)
class _Records:
    """Pass 1's result: every context record's offset in depth-first pre-order, its parent's
    row (entry point ``k`` is ``-1 - k``) and depth, and each entry point's first row."""

    offsets: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    ep_first: list[int] = field(default_factory=list)


def read_contexts(
    r: _Reader, strings: Strings, tables: tuple[Table, Table, Table]
) -> tuple[list[Entry], ContextIndex]:
    """formats.md §3.2 Context section: entry points, then the tree, in two passes."""
    header = r.need(SEC_CONTEXT, CONTEXTS_HEADER_DTYPE)
    eps = r.array(
        int(header["pEntryPoints"]),
        ENTRY_POINT_DTYPE,
        int(header["nEntryPoints"]),
        int(header["szEntryPoint"]),
        "Context",
        "entry points",
    )
    data = r.buf if isinstance(r.buf, bytes) else bytes(r.buf)
    records = _context_records(r, data, eps)
    columns = _context_columns(r, data, np.array(records.offsets, dtype=np.int64), tables)
    return _context_objects(eps, strings, records, columns)


def _context_records(r: _Reader, data: bytes, eps: npt.NDArray[np.void]) -> _Records:
    """Pass 1: the offset of every record, depth-first pre-order; child arrays checked."""
    size = len(data)
    seen_arrays: dict[int, int] = {}  # child-array start -> end, to refuse shared/overlapping ones

    def child_array(p: int, sz: int, owner: int) -> list[int]:
        """Record offsets of the child array [p, p+sz) of context ``owner`` (checked)."""
        if sz == 0:
            return []
        if p + sz > size or p < 0:
            raise r.fail(
                "Context",
                f"child array of context {owner} at 0x{p:x} (+{sz} bytes) runs past the end of "
                f"the file (0x{size:x} bytes)",
            )
        if p in seen_arrays:
            raise r.fail(
                "Context", f"child array at 0x{p:x} of context {owner} is shared with another"
            )
        seen_arrays[p] = p + sz
        out = []
        end = p + sz
        pos = p
        while pos < end:
            if pos + 0x20 > end:
                raise r.fail(
                    "Context",
                    f"child array of context {owner} at 0x{p:x}: record at 0x{pos:x} overruns "
                    f"the array's {sz} bytes",
                )
            out.append(pos)
            pos += 0x20 + 8 * data[pos + 0x17]
            if pos > end:
                raise r.fail(
                    "Context",
                    f"child array of context {owner} at 0x{p:x}: record at 0x{out[-1]:x} "
                    f"overruns the array's {sz} bytes",
                )
        return out

    records = _Records()
    unpack = _ARRAY_HEAD.unpack_from
    for k, (ep_sz, ep_p, ep_id) in enumerate(
        zip(
            eps["szChildren"].tolist(),
            eps["pChildren"].tolist(),
            eps["ctxId"].tolist(),
            strict=True,
        )
    ):
        records.ep_first.append(len(records.offsets))
        stack = [(o, -1 - k, 1) for o in reversed(child_array(ep_p, ep_sz, ep_id))]
        while stack:
            o, parent, depth = stack.pop()
            row = len(records.offsets)
            records.offsets.append(o)
            records.parents.append(parent)
            records.depths.append(depth)
            sz, p = unpack(data, o)
            if sz:
                ctx_id = int.from_bytes(data[o + 0x10 : o + 0x14], "little")
                stack.extend((c, row, depth + 1) for c in reversed(child_array(p, sz, ctx_id)))

    # No two child arrays may overlap (a shared tail would make one record two contexts).
    if seen_arrays:
        starts = np.array(sorted(seen_arrays), dtype=np.int64)
        ends = np.array([seen_arrays[s] for s in starts.tolist()], dtype=np.int64)
        clash = np.flatnonzero(starts[1:] < ends[:-1])
        if len(clash):
            raise r.fail(
                "Context",
                f"child arrays at 0x{starts[clash[0]]:x} and 0x{starts[clash[0] + 1]:x} overlap",
            )
    return records


def _context_columns(
    r: _Reader, data: bytes, off: npt.NDArray[np.int64], tables: tuple[Table, Table, Table]
) -> dict[str, npt.NDArray[Any]]:
    """Pass 2: every field of every record in bulk (formats.md §3.2 {Ctx}), pointers resolved
    to table indices (-1: none)."""
    fn_table, file_table, mod_table = tables
    n = len(off)
    sz_children = gather_u64(data, off)
    p_children = gather_u64(data, off + 0x08)
    packed = gather_u64(data, off + 0x10)  # ctxId | flags<<32 | relation<<40 | lex<<48 | n<<56
    ctx_id = (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    flags = ((packed >> np.uint64(32)) & np.uint64(0xFF)).astype(np.int64)
    n_flex = (packed >> np.uint64(56)).astype(np.int64)
    has_fn = (flags & CTX_HAS_FUNCTION) != 0
    has_sl = (flags & CTX_HAS_SRCLOC) != 0
    has_pt = (flags & CTX_HAS_POINT) != 0
    # Flex words in fixed order: [pFunction] [pFile, line] [pModule, offset] (formats.md §3.2).
    w_file = has_fn.astype(np.int64)
    w_mod = w_file + 2 * has_sl
    needed = w_mod + 2 * has_pt
    short = np.flatnonzero(needed > n_flex)
    if len(short):
        i = int(short[0])
        raise r.fail(
            "Context",
            f"context {int(ctx_id[i])} has flags 0x{int(flags[i]):x} needing "
            f"{int(needed[i])} flex words but nFlexWords is {int(n_flex[i])}",
        )

    def word(k: npt.NDArray[np.int64], mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint64]:
        out = np.zeros(n, dtype=np.uint64)
        sel = np.flatnonzero(mask)
        if len(sel):
            out[sel] = gather_u64(data, off[sel] + 0x20 + 8 * k[sel])
        return out

    def bad(what: str) -> FormatError:
        return FormatError(r.path, "Context", f"context {what} pointer does not point at an entry:")

    return {
        "ctx_id": ctx_id,
        "relation": ((packed >> np.uint64(40)) & np.uint64(0xFF)).astype(np.uint8),
        "lexical_type": ((packed >> np.uint64(48)) & np.uint64(0xFF)).astype(np.uint8),
        "propagation": (gather_u64(data, off + 0x18) & np.uint64(0xFFFF)).astype(np.uint16),
        "function": _resolve_flagged(word(w_file * 0, has_fn), has_fn, fn_table, bad("function")),
        "file": _resolve_flagged(word(w_file, has_sl), has_sl, file_table, bad("file")),
        "line": word(w_file + 1, has_sl) & np.uint64(0xFFFFFFFF),
        "module": _resolve_flagged(word(w_mod, has_pt), has_pt, mod_table, bad("module")),
        "offset": word(w_mod + 1, has_pt),
        "elided": (sz_children == 0) & (p_children != 0),
        "has_srcloc": has_sl,
        "has_point": has_pt,
    }


def _context_objects(
    eps: npt.NDArray[np.void],
    strings: Strings,
    records: _Records,
    columns: dict[str, npt.NDArray[Any]],
) -> tuple[list[Entry], ContextIndex]:
    """The entry points and contexts as objects, and the flat index, from the columns."""
    # Build the objects from plain lists (the fastest way to make many small Python objects).
    entry_points = [
        Entry(ctx_id, kind, strings.get(p, "Context"), [])
        for ctx_id, kind, p in zip(
            eps["ctxId"].tolist(),
            eps["entryPoint"].tolist(),
            eps["pPrettyName"].tolist(),
            strict=True,
        )
    ]
    fields = ("ctx_id", "relation", "lexical_type", "function", "file", "line", "module")
    nodes = [
        Context(
            cid,
            rel,
            lex,
            None if fn < 0 else fn,
            None if fl < 0 else fl,
            ln,
            None if md < 0 else md,
            ofs,
            prop,
            [],
            eld,
        )
        for cid, rel, lex, fn, fl, ln, md, ofs, prop, eld in zip(
            *(columns[name].tolist() for name in fields),
            columns["offset"].tolist(),
            columns["propagation"].tolist(),
            columns["elided"].tolist(),
            strict=True,
        )
    ]
    for node, parent in zip(nodes, records.parents, strict=True):
        (nodes[parent] if parent >= 0 else entry_points[-1 - parent]).children.append(node)

    # The flat index, straight from the columns: entry point k's row goes right before its
    # subtree, so context row i moves down by the number of entry points up to its own.
    n, n_eps = len(nodes), len(entry_points)
    parent_arr = np.array(records.parents, dtype=np.int64)
    ep_first = np.array(records.ep_first, dtype=np.int64)
    ep_of = np.zeros(n, dtype=np.int64)
    if n_eps and n:
        ep_of = np.searchsorted(ep_first, np.arange(n), "right") - 1
    ctx_rows = np.arange(n, dtype=np.int64) + ep_of + 1
    ep_rows = ep_first + np.arange(n_eps, dtype=np.int64)
    table = np.zeros(n + n_eps, dtype=CONTEXT_TABLE_DTYPE)
    parent_row = np.full(n + n_eps, -1, dtype=np.int64)
    if n:
        parent_row[ctx_rows] = np.where(
            parent_arr >= 0,
            ctx_rows[np.maximum(parent_arr, 0)],
            ep_rows[np.clip(-1 - parent_arr, 0, max(n_eps - 1, 0))] if n_eps else -1,
        )
    for name in (*fields[:3], "propagation", *fields[3:5], "module"):
        table[name][ctx_rows] = columns[name]
    table["depth"][ctx_rows] = np.array(records.depths, dtype=np.uint32)
    table["entry_point"][ctx_rows] = -1
    table["line"][ctx_rows] = np.where(columns["has_srcloc"], columns["line"], 0)
    table["offset"][ctx_rows] = np.where(columns["has_point"], columns["offset"], 0)
    table["ctx_id"][ep_rows] = eps["ctxId"]
    table["entry_point"][ep_rows] = eps["entryPoint"]
    table["relation"][ep_rows] = NO_ENUM
    table["lexical_type"][ep_rows] = NO_ENUM
    for name in ("function", "file", "module"):
        table[name][ep_rows] = -1
    fill_parent_ids(table, parent_row)
    all_nodes: list[Node] = [None] * (n + n_eps)  # type: ignore[list-item]
    for row, ep in zip(ep_rows.tolist(), entry_points, strict=True):
        all_nodes[row] = ep
    for row, node in zip(ctx_rows.tolist(), nodes, strict=True):
        all_nodes[row] = node
    return entry_points, ContextIndex(table, all_nodes, parent_row)


def gather_u64(data: bytes, at: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """The little-endian u64s at byte offsets ``at`` (already bounds-checked), in bulk."""
    if not len(at):
        return np.zeros(0, dtype=np.uint64)
    if not bool(np.any(at & 7)):
        words = np.frombuffer(data, dtype="<u8", count=len(data) // 8)
        gathered: npt.NDArray[np.uint64] = words[at >> 3].astype(np.uint64)
        return gathered
    u8 = np.frombuffer(data, dtype=np.uint8)
    out = np.zeros(len(at), dtype=np.uint64)
    for k in range(8):
        out |= u8[at + k].astype(np.uint64) << np.uint64(8 * k)
    return out


def _resolve_flagged(
    pointers: npt.NDArray[np.uint64],
    present: npt.NDArray[np.bool_],
    table: Table,
    fail: FormatError,
) -> npt.NDArray[np.int64]:
    """Indices of flagged pointers into a table (a flagged null pointer is an error), else -1."""
    base, stride, count = table
    idx = np.full(len(pointers), -1, dtype=np.int64)
    sel = np.flatnonzero(present)
    if len(sel):
        idx[sel] = _resolve(pointers[sel], base, stride, count, fail, False)
    return idx


__all__ = ["gather_u64", "read", "read_buffer", "sniff"]
