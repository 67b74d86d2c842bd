"""Small databases built from a readable description, with values propagated by the book.

Tests and the scale benchmark need databases whose answers are known by construction. A
:class:`Spec` describes a calling context tree (entry points, functions, inlined functions,
loops, lines, instructions) with the *point* values each profile measured at each context;
:func:`build` propagates them into the four scopes exactly as formats.md §3.2 defines them,
by a direct recursive walk (the slow, obvious oracle of style.md item 10):

* point — the value measured at the context;
* function — point plus the function values of *lexical* children (stops at call/inlined edges);
* lex_aware — like function, but a loop leaves out its nested loops;
* execution — point plus the execution values of all children.

The summary profile is the sum over profiles (the ``sum`` of ``$$`` statistic).
:func:`write_database` writes such an experiment as a database directory with the format
writers (meta.db, profile.db, cct.db and, when given, ``metrics/default.yaml``), so the command
line and the file readers can be tested on it too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pyhpctk.core.metrics import metric_base, prop_id, stat_id
from pyhpctk.formats import cctdb, metadb, profiledb
from pyhpctk.formats.hpcrun_model import DEFAULT_ID_NAMES
from pyhpctk.formats.vocabulary import SCOPE_NAMES, Combine, LexicalType, Relation
from pyhpctk.present.model import (
    LEX_ENTRY,
    LEX_ROOT,
    REL_NONE,
    ContextTree,
    Experiment,
    FunctionInfo,
    InMemoryTraces,
    InMemoryValues,
    MetricInfo,
    Profile,
    SummaryStat,
    Timeline,
)

SCOPES = SCOPE_NAMES
_KINDS = {
    "entry": (LEX_ENTRY, REL_NONE),
    "function": (LexicalType.FUNCTION, Relation.CALL),
    "inlined": (LexicalType.FUNCTION, Relation.INLINED),
    "loop": (LexicalType.LOOP, Relation.LEXICAL),
    "line": (LexicalType.LINE, Relation.LEXICAL),
    "instruction": (LexicalType.INSTRUCTION, Relation.CALL),
}


@dataclass(frozen=True)
class Spec:
    """One context: its kind, what it names, point values per metric per profile, children."""

    kind: str
    name: str = ""  # function name or entry-point name
    file: str = ""
    line: int = 0
    module: str = "/bin/app"
    offset: int = 0
    values: dict[str, tuple[float, ...]] = field(default_factory=dict)
    children: tuple[Spec, ...] = ()
    ctx_id: int | None = None
    relation: int | None = None  # override (e.g. a lexical instruction)


def metric_info(name: str, base: int) -> MetricInfo:
    """A plain metric as hpcprof writes it: scope k has prop id ``base + k`` and a single
    partial, ``sum($$)``, whose stat id is the same."""
    return MetricInfo(
        name,
        tuple((scope, prop_id(base, k)) for k, scope in enumerate(SCOPES)),
        tuple(
            SummaryStat(scope, "$$", Combine.SUM.label, stat_id(base, 0, k))
            for k, scope in enumerate(SCOPES)
        ),
    )


def build(
    entries: Sequence[Spec],
    metrics: Sequence[str],
    profiles: Sequence[tuple[tuple[str, int], ...]],
    title: str = "synthetic",
    traces: Sequence[Timeline] | None = None,
    taxonomy_text: str | None = None,
) -> Experiment:
    """An :class:`Experiment` from specs; ctxIds are assigned in pre-order unless given."""
    nodes = _preorder(entries)
    tree = _tree(nodes)
    n_ctx = int(tree.ctx_id.max()) + 1
    summary: dict[int, np.ndarray] = {}
    per_profile: dict[int, np.ndarray] = {}
    infos = []
    for m, metric in enumerate(metrics):
        base = metric_base(m, 1)  # one partial: sum($$)
        scope = _propagate(nodes, tree, metric, len(profiles))
        for k, s in enumerate(SCOPES):
            dense = np.zeros((len(profiles), n_ctx))
            dense[:, tree.ctx_id] = scope[s]
            per_profile[prop_id(base, k)] = dense
            summary[stat_id(base, 0, k)] = dense.sum(axis=0)
        infos.append(metric_info(metric, base))
    profile_infos = tuple(Profile(i + 1, ident) for i, ident in enumerate(profiles))
    return Experiment(
        path=f"<{title}>",
        title=title,
        tree=tree,
        metrics=tuple(infos),
        profiles=profile_infos,
        values=InMemoryValues(n_ctx, summary, per_profile),
        traces=None if traces is None else InMemoryTraces(tuple(traces)),
        taxonomy_text=taxonomy_text,
    )


def _preorder(entries: Sequence[Spec]) -> list[tuple[Spec, int]]:
    """Every spec in pre-order with its parent's node (node 0: the global context)."""
    nodes: list[tuple[Spec, int]] = []  # (spec, parent node)
    stack: list[tuple[Spec, int]] = [(e, 0) for e in reversed(entries)]
    while stack:
        spec, above = stack.pop()
        nodes.append((spec, above))
        me = len(nodes)
        stack.extend((c, me) for c in reversed(spec.children))
    return nodes


