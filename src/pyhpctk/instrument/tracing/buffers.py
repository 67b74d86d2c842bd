"""The host's side of a traced launch's buffers: the control block's words, the exact strategy's
per-warp table (from the counting pass's tallies), the chunk strategy's pool, and their limits.

Everything here is numpy on the host: sizes and tables are computed from what the device gave
back (tallies, the chunk cursor) and written to the device by the launcher
(:mod:`.launcher`). The words and layouts are those of
:mod:`pyhpctk.instrument.ptx.traces`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyhpctk.instrument.ptx.traces import CONTROL, EVENT_BYTES, Strategy

Dim3 = tuple[int, int, int]
DEFAULT_CHUNK_EVENTS = 64  # 2 KiB a chunk: one global atomic per 64 events of a warp


def dim3(value: int | tuple[int, ...]) -> Dim3:
    """A grid or block shape as (x, y, z)."""
    parts = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(parts) <= 3 or any(int(p) < 1 for p in parts):
        raise ValueError(f"a launch shape is 1 to 3 positive numbers, not {value!r}")
    x, y, z = (*(int(p) for p in parts), 1, 1)[:3]
    return x, y, z


def warps_per_cta(block: Dim3) -> int:
    return (block[0] * block[1] * block[2] + 31) // 32


def launch_warps(grid: Dim3, block: Dim3) -> int:
    """How many warps a launch of ``grid`` CTAs of ``block`` threads runs."""
    return grid[0] * grid[1] * grid[2] * warps_per_cta(block)


def control_words(
    strategy: Strategy,
    events: int = 0,
    table: int = 0,
    tallies: int = 0,
    chunk_events: int = 0,
    chunks: int = 0,
) -> np.ndarray:
    """The 8 words of a control block: device addresses of the buffers, the pool's shape."""
    words = np.zeros(len(CONTROL), dtype=np.uint64)
    words[CONTROL.EVENTS] = events
    if strategy is Strategy.EXACT:
        words[CONTROL.TABLE] = table
        words[CONTROL.TALLIES] = tallies
    else:
        words[CONTROL.CHUNK_EVENTS] = chunk_events
        words[CONTROL.CHUNKS] = chunks
    return words


@dataclass(frozen=True)
class ExactLayout:
    """Each warp's slots in the exact strategy's event buffer, from its counted events; with a
    cap, each warp keeps the share of its events the cap allows (the rest counted as lost)."""

    counted: np.ndarray  # u32 per warp: events the counting pass saw
    sizes: np.ndarray  # u32 per warp: slots given

    @classmethod
    def from_tallies(cls, tallies: np.ndarray, cap_events: int | None = None) -> ExactLayout:
        counted = np.asarray(tallies, dtype=np.uint32)
        sizes = counted.astype(np.uint64)
        total = int(sizes.sum())
        if cap_events is not None and total > cap_events:
            sizes = (sizes * cap_events) // max(total, 1)
        return cls(counted, sizes.astype(np.uint32))

    @property
    def events(self) -> int:
        return int(self.sizes.astype(np.uint64).sum())

    @property
    def nbytes(self) -> int:
        return self.events * EVENT_BYTES

    def table(self) -> np.ndarray:
        """(warps, 2) u32: each warp's first slot and one past its last."""
        ends = np.cumsum(self.sizes.astype(np.uint64))
        if len(ends) and int(ends[-1]) >= 1 << 32:
            raise ValueError(f"{int(ends[-1])} events: more than a u32 slot index reaches")
        out = np.zeros((len(self.sizes), 2), dtype=np.uint32)
        out[:, 1] = ends
        out[1:, 0] = ends[:-1]
        return out


@dataclass(frozen=True)
class ChunkPool:
    """The chunk strategy's pool: ``chunks`` chunks of ``chunk_events`` slots."""

    chunks: int
    chunk_events: int = DEFAULT_CHUNK_EVENTS

    @classmethod
    def for_bytes(cls, nbytes: int, chunk_events: int = DEFAULT_CHUNK_EVENTS) -> ChunkPool:
        if chunk_events < 1:
            raise ValueError("a chunk holds at least one event")
        return cls(max(nbytes // (EVENT_BYTES * chunk_events), 0), chunk_events)

    @property
    def events(self) -> int:
        return self.chunks * self.chunk_events

    @property
    def nbytes(self) -> int:
        return self.events * EVENT_BYTES
