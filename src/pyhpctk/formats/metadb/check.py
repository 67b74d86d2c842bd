"""Checking meta.db's model: the consistency problems :func:`verify` reports (formats.md §3.2).

Cross-references that do not resolve, ids that repeat, and what the reader met in the bytes that
the model cannot hold; the writer refuses a model with dangling references
(:func:`table_problems`). Runs in bulk over the flat index.
"""

from __future__ import annotations

import numpy as np

from pyhpctk.formats.metadb.layout import enum_name
from pyhpctk.formats.metadb.model import ContextIndex, MetaDB
from pyhpctk.formats.vocabulary import PROPAGATION_FUNCTION_BIT, Relation


def verify(db: MetaDB) -> list[str]:
    """Consistency problems of ``db`` (formats.md §3.2, §3.7); empty when clean.

    Checks: names that :func:`read` found outside the Strings section (``read_problems``);
    every scope, module, file and function index resolves ("dangling ..." otherwise);
    prop and stat metric ids are each unique; ctxIds are unique and not 0; the propagation bit 0
    is set exactly on lexical contexts. Runs in bulk over the flat index (built afresh, so it
    sees the tree as it is now).
    """
    problems = [*db.read_problems, *table_problems(db)]
    try:
        index = ContextIndex.build(db.entry_points)
    except (OverflowError, ValueError) as error:
        return [*problems, f"a context field is out of range for its on-disk type ({error})"]
    t = index.table
    ids, counts = np.unique(t["ctx_id"], return_counts=True)
    if bool(np.any(counts > 1)):
        problems.append(f"duplicate ctxIds: {ids[counts > 1][:10].tolist()}")
    if bool(np.any(t["ctx_id"] == 0)):
        problems.append("ctxId 0 is reserved for the global context")
    ctx = t[t["entry_point"] < 0]
    for what, count in (
        ("function", len(db.functions)),
        ("file", len(db.files)),
        ("module", len(db.modules)),
    ):
        bad = ctx[(ctx[what] >= count) | (ctx[what] < -1)]
        if len(bad):
            problems.append(
                f"dangling {what} {int(bad[what][0])} in context {int(bad['ctx_id'][0])}"
                + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
            )
    lexical = ctx["relation"] == Relation.LEXICAL
    bit = (ctx["propagation"] & PROPAGATION_FUNCTION_BIT) != 0
    wrong = ctx[lexical != bit]
    if len(wrong):
        c = wrong[0]
        problems.append(
            f"context {int(c['ctx_id'])}: propagation bit 0 is "
            f"{'set' if int(c['propagation']) & 1 else 'clear'} on a "
            f"{enum_name(Relation, int(c['relation']))} context (it must be set iff the "
            "relation is lexical)" + (f"; {len(wrong) - 1} more" if len(wrong) > 1 else "")
        )
    return problems


def table_problems(db: MetaDB) -> list[str]:
    """verify()'s checks of the metric and function tables."""
    problems: list[str] = []

    def dangling(k: int | None, n: int) -> bool:
        return k is not None and not 0 <= k < n

    for i, m in enumerate(db.metrics):
        for s in m.scope_insts:
            if dangling(s.scope, len(db.scopes)):
                problems.append(f"dangling scope {s.scope} in metric {i} ({m.name})")
        for ss in m.summaries:
            if dangling(ss.scope, len(db.scopes)):
                problems.append(f"dangling scope {ss.scope} in a summary of metric {i}")
    prop_ids = [s.prop_metric_id for m in db.metrics for s in m.scope_insts]
    stat_ids = [s.stat_metric_id for m in db.metrics for s in m.summaries]
    for kind, ids in (("propMetricId", prop_ids), ("statMetricId", stat_ids)):
        dup = _dups(ids)
        if dup:
            problems.append(f"duplicate {kind}s: {dup[:10]}")
    for i, f in enumerate(db.functions):
        if dangling(f.module, len(db.modules)):
            problems.append(f"dangling module {f.module} in function {i} ({f.name})")
        if dangling(f.file, len(db.files)):
            problems.append(f"dangling file {f.file} in function {i} ({f.name})")
    return problems


def _dups(ids: list[int]) -> list[int]:
    arr = np.sort(np.array(ids, dtype=np.int64))
    return sorted(set(arr[1:][arr[1:] == arr[:-1]].tolist()))


__all__ = ["table_problems", "verify"]
