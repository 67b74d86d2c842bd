"""What ties the files of one directory together: the cross-file half of ``pyhpctk verify``.

Each format module's ``verify`` checks a file alone; this module checks every id one file takes
from another file's table, and the values whose meaning only another file gives:

- a measurement directory (formats.md §0.1, §1.10, §2): a trace names only nodes of its sibling
  ``.hpcrun`` and its times lie in that profile's ``trace-min-time``..``trace-max-time``; a
  profile's ``logical/`` load module exists and every Python frame names a function (fid) of it;
  a ``threads/`` file names only profiles of the directory, with their process id;
- a database (formats.md §3.2-§3.5): every context id of ``profile.db``, ``meta.db`` and
  ``trace.db`` is below ``cct.db``'s context count; ``trace.db`` names only contexts of
  ``meta.db``; every metric id of a thread profile and of ``cct.db`` is a propMetricId of
  ``meta.db`` and every metric id of a summary profile a statMetricId; every profile index of
  ``cct.db`` and ``trace.db`` is a thread profile of ``profile.db`` (a trace.db line at most one
  per profile); every id-tuple kind has a name in ``meta.db``; no time is negative;
  ``cct.db`` is exactly the transpose of ``profile.db``'s thread profiles; and ``threads.txt``
  names only thread profiles of ``profile.db`` (not GPU streams).

Problems are strings ``PATH: PROBLEM``; nothing is raised for bad data. This module reads no file
itself (it is given what the format modules read) and never writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats import (
    cctdb,
    cctdb_check,
    hpctrace,
    metadb,
    profiledb,
    summarycheck,
    threads,
    tracedb,
)
from pyhpctk.formats.hpcrun_constants import UNKNOWN_FID
from pyhpctk.formats.hpcrun_model import HpcrunProfile, HpctraceFile, is_time_metric
from pyhpctk.formats.logical import LogicalMetadata
from pyhpctk.formats.vocabulary import GPU_ID_NAMES

Read = Mapping[Path, tuple[str, object]]
"""What a directory's files were read as: path -> (format name, model)."""

DATABASE_FILES = ("meta.db", "profile.db", "cct.db", "trace.db", threads.DATABASE_FILE)
# formats.md §3.2: summary partials whose values cannot be negative when the measured ones are not
# (the identity, the square, the count), whatever the combine (sum, min, max).
NON_NEGATIVE_PARTIALS = frozenset({"$$", "$$^2", "1"})
_SHOWN = 10  # ids named in one message before "..."


def _ids(values: npt.NDArray[np.generic]) -> str:
    unique = np.unique(values)
    shown = ", ".join(str(int(v)) for v in unique[:_SHOWN])
    return shown + (f" ... ({len(unique)} in all)" if len(unique) > _SHOWN else "")


# --------------------------------------------------------------------------------------------
# Measurement directories


def measurement_problems(read: Read) -> list[str]:
    """Problems between the files of one measurement directory (see the module docstring)."""
    problems: list[str] = []
    logical = {path: obj for path, (name, obj) in read.items() if isinstance(obj, LogicalMetadata)}
    for file, (_, profile) in read.items():
        if isinstance(profile, HpcrunProfile):
            problems.extend(f"{file}: {p}" for p in _logical_problems(file, profile, logical))
    for file, (_, trace) in read.items():
        if not isinstance(trace, HpctraceFile):
            continue
        sibling = read.get(file.with_suffix(".hpcrun"))
        if sibling is None or not isinstance(sibling[1], HpcrunProfile):
            problems.append(f"{file}: trace without a readable sibling .hpcrun profile")
            continue
        problems.extend(f"{file}: {p}" for p in hpctrace.verify_trace(trace, sibling[1]))
    for file, (_, names) in read.items():
        if isinstance(names, threads.ThreadNamesFile):
            problems.extend(f"{file}: {p}" for p in _names_problems(file, names, read))
    return problems


