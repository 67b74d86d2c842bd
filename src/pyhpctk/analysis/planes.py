"""Per-profile planes: one profile's values and trace on final contexts, as the files hold them.

Stage 4 for one profile (:func:`profile_statistics`: point values placed on the expanded
contexts, then the four scopes; :func:`rewrite_trace`: records on the contexts meta.db shows),
turned into what the writers take: a profile.db block (:func:`block_of`) and a trace.db line,
kept in a :class:`ProfilePlane`. Under ``--memory-limit`` finished blocks wait in a scratch file
(:class:`Spill`) rather than in memory. Also the positioned-write helpers every writer of the
driver uses (``os.pwrite`` until done, so ranks and threads write disjoint slices of one file).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pyhpctk.analysis.comm import Comm, agree
from pyhpctk.analysis.database import Trace
from pyhpctk.analysis.expand import Expansion
from pyhpctk.analysis.stats import (
    SCOPE_BUDGET,
    SparseValues,
    TreeShape,
    profile_scopes,
    scope_planes,
    stored_values,
)
from pyhpctk.analysis.unify import ProfileData
from pyhpctk.core.ids import ROOT
from pyhpctk.formats import profiledb, tracedb
from pyhpctk.formats.output import OutputError


def profile_statistics(
    data: ProfileData,
    mapping: npt.NDArray[np.int64],
    expansion: Expansion,
    shape: TreeShape,
    global_base: npt.NDArray[np.int64],
    move: npt.NDArray[np.bool_],
) -> SparseValues:
    """Stage 4 for one profile: its point values placed on final contexts, then its scopes."""
    ctx, metric, value = _placed(data, mapping, expansion, global_base, move)
    return profile_scopes(shape, ctx, metric, value, global_base)


def profile_block(
    data: ProfileData,
    mapping: npt.NDArray[np.int64],
    expansion: Expansion,
    shape: TreeShape,
    global_base: npt.NDArray[np.int64],
    move: npt.NDArray[np.bool_],
) -> tuple[profiledb.ProfileValues, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`profile_statistics` as the profile.db block :func:`block_of` makes of it, built
    from the scopes' planes directly (the same bytes, without the triples in between); with
    contexts and how many values each has in the block (some may have none)."""
    ctx, metric, value = _placed(data, mapping, expansion, global_base, move)
    n_metrics = int(np.count_nonzero(np.bincount(metric))) if len(metric) else 0
    nodes = shape.closure(ctx)
    if n_metrics == 0 or (n_metrics > 1 and len(nodes) * n_metrics > SCOPE_BUDGET):
        block = block_of(profile_scopes(shape, ctx, metric, value, global_base))  # in groups
        bounds = block.bounds().astype(np.int64)
        return block, block.ctx_ids().astype(np.int64), bounds[1:] - bounds[:-1]
    nodes, metrics, planes = scope_planes(shape, ctx, metric, value, nodes)
    per_row, ids, stored = stored_values(metrics, planes, global_base)
    del planes
    out = np.empty(len(stored), profiledb.PROFILE_VALUE_DTYPE)
    out["metric_id"] = ids
    out["value"] = stored
    rows = np.flatnonzero(per_row)
    index = np.empty(len(rows), profiledb.PROFILE_CTX_INDEX_DTYPE)
    index["ctx_id"] = nodes[rows]
    index["start"] = (np.cumsum(per_row) - per_row)[rows]
    return profiledb.ProfileValues(index, out), nodes, per_row


