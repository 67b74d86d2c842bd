"""Writing meta.db: hpcprof's exact layout, one writer per section (formats.md §3.6).

Checked byte for byte against every ``meta.db`` of the reference databases (hpcprof's
``sinks/metadb.cpp``):

- header and section table (0x90 bytes), then each section 8-aligned with NUL padding, in the
  order General, IdNames, Metrics, Strings, Modules, Files, Functions, Context, then the footer;
- General (:func:`write_general`): its 16-byte header, the title, the description;
- IdNames (:func:`write_id_names`): 9-byte header, an empty string, the names, then (8-aligned)
  the pointer array;
- Metrics (:func:`write_metrics`): 27-byte header; the scope names, then (8-aligned) the scopes;
  per metric: the scope instances (8-aligned), its formula strings (one copy per summary, never
  deduplicated), the summaries (8-aligned) and its name; then (8-aligned) the descriptions;
- Strings: the deduplicated pool, no header (:func:`string_pool`);
- Modules / Files / Functions (:func:`write_tables`): 14-byte header, then (8-aligned) entries;
- Context (:func:`write_contexts`): 11-byte header, then (8-aligned) every non-empty child array
  in post-order (an array after the arrays of all its descendants, entry points' subtrees in
  order), then the entry points. A leaf has ``szChildren = pChildren = 0``, except a leaf whose
  children hpcprof elided (§3.7): hpcprof writes an empty array for it, so ``pChildren`` is the
  offset the traversal had reached; :attr:`Context.elided_children` keeps that fact.

The one thing not derivable from the model is the order of the Strings pool, which hpcprof fills
in the order its worker threads first met each string: the reader records it in
``MetaDB.string_order``, a layout hint the pool is seeded with (strings the model no longer uses
stay in the pool); without it the pool has a canonical order: the entry-point names, then each
function's name, module path and file path in table order, then the remaining module and file
paths. All context records are laid out with numpy in one go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pyhpctk.formats import _db
from pyhpctk.formats.metadb.check import table_problems
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
    HEADER_END,
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
    SUMMARY_DTYPE,
    TABLE_HEADER_DTYPE,
)
from pyhpctk.formats.metadb.model import Context, Entry, MetaDB, Node, no_gc


def to_bytes(db: MetaDB) -> bytes:
    """The ``meta.db`` file for ``db``, laid out exactly as hpcprof lays it out.

    Raises ValueError when the model cannot be encoded (an index that resolves to nothing, a
    value too wide for its field).
    """
    with no_gc():
        problems = [p for p in table_problems(db) if p.startswith("dangling")]
        if problems:
            raise ValueError("cannot write meta.db: " + "; ".join(problems[:5]))
        out = _Out()
        write_general(out, db)
        write_id_names(out, db)
        write_metrics(out, db)
        pool = string_pool(db)
        s_base = len(out.data)
        out.data.extend(pool.data)
        out.sections[SEC_STRINGS] = (len(pool), s_base)

        def pooled(text: str) -> int:
            return s_base + pool.add(text)

        tables = write_tables(out, db, pooled)
        write_contexts(out, db, pooled, tables)
        if len(pool) != out.sections[SEC_STRINGS][0]:
            raise AssertionError("a string was added to the pool after it was written")
        out.data.extend(FOOTER)
        out.put(0, _db.write_header(FORMAT_ID, out.sections))
        return bytes(out.data)


def write(db: MetaDB, dest: _db.Dest) -> None:
    """Write ``db`` as a ``meta.db`` to a path or a binary file object."""
    _db.write_dest(to_bytes(db), dest)


class _Out:
    """The file as it grows, and the section table."""

    def __init__(self) -> None:
        self.data = bytearray(HEADER_END)
        self.sections: list[tuple[int, int]] = [(0, 0)] * N_SECTIONS

    def cstr(self, text: str) -> int:
        """Append a NUL-terminated string (not pooled); where it starts."""
        at = len(self.data)
        raw = text.encode("utf-8", "surrogateescape")  # non-UTF-8 bytes as read (cstring_at)
        if b"\0" in raw:
            raise ValueError(f"strings cannot contain NUL: {text!r}")
        self.data.extend(raw + b"\0")
        return at

    def begin(self) -> int:
        """Pad to 8 bytes; where the next thing starts."""
        _db.pad_to(self.data, 8)
        return len(self.data)

    def end(self, k: int, start: int) -> None:
        """Section ``k`` ran from ``start`` to here."""
        self.sections[k] = (len(self.data) - start, start)

    def put(self, at: int, data: bytes) -> None:
        self.data[at : at + len(data)] = data


def _record(dtype: np.dtype[np.void], **values: int) -> bytes:
    rec = np.zeros(1, dtype=dtype)
    for name, value in values.items():
        rec[name] = value
    return rec.tobytes()


def _column(values: Sequence[int], dtype: str, what: str) -> npt.NDArray[Any]:
    """``values`` as a numpy column of ``dtype``; a value out of range is a ValueError."""
    try:
        wide = np.array(values, dtype=np.uint64 if dtype == "<u8" else np.int64)
    except OverflowError as error:
        raise ValueError(f"cannot write meta.db: a {what} does not fit in {dtype}") from error
    info = np.iinfo(np.dtype(dtype))
    if len(wide) and (int(wide.min()) < info.min or int(wide.max()) > info.max):
        raise ValueError(f"cannot write meta.db: a {what} does not fit in {dtype}")
    return wide.astype(dtype)


def write_general(out: _Out, db: MetaDB) -> None:
    """formats.md §3.2, General: the header, the title, the description."""
    start = out.begin()
    out.data.extend(bytes(GENERAL_DTYPE.itemsize))
    p_title = out.cstr(db.title)
    p_desc = out.cstr(db.description)
    out.put(start, _record(GENERAL_DTYPE, pTitle=p_title, pDescription=p_desc))
    out.end(SEC_GENERAL, start)


def write_id_names(out: _Out, db: MetaDB) -> None:
    """formats.md §3.2, IdNames: header, an empty string, the names, the pointer array."""
    start = out.begin()
    out.data.extend(bytes(ID_NAMES_DTYPE.itemsize))
    out.cstr("")
    name_ptrs = [out.cstr(s) for s in db.id_names]
    pp = out.begin()
    out.data.extend(np.array(name_ptrs, dtype="<u8").tobytes())
    out.put(start, _record(ID_NAMES_DTYPE, ppNames=pp, nKinds=len(name_ptrs)))
    out.end(SEC_ID_NAMES, start)


def write_metrics(out: _Out, db: MetaDB) -> None:
    """formats.md §3.2, Metrics: the scopes, then each metric's arrays, then the descriptions."""
    start = out.begin()
    out.data.extend(bytes(METRICS_HEADER_DTYPE.itemsize))
    scope_names = [out.cstr(s.name) for s in db.scopes]
    p_scopes = out.begin()
    scope_arr = np.zeros(len(db.scopes), dtype=SCOPE_DTYPE)
    scope_arr["pScopeName"] = scope_names
    scope_arr["type"] = [s.type for s in db.scopes]
    scope_arr["propagationIndex"] = [s.propagation_index for s in db.scopes]
    out.data.extend(scope_arr.tobytes())
    metric_arr = np.zeros(len(db.metrics), dtype=METRIC_DTYPE)
    for i, m in enumerate(db.metrics):
        p_insts = out.begin()
        insts = np.zeros(len(m.scope_insts), dtype=SCOPE_INST_DTYPE)
        insts["pScope"] = [p_scopes + SCOPE_DTYPE.itemsize * s.scope for s in m.scope_insts]
        insts["propMetricId"] = [s.prop_metric_id for s in m.scope_insts]
        out.data.extend(insts.tobytes())
        formulas = [out.cstr(s.formula) for s in m.summaries]
        p_sums = out.begin()
        sums = np.zeros(len(m.summaries), dtype=SUMMARY_DTYPE)
        sums["pScope"] = [p_scopes + SCOPE_DTYPE.itemsize * s.scope for s in m.summaries]
        sums["pFormula"] = formulas
        sums["combine"] = [s.combine for s in m.summaries]
        sums["statMetricId"] = [s.stat_metric_id for s in m.summaries]
        out.data.extend(sums.tobytes())
        metric_arr[i] = (out.cstr(m.name), p_insts, p_sums, len(m.scope_insts), len(m.summaries))
    p_metrics = out.begin()
    out.data.extend(metric_arr.tobytes())
    out.put(
        start,
        _record(
            METRICS_HEADER_DTYPE,
            pMetrics=p_metrics,
            nMetrics=len(db.metrics),
            szMetric=METRIC_DTYPE.itemsize,
            szScopeInst=SCOPE_INST_DTYPE.itemsize,
            szSummary=SUMMARY_DTYPE.itemsize,
            pScopes=p_scopes,
            nScopes=len(db.scopes),
            szScope=SCOPE_DTYPE.itemsize,
        ),
    )
    out.end(SEC_METRICS, start)


