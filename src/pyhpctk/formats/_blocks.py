"""What the database readers, ``verify`` and ``dump`` share about the arrays a file points at:
profile.db's value blocks, cct.db's context blocks, trace.db's lines, meta.db's metric tables.

- :func:`first_overlap`: hpcprof gives every non-empty array its own bytes (formats.md §3.3-§3.6;
  only empty ones may alias). A file whose arrays overlap is refused, since aliasing lets a small
  file name far more values than it holds (thousands of profiles sharing one block make a
  transposition or a viewer allocate the square of the file size).
- :func:`non_finite_problem`: a stored value that is NaN or infinite (no measurement or statistic
  produces one).
- :func:`block_for_dump` and :func:`dump_bounds`: ``dump`` shows a block that fails its checks
  as it is, marked, instead of refusing the file.

Imports nothing but numpy and :mod:`pyhpctk.errors`; never reads or writes a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from pyhpctk.errors import FormatError


def first_overlap(starts: npt.ArrayLike, ends: npt.ArrayLike) -> tuple[int, int] | None:
    """Two non-empty ``[start, end)`` intervals that share bytes, as indices ``(i, j)`` into
    ``starts``/``ends`` (``i`` starting first), or None when all are disjoint."""
    lo = np.asarray(starts, dtype=np.uint64)
    hi = np.asarray(ends, dtype=np.uint64)
    busy = np.flatnonzero(hi > lo)
    if len(busy) < 2:
        return None
    order = busy[np.argsort(lo[busy], kind="stable")]
    reach = np.maximum.accumulate(hi[order])
    clash = np.flatnonzero(lo[order][1:] < reach[:-1])
    if not len(clash):
        return None
    k = int(clash[0]) + 1
    earlier = int(np.argmax(hi[order][:k] > lo[order][k]))
    return int(order[earlier]), int(order[k])


def refuse_overlaps(
    path: str | None,
    section: str,
    arrays: Sequence[tuple[str, npt.ArrayLike, npt.ArrayLike]],
) -> None:
    """Raise FormatError when two of the non-empty arrays share bytes (formats.md §3.6).

    ``arrays`` lists kinds of array as ``(label, starts, ends)``: record ``i`` of a kind owns
    ``[starts[i], ends[i])``, named in the message as ``label.format(i)`` (``"profile {}
    values"``).
    """
    labels: list[tuple[str, int]] = []
    starts, ends = [], []
    for label, lo, hi in arrays:
        lo_arr, hi_arr = np.asarray(lo, dtype=np.uint64), np.asarray(hi, dtype=np.uint64)
        starts.append(lo_arr)
        ends.append(hi_arr)
        labels.append((label, len(lo_arr)))
    clash = first_overlap(np.concatenate(starts), np.concatenate(ends)) if starts else None
    if clash is None:
        return

    def name(k: int) -> str:
        for label, count in labels:
            if k < count:
                return label.format(k)
            k -= count
        raise AssertionError("index past every array")  # pragma: no cover

    i, j = clash
    raise FormatError(path, section, f"{name(i)} and {name(j)} overlap (a corrupt file)")


def non_finite_problem(values: npt.NDArray[np.void]) -> list[str]:
    """A block's value that is NaN or infinite, as a problem for ``verify``; [] when none."""
    bad = ~np.isfinite(np.asarray(values["value"], dtype=np.float64))
    if not bad.any():
        return []
    first = float(values["value"][int(np.argmax(bad))])
    return [f"{int(bad.sum())} values are not finite numbers (the first is {first!r})"]


class _Checked(Protocol):
    def problems(self) -> list[str]: ...


BlockT = TypeVar("BlockT", bound=_Checked)


def block_for_dump(blocks: Sequence[BlockT], i: int) -> tuple[BlockT, str | None]:
    """Block ``i`` for a text dump: the checked block and None, or, when it fails its checks,
    the unchecked block and the problem (a dump shows what is there; it never refuses)."""
    try:
        return blocks[i], None
    except FormatError as error:
        raw = getattr(blocks, "raw", None)
        if raw is None:
            raise
        block: BlockT = raw(i)
        return block, error.problem


def dump_bounds(index: npt.NDArray[np.void], n_values: int) -> list[int]:
    """Where each entry of a block's index starts in its values, then ``n_values``, clipped into
    ``[0, n_values]`` and made ascending: a dump of a broken block slices without running off."""
    bounds = np.empty(len(index) + 1, dtype=np.uint64)
    bounds[:-1] = index["start"]
    bounds[-1] = n_values
    clipped = np.minimum(bounds, np.uint64(n_values)).astype(np.int64)
    out: list[int] = np.maximum.accumulate(clipped).tolist()
    return out
