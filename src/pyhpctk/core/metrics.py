"""Metrics as the database presents them: propagation scopes, summary partials and metric ids.

formats.md §3.2: hpcprof always emits four propagation scopes (point, function, lex_aware,
execution); a metric with base id ``B`` has ``propMetricId = B + scope`` in the per-profile
values and ``statMetricId = B + 4 * partial + scope`` in the summary profile. A *partial* is a
per-profile transform (``$$`` identity, ``$$^2``, ``1``) with a combine operator (sum, min, max)
across profiles; ``-M sum`` keeps the single partial ``sum($$)``, ``-M stats`` adds those needed
for min / mean / max / standard deviation / coefficient of variation.

Data only, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# formats.md §3.2, the four scopes in hpcprof's order: (name, type, propagation index).
SCOPE_POINT, SCOPE_FUNCTION, SCOPE_LEX_AWARE, SCOPE_EXECUTION = 0, 1, 2, 3
SCOPE_NAMES: tuple[str, ...] = ("point", "function", "lex_aware", "execution")
SCOPE_TYPE_CUSTOM, SCOPE_TYPE_POINT, SCOPE_TYPE_EXECUTION, SCOPE_TYPE_TRANSITIVE = 0, 1, 2, 3
SCOPE_TYPES: tuple[int, ...] = (
    SCOPE_TYPE_POINT,
    SCOPE_TYPE_TRANSITIVE,
    SCOPE_TYPE_CUSTOM,
    SCOPE_TYPE_EXECUTION,
)
NO_PROPAGATION_INDEX = 255  # formats.md §3.9 item 8
SCOPE_PROPAGATION_INDEX: tuple[int, ...] = (
    NO_PROPAGATION_INDEX,
    0,
    NO_PROPAGATION_INDEX,
    NO_PROPAGATION_INDEX,
)
N_SCOPES = len(SCOPE_NAMES)


class Combine(enum.IntEnum):
    """How a partial combines across profiles (formats.md §3.2, ``{SS}.combine``)."""

    SUM = 0
    MIN = 1
    MAX = 2


@dataclass(frozen=True, slots=True)
class Partial:
    """One summary partial: a per-profile formula and a combine operator."""

    formula: str
    combine: Combine


SUM = Partial("$$", Combine.SUM)
MIN = Partial("$$", Combine.MIN)
MAX = Partial("$$", Combine.MAX)
SUM_OF_SQUARES = Partial("$$^2", Combine.SUM)
COUNT = Partial("1", Combine.SUM)

PARTIALS_SUM: tuple[Partial, ...] = (SUM,)
PARTIALS_STATS: tuple[Partial, ...] = (SUM, MIN, MAX, SUM_OF_SQUARES, COUNT)


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """A metric as pyprof aggregates it, built from an ``.hpcrun`` metric descriptor.

    ``formula`` non-empty marks a derived presentation metric: it has no stored values and lives
    only in ``metrics/default.yaml`` (formats.md §1.6).
    """

    name: str
    description: str = ""
    is_real: bool = True
    move_to_proc: bool = False
    show: int = 1
    show_percent: bool = True
    period: int = 1
    formula: str = ""
    format: str = ""

    @property
    def is_derived(self) -> bool:
        return bool(self.formula)


def prop_metric_id(base: int, scope: int) -> int:
    """formats.md §3.2: the id of ``scope``'s values in non-summary profiles and cct.db."""
    return base + scope


def stat_metric_id(base: int, partial: int, scope: int) -> int:
    """formats.md §3.2: the id of partial ``partial`` of ``scope`` in the summary profile."""
    return base + N_SCOPES * partial + scope
