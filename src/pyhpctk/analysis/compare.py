"""Compare two databases by meaning, not by bytes: context paths, metrics, values, traces.

Two databases of the same measurements (pyprof's and hpcprof's, or pyprof's under two ``-j``)
number their contexts, metrics and profiles differently. :func:`compare` matches

* contexts by their *path*: the labels (relation, lexical type, function, file, line, module,
  offset) from the entry point down; siblings that print the same are merged (values summed);
* metrics by (name, scope), and summary statistics by (name, scope, formula, combine);
* profiles by identifier tuple (the summary by being the summary);
* contexts that carry values but are absent from meta.db (elided instruction contexts, formats.md
  §3.7) as a multiset of value rows per profile, since nothing in the files places them;
* traces record by record (same times, same context paths).

Values agree when their relative difference is at most ``rel_tol`` (1e-9 by default).
:func:`view_of_aggregate` and :func:`read_view` build the :class:`DatabaseView` both sides are
reduced to; :func:`compare_dirs` compares two database directories.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.context import ENTRY_POINT_NAMES, EntryPoint
from pyhpctk.analysis.database import AggregateDatabase
from pyhpctk.core.metrics import SCOPE_NAMES, prop_id, stat_id

Label = tuple[Hashable, ...]
Path_ = tuple[Label, ...]


@dataclass(slots=True)
class ProfileView:
    """One profile's values (``id_tuple`` None for the summary)."""

    id_tuple: tuple[tuple[int, bool, int, int], ...] | None
    ctx: npt.NDArray[np.int64]
    metric: npt.NDArray[np.int64]
    value: npt.NDArray[np.float64]


@dataclass(slots=True)
class DatabaseView:
    """What :func:`compare` needs of a database, with the database's own ids."""

    title: str
    contexts: dict[int, tuple[int, Label]]
    metric_names: dict[int, tuple[str, str]]
    stat_names: dict[int, tuple[str, str, str, int]]
    profiles: list[ProfileView]
    traces: dict[int, tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]] = field(
        default_factory=dict
    )
    trace_range: tuple[int, int] | None = None
    modules: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    functions: list[tuple[Hashable, ...]] = field(default_factory=list)

    def paths(self) -> dict[int, Path_]:
        """Every visible context's path (root: the empty path)."""
        cache: dict[int, Path_] = {0: ()}

        def path(ident: int) -> Path_:
            found = cache.get(ident)
            if found is not None:
                return found
            chain = []
            cursor = ident
            while cursor not in cache:
                parent, label = self.contexts[cursor]
                chain.append((cursor, label))
                cursor = parent
            result = cache[cursor]
            for node, label in reversed(chain):
                result = (*result, label)
                cache[node] = result
            return result

        for ident in self.contexts:
            path(ident)
        return cache


def entry_label(kind: int) -> Label:
    return ("entry", kind)


def context_label(
    relation: int,
    lexical_type: int,
    function: tuple[Hashable, ...] | None,
    file: str | None,
    line: int,
    module: str | None,
    offset: int,
) -> Label:
    return (
        relation,
        lexical_type,
        function,
        file,
        line if file is not None else 0,
        module,
        offset if module is not None else 0,
    )


def view_of_aggregate(db: AggregateDatabase) -> DatabaseView:
    """The view of a database still in memory (ids as the writer would write them)."""
    contexts: dict[int, tuple[int, Label]] = {}
    visible = db.tree.visible_ancestor()
    for ident in range(1, len(db.tree)):
        key = db.tree.keys[ident]
        if key.is_elided:
            continue
        parent = int(visible[db.tree.parent[ident]])
        if key.entry_point is not None:
            label = entry_label(int(key.entry_point))
        else:
            label = context_label(
                int(key.relation),
                int(key.lexical_type),
                key.function.describe() if key.function is not None else None,
                key.file,
                key.line,
                key.module,
                key.offset,
            )
        contexts[ident] = (parent, label)
    metric_names: dict[int, tuple[str, str]] = {}
    stat_names: dict[int, tuple[str, str, str, int]] = {}
    for metric in db.stored_metrics:
        base = db.bases[metric.name]
        for scope, scope_name in enumerate(SCOPE_NAMES):
            metric_names[prop_id(base, scope)] = (metric.name, scope_name)
            for p, partial in enumerate(db.partials):
                stat_names[stat_id(base, p, scope)] = (
                    metric.name,
                    scope_name,
                    partial.formula,
                    int(partial.combine),
                )
    profiles = [ProfileView(None, db.summary.ctx, db.summary.metric, db.summary.value)]
    traces = {}
    for index, profile in enumerate(db.profiles, start=1):
        profiles.append(
            ProfileView(
                tuple((e.kind, e.is_physical, e.logical, e.physical) for e in profile.id_tuple),
                profile.values.ctx,
                profile.values.metric,
                profile.values.value,
            )
        )
        if profile.trace is not None:
            traces[index] = (profile.trace.time, profile.trace.ctx)
    return DatabaseView(
        title=db.title,
        contexts=contexts,
        metric_names=metric_names,
        stat_names=stat_names,
        profiles=profiles,
        traces=traces,
        trace_range=db.trace_range,
        modules=db.modules(),
        files=db.files(),
        functions=[f.describe() for f in db.functions()],
    )


