"""The database's ids, one ``NewType`` each so that they cannot be mixed up (style.md item 6).

A context id is meta.db's ``ctxId`` (0: the implicit global context, :data:`ROOT`); a metric id
a ``propMetricId`` or ``statMetricId`` (:mod:`pyhpctk.core.metrics` computes them); a profile
index is a profile's place in profile.db (0: the summary profile). Declared here once, for every
tool; data only.
"""

from __future__ import annotations

from typing import NewType

ContextId = NewType("ContextId", int)
MetricId = NewType("MetricId", int)
ProfileIndex = NewType("ProfileIndex", int)

ROOT = ContextId(0)

__all__ = ["ROOT", "ContextId", "MetricId", "ProfileIndex"]
