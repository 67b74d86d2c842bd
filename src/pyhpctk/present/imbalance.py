"""Values across threads and ranks: one context's per-profile values and their statistics.

For a context and a metric, cct.db holds one value per profile (thread, GPU stream, rank ×
thread) that has a non-zero value (formats.md §3.4); profiles it does not list have 0. From those
this module computes min / mean / max / standard deviation / coefficient of variation over all
non-summary profiles (or a chosen kind of profile: CPU threads or GPU streams), and ranks the
contexts whose cost is most unevenly spread — the load imbalance a user wants to see first.

Only plain metrics have per-profile values: a derived metric is a formula over summaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pyhpctk.present.labels import context_label
from pyhpctk.present.metrics import MetricCatalog, MetricError
from pyhpctk.present.model import (
    EXCLUSIVE_SCOPE,
    INCLUSIVE_SCOPE,
    Experiment,
    FloatArray,
    Profile,
    ProfileList,
    profile_indices,
)

PATH_ENDS = 10  # a printed path longer than twice this shows its two ends only


@dataclass(frozen=True, slots=True)
class ProfileStats:
    """Statistics of one context's values over a set of profiles (zeros included)."""

    count: int
    minimum: float
    mean: float
    maximum: float
    stddev: float
    total: float

    @property
    def cv(self) -> float:
        """Coefficient of variation (stddev / mean); 0 for a zero mean."""
        return self.stddev / self.mean if self.mean else 0.0

    @property
    def imbalance(self) -> float:
        """``max / mean - 1``: how much longer the slowest profile took than the average."""
        return self.maximum / self.mean - 1.0 if self.mean else 0.0

    @classmethod
    def of(cls, values: FloatArray) -> ProfileStats:
        if len(values) == 0:
            return cls(0, math.nan, math.nan, math.nan, math.nan, 0.0)
        return cls(
            len(values),
            float(values.min()),
            float(values.mean()),
            float(values.max()),
            float(values.std()),
            float(values.sum()),
        )


@dataclass(frozen=True, slots=True)
class ContextSpread:
    """One context's per-profile values of one metric, with their statistics."""

    ctx_id: int
    label: str
    path: tuple[str, ...]  # labels from the entry point down to this context
    metric: str
    inclusive: bool
    profiles: Sequence[Profile]
    values: FloatArray  # one per profile in ``profiles`` (zeros included)
    stats: ProfileStats


def select_profiles(exp: Experiment, kind: str = "all") -> Sequence[Profile]:
    """Non-summary profiles of a kind: ``all``, ``cpu`` (threads) or ``gpu`` (streams)."""
    if kind == "all":
        return exp.profiles
    if kind in ("cpu", "gpu") and isinstance(exp.profiles, ProfileList):
        return exp.profiles.where(kind)
    if kind == "gpu":
        return tuple(p for p in exp.profiles if p.is_gpu)
    if kind == "cpu":
        return tuple(p for p in exp.profiles if not p.is_gpu)
    raise ValueError(f"unknown profile kind {kind!r}")


def _prop_id(catalog: MetricCatalog, metric: str, inclusive: bool) -> int:
    display = catalog.get(metric)
    raw = display.raw_metric
    if raw is None:
        raise MetricError(f"{metric!r} is derived: it has no per-thread values")
    prop = catalog.experiment.metric(raw).prop_id(INCLUSIVE_SCOPE if inclusive else EXCLUSIVE_SCOPE)
    if prop is None:
        raise MetricError(f"metric {metric!r} has no per-thread values in this database")
    return prop


def context_path(exp: Experiment, node: int) -> tuple[str, ...]:
    tree = exp.tree
    out: list[str] = []
    while node > 0:
        out.append(context_label(tree, node)[0])
        node = int(tree.parent[node])
    return tuple(reversed(out))