def _close(a: float, b: float, rel_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0) or a == b


def _describe(path: Path_) -> str:
    parts = []
    for label in path:
        if label[0] == "entry":
            parts.append(ENTRY_POINT_NAMES.get(EntryPoint(int(label[1])), "?"))  # type: ignore[call-overload]
            continue
        relation, lexical, function, file, line, module, offset = label
        text = f"-{['lexical', 'call', 'inlined'][int(relation)]}> "  # type: ignore[call-overload]
        text += f"[{['function', 'loop', 'line', 'instruction'][int(lexical)]}]"  # type: ignore[call-overload]
        if function is not None:
            text += f" {function[0]}"  # type: ignore[index]
        if file is not None:
            text += f" {os.path.basename(str(file))}:{line}"
        if module is not None:
            text += f" {os.path.basename(str(module))}+{int(offset):#x}"  # type: ignore[call-overload]
        parts.append(text)
    return " / ".join(parts) or "<root>"


def _profile_values(
    view: DatabaseView,
    profile: ProfileView,
    paths: dict[int, Path_],
    summary: bool,
) -> tuple[dict[tuple[Hashable, ...], float], list[dict[tuple[Hashable, ...], float]]]:
    """(values keyed by (path, metric key), hidden rows) of one profile."""
    names: dict[int, tuple[Hashable, ...]] = (
        dict(view.stat_names.items()) if summary else dict(view.metric_names.items())
    )
    keyed: dict[tuple[Hashable, ...], float] = {}
    hidden: dict[int, dict[tuple[Hashable, ...], float]] = {}
    for c, m, v in zip(
        profile.ctx.tolist(), profile.metric.tolist(), profile.value.tolist(), strict=True
    ):
        name = names.get(m, ("<unknown metric>", m))
        path = paths.get(c)
        if path is None:
            row = hidden.setdefault(c, {})
            row[name] = row.get(name, 0.0) + v
        else:
            key = (path, name)
            keyed[key] = keyed.get(key, 0.0) + v
    return keyed, list(hidden.values())


def _row_sort_key(row: dict[tuple[Hashable, ...], float]) -> tuple[object, ...]:
    items = sorted(row.items(), key=lambda kv: repr(kv[0]))
    return tuple((repr(k), float(f"{v:.6g}")) for k, v in items)


