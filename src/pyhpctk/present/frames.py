"""Every context of every thread as a table, in thicket's layout (issue #21 item 8).

llnl-hatchet's reader of HPCToolkit databases (``readers/hpctoolkit_reader_latest.py``) walks
only the entry point of kind 1, "main thread", and stops there; the contexts of every other
thread sit under "application thread" (kind 2) in a database as hpcprof writes it (formats.md
§3.2), so hatchet never sees them. Putting them under the main thread would make databases
hpcprof never writes. Instead pyview exports the whole database per profile, in the layout
thicket (hatchet's multi-run companion) uses:

* a **performance table**, one row per (context, profile) with a value: ``node`` (the ctxId)
  and ``profile`` (the profile.db index), then ``name`` (the context as pyview labels it),
  ``kind``, ``parent`` (the parent's ctxId, -1 at the top), ``depth``, and for each metric
  ``"NAME (inc)"`` (inclusive, ``execution``) and ``"NAME"`` (exclusive, ``function``) — hatchet's
  column names;
* a **metadata table**, one row per profile: ``profile``, its identifier tuple as one column per
  kind (``node``, ``rank``, ``thread``, ``gpucontext``, ``gpustream``, ...), ``label`` and ``gpu``,
  and where pyrun recorded them (the database's ``threads.txt``) ``thread_name``, ``pid`` and
  ``program``.

:func:`profile_tables` builds both as plain columns (numpy arrays and lists, no pandas);
:meth:`pyhpctk.present.api.Database.to_thicket` turns them into pandas DataFrames indexed by
``(node, profile)`` and ``profile``, when pandas is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pyhpctk.present.labels import context_label
from pyhpctk.present.metrics import MetricCatalog
from pyhpctk.present.model import SCOPE_EXECUTION, SCOPE_FUNCTION

Columns = dict[str, Any]


def profile_tables(catalog: MetricCatalog, metrics: Sequence[str]) -> tuple[Columns, Columns]:
    """(performance table, metadata table) as dicts of equal-length columns (see above).

    ``metrics``: names in ``catalog`` of metrics meta.db stores (derived ones have no
    per-profile values and are refused with :class:`ValueError`).
    """
    exp = catalog.experiment
    tree = exp.tree
    props: list[tuple[str, int | None, int | None]] = []
    for name in metrics:
        raw = catalog.get(name).raw_metric
        if raw is None:
            raise ValueError(f"{name}: a derived metric has no values per profile")
        metric = exp.metric(raw)
        props.append((name, metric.prop_id(SCOPE_EXECUTION), metric.prop_id(SCOPE_FUNCTION)))
    depth = tree.depth()
    node_ids: list[np.ndarray[Any, Any]] = []
    profile_ids: list[np.ndarray[Any, Any]] = []
    values: dict[str, list[np.ndarray[Any, Any]]] = {}
    for prof in exp.profiles:
        columns = []
        for _, inclusive, exclusive in props:
            for prop in (inclusive, exclusive):
                if prop is None:
                    columns.append(np.zeros(tree.size))
                else:
                    columns.append(exp.by_node(exp.values.profile_column(prof.index, prop)))
        matrix = np.vstack(columns) if columns else np.zeros((0, tree.size))
        rows = np.flatnonzero(np.any(matrix != 0, axis=0))
        node_ids.append(rows)
        profile_ids.append(np.full(len(rows), prof.index, dtype=np.int64))
        for k, (name, _, _) in enumerate(props):
            values.setdefault(f"{name} (inc)", []).append(matrix[2 * k, rows])
            values.setdefault(name, []).append(matrix[2 * k + 1, rows])
    nodes = np.concatenate(node_ids) if node_ids else np.zeros(0, dtype=np.int64)
    labels = [context_label(tree, i) for i in range(tree.size)]
    parent_ctx = np.where(tree.parent >= 0, tree.ctx_id[np.maximum(tree.parent, 0)], -1)
    performance: Columns = {
        "node": tree.ctx_id[nodes],
        "profile": np.concatenate(profile_ids) if profile_ids else np.zeros(0, dtype=np.int64),
        "name": [labels[i][0] for i in nodes.tolist()],
        "kind": [labels[i][1] for i in nodes.tolist()],
        "parent": parent_ctx[nodes],
        "depth": depth[nodes],
    }
    for column, parts in values.items():
        performance[column] = np.concatenate(parts)
    kinds: list[str] = []
    for prof in exp.profiles:
        for kind, _ in prof.identifier:
            if kind.lower() not in kinds:
                kinds.append(kind.lower())
    metadata: Columns = {"profile": [p.index for p in exp.profiles]}
    for kind in kinds:
        metadata[kind] = [
            next((ident for k, ident in p.identifier if k.lower() == kind), None)
            for p in exp.profiles
        ]
    metadata["label"] = [p.label for p in exp.profiles]
    metadata["gpu"] = [p.is_gpu for p in exp.profiles]
    if exp.thread_names:  # what pyrun recorded (threads.txt): None for a profile it did not name
        named = [exp.thread_names.get(p.index) for p in exp.profiles]
        metadata["thread_name"] = [None if n is None else n.name for n in named]
        metadata["pid"] = [None if n is None else n.pid for n in named]
        metadata["program"] = [None if n is None else n.program for n in named]
    return performance, metadata