def _names_problems(file: Path, names: threads.ThreadNamesFile, read: Read) -> list[str]:
    """A ``threads/`` file's keys are the stems of profiles beside it (``MEAS/threads/`` ->
    ``MEAS/STEM.hpcrun``), each of the process the entry says."""
    if names.keyed_by != threads.BY_FILE:
        return [f"keyed {names.keyed_by}: a measurement directory's names are keyed by file"]
    problems = []
    for entry in names.entries:
        found = read.get(file.parent.parent / (entry.key + ".hpcrun"))
        if found is None or not isinstance(found[1], HpcrunProfile):
            problems.append(f"{entry.key!r}: no readable profile {entry.key}.hpcrun")
        elif found[1].header("process-id") != str(entry.pid):
            problems.append(
                f"{entry.key!r}: process id {entry.pid}, the profile's is "
                f"{found[1].header('process-id')}"
            )
    return problems


def _logical_problems(
    file: Path, profile: HpcrunProfile, logical: Mapping[Path, LogicalMetadata]
) -> list[str]:
    """A profile's ``logical/`` load modules (paths relative to the directory, formats.md
    §1.10) must exist, and each Python frame ``(lm, fid << 32 | line)`` must name a fid of its
    module's file (fid 0 stands for an unknown function)."""
    problems = []
    lm_ids = np.asarray(profile.cct["lm_id"], dtype=np.uint16)
    for module in profile.load_modules:
        rel = str(module.path)
        if not rel.startswith("logical/"):
            continue
        path = file.parent / rel
        if not path.is_file():
            problems.append(f"load module {rel} is missing")
            continue
        metadata = logical.get(path)
        if metadata is None:
            continue  # unreadable: reported as such
        mine = lm_ids == module.id
        fids = np.asarray(profile.cct["lm_ip"], dtype=np.uint64)[mine] >> np.uint64(32)
        known = np.array([UNKNOWN_FID, *metadata.by_fid()], dtype=np.uint64)
        unknown = ~np.isin(fids, known)
        if unknown.any():
            node_ids = np.asarray(profile.cct["id"], dtype=np.uint32)[mine][unknown]
            problems.append(
                f"cct: nodes {_ids(node_ids)} name Python functions (fids "
                f"{_ids(fids[unknown])}) that {rel} does not list"
            )
    return problems


# --------------------------------------------------------------------------------------------
# Databases


def database_problems(root: Path, read: Read) -> list[str]:
    """Problems between the files of one database directory (see the module docstring)."""
    missing = [n for n in DATABASE_FILES[:3] if not (root / n).is_file()]
    problems = [f"{root}: missing {n}" for n in missing]
    parts = {name: obj for name, obj in read.values()}
    meta, profiles = parts.get("metadb"), parts.get("profiledb")
    contexts, traces = parts.get("cctdb"), parts.get("tracedb")
    names = parts.get("threads")
    meta = meta if isinstance(meta, metadb.MetaDB) else None
    profiles = profiles if isinstance(profiles, profiledb.ProfileDB) else None
    contexts = contexts if isinstance(contexts, cctdb.CctDB) else None
    traces = traces if isinstance(traces, tracedb.TraceDB) else None

    def add(name: str, found: list[str]) -> None:
        problems.extend(f"{root / name}: {p}" for p in found)

    n_contexts = contexts.n_contexts if contexts is not None else None
    if meta is not None:
        add("meta.db", _meta_problems(meta, n_contexts))
    if profiles is not None:
        add("profile.db", _profile_problems(profiles, meta, n_contexts))
    if contexts is not None:
        add("cct.db", _cct_problems(contexts, meta, profiles))
    if profiles is not None and meta is not None:
        add("profile.db", summarycheck.summary_problems(profiles, meta))
    if profiles is not None and contexts is not None:
        add("cct.db", cctdb_check.verify_against_profiles(contexts, profiles))
    if traces is not None:
        add("trace.db", _trace_problems(traces, meta, profiles, n_contexts))
    if isinstance(names, threads.ThreadNamesFile) and profiles is not None:
        add(threads.DATABASE_FILE, _profile_names_problems(names, profiles, meta))
    return problems