def string_pool(db: MetaDB) -> _db.StringTable:
    """The Strings pool: the hint's order first, then the canonical order (module docstring)."""
    pool = _db.StringTable()
    for s in db.string_order or ():
        pool.add(s)
    for ep in db.entry_points:
        pool.add(ep.pretty_name)
    for f in db.functions:
        if f.name is not None:
            pool.add(f.name)
        if f.module is not None:
            pool.add(db.modules[f.module].path)
        if f.file is not None:
            pool.add(db.files[f.file].path)
    for m in db.modules:
        pool.add(m.path)
    for sf in db.files:
        pool.add(sf.path)
    return pool


Pooled = Callable[[str], int]
"""A string's pointer in the Strings pool (added to it on first use)."""


def write_tables(out: _Out, db: MetaDB, pooled: Pooled) -> tuple[int, int, int]:
    """formats.md §3.2, Modules, Files, Functions; where each table's entries start (each
    table's base is known before it is written: the header's 14 bytes pad to 16)."""

    def table(k: int, dtype: np.dtype[np.void], arr: npt.NDArray[np.void]) -> int:
        start = out.begin()
        out.data.extend(bytes(TABLE_HEADER_DTYPE.itemsize))
        base = out.begin()
        out.data.extend(arr.tobytes())
        out.put(
            start,
            _record(TABLE_HEADER_DTYPE, pEntries=base, nEntries=len(arr), szEntry=dtype.itemsize),
        )
        out.end(k, start)
        return base

    mods = np.zeros(len(db.modules), dtype=MODULE_DTYPE)
    mods["flags"] = [m.flags for m in db.modules]
    mods["pPath"] = [pooled(m.path) for m in db.modules]
    mod_base = table(SEC_MODULES, MODULE_DTYPE, mods)
    files = np.zeros(len(db.files), dtype=FILE_DTYPE)
    files["flags"] = [f.raw_flags for f in db.files]
    files["pPath"] = [pooled(f.path) for f in db.files]
    file_base = table(SEC_FILES, FILE_DTYPE, files)

    def p_mod(k: int | None) -> int:
        return 0 if k is None else mod_base + MODULE_DTYPE.itemsize * k

    def p_file(k: int | None) -> int:
        return 0 if k is None else file_base + FILE_DTYPE.itemsize * k

    fns = np.zeros(len(db.functions), dtype=FUNCTION_DTYPE)
    fns["pName"] = [0 if f.name is None else pooled(f.name) for f in db.functions]
    fns["pModule"] = [p_mod(f.module) for f in db.functions]
    fns["offset"] = [f.offset for f in db.functions]
    fns["pFile"] = [p_file(f.file) for f in db.functions]
    fns["line"] = [f.line for f in db.functions]
    fns["flags"] = [f.flags for f in db.functions]
    fn_base = table(SEC_FUNCTIONS, FUNCTION_DTYPE, fns)
    return fn_base, file_base, mod_base