def compare(
    expected: DatabaseView, actual: DatabaseView, rel_tol: float = 1e-9, limit: int = 50
) -> list[str]:
    """Differences between two databases (empty when they mean the same)."""
    problems: list[str] = []

    def report(text: str) -> None:
        if len(problems) < limit:
            problems.append(text)

    if expected.title != actual.title:
        report(f"title: expected {expected.title!r}, got {actual.title!r}")
    for what, left, right in (
        ("modules", expected.modules, actual.modules),
        ("files", expected.files, actual.files),
    ):
        if set(left) != set(right):
            report(
                f"{what}: missing {sorted(set(left) - set(right))}, "
                f"unexpected {sorted(set(right) - set(left))}"
            )
    if Counter(map(repr, expected.functions)) != Counter(map(repr, actual.functions)):
        missing = Counter(map(repr, expected.functions)) - Counter(map(repr, actual.functions))
        extra = Counter(map(repr, actual.functions)) - Counter(map(repr, expected.functions))
        report(f"functions: missing {sorted(missing)}, unexpected {sorted(extra)}")
    if set(expected.metric_names.values()) != set(actual.metric_names.values()):
        want, got = set(expected.metric_names.values()), set(actual.metric_names.values())
        report(f"metrics: missing {sorted(want - got)[:10]}, unexpected {sorted(got - want)[:10]}")
    if set(expected.stat_names.values()) != set(actual.stat_names.values()):
        report("summary statistics differ")

    expected_paths = expected.paths()
    actual_paths = actual.paths()
    tree_left = Counter(expected_paths[i] for i in expected.contexts)
    tree_right = Counter(actual_paths[i] for i in actual.contexts)
    for path in sorted(set(tree_left) | set(tree_right), key=repr):
        if tree_left[path] != tree_right[path]:
            report(f"context {_describe(path)}: expected {tree_left[path]}, got {tree_right[path]}")

    def by_tuple(view: DatabaseView) -> dict[object, tuple[int, ProfileView]]:
        return {p.id_tuple: (i, p) for i, p in enumerate(view.profiles)}

    left_profiles, right_profiles = by_tuple(expected), by_tuple(actual)
    if set(left_profiles) != set(right_profiles):
        report(
            f"profiles: expected {sorted(map(str, left_profiles))}, "
            f"got {sorted(map(str, right_profiles))}"
        )
    for id_tuple, (left_index, left_profile) in left_profiles.items():
        if id_tuple not in right_profiles:
            continue
        right_index, right_profile = right_profiles[id_tuple]
        summary = id_tuple is None
        label = "summary" if summary else f"profile {id_tuple}"
        lv, lh = _profile_values(expected, left_profile, expected_paths, summary)
        rv, rh = _profile_values(actual, right_profile, actual_paths, summary)
        for key in sorted(set(lv) | set(rv), key=repr):
            a, b = lv.get(key, 0.0), rv.get(key, 0.0)
            if not _close(a, b, rel_tol):
                where = _describe(key[0])  # type: ignore[arg-type]
                report(f"{label}: {where} {key[1]}: expected {a!r}, got {b!r}")
        if len(lh) != len(rh):
            report(f"{label}: {len(lh)} elided contexts with values expected, got {len(rh)}")
        else:
            for a_row, b_row in zip(
                sorted(lh, key=_row_sort_key), sorted(rh, key=_row_sort_key), strict=True
            ):
                if set(a_row) != set(b_row) or not all(
                    _close(a_row[k], b_row[k], rel_tol) for k in a_row
                ):
                    report(f"{label}: elided context values differ: expected {a_row}, got {b_row}")
                    break
        left_trace = expected.traces.get(left_index)
        right_trace = actual.traces.get(right_index)
        if (left_trace is None or not len(left_trace[0])) != (
            right_trace is None or not len(right_trace[0])
        ):
            report(f"{label}: trace present on one side only")
        elif left_trace is not None and right_trace is not None:
            if len(left_trace[0]) != len(right_trace[0]) or np.any(left_trace[0] != right_trace[0]):
                report(
                    f"{label}: trace times differ ({len(left_trace[0])} vs "
                    f"{len(right_trace[0])} records)"
                )
            else:
                for n, (a_ctx, b_ctx) in enumerate(
                    zip(left_trace[1].tolist(), right_trace[1].tolist(), strict=True)
                ):
                    a_path = expected_paths.get(a_ctx)
                    b_path = actual_paths.get(b_ctx)
                    if a_path != b_path:
                        report(
                            f"{label}: trace record {n}: expected "
                            f"{_describe(a_path or ())}, got {_describe(b_path or ())}"
                        )
                        break
    if expected.trace_range != actual.trace_range:
        report(f"trace time range: expected {expected.trace_range}, got {actual.trace_range}")
    return problems


