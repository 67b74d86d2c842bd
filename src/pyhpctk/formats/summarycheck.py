"""``verify``'s check of a database's summary profile against the thread profiles it sums.

The summary profile (profile.db's profile 0) holds statistics over the other profiles
(formats.md §3.2); the views show them as the metrics' values. Each statistic ``sum`` of the
partial ``$$`` of a metric in a scope is, at every context, the sum over the thread profiles of
that metric's value there (its propMetricId of the same scope), as pyprof writes it. hpcprof's
own summaries fall short of that sum at a few contexts (6 of loops-cputime-t.d's, in recursive
code), never past it: a sum larger than the thread profiles' values (1e300 s over threads
summing 0.75 s) is reported, to a relative 1e-6 (the order of the sum differs between writers).

Memory: the summary block, and one thread profile's block at a time.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats import metadb, profiledb
from pyhpctk.formats.vocabulary import Combine

RTOL = 1e-6
_SHOWN = 3  # disagreements named in the message


def _sums_of(meta: metadb.MetaDB) -> npt.NDArray[np.int64]:
    """Over all u16 statMetricIds: the propMetricId whose sum over profiles it is, or -1."""
    prop_of = np.full(1 << 16, -1, dtype=np.int64)
    for m in meta.metrics:
        scoped = {si.scope: si.prop_metric_id for si in m.scope_insts}
        for ss in m.summaries:
            if ss.formula == "$$" and ss.combine == Combine.SUM and ss.scope in scoped:
                prop_of[ss.stat_metric_id & 0xFFFF] = scoped[ss.scope] & 0xFFFF
    return prop_of


def _keys(block: profiledb.ProfileValues, metric: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return (block.value_ctx_ids().astype(np.int64) << 16) | metric


def summary_problems(profiles: profiledb.ProfileDB, meta: metadb.MetaDB) -> list[str]:
    """Summary sums larger than the sums of the thread profiles' values (module docstring)."""
    prop_of = _sums_of(meta)
    summaries = [i for i, info in enumerate(profiles.profiles) if info.is_summary]
    if len(summaries) != 1 or not (prop_of >= 0).any():
        return []
    try:
        summary = profiles.values[summaries[0]]
    except FormatError:
        return []  # reported by profiledb.verify
    props = prop_of[np.asarray(summary.values["metric_id"], dtype=np.int64)]
    summed = props >= 0
    keys = _keys(summary, props)[summed]
    said = np.asarray(summary.values["value"], dtype=np.float64)[summed]
    order = np.argsort(keys, kind="stable")
    keys, said = keys[order], said[order]
    sums = np.zeros(len(keys))
    for i in range(len(profiles.profiles)):
        if i == summaries[0]:
            continue
        try:
            block = profiles.values[i]
        except FormatError:
            return []  # a profile that cannot be read: the sums cannot be checked
        found = _keys(block, np.asarray(block.values["metric_id"], dtype=np.int64))
        at = np.minimum(np.searchsorted(keys, found), max(len(keys) - 1, 0))
        hit = (keys[at] == found) if len(keys) else np.zeros(len(found), dtype=bool)
        np.add.at(sums, at[hit], np.asarray(block.values["value"], dtype=np.float64)[hit])
    with np.errstate(invalid="ignore", over="ignore"):
        wrong = said > sums + RTOL * np.abs(sums)
    if not wrong.any():
        return []
    shown = ", ".join(
        f"context {int(k >> 16)} metric {int(k & 0xFFFF)}: {float(s)!r} for {float(t)!r}"
        for k, s, t in zip(keys[wrong][:_SHOWN], said[wrong], sums[wrong], strict=False)
    )
    more = f" and {int(wrong.sum()) - _SHOWN} more" if wrong.sum() > _SHOWN else ""
    return [
        f"summary profile: {int(wrong.sum())} sums are larger than the sums of the thread "
        f"profiles' values ({shown}{more})"
    ]
