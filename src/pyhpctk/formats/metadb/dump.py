"""meta.db as text: every field, one line per context, so two files diff cleanly (style.md 4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from pyhpctk.formats import _db
from pyhpctk.formats.metadb.layout import enum_name
from pyhpctk.formats.metadb.model import Context, Entry, MetaDB, Module, SourceFile
from pyhpctk.formats.vocabulary import Combine, LexicalType, Relation, ScopeType
from pyhpctk.formats.vocabulary import EntryPoint as EntryPointKind

_RELATION_ARROWS = {
    Relation.LEXICAL: "lexical",
    Relation.CALL: "call",
    Relation.INLINED: "inlined",
}


def describe(db: MetaDB, c: Context) -> str:
    """One line for a context: ``-call> [function] main (/src/a.c:10) [/bin/a+0x118b]``."""
    try:
        arrow = _RELATION_ARROWS[Relation(c.relation)]
    except ValueError:
        arrow = f"rel{c.relation}"
    parts = [f"-{arrow}> [{enum_name(LexicalType, c.lexical_type)}]"]
    if c.function is not None:
        f = db.functions[c.function] if 0 <= c.function < len(db.functions) else None
        if f is None:
            parts.append(f"<function {c.function}?>")
        else:
            parts.append(f.name if f.name is not None else "<unnamed function>")
            where = []
            if f.file is not None:
                where.append(f"{_path(db.files, f.file)}:{f.line}")
            if f.module is not None:
                where.append(f"{_path(db.modules, f.module)}+0x{f.offset:x}")
            if where:
                parts.append("(" + " ".join(where) + ")")
    elif c.lexical_type == LexicalType.FUNCTION:
        parts.append("<unknown function>")
    if c.file is not None:
        parts.append(f"{_path(db.files, c.file)}:{c.line}")
    if c.module is not None:
        parts.append(f"{_path(db.modules, c.module)}+0x{c.offset:x}")
    return " ".join(parts)


def _path(table: Sequence[Module] | Sequence[SourceFile], k: int) -> str:
    return table[k].path if 0 <= k < len(table) else f"<missing {k}>"


def dump(db: MetaDB, out: TextIO) -> None:
    """Write every field of ``db`` as readable text; two dumps diff cleanly."""
    w = out.write
    w(f"meta.db v{_db.MAJOR}.{_db.MINOR}\n")
    w(f"title: {db.title}\n")
    w(f"description: {db.description}\n")
    w("id names:\n")
    for k, name in enumerate(db.id_names):
        w(f"  [{k}] {name}\n")
    w("propagation scopes:\n")
    for k, s in enumerate(db.scopes):
        w(
            f"  [{k}] {s.name} type={enum_name(ScopeType, s.type)} "
            f"propagation_index={s.propagation_index}\n"
        )
    w("metrics:\n")
    for k, m in enumerate(db.metrics):
        w(f"  [{k}] {m.name}\n")
        for si in m.scope_insts:
            w(f"      scope {_scope_name(db, si.scope)}: prop_metric_id={si.prop_metric_id}\n")
        for ss in m.summaries:
            w(
                f"      summary {_scope_name(db, ss.scope)}: {enum_name(Combine, ss.combine)} of "
                f"{ss.formula!r} stat_metric_id={ss.stat_metric_id}\n"
            )
    w("modules:\n")
    for k, mod in enumerate(db.modules):
        w(f"  [{k}] {mod.path} flags=0x{mod.flags:x}\n")
    w("files:\n")
    for k, f in enumerate(db.files):
        extra = f" flags=0x{f.flags:x}" if f.flags else ""
        w(f"  [{k}] {f.path}{' (copied)' if f.copied else ''}{extra}\n")
    w("functions:\n")
    for k, fn in enumerate(db.functions):
        module = "-" if fn.module is None else f"[{fn.module}]"
        file = "-" if fn.file is None else f"[{fn.file}]:{fn.line}"
        w(
            f"  [{k}] {fn.name if fn.name is not None else '<no name>'} module={module} "
            f"offset=0x{fn.offset:x} file={file} flags=0x{fn.flags:x}\n"
        )
    w("context tree:\n")
    for node, _, depth in db.contexts():
        indent = "  " * (depth + 1)
        if isinstance(node, Entry):
            w(
                f"{indent}#{node.ctx_id} entry {enum_name(EntryPointKind, node.kind)} "
                f"({node.pretty_name})\n"
            )
        else:
            elided = " (children elided)" if node.elided_children and not node.children else ""
            w(f"{indent}#{node.ctx_id} {describe(db, node)} prop=0x{node.propagation:x}{elided}\n")


def _scope_name(db: MetaDB, k: int) -> str:
    return db.scopes[k].name if 0 <= k < len(db.scopes) else f"<missing scope {k}>"


__all__ = ["describe", "dump"]