def post_order(
    entry_points: Sequence[Entry],
) -> tuple[list[Context], dict[int, tuple[int, int]], list[tuple[int, int]]]:
    """hpcprof's Context-section order (``sinks/metadb.cpp``): every non-empty child array after
    the arrays of all its descendants, entry point by entry point.

    Returns the records in file order, ``id(node) -> (first record, count)`` for each node with
    children, and ``(record, records before)`` for each elided-children leaf, whose empty array
    hpcprof "writes" at the position reached when the traversal passes it.
    """
    records: list[Context] = []
    array_of: dict[int, tuple[int, int]] = {}
    elided_at: list[tuple[int, int]] = []
    record_of: dict[int, int] = {}
    for ep in entry_points:
        stack: list[tuple[Node, bool]] = [(ep, False)]
        while stack:
            node, expanded = stack.pop()
            if not node.children:
                if isinstance(node, Context) and node.elided_children:
                    elided_at.append((id(node), len(records)))
                continue
            if not expanded:
                stack.append((node, True))
                stack.extend((c, False) for c in reversed(node.children))
                continue
            array_of[id(node)] = (len(records), len(node.children))
            for c in node.children:
                record_of[id(c)] = len(records)
                records.append(c)
    return records, array_of, [(record_of[node], k) for node, k in elided_at]


def write_contexts(out: _Out, db: MetaDB, pooled: Pooled, tables: tuple[int, int, int]) -> None:
    """formats.md §3.2, Context: the child arrays in post-order, then the entry points."""
    start = out.begin()
    out.data.extend(bytes(CONTEXTS_HEADER_DTYPE.itemsize))
    base = out.begin()
    records, array_of, elided_at = post_order(db.entry_points)
    words, byte_at = _context_words(db, records, array_of, elided_at, base, tables)
    out.data.extend(words.tobytes())

    def array_at(node: Node) -> tuple[int, int]:
        found = array_of.get(id(node))
        if found is None:
            return 0, 0
        first_k, count_k = found
        return int(byte_at[first_k + count_k] - byte_at[first_k]), int(byte_at[first_k])

    p_eps = out.begin()
    eps = np.zeros(len(db.entry_points), dtype=ENTRY_POINT_DTYPE)
    for i, ep in enumerate(db.entry_points):
        sz, p = array_at(ep)
        eps[i] = (sz, p, ep.ctx_id, ep.kind, pooled(ep.pretty_name))
    out.data.extend(eps.tobytes())
    out.put(
        start,
        _record(
            CONTEXTS_HEADER_DTYPE,
            pEntryPoints=p_eps,
            nEntryPoints=len(db.entry_points),
            szEntryPoint=ENTRY_POINT_DTYPE.itemsize,
        ),
    )
    out.end(SEC_CONTEXT, start)


