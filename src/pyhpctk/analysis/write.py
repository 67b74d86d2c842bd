"""Write an :class:`~.database.AggregateDatabase` as a database directory.

The bytes belong to the format modules (:mod:`pyhpctk.formats.metadb`, ``profiledb``, ``cctdb``,
``tracedb``); this module only builds their models from the aggregate: meta.db's tables and
context tree (elided instruction contexts spliced out, formats.md §3.7), profile.db's blocks
(summary first in index order, written last in the file as hpcprof does), cct.db as the exact
transpose of the non-summary profiles, trace.db when any profile had a trace, plus
``metrics/default.yaml`` and copies of the source files something vouches for (``src/``,
:mod:`.sources`).

The directory is assembled under a temporary name next to the destination and renamed into place
at the end (:mod:`pyhpctk.formats.output`), so an interrupted run or a full disk never leaves a
half-written database under the real name, and an existing database is replaced only when asked
(``force``). No name read from a measurement chooses where anything is written: source copies
land inside ``src/`` whatever their names hold (:func:`.sources.copy_sources`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pyhpctk.analysis.context import ENTRY_POINT_NAMES, ContextKey, FunctionKey, Relation
from pyhpctk.analysis.database import AggregateDatabase
from pyhpctk.analysis.sources import Warrants, copy_sources
from pyhpctk.analysis.taxonomy import EXTRA_ROOTS, default_yaml
from pyhpctk.core.metrics import N_SCOPES, prop_id, stat_id
from pyhpctk.formats import cctdb, metadb, profiledb, tracedb
from pyhpctk.formats import output as output_files
from pyhpctk.formats.output import OutputError, already_exists

DATABASE_FILES = ("meta.db", "profile.db", "cct.db")


def build_metadb(db: AggregateDatabase) -> metadb.MetaDB:
    """The meta.db model of an aggregate database."""
    modules = db.modules()
    files = db.files()
    functions = db.functions()
    module_index = {path: i for i, path in enumerate(modules)}
    file_index = {path: i for i, path in enumerate(files)}
    function_index = {f: i for i, f in enumerate(functions)}

    metrics = []
    for metric in db.stored_metrics:
        base = db.bases[metric.name]
        metrics.append(
            metadb.Metric(
                name=metric.name,
                scope_insts=tuple(
                    metadb.ScopeInstance(scope=s, prop_metric_id=prop_id(base, s))
                    for s in range(N_SCOPES)
                ),
                summaries=tuple(
                    metadb.SummaryStatistic(
                        scope=s,
                        formula=partial.formula,
                        combine=int(partial.combine),
                        stat_metric_id=stat_id(base, p, s),
                    )
                    for p, partial in enumerate(db.partials)
                    for s in range(N_SCOPES)
                ),
            )
        )

    tree = db.tree
    nodes: dict[int, metadb.Context | metadb.Entry] = {}
    entry_points: list[metadb.Entry] = []
    visible = tree.visible_ancestor()
    for ident in range(1, len(tree)):
        key = tree.keys[ident]
        if key.is_elided:
            holder = nodes.get(int(visible[ident]))
            if isinstance(holder, metadb.Context) and not holder.children:
                holder.elided_children = True
            continue
        if key.entry_point is not None:
            entry = metadb.Entry(
                ctx_id=ident,
                kind=int(key.entry_point),
                pretty_name=ENTRY_POINT_NAMES[key.entry_point],
            )
            nodes[ident] = entry
            entry_points.append(entry)
            continue
        context = _context(ident, key, module_index, file_index, function_index)
        nodes[ident] = context
        parent = nodes.get(int(visible[tree.parent[ident]]))
        if parent is None:
            raise OutputError(f"context {ident} has no entry point above it")
        parent.children.append(context)
        if isinstance(parent, metadb.Context):
            parent.elided_children = False

    return metadb.MetaDB(
        title=db.title,
        scopes=list(metadb.STANDARD_SCOPES),
        metrics=metrics,
        modules=[metadb.Module(path) for path in modules],
        files=[metadb.SourceFile(path, copied=path in db.copied_files) for path in files],
        functions=[
            metadb.Function(
                name=f.name,
                module=module_index[f.module] if f.module is not None else None,
                offset=f.offset,
                file=file_index[f.file] if f.file is not None else None,
                line=f.line,
            )
            for f in functions
        ],
        entry_points=entry_points,
    )


def _context(
    ident: int,
    key: ContextKey,
    module_index: dict[str, int],
    file_index: dict[str, int],
    function_index: dict[FunctionKey, int],
) -> metadb.Context:
    return metadb.Context(
        ctx_id=ident,
        relation=int(key.relation),
        lexical_type=int(key.lexical_type),
        function=function_index[key.function] if key.function is not None else None,
        file=file_index[key.file] if key.file is not None else None,
        line=key.line if key.file is not None else 0,
        module=module_index[key.module] if key.module is not None else None,
        offset=key.offset if key.module is not None else 0,
        propagation=metadb.PROPAGATION_FUNCTION_BIT if key.relation is Relation.LEXICAL else 0,
    )


def build_profiledb(db: AggregateDatabase) -> profiledb.ProfileDB:
    """profile.db: the summary (index 0) then one profile per input, in input order."""
    infos = [profiledb.ProfileInfo(is_summary=True, id_tuple=None)]
    blocks = [
        profiledb.ProfileValues.from_triples(db.summary.ctx, db.summary.metric, db.summary.value)
    ]
    for profile in db.profiles:
        infos.append(
            profiledb.ProfileInfo(
                is_summary=False,
                id_tuple=tuple(
                    profiledb.IdTupleElement(e.kind, e.is_physical, e.logical, e.physical)
                    for e in profile.id_tuple
                ),
            )
        )
        values = profile.values
        blocks.append(profiledb.ProfileValues.from_triples(values.ctx, values.metric, values.value))
    return profiledb.ProfileDB(infos, blocks)


def build_tracedb(db: AggregateDatabase) -> tracedb.TraceDB | None:
    """trace.db, or None when no profile had a trace (formats.md §0.2)."""
    if all(p.trace is None for p in db.profiles):
        return None
    lines = []
    for index, profile in enumerate(db.profiles, start=1):
        if profile.trace is None:
            lines.append(tracedb.TraceLine.from_arrays(index, [], []))
        else:
            lines.append(
                tracedb.TraceLine.from_arrays(index, profile.trace.time, profile.trace.ctx)
            )
    low, high = db.trace_range if db.trace_range is not None else (0, 0)
    return tracedb.TraceDB(lines, low, high)


def prepare_output(output: Path, force: bool) -> None:
    """Refuse to overwrite an existing directory unless ``force`` (and then only a database)."""
    if not os.path.lexists(output):
        if not output.parent.exists():
            raise OutputError(f"{output}: parent directory {output.parent} does not exist")
        if not output.parent.is_dir():
            raise OutputError(f"{output}: {output.parent} is not a directory")
        return
    if not force:
        raise already_exists(output, "-o")
    if output.is_symlink():
        raise OutputError(f"{output}: is a symbolic link; not replacing it (give its target as -o)")
    if not output.is_dir():
        raise OutputError(f"{output}: exists and is not a directory; refusing to replace it")
    entries = set(os.listdir(output))
    if entries and "meta.db" not in entries:
        raise OutputError(
            f"{output}: exists and does not look like a database (no meta.db); not replacing it"
        )


def make_staging(output: Path) -> Path:
    """A new empty directory beside ``output`` to assemble the database in."""
    return output_files.make_staging(output, "the database")


def write_database(
    db: AggregateDatabase,
    output: Path,
    force: bool = False,
    copy: bool = True,
    derived: bool = False,
    warrants: Warrants | None = None,
) -> None:
    """Write the whole database directory ``output`` (atomically replaced); ``warrants``: what
    vouches for copying each source file (none: no file is copied, :mod:`.sources`).

    On any error, a full disk included, the staging directory is removed and ``output`` is as it
    was (absent, or the old database); an ``OSError`` becomes :class:`OutputError`.
    """
    prepare_output(output, force)
    replacing = os.path.lexists(output)
    staging = make_staging(output)
    try:
        if copy:
            copied, _ = copy_sources(db.files(), staging, warrants or Warrants())
            db.copied_files |= copied
        metadb.write(build_metadb(db), staging / "meta.db")
        profiles = build_profiledb(db)
        profiledb.write(profiles, staging / "profile.db")
        cctdb.write(cctdb.transpose(profiles, n_contexts=len(db.tree)), staging / "cct.db")
        traces = build_tracedb(db)
        if traces is not None:
            tracedb.write(traces, staging / "trace.db")
        write_taxonomy(
            staging,
            default_yaml(db.metrics, db.formulas, db.partials, EXTRA_ROOTS if derived else ()),
        )
        output_files.commit_directory(staging, output)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise database_error(output, error, replacing) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_taxonomy(directory: Path, text: str) -> None:
    """``metrics/default.yaml`` (names from measurements keep their bytes: surrogateescape)."""
    (directory / "metrics").mkdir()
    with open(
        directory / "metrics" / "default.yaml", "w", encoding="utf-8", errors="surrogateescape"
    ) as stream:
        stream.write(text)


def database_error(output: Path, error: OSError, replacing: bool) -> OutputError:
    """The one-line error for an ``OSError`` met while assembling the database ``output``."""
    kept = "the existing database is unchanged" if replacing else "nothing was left under that name"
    return output_files.write_error(output, error, kept)


__all__ = [
    "DATABASE_FILES",
    "OutputError",
    "build_metadb",
    "build_profiledb",
    "build_tracedb",
    "database_error",
    "make_staging",
    "prepare_output",
    "write_database",
    "write_taxonomy",
]
