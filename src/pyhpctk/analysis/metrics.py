"""pyprof's metrics: summary partials, and a metric as pyprof aggregates it.

A *partial* is a per-profile transform (``$$`` identity, ``$$^2``, ``1``) with a combine operator
(sum, min, max) across profiles; ``-M sum`` keeps the single partial ``sum($$)``, ``-M stats``
adds those needed for min / mean / max / standard deviation / coefficient of variation. The ids
they are written under come from :mod:`pyhpctk.core.metrics`. Data only, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyhpctk.formats.vocabulary import Combine


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
class MeasuredMetric:
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
