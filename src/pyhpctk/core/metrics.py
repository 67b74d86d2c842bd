"""Metric ids as the database numbers them, computed here and nowhere else.

formats.md §3.2: hpcprof always emits four propagation scopes (point, function, lex_aware,
execution); a metric with base id ``B`` has ``propMetricId = B + scope`` in the per-profile
values and ``statMetricId = B + 4 * partial + scope`` in the summary profile, where a *partial*
is a per-profile transform with a combine operator across profiles (pyprof's are in
:mod:`pyhpctk.analysis.metrics`). Every function here takes ints or numpy arrays of them alike.

Data only, no I/O.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

# formats.md §3.2: the four scopes and the combine operators are the database's vocabulary.
from pyhpctk.formats.vocabulary import (
    N_SCOPES,
    NO_PROPAGATION_INDEX,
    SCOPE_EXECUTION,
    SCOPE_FUNCTION,
    SCOPE_LEX_AWARE,
    SCOPE_NAMES,
    SCOPE_POINT,
    Combine,
    StandardScope,
)

Ids = TypeVar("Ids", int, npt.NDArray[np.int64])


def metric_base(index: int, n_partials: int) -> int:
    """The base id of the ``index``-th stored metric, leaving room for its ``4 * n_partials``
    stat ids below the next metric's."""
    return N_SCOPES * n_partials * index


def prop_id(base: Ids, scope: Ids) -> Ids:
    """``propMetricId = base + scope``: a metric's values in one scope, per profile."""
    return base + scope


def stat_id(base: Ids, partial: int, scope: Ids) -> Ids:
    """``statMetricId = base + 4 * partial + scope``: a partial of a metric in one scope, in
    the summary profile."""
    return base + N_SCOPES * partial + scope


def scope_of(metric_id: Ids) -> Ids:
    """The scope a prop or stat id is of."""
    return metric_id % N_SCOPES


__all__ = [
    "NO_PROPAGATION_INDEX",
    "N_SCOPES",
    "SCOPE_EXECUTION",
    "SCOPE_FUNCTION",
    "SCOPE_LEX_AWARE",
    "SCOPE_NAMES",
    "SCOPE_POINT",
    "Combine",
    "StandardScope",
    "metric_base",
    "prop_id",
    "scope_of",
    "stat_id",
]
