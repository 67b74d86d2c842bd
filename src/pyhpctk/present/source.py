"""Open a database directory (meta.db, profile.db, cct.db, trace.db) as an :class:`Experiment`.

This is the only place pyview touches the format readers (:mod:`pyhpctk.formats.metadb`,
``profiledb``, ``cctdb``, ``tracedb``). They memory-map the files and hand out value blocks as
numpy views on demand, so opening a multi-GB database reads its headers and the meta.db tree
only; a metric column reads one summary block, a per-thread view one cct.db block.

Errors a user can cause (not a directory, not a database, a file missing, a damaged file) are
:class:`~pyhpctk.errors.FormatError` naming the path and the problem; another tool's input
(a measurement directory) is a :class:`~pyhpctk.errors.UsageError` saying which tool reads it.
A damaged trace.db is the exception: the profile views do not need it, so it is a warning, and
only the views that read the trace fail.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError, FormatWarning, UsageError
from pyhpctk.formats import cctdb, metadb, profiledb, threads, tracedb
from pyhpctk.formats.inspect import misplaced_input
from pyhpctk.formats.vocabulary import GPU_ID_NAMES, Combine, LexicalType, Relation
from pyhpctk.present.model import (
    LEX_ENTRY,
    LEX_ROOT,
    REL_NONE,
    ContextTree,
    Experiment,
    FloatArray,
    FunctionInfo,
    MetricInfo,
    ProfileList,
    SummaryStat,
    ThreadName,
    Timeline,
)
from pyhpctk.present.names import shown_name

REQUIRED = ("meta.db", "profile.db", "cct.db")


def _combine_label(value: int) -> str:
    """``sum``, ``min``, ``max``; a value this version does not know keeps its number."""
    try:
        return Combine(value).label
    except ValueError:
        return f"combine{value}"


def tree_from_metadb(meta: metadb.MetaDB) -> ContextTree:
    """The context tree of a meta.db as :class:`ContextTree` arrays (node 0 = ctxId 0)."""
    index = meta.index()
    table = index.table
    n = len(table) + 1
    entry = table["entry_point"] >= 0

    def col(name: str, fill: int, dtype: type[np.generic] = np.int64) -> npt.NDArray[np.generic]:
        out = np.empty(n, dtype=dtype)
        out[0] = fill
        out[1:] = table[name]
        return out

    lexical = col("lexical_type", LEX_ROOT, np.int16).astype(np.int8)
    relation = col("relation", REL_NONE, np.int16).astype(np.int8)
    raw_lex = table["lexical_type"].astype(np.int16)
    raw_rel = table["relation"].astype(np.int16)
    unknown_lex, unknown_rel = raw_lex == metadb.NO_ENUM, raw_rel == metadb.NO_ENUM
    lexical[1:] = np.where(
        entry, LEX_ENTRY, np.where(unknown_lex, LexicalType.INSTRUCTION, raw_lex)
    )
    relation[1:] = np.where(entry, REL_NONE, np.where(unknown_rel, Relation.CALL, raw_rel))
    parent = np.empty(n, dtype=np.int64)
    parent[0] = -1
    parent[1:] = index.parent_row + 1  # -1 (under the global context) becomes node 0
    names = [""] + [
        node.pretty_name if isinstance(node, metadb.Entry) else "" for node in index.nodes
    ]
    functions = tuple(
        FunctionInfo(
            shown_name(f.name) if f.name is not None else "<unknown function>",
            -1 if f.module is None else f.module,
            -1 if f.file is None else f.file,
            f.line,
            f.offset,
        )
        for f in meta.functions
    )
    return ContextTree(
        ctx_id=col("ctx_id", 0).astype(np.int64),
        parent=parent,
        lexical_type=lexical,
        relation=relation,
        function=col("function", -1).astype(np.int64),
        file=col("file", -1).astype(np.int64),
        line=col("line", 0).astype(np.int64),
        module=col("module", -1).astype(np.int64),
        offset=col("offset", 0, np.uint64).astype(np.uint64),
        names=tuple(names),
        functions=functions,
        files=tuple(shown_name(f.path) for f in meta.files),
        modules=tuple(shown_name(m.path) for m in meta.modules),
    )


def metrics_from_metadb(meta: metadb.MetaDB) -> tuple[MetricInfo, ...]:
    scope_names = [s.name for s in meta.scopes]
    return tuple(
        MetricInfo(
            m.name,
            tuple((scope_names[i.scope], i.prop_metric_id) for i in m.scope_insts),
            tuple(
                SummaryStat(
                    scope_names[s.scope],
                    s.formula,
                    _combine_label(s.combine),
                    s.stat_metric_id,
                )
                for s in m.summaries
            ),
        )
        for m in meta.metrics
    )


@dataclass
class DatabaseValues:
    """:class:`~pyhpctk.present.model.ValueSource` over a lazily read profile.db and cct.db."""

    profiles: profiledb.ProfileDB
    contexts: cctdb.CctDB
    _expanded: dict[int, npt.NDArray[np.uint32]] = field(default_factory=dict)

    @property
    def n_contexts(self) -> int:
        return self.contexts.n_contexts

    def _column(self, profile: int, metric_id: int) -> FloatArray:
        out = np.zeros(self.n_contexts)
        block = self.profiles.block(profile)
        if block.n_values == 0:
            return out
        if profile not in self._expanded:
            self._expanded[profile] = block.value_ctx_ids()
        ctx = self._expanded[profile]
        chosen = block.values["metric_id"] == metric_id
        ids = ctx[chosen].astype(np.int64)
        if len(ids) and int(ids.max()) >= len(out):
            out = np.concatenate([out, np.zeros(int(ids.max()) + 1 - len(out))])
        out[ids] = block.values["value"][chosen]
        return out

    def summary_column(self, stat_id: int) -> FloatArray:
        return self._column(0, stat_id)

    def profile_column(self, profile: int, prop_id: int) -> FloatArray:
        return self._column(profile, prop_id)

    def context_profiles(
        self, ctx_id: int, prop_id: int
    ) -> tuple[npt.NDArray[np.int64], FloatArray]:
        if ctx_id >= self.n_contexts:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        pairs = self.contexts.context(ctx_id).metric(prop_id)
        return pairs["prof_index"].astype(np.int64), pairs["value"].astype(np.float64)


def profile_list(profiles: profiledb.ProfileDB, id_names: Sequence[str]) -> ProfileList:
    """The non-summary profiles of a profile.db, each made when asked for (issue #19: a
    database of 100,000 profiles opens without 100,000 objects)."""
    table = profiles.profiles
    names = [shown_name(name) for name in id_names]

    def identify(index: int) -> tuple[tuple[str, int], ...]:
        return tuple(
            (names[e.kind] if e.kind < len(names) else f"kind{e.kind}", e.logical_id)
            for e in (table[index].id_tuple or ())
        )

    def gpu() -> npt.NDArray[np.bool_]:
        kinds = [k for k, name in enumerate(names) if name in GPU_ID_NAMES]
        if isinstance(table, profiledb.ProfileTable):
            return table.has_kind(kinds)
        return np.array(
            [any(e.kind in kinds for e in (p.id_tuple or ())) for p in table], dtype=bool
        )

    return ProfileList(np.arange(1, len(table), dtype=np.int64), identify, gpu)


def damaged_trace_error(error: FormatError) -> Exception:
    """What a view that needs the trace raises when trace.db is damaged.

    A :class:`~pyhpctk.present.traces.NoTraceError`, so the HTML report leaves its timeline
    out as for a database without traces, and pyview's trace options fail with this message.
    """
    from pyhpctk.present.traces import NoTraceError

    return NoTraceError(
        f"{error}: trace.db is damaged, so the views that need the trace (--trace-summary, "
        "--blame, --trace-export) cannot be shown; the profile views do not need it"
    )


@dataclass
class DatabaseTraces:
    """:class:`~pyhpctk.present.model.TraceSource` over a lazily read trace.db.

    A line that turns out damaged when first read, or that names no thread profile of
    profile.db (``n_profiles`` profiles, the summary first), fails every view that needs the
    trace with :func:`damaged_trace_error`; the other views never read it.
    """

    db: tracedb.TraceDB
    n_profiles: int
    path: Path
    _lines: list[Timeline] | None = None

    def lines(self) -> Sequence[Timeline]:
        if self._lines is None:
            lines = []
            try:
                for i, line in enumerate(self.db.lines):
                    if not 1 <= line.prof_index < self.n_profiles:
                        raise FormatError(
                            self.path,
                            f"trace line {i}",
                            f"profile index {line.prof_index} is not a thread profile of "
                            f"profile.db ({self.n_profiles} profiles)",
                        )
                    lines.append(
                        Timeline(
                            line.prof_index,
                            np.asarray(line.elements["timestamp"], dtype=np.uint64),
                            np.asarray(line.elements["ctx_id"], dtype=np.uint32),
                        )
                    )
            except FormatError as error:
                raise damaged_trace_error(error) from None
            self._lines = lines
        return self._lines


@dataclass(frozen=True, slots=True)
class DamagedTraces:
    """:class:`~pyhpctk.present.model.TraceSource` for a trace.db whose headers cannot be read."""

    error: FormatError

    def lines(self) -> Sequence[Timeline]:
        raise damaged_trace_error(self.error)


def database_dir(path: str | os.PathLike[str]) -> Path:
    """The database directory ``path`` names (a directory, or a file inside one)."""
    p = Path(path)
    if not p.exists():
        raise FormatError(p, "database", "no such file or directory")
    if p.is_file():
        if p.name in (*REQUIRED, "trace.db"):
            p = p.parent
        else:
            advice = misplaced_input(p)
            if advice is not None:  # another tool's input: say which tool reads it
                raise UsageError(f"{p}: not a database: {advice}")
            raise FormatError(p, "database", "not a database: expected a directory with meta.db")
    elif not p.is_dir():  # a FIFO, a device, a socket: never opened
        raise FormatError(p, "database", "not a database: not a directory nor a file in one")
    if not (p / "meta.db").is_file():
        advice = misplaced_input(p)
        if advice is not None:
            raise UsageError(f"{p}: {advice}")
        raise FormatError(p, "database", "not a database: no meta.db in this directory")
    missing = [name for name in REQUIRED if not (p / name).is_file()]
    if missing:
        raise FormatError(p, "database", f"incomplete database: {', '.join(missing)} missing")
    return p


def open_experiment(path: str | os.PathLike[str]) -> Experiment:
    """Open a database directory lazily (memory maps) as an :class:`Experiment`."""
    d = database_dir(path)
    meta = metadb.read(d / "meta.db")
    profiles = profiledb.read(d / "profile.db")
    contexts = cctdb.read(d / "cct.db")
    if not len(profiles.profiles) or not profiles.profiles[0].is_summary:
        raise FormatError(d / "profile.db", "ProfileInfos", "profile 0 is not the summary profile")
    traces: DatabaseTraces | DamagedTraces | None = None
    if (d / "trace.db").is_file():
        try:
            trace_db = tracedb.read(d / "trace.db")
            traces = DatabaseTraces(trace_db, len(profiles.profiles), d / "trace.db")
        except FormatError as error:  # the profile views do not need the trace: say so, go on
            traces = DamagedTraces(error)
            warnings.warn(
                f"{error}: trace.db is damaged: the profile views are shown without it, the "
                "views of the trace cannot be",
                FormatWarning,
                stacklevel=2,
            )
    taxonomy = d / "metrics" / "default.yaml"
    return Experiment(
        path=str(d),
        title=shown_name(meta.title),
        tree=tree_from_metadb(meta),
        metrics=metrics_from_metadb(meta),
        profiles=profile_list(profiles, meta.id_names),
        values=DatabaseValues(profiles, contexts),
        traces=traces,
        taxonomy_text=read_taxonomy(taxonomy),
        thread_names=read_thread_names(d),
    )


def read_taxonomy(path: Path) -> str | None:
    """The text of ``metrics/default.yaml``, None without one. pyprof writes a metric's name
    with the bytes it was measured with, so bytes that are not UTF-8 are surrogate escapes, as
    in every name (docs/formats.md); one the taxonomy cannot use is the parser's to report."""
    if not path.is_file():
        return None
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as error:
        raise FormatError(path, "file", error.strerror or str(error)) from None


def read_thread_names(d: Path) -> dict[int, ThreadName]:
    """``threads.txt`` by profile index; {} without one. A damaged one is a warning: the views
    then name profiles by identifier, as for a database without names."""
    path = d / threads.DATABASE_FILE
    if not path.is_file():
        return {}
    try:
        names = threads.read(path)
    except FormatError as error:
        warnings.warn(
            f"{error}: the thread names are damaged; profiles are named by identifier",
            FormatWarning,
            stacklevel=3,
        )
        return {}
    return {
        index: ThreadName(shown_name(entry.name), entry.pid, shown_name(entry.program))
        for index, entry in names.by_profile().items()
    }