def _intern(table: list[str], value: str) -> int:
    if not value:
        return -1
    if value not in table:
        table.append(value)
    return table.index(value)


def _tree(nodes: list[tuple[Spec, int]]) -> ContextTree:
    """The context tree of the pre-ordered specs, ctxIds given or assigned in pre-order."""
    n = len(nodes) + 1
    modules: list[str] = []
    files: list[str] = []
    functions: list[FunctionInfo] = []
    ctx_id = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    lexical = np.full(n, LEX_ROOT, dtype=np.int8)
    relation = np.full(n, REL_NONE, dtype=np.int8)
    function = np.full(n, -1, dtype=np.int64)
    file = np.full(n, -1, dtype=np.int64)
    line = np.zeros(n, dtype=np.int64)
    module = np.full(n, -1, dtype=np.int64)
    offset = np.zeros(n, dtype=np.uint64)
    names = [""] * n
    used = {s.ctx_id for s, _ in nodes if s.ctx_id is not None}
    next_id = 1
    for i, (spec, up) in enumerate(nodes, start=1):
        if spec.ctx_id is not None:
            ctx_id[i] = spec.ctx_id
        else:
            while next_id in used:
                next_id += 1
            ctx_id[i] = next_id
            used.add(next_id)
        parent[i] = up
        lex, rel = _KINDS[spec.kind]
        lexical[i] = lex
        relation[i] = rel if spec.relation is None else spec.relation
        if spec.kind == "entry":
            names[i] = spec.name
        elif lex == LexicalType.FUNCTION:
            functions.append(
                FunctionInfo(
                    spec.name,
                    _intern(modules, spec.module),
                    _intern(files, spec.file),
                    spec.line,
                    spec.offset,
                )
            )
            function[i] = len(functions) - 1
        elif lex in (LexicalType.LOOP, LexicalType.LINE):
            file[i] = _intern(files, spec.file)
            line[i] = spec.line
            if lex == LexicalType.LOOP:
                module[i] = _intern(modules, spec.module)
                offset[i] = spec.offset
        else:
            module[i] = _intern(modules, spec.module)
            offset[i] = spec.offset
    return ContextTree(
        ctx_id,
        parent,
        lexical,
        relation,
        function,
        file,
        line,
        module,
        offset,
        tuple(names),
        tuple(functions),
        tuple(files),
        tuple(modules),
    )


def _propagate(
    nodes: list[tuple[Spec, int]], tree: ContextTree, metric: str, n_prof: int
) -> dict[str, np.ndarray]:
    """One metric's values in the four scopes, per profile and node (formats.md §3.2)."""
    n = tree.size
    parent, relation, lexical = tree.parent, tree.relation, tree.lexical_type
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[int(parent[i])].append(i)
    point = np.zeros((n_prof, n))
    for i, (spec, _) in enumerate(nodes, start=1):
        vals = spec.values.get(metric, ())
        point[: len(vals), i] = vals
    scope = {s: np.zeros((n_prof, n)) for s in SCOPES}
    scope["point"] = point
    for i in range(n - 1, -1, -1):  # children come after parents: walk backwards
        lexical_kids = [c for c in children[i] if relation[c] == Relation.LEXICAL]
        scope["execution"][:, i] = point[:, i] + sum(
            (scope["execution"][:, c] for c in children[i]), np.zeros(n_prof)
        )
        scope["function"][:, i] = point[:, i] + sum(
            (scope["function"][:, c] for c in lexical_kids), np.zeros(n_prof)
        )
        if lexical[i] == LexicalType.LOOP:
            scope["lex_aware"][:, i] = point[:, i] + sum(
                (scope["function"][:, c] for c in lexical_kids if lexical[c] != LexicalType.LOOP),
                np.zeros(n_prof),
            )
        else:
            scope["lex_aware"][:, i] = scope["function"][:, i]
    return scope