def read_view(directory: str | os.PathLike[str]) -> DatabaseView:
    """The view of a database directory on disk, read with the format modules."""
    from pyhpctk.formats import metadb, profiledb, tracedb

    root = os.fspath(directory)
    meta = metadb.read(os.path.join(root, "meta.db"))
    modules = [m.path for m in meta.modules]
    files = [f.path for f in meta.files]

    def function(index: int | None) -> tuple[Hashable, ...] | None:
        if index is None:
            return None
        f = meta.functions[index]
        return (
            f.name,
            modules[f.module] if f.module is not None else None,
            f.offset,
            files[f.file] if f.file is not None else None,
            f.line,
        )

    contexts: dict[int, tuple[int, Label]] = {}
    stack: list[tuple[int, metadb.Context]] = []
    for entry in meta.entry_points:
        contexts[entry.ctx_id] = (0, entry_label(int(entry.kind)))
        stack += [(entry.ctx_id, child) for child in entry.children]
    while stack:
        parent, ctx = stack.pop()
        contexts[ctx.ctx_id] = (
            parent,
            context_label(
                int(ctx.relation),
                int(ctx.lexical_type),
                function(ctx.function),
                files[ctx.file] if ctx.file is not None else None,
                ctx.line,
                modules[ctx.module] if ctx.module is not None else None,
                ctx.offset,
            ),
        )
        stack += [(ctx.ctx_id, child) for child in ctx.children]

    metric_names: dict[int, tuple[str, str]] = {}
    stat_names: dict[int, tuple[str, str, str, int]] = {}
    for metric in meta.metrics:
        for inst in metric.scope_insts:
            metric_names[inst.prop_metric_id] = (metric.name, meta.scopes[inst.scope].name)
        for stat in metric.summaries:
            stat_names[stat.stat_metric_id] = (
                metric.name,
                meta.scopes[stat.scope].name,
                stat.formula,
                int(stat.combine),
            )

    prof = profiledb.read(os.path.join(root, "profile.db"))
    profiles = []
    for info, block in zip(prof.profiles, prof.values, strict=True):
        id_tuple = (
            None
            if info.is_summary
            else tuple(
                (e.kind, bool(e.is_physical), e.logical_id, e.physical_id)
                for e in (info.id_tuple or ())
            )
        )
        profiles.append(
            ProfileView(
                id_tuple,
                block.value_ctx_ids().astype(np.int64),
                np.asarray(block.values["metric_id"], dtype=np.int64),
                np.asarray(block.values["value"], dtype=np.float64),
            )
        )
    traces: dict[int, tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]] = {}
    trace_range = None
    trace_path = os.path.join(root, "trace.db")
    if os.path.exists(trace_path):
        trace = tracedb.read(trace_path)
        trace_range = (trace.min_timestamp, trace.max_timestamp)
        for line in trace.lines:
            traces[line.prof_index] = (
                np.asarray(line.elements["timestamp"], dtype=np.uint64),
                np.asarray(line.elements["ctx_id"], dtype=np.int64),
            )
    return DatabaseView(
        title=meta.title,
        contexts=contexts,
        metric_names=metric_names,
        stat_names=stat_names,
        profiles=profiles,
        traces=traces,
        trace_range=trace_range,
        modules=modules,
        files=files,
        functions=[function(i) for i in range(len(meta.functions))],  # type: ignore[misc]
    )


def compare_taxonomies(expected: str, actual: str) -> list[str]:
    """Differences between two ``metrics/default.yaml`` texts.

    The ``roots`` part must be identical; the ``inputs`` are compared as a multiset of entries,
    since hpcprof lists them in hash order.
    """

    def parts(text: str) -> tuple[Counter[str], str]:
        head, _, roots = text.partition("roots:")
        return Counter(block.strip() for block in head.split("  - ")[1:]), roots

    (left_inputs, left_roots), (right_inputs, right_roots) = parts(expected), parts(actual)
    problems = []
    if left_inputs != right_inputs:
        missing = sorted(left_inputs - right_inputs)[:3]
        extra = sorted(right_inputs - left_inputs)[:3]
        problems.append(f"default.yaml inputs: missing {missing}, unexpected {extra}")
    if left_roots != right_roots:
        for n, (a, b) in enumerate(
            zip(left_roots.splitlines(), right_roots.splitlines(), strict=False)
        ):
            if a != b:
                problems.append(f"default.yaml roots, line {n + 1}: expected {a!r}, got {b!r}")
                break
        else:
            problems.append("default.yaml roots: different lengths")
    return problems


def compare_dirs(
    expected: str | os.PathLike[str], actual: str | os.PathLike[str], rel_tol: float = 1e-9
) -> list[str]:
    """Differences between two database directories (empty when they mean the same).

    Covers the four database files and, when both have one, ``metrics/default.yaml``.
    """
    problems = compare(read_view(expected), read_view(actual), rel_tol)
    if os.path.exists(os.path.join(actual, "trace.db")) != os.path.exists(
        os.path.join(expected, "trace.db")
    ):
        problems.append("trace.db present in only one database")
    taxonomy = [os.path.join(d, "metrics", "default.yaml") for d in (expected, actual)]
    if all(os.path.exists(p) for p in taxonomy):
        with (
            open(taxonomy[0], encoding="utf-8") as left,
            open(taxonomy[1], encoding="utf-8") as right,
        ):
            problems += compare_taxonomies(left.read(), right.read())
    return problems