def _profile_names_problems(
    names: threads.ThreadNamesFile, profiles: profiledb.ProfileDB, meta: metadb.MetaDB | None
) -> list[str]:
    """``threads.txt`` is keyed by the profile.db index of a thread profile."""
    if names.keyed_by != threads.BY_PROFILE:
        return [f"keyed {names.keyed_by}: a database's names are keyed by profile"]
    n = len(profiles.profiles)
    gpu_kinds = set()
    if meta is not None:
        gpu_kinds = {i for i, name in enumerate(meta.id_names) if name in GPU_ID_NAMES}
    problems = []
    for index in names.by_profile():
        if not 1 <= index < n:
            problems.append(f"profile {index}: not a thread profile of profile.db (1..{n - 1})")
        elif any(e.kind in gpu_kinds for e in profiles.profiles[index].id_tuple or ()):
            problems.append(f"profile {index}: a GPU stream, not a thread")
    return problems


def _meta_problems(meta: metadb.MetaDB, n_contexts: int | None) -> list[str]:
    """formats.md §3.4: cct.db's nCtxs is the largest ctxId + 1, so every context is below it."""
    if n_contexts is None:
        return []
    ids = meta.index().table["ctx_id"]
    past = ids[ids.astype(np.int64) >= n_contexts]
    if not len(past):
        return []
    return [f"contexts {_ids(past)} are past cct.db's context count {n_contexts}"]