def _placed(
    data: ProfileData,
    mapping: npt.NDArray[np.int64],
    expansion: Expansion,
    global_base: npt.NDArray[np.int64],
    move: npt.NDArray[np.bool_],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A profile's point values on final contexts: (context, global metric index, value)."""
    metric = mapping[data.value_metric] if len(data.value_metric) else data.value_metric
    nodes, value = data.value_node, data.value
    keep = global_base[metric] >= 0 if len(metric) else np.zeros(0, dtype=bool)
    if not keep.all():
        nodes, metric, value = nodes[keep], metric[keep], value[keep]
    rows, ctx, value = expansion.place(nodes, move[metric], value)
    return ctx, (metric if rows is None else metric[rows]), value


def rewrite_trace(
    time: npt.NDArray[np.uint64],
    node: npt.NDArray[np.int64],
    node_ctx: npt.NDArray[np.int64],
    visible: npt.NDArray[np.int64],
) -> Trace:
    """formats.md §3.5: records to final (visible) contexts, time-sorted, no repeated idles."""
    ctx = visible[node_ctx[node]]
    if len(time) > 1 and np.any(time[1:] < time[:-1]):
        order = np.argsort(time, kind="stable")
        time, ctx = time[order], ctx[order]
    if len(ctx) > 1:
        repeated_idle = np.zeros(len(ctx), dtype=bool)
        repeated_idle[1:] = (ctx[1:] == ROOT) & (ctx[:-1] == ROOT)
        time, ctx = time[~repeated_idle], ctx[~repeated_idle]
    return Trace(time.astype(np.uint64), ctx.astype(np.int64))


def block_of(values: SparseValues) -> profiledb.ProfileValues:
    """``ProfileValues.from_triples`` for values already sorted, unique and non-zero (as
    :func:`.stats.profile_scopes` returns them): no sort needed, the same bytes."""
    key = (values.ctx << 16) | values.metric
    if (len(key) > 1 and bool(np.any(key[1:] <= key[:-1]))) or bool(np.any(values.value == 0)):
        return profiledb.ProfileValues.from_triples(values.ctx, values.metric, values.value)
    out = np.empty(len(key), profiledb.PROFILE_VALUE_DTYPE)
    out["metric_id"] = values.metric
    out["value"] = values.value
    new_ctx = np.ones(len(key), dtype=bool)
    new_ctx[1:] = values.ctx[1:] != values.ctx[:-1]
    starts = np.flatnonzero(new_ctx)
    index = np.empty(len(starts), profiledb.PROFILE_CTX_INDEX_DTYPE)
    index["ctx_id"] = values.ctx[starts]
    index["start"] = starts
    return profiledb.ProfileValues(index, out)


@dataclass(slots=True)
class ProfilePlane:
    """One of this rank's profiles after statistics: its profile.db block (or where it was set
    aside) and its trace.db line."""

    position: int  # 0-based among usable profiles; profile.db index is position + 1
    n_values: int
    n_contexts: int
    block: profiledb.ProfileValues | None
    spilled_at: int
    trace: tracedb.TraceLine | None
    trace_range: tuple[int, int] | None

    def load(self, spill: Spill | None) -> profiledb.ProfileValues:
        """The block, from memory or from the scratch file."""
        if self.block is not None:
            return self.block
        assert spill is not None
        return spill.get(self.spilled_at, self.n_values, self.n_contexts)


class Spill:
    """This rank's finished profile.db blocks in a scratch file, when memory is capped.

    Blocks are appended as computed (values, then context indices) and read back one at a time
    when they are copied into profile.db and in each cct.db round, so a rank never holds more
    than one of them. The file lives in ``$TMPDIR`` (node-local on most clusters) and is removed
    by :meth:`close`.
    """

    def __init__(self) -> None:
        try:
            handle, name = tempfile.mkstemp(prefix="pyprof-mpi-blocks-")
        except OSError as error:
            raise self._error(tempfile.gettempdir(), error) from None
        self.fd = handle
        self.path = name
        self.end = 0
        self.lock = threading.Lock()

    def put(self, block: profiledb.ProfileValues) -> int:
        """Append ``block``; returns where it starts."""
        values = np.ascontiguousarray(block.values).view(np.uint8)
        index = np.ascontiguousarray(block.ctx_indices).view(np.uint8)
        with self.lock:
            at = self.end
            self.end += len(values) + len(index)
        try:
            pwrite_all(self.fd, values, at)
            pwrite_all(self.fd, index, at + len(values))
        except OSError as error:
            raise self._error(self.path, error) from None
        return at

    @staticmethod
    def _error(where: str, error: OSError) -> OutputError:
        return OutputError(
            f"{where}: cannot write pyprof-mpi's scratch file: {error.strerror or error} "
            "(--memory-limit keeps blocks in $TMPDIR: point TMPDIR at a larger file system)"
        )

    def get(self, at: int, n_values: int, n_contexts: int) -> profiledb.ProfileValues:
        """The block :meth:`put` stored at ``at``."""
        size_v = n_values * profiledb.PROFILE_VALUE_DTYPE.itemsize
        size_c = n_contexts * profiledb.PROFILE_CTX_INDEX_DTYPE.itemsize
        raw = pread_all(self.fd, size_v + size_c, at)
        return profiledb.ProfileValues(
            np.frombuffer(raw, profiledb.PROFILE_CTX_INDEX_DTYPE, n_contexts, size_v),
            np.frombuffer(raw, profiledb.PROFILE_VALUE_DTYPE, n_values, 0),
        )

    def index(self, at: int, n_values: int, n_contexts: int) -> npt.NDArray[np.void]:
        """The context index of the block stored at ``at`` (without its values)."""
        size_v = n_values * profiledb.PROFILE_VALUE_DTYPE.itemsize
        size_c = n_contexts * profiledb.PROFILE_CTX_INDEX_DTYPE.itemsize
        raw = pread_all(self.fd, size_c, at + size_v)
        return np.frombuffer(raw, profiledb.PROFILE_CTX_INDEX_DTYPE, n_contexts)

    def values(self, at: int, first: int, last: int) -> npt.NDArray[np.void]:
        """Values ``first..last-1`` of the block stored at ``at``."""
        size = profiledb.PROFILE_VALUE_DTYPE.itemsize
        raw = pread_all(self.fd, (last - first) * size, at + first * size)
        return np.frombuffer(raw, profiledb.PROFILE_VALUE_DTYPE, last - first)

    def close(self) -> None:
        os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def open_spill(comm: Comm) -> Spill:
    """A scratch file on every rank, or the first rank's error on all (none left open)."""
    spill: Spill | None = None
    error: OutputError | None = None
    try:
        spill = Spill()
    except OutputError as caught:
        error = caught
    try:
        agree(comm, error)
    except BaseException:
        if spill is not None:
            spill.close()
        raise
    assert spill is not None
    return spill


def pread_all(fd: int, size: int, offset: int) -> bytes:
    """Exactly ``size`` bytes at ``offset``."""
    parts = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise OSError(f"scratch file ended {size} bytes early")
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


def pwrite_all(fd: int, image: npt.NDArray[np.uint8], offset: int) -> None:
    """``os.pwrite`` all of ``image`` at ``offset``."""
    view = memoryview(np.ascontiguousarray(image).data).cast("B")
    while len(view):
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


__all__ = [
    "ProfilePlane",
    "Spill",
    "block_of",
    "open_spill",
    "pread_all",
    "profile_block",
    "profile_statistics",
    "pwrite_all",
    "rewrite_trace",
]