def _context_words(
    db: MetaDB,
    records: list[Context],
    array_of: dict[int, tuple[int, int]],
    elided_at: list[tuple[int, int]],
    base: int,
    tables: tuple[int, int, int],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """Every context record as 8-byte words (formats.md §3.2 {Ctx}, flex words included), laid
    out at once with numpy, and the byte offset of each record (then of the end)."""
    fn_base, file_base, mod_base = tables
    n = len(records)
    ids = _column([c.ctx_id for c in records], "<u4", "ctxId")
    relation = _column([c.relation for c in records], "u1", "relation")
    lexical = _column([c.lexical_type for c in records], "u1", "lexicalType")
    propagation = _column([c.propagation for c in records], "<u2", "propagation")
    fn_idx = _column([-1 if c.function is None else c.function for c in records], "<i8", "")
    file_idx = _column([-1 if c.file is None else c.file for c in records], "<i8", "")
    mod_idx = _column([-1 if c.module is None else c.module for c in records], "<i8", "")
    lines = _column([c.line if c.file is not None else 0 for c in records], "<u4", "line")
    offsets = _column([c.offset if c.module is not None else 0 for c in records], "<u8", "offset")
    for what, idx, count in (
        ("function", fn_idx, len(db.functions)),
        ("file", file_idx, len(db.files)),
        ("module", mod_idx, len(db.modules)),
    ):
        if n and int(idx.max()) >= count:
            raise ValueError(f"cannot write meta.db: a context refers to a missing {what}")
        if n and int(idx.min()) < -1:
            raise ValueError(f"cannot write meta.db: a context has a negative {what} index")
    has_fn, has_sl, has_pt = fn_idx >= 0, file_idx >= 0, mod_idx >= 0
    n_flex = has_fn.astype(np.int64) + 2 * has_sl + 2 * has_pt
    flags = has_fn * CTX_HAS_FUNCTION | has_sl * CTX_HAS_SRCLOC | has_pt * CTX_HAS_POINT
    word_at = np.zeros(n + 1, dtype=np.int64)  # word index of each record, then of the end
    np.cumsum(4 + n_flex, out=word_at[1:])
    byte_at = base + 8 * word_at
    # szChildren / pChildren of every record, from their arrays.
    sz_children = np.zeros(n, dtype=np.uint64)
    p_children = np.zeros(n, dtype=np.uint64)
    own = [(i, array_of[id(c)]) for i, c in enumerate(records) if c.children]
    if own:
        rows = np.array([i for i, _ in own], dtype=np.int64)
        firsts = np.array([a[0] for _, a in own], dtype=np.int64)
        counts = np.array([a[1] for _, a in own], dtype=np.int64)
        sz_children[rows] = byte_at[firsts + counts] - byte_at[firsts]
        p_children[rows] = byte_at[firsts]
    for i, k in elided_at:
        p_children[i] = byte_at[k]  # hpcprof's empty array points where it would have started
    words = np.zeros(int(word_at[-1]), dtype="<u8")
    head = word_at[:-1]
    words[head] = sz_children
    words[head + 1] = p_children
    words[head + 2] = (
        ids.astype(np.uint64)
        | flags.astype(np.uint64) << np.uint64(32)
        | relation.astype(np.uint64) << np.uint64(40)
        | lexical.astype(np.uint64) << np.uint64(48)
        | n_flex.astype(np.uint64) << np.uint64(56)
    )
    words[head + 3] = propagation
    flex = head + 4  # formats.md §3.2: [pFunction] [pFile, line] [pModule, offset]
    words[flex[has_fn]] = fn_base + FUNCTION_DTYPE.itemsize * fn_idx[has_fn]
    flex = flex + has_fn
    words[flex[has_sl]] = file_base + FILE_DTYPE.itemsize * file_idx[has_sl]
    words[flex[has_sl] + 1] = lines[has_sl]
    flex = flex + 2 * has_sl
    words[flex[has_pt]] = mod_base + MODULE_DTYPE.itemsize * mod_idx[has_pt]
    words[flex[has_pt] + 1] = offsets[has_pt]
    return words, byte_at


__all__ = ["post_order", "string_pool", "to_bytes", "write"]