def _metric_tables(
    meta: metadb.MetaDB,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Over all u16 metric ids: (is a propMetricId, is a statMetricId, cannot be negative)."""
    prop, stat, time = (np.zeros(1 << 16, dtype=bool) for _ in range(3))
    for m in meta.metrics:
        timed = is_time_metric(m.name)
        for si in m.scope_insts:
            prop[si.prop_metric_id & 0xFFFF] = True
            time[si.prop_metric_id & 0xFFFF] |= timed
    # prop and stat ids are separate namespaces (formats.md §3.2): their own table each.
    stat_time = np.zeros(1 << 16, dtype=bool)
    for m in meta.metrics:
        timed = is_time_metric(m.name)
        for ss in m.summaries:
            stat[ss.stat_metric_id & 0xFFFF] = True
            stat_time[ss.stat_metric_id & 0xFFFF] |= timed and ss.formula in NON_NEGATIVE_PARTIALS
    return prop, stat, np.stack([time, stat_time])


def _value_problems(
    where: str,
    metric_ids: npt.NDArray[np.generic],
    values: npt.NDArray[np.float64],
    known: npt.NDArray[np.bool_] | None,
    timed: npt.NDArray[np.bool_] | None,
    namespace: str,
) -> list[str]:
    """Metric ids missing from ``known`` and negative values of ``timed`` metrics."""
    problems = []
    ids = np.asarray(metric_ids, dtype=np.int64)
    if known is not None:
        unknown = ids[~known[ids]]
        if len(unknown):
            problems.append(f"{where}: metric ids {_ids(unknown)} are not {namespace}s of meta.db")
    if timed is not None:
        with np.errstate(invalid="ignore"):
            negative = timed[ids] & (values < 0)
        if negative.any():
            problems.append(
                f"{where}: {int(negative.sum())} negative times (metric ids "
                f"{_ids(ids[negative])}, first {float(values[negative][0])!r})"
            )
    return problems


def _profile_problems(
    profiles: profiledb.ProfileDB, meta: metadb.MetaDB | None, n_contexts: int | None
) -> list[str]:
    problems: list[str] = []
    tables = _metric_tables(meta) if meta is not None else None
    n_kinds = len(meta.id_names) if meta is not None else None
    for i, info in enumerate(profiles.profiles):
        if n_kinds is not None and info.id_tuple is not None:
            kinds = sorted({e.kind for e in info.id_tuple if e.kind >= n_kinds})
            if kinds:
                problems.append(
                    f"profile {i}: id tuple kinds {kinds} have no name in meta.db "
                    f"({n_kinds} id names)"
                )
        try:
            block = profiles.values[i]
        except FormatError:
            continue  # reported by profiledb.verify
        ctx = block.ctx_ids()
        if n_contexts is not None and len(ctx) and int(ctx.max()) >= n_contexts:
            past = ctx[ctx.astype(np.int64) >= n_contexts]
            problems.append(
                f"profile {i}: contexts {_ids(past)} are past cct.db's context count {n_contexts}"
            )
        if tables is not None:
            prop, stat, timed = tables
            summary = info.is_summary
            problems.extend(
                _value_problems(
                    f"profile {i}",
                    block.values["metric_id"],
                    np.asarray(block.values["value"], dtype=np.float64),
                    stat if summary else prop,
                    timed[1] if summary else timed[0],
                    "statMetricId" if summary else "propMetricId",
                )
            )
    return problems


def _cct_problems(
    contexts: cctdb.CctDB, meta: metadb.MetaDB | None, profiles: profiledb.ProfileDB | None
) -> list[str]:
    """cct.db holds only propMetricIds and the values of thread profiles (formats.md §3.4)."""
    problems: list[str] = []
    tables = _metric_tables(meta) if meta is not None else None
    thread = None
    if profiles is not None:
        thread = np.array([not p.is_summary for p in profiles.profiles], dtype=bool)
    nv, nm = contexts.value_counts()
    for c in np.flatnonzero(nv | nm).tolist():
        try:
            block = contexts.values[c]
        except FormatError:
            continue  # reported by cctdb.verify
        prof = np.asarray(block.values["prof_index"], dtype=np.int64)
        if thread is not None:
            inside = prof < len(thread)
            is_thread = np.zeros(len(prof), dtype=bool)
            is_thread[inside] = thread[prof[inside]]
            bad = prof[~is_thread]
            if len(bad):
                problems.append(
                    f"context {c}: profile indices {_ids(bad)} are not thread profiles of "
                    f"profile.db ({len(thread)} profiles)"
                )
        if tables is not None:
            prop, _, timed = tables
            problems.extend(
                _value_problems(
                    f"context {c}",
                    block.value_metric_ids(),
                    np.asarray(block.values["value"], dtype=np.float64),
                    None,
                    timed[0],
                    "propMetricId",
                )
            )
            ids = np.asarray(block.metric_ids(), dtype=np.int64)
            if len(ids) and not prop[ids].all():
                problems.append(
                    f"context {c}: metric ids {_ids(ids[~prop[ids]])} are not propMetricIds "
                    "of meta.db"
                )
        if len(problems) >= 2 * _SHOWN:
            problems.append("... (further contexts not checked)")
            break
    return problems


def _trace_problems(
    traces: tracedb.TraceDB,
    meta: metadb.MetaDB | None,
    profiles: profiledb.ProfileDB | None,
    n_contexts: int | None,
) -> list[str]:
    """Each line belongs to one thread profile; its contexts are meta.db's (formats.md §3.5)."""
    problems: list[str] = []
    prof = traces.prof_indices()
    if profiles is not None:
        thread = np.array([not p.is_summary for p in profiles.profiles], dtype=bool)
        for i, p in enumerate(prof.tolist()):
            if not (0 <= p < len(thread) and thread[p]):
                problems.append(
                    f"line {i}: profile index {p} is not a thread profile of profile.db "
                    f"({len(thread)} profiles)"
                )
    if meta is not None:
        problems.extend(tracedb.verify_contexts(traces, meta.index().table["ctx_id"]))
    elif n_contexts is not None:
        problems.extend(tracedb.verify_contexts(traces, np.arange(n_contexts)))
    return problems