def write_database(exp: Experiment, directory: str | os.PathLike[str]) -> Path:
    """Write an experiment made by :func:`build` as a database directory; returns its path.

    Every metric keeps the ids :func:`build` gave it (scope ``k`` of metric ``m``: ``4m + k``),
    profile ``p``'s values come from the in-memory matrices and cct.db is their transpose.
    """
    if not isinstance(exp.values, InMemoryValues):
        raise TypeError("write_database writes experiments made by synthetic.build")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tree = exp.tree
    meta = metadb.MetaDB(title=exp.title)
    meta.metrics = [
        metadb.Metric.standard(m.name, metric_base(k, 1)) for k, m in enumerate(exp.metrics)
    ]
    meta.modules = [metadb.Module(m) for m in tree.modules]
    meta.files = [metadb.SourceFile(f) for f in tree.files]
    meta.functions = [
        metadb.Function(
            f.name,
            None if f.module < 0 else f.module,
            f.offset,
            None if f.file < 0 else f.file,
            f.line,
        )
        for f in tree.functions
    ]
    nodes: list[metadb.Entry | metadb.Context | None] = [None]
    for i in range(1, tree.size):
        up = nodes[int(tree.parent[i])]
        lex = int(tree.lexical_type[i])
        node: metadb.Entry | metadb.Context
        if lex == LEX_ENTRY:
            entry = metadb.Entry(
                int(tree.ctx_id[i]), metadb.EntryPointKind.MAIN_THREAD, tree.names[i]
            )
            meta.entry_points.append(entry)
            node = entry
        else:
            assert up is not None, "synthetic contexts sit under an entry point"
            rel = int(tree.relation[i])
            node = metadb.Context(
                int(tree.ctx_id[i]),
                rel,
                lex,
                function=None if tree.function[i] < 0 else int(tree.function[i]),
                file=None if tree.file[i] < 0 else int(tree.file[i]),
                line=int(tree.line[i]),
                module=None if tree.module[i] < 0 else int(tree.module[i]),
                offset=int(tree.offset[i]),
                propagation=1 if rel == Relation.LEXICAL else 0,
            )
            up.children.append(node)
        nodes.append(node)
    metadb.write(meta, out / "meta.db")
    kinds = {name: kind for kind, name in DEFAULT_ID_NAMES}
    infos = [profiledb.ProfileInfo(True, None)] + [
        profiledb.ProfileInfo(
            False,
            tuple(profiledb.IdTupleElement(kinds[k], False, i, i) for k, i in p.identifier),
        )
        for p in exp.profiles
    ]

    def block(columns: dict[int, np.ndarray]) -> profiledb.ProfileValues:
        ids = sorted(columns)
        ctx = np.tile(np.arange(exp.values.n_contexts), len(ids))
        met = np.repeat(ids, exp.values.n_contexts)
        return profiledb.ProfileValues.from_triples(
            ctx, met, np.concatenate([columns[i] for i in ids])
        )

    values = exp.values
    blocks = [block(values.summary)] + [
        block({k: m[p] for k, m in values.per_profile.items()}) for p in range(len(exp.profiles))
    ]
    profiles = profiledb.ProfileDB(infos, blocks)
    profiledb.write(profiles, out / "profile.db")
    cctdb.write(cctdb.transpose(profiles, n_contexts=values.n_contexts), out / "cct.db")
    if exp.taxonomy_text is not None:
        (out / "metrics").mkdir(exist_ok=True)
        (out / "metrics" / "default.yaml").write_text(exp.taxonomy_text, encoding="utf-8")
    return out
