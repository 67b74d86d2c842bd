"""Is a cct.db the transpose of its profile.db? (formats.md §3.4), a window of contexts at a time.

``pyhpctk verify`` compares every value of the two files. Transposing the whole profile.db at
once would hold every value of the database in memory, several times over (keys, the sort's
order, the packed copy); here profile.db is transposed one window of contexts at a time, each
holding at most :data:`WINDOW_VALUES` values (or one context's, when a single context has more),
and compared with cct.db's blocks of those contexts. So memory follows the window, not the files:

1. one pass over the thread profiles' context indices counts each context's values (and finds a
   block that cannot be read, or a context past cct.db's count, as :func:`.cctdb.transpose`
   would: the comparison then stops with that reason);
2. the contexts are cut into windows by those counts; for each, every profile's run of values
   in it (found by binary search in its context index) is packed context-major
   (:func:`.cctdb.pack`) and compared with cct.db: first the counts of values and metrics of
   every context, then, while no count differed, the values themselves.

The answer is the one of comparing with a whole transpose: the first 10 contexts whose counts
differ, else the first 10 whose values differ. Never writes; imports only numpy and the format
modules.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError
from pyhpctk.formats.cctdb import CctDB, pack, windows
from pyhpctk.formats.profiledb import ProfileDB

WINDOW_VALUES = 1 << 20
"""Values of profile.db transposed at a time (about 60 bytes each while packed and compared)."""

_SHOWN = 10  # contexts named before the comparison stops


def verify_against_profiles(contexts: CctDB, profiles: ProfileDB) -> list[str]:
    """Problems where a cct.db is not the transpose of its profile.db's thread profiles
    (formats.md §3.4), found a window of contexts at a time (memory bounded by the window)."""
    n = contexts.n_contexts
    try:
        expected, spans = _expected_counts(profiles, n)
    except (ValueError, FormatError) as error:
        return [f"cct.db cannot be compared with profile.db: {error}"]
    nv, nm = contexts.value_counts()
    counts: list[str] = []
    differ: list[str] = []
    for c0, c1 in windows(expected, WINDOW_VALUES):
        window = _window(profiles, spans, c0, c1)
        wnv, wnm = window.value_counts()
        for c in (np.flatnonzero((nv[c0:c1] != wnv) | (nm[c0:c1] != wnm)) + c0).tolist():
            counts.append(
                f"context {c}: cct.db has {nv[c]} values in {nm[c]} metrics, profile.db "
                f"{wnv[c - c0]} values in {wnm[c - c0]} metrics"
            )
        if len(counts) >= _SHOWN:
            return counts[:_SHOWN]
        if counts or len(differ) >= _SHOWN:
            continue  # counts differ (or enough values did): only counts are still reported
        for c in (np.flatnonzero(nv[c0:c1]) + c0).tolist():
            try:
                block = contexts.values[c]
            except FormatError:
                continue  # reported by cctdb.verify
            if block != window.values[c - c0]:
                differ.append(f"context {c}: values differ from profile.db's")
                if len(differ) >= _SHOWN:
                    break
    return counts or differ


def _expected_counts(
    profiles: ProfileDB, n: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Values per context over the thread profiles, and each thread profile's first and last
    context (``(index, first, last)`` rows, profiles without values left out).

    Raises the FormatError of a block that cannot be read, and a ValueError when a context id
    is not below ``n`` (the messages :func:`.cctdb.transpose` gives).
    """
    expected = np.zeros(n, dtype=np.int64)
    rows = []
    top = 0
    for i in np.flatnonzero(~profiles.is_summary()).tolist():
        block = profiles.values[i]
        if not block.n_values:
            continue
        ctx = block.ctx_ids()
        last = int(ctx[-1])  # a checked block's contexts ascend
        top = max(top, last + 1)
        if last < n:
            bounds = block.bounds().astype(np.int64)
            expected[ctx] += bounds[1:] - bounds[:-1]
        rows.append((i, int(ctx[0]), last))
    if top > n:
        raise ValueError(f"n_contexts {n} is smaller than the largest context id + 1 ({top})")
    return expected, np.array(rows, dtype=np.int64).reshape(-1, 3)


def _window(profiles: ProfileDB, spans: npt.NDArray[np.int64], c0: int, c1: int) -> CctDB:
    """Contexts ``c0..c1-1`` of the transpose of ``profiles`` (``spans``: from
    :func:`_expected_counts`), numbered from 0."""
    keys, profs, vals = [], [], []
    # Every block was checked by _expected_counts: a file's are not checked again.
    block_of = getattr(profiles.values, "raw", profiles.values.__getitem__)
    touching = spans[(spans[:, 1] < c1) & (spans[:, 2] >= c0), 0]
    for i in touching.tolist():
        block = block_of(i)
        ctx_ids = block.ctx_indices["ctx_id"]
        a, b = np.searchsorted(ctx_ids, [c0, c1]).tolist()
        if a == b:
            continue
        starts = block.ctx_indices["start"][a : b + 1].astype(np.int64)
        first = int(starts[0])
        last = int(starts[-1]) if b < len(ctx_ids) else block.n_values
        runs = np.diff(np.append(starts[: b - a], last))
        ctx = np.repeat(ctx_ids[a:b].astype(np.uint64) - np.uint64(c0), runs)
        part = block.values[first:last]
        keys.append((ctx << np.uint64(16)) | part["metric_id"])
        profs.append(np.full(len(part), i, dtype=np.uint32))
        vals.append(np.array(part["value"], dtype=np.float64))  # copied now, while mapped
    return CctDB(pack(keys, profs, vals, c1 - c0))