def _per_profile(
    exp: Experiment, ctx_id: int, prop: int, profiles: Sequence[Profile]
) -> FloatArray:
    """One context's values, one per profile of ``profiles`` (0 where cct.db has none).

    Each value goes to its profile's position by a search, not a dictionary of every profile:
    a database may hold 100,000 of them (issue #19).
    """
    where, values = exp.values.context_profiles(ctx_id, prop)
    indices = profile_indices(profiles)
    dense = np.zeros(len(profiles))
    if len(indices):
        ascending = bool(np.all(indices[1:] > indices[:-1]))  # a database's list is
        order = None if ascending else np.argsort(indices, kind="stable")
        by_index = indices if order is None else indices[order]
        at = np.searchsorted(by_index, where)
        np.minimum(at, len(indices) - 1, out=at)
        listed = by_index[at] == where
        dense[at[listed] if order is None else order[at[listed]]] = values[listed]
    return dense


def spread(
    catalog: MetricCatalog,
    ctx_id: int,
    metric: str,
    inclusive: bool = True,
    profiles: Sequence[Profile] | None = None,
) -> ContextSpread:
    """Per-profile values of ``metric`` at one context, and their statistics."""
    exp = catalog.experiment
    profiles = exp.profiles if profiles is None else profiles
    prop = _prop_id(catalog, metric, inclusive)
    dense = _per_profile(exp, ctx_id, prop, profiles)
    node = exp.tree.node_of(ctx_id)
    label = context_label(exp.tree, node)[0] if node >= 0 else f"<hidden context {ctx_id}>"
    path = context_path(exp, node) if node >= 0 else (label,)
    return ContextSpread(
        ctx_id, label, path, metric, inclusive, profiles, dense, ProfileStats.of(dense)
    )


def short_path(path: tuple[str, ...], keep: int = PATH_ENDS) -> str:
    """A context's path for one line: ``a > b > … 9,996 more … > y > z`` when it is long."""
    if len(path) <= 2 * keep + 1:
        return " > ".join(path)
    more = len(path) - 2 * keep
    return " > ".join((*path[:keep], f"… {more:,} more …", *path[-keep:]))


def most_imbalanced(
    catalog: MetricCatalog,
    metric: str,
    count: int = 10,
    min_share: float = 1.0,
    profiles: Sequence[Profile] | None = None,
    inclusive: bool = True,
) -> list[ContextSpread]:
    """Contexts holding at least ``min_share`` percent of the total, by imbalance (max/mean-1).

    Ties are broken by the context's share of the total, so the costliest uneven context wins.
    """
    exp = catalog.experiment
    profiles = exp.profiles if profiles is None else profiles
    if len(profiles) < 2:
        return []
    prop = _prop_id(catalog, metric, inclusive)  # fails early for derived metrics
    column = catalog.column(metric, inclusive)
    total = float(catalog.column(metric, True)[0])
    cutoff = abs(total) * min_share / 100.0
    candidates = np.flatnonzero((np.nan_to_num(column) > 0) & (np.nan_to_num(column) >= cutoff))
    candidates = candidates[candidates > 0]
    depth = exp.tree.depth()
    # A chain of contexts with the same per-profile values says one thing: keep its deepest.
    # Paths are built for the chosen contexts only (a chain's paths are quadratic in its depth).
    deepest: dict[bytes, tuple[int, ProfileStats, int]] = {}
    for node in candidates.tolist():
        ctx_id = int(exp.tree.ctx_id[node])
        values = _per_profile(exp, ctx_id, prop, profiles)
        key = values.tobytes()
        if key not in deepest or depth[node] > depth[deepest[key][0]]:
            deepest[key] = (node, ProfileStats.of(values), ctx_id)
    ranked = sorted(deepest.values(), key=lambda f: (-round(f[1].imbalance, 12), -f[1].total, f[2]))
    return [spread(catalog, ctx_id, metric, inclusive, profiles) for _, _, ctx_id in ranked[:count]]
